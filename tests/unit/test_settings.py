"""The settings table, the command line, config files and environment variables."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stompbroker.cli import parse_config
from stompbroker.settings import README_END, README_START, SETTINGS, make_config, markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stompica_key_value_form():
    config = parse_config(["processors=10", "port=3000", "TTL=5000", "max_input_queue_size=7",
                           "max_stale_queue_size=8"])
    assert (config.processors, config.port, config.TTL) == (10, 3000, 5000)
    assert (config.max_input_queue_size, config.max_stale_queue_size) == (7, 8)
    assert config.writers == 8


def test_ttl_key_is_case_insensitive_and_flags_work():
    assert parse_config(["ttl=5"]).TTL == 5
    config = parse_config(["--port", "3001", "--TTL", "9", "--store", "sqlite"])
    assert (config.port, config.TTL, config.store) == (3001, 9, "sqlite")


def test_config_file_and_environment(tmp_path, monkeypatch):
    conf = tmp_path / "broker.conf"
    conf.write_text("# comment\nport = 4000\nmax_connections = 12\n")
    monkeypatch.setenv("STOMPBROKER_MAX_CONNECTIONS", "13")
    config = parse_config(["-c", str(conf)])
    assert config.port == 4000
    assert config.max_connections == 13  # the environment beats the file
    assert parse_config(["-c", str(conf), "max_connections=14"]).max_connections == 14  # the command line beats both


def test_unknown_key_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(["proccessors=4"])
    assert exc.value.code == 2
    assert "unknown setting 'proccessors'" in capsys.readouterr().err


def test_unknown_config_file_key_is_an_error(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("prot = 4000\n")
    with pytest.raises(SystemExit):
        parse_config(["-c", str(conf)])


@pytest.mark.parametrize("word", ["port=70000", "max_frame_size=0", "store=redis", "log_level=LOUD",
                                  "heartbeat_min_ms=200000", "dead_letter_queue=/topic/dlq", "processors=x"])
def test_bad_values_are_errors(word):
    with pytest.raises(SystemExit):
        parse_config([word])


def test_writers_rule():
    assert make_config(processors=1).writers == 1
    assert make_config(processors=3).writers == 1
    assert make_config(processors=4).writers == 2


def test_help_lists_every_setting_with_its_default():
    out = subprocess.run([sys.executable, "-m", "stompbroker", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30).stdout
    out = " ".join(out.split())
    for s in SETTINGS:
        assert f"--{s.name}" in out
    assert "default: 61613" in out


def test_readme_settings_table_is_current():
    text = open(os.path.join(ROOT, "README.md")).read()
    table = text[text.index(README_START) + len(README_START):text.index(README_END)].strip()
    assert table == markdown_table(), "run: python -m stompbroker.settings --readme"


def test_diag_admin_only_follows_auth_unless_set():
    assert make_config().diag_admin_only is False
    assert make_config(auth="passwd").diag_admin_only is True
    assert make_config(secret="s").diag_admin_only is True                     # token logins are logins too
    assert parse_config(["auth=passwd", "diag_admin_only=false"]).diag_admin_only is False
    assert parse_config(["diag_admin_only=auto", "auth=passwd"]).diag_admin_only is True
    assert make_config(auth="passwd").describe() == "auth=passwd"               # a followed default is a default
    assert "diag_admin_only=False" in make_config(auth="passwd", diag_admin_only=False).describe()


def test_diag_before_connect_is_off_and_cannot_be_on_with_logins(capsys):
    assert make_config().diag_before_connect is False
    assert make_config(diag_before_connect=True).diag_before_connect is True
    for words in (["auth=passwd", "diag_before_connect=true"], ["secret=s", "diag_before_connect=true"]):
        with pytest.raises(SystemExit):
            parse_config(words)
        assert "diag_before_connect=true needs auth=off" in capsys.readouterr().err


@pytest.mark.parametrize("name, low, high", [
    ("max_http_head", 1024, 1024 * 1024), ("api_max_page_size", 1, 100_000), ("auth_fail_delay_max_ms", 0, 3_600_000),
    ("auth_fail_window_ms", 0, 86_400_000), ("auth_fail_records", 1, 10_000_000), ("console_tokens_per_user", 1, 1000),
    ("restart_budget", 1, 1000), ("restart_delay_max_ms", 100, 60_000)])
def test_limits_have_bounds(name, low, high):
    assert getattr(make_config(**{name: str(low)}), name) == low
    assert getattr(make_config(**{name: str(high)}), name) == high
    for bad in (low - 1, high + 1):
        with pytest.raises(ValueError, match=f"{name} must be {low} to {high}"):
            make_config(**{name: str(bad)})

"""Setting errors: one clear line (where, what, what is accepted), exit status 2, never a usage dump."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stompbroker.cli import parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def error_of(argv, capsys, environ=None) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, environ={} if environ is None else environ)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "usage:" not in err and "--help" in err
    return err


@pytest.mark.parametrize("argv, expected", [
    (["port=x"], "port: expected a whole number, got 'x'"),
    (["diag_admin_only=maybe"], "diag_admin_only: expected auto, true or false (also yes/no, on/off, 1/0), got 'maybe'"),
    (["proccessors=4"], "unknown setting 'proccessors' (did you mean processors?)"),
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["port=70000"], "port must be at most 65535"),
    (["checkpoint=soon"], "checkpoint: expected a number, got 'soon'"),
])
def test_bad_setting_is_one_line_and_status_2(argv, expected, capsys):
    assert expected in error_of(argv, capsys)


def test_bad_value_from_the_environment_names_the_variable(capsys):
    err = error_of([], capsys, environ={"STOMPBROKER_PORT": "eighty"})
    assert "STOMPBROKER_PORT: port: expected a whole number" in err


def test_config_file_errors_name_file_and_line(tmp_path, capsys):
    conf = tmp_path / "broker.conf"
    conf.write_text("# comment\nport = 4000\nprot = 5\n")
    assert f"{conf}:3: unknown setting 'prot' (did you mean port?)" in error_of(["-c", str(conf)], capsys)
    conf.write_text("port = many\n")
    assert f"{conf}:1: port: expected a whole number, got 'many'" in error_of(["-c", str(conf)], capsys)
    assert f"config file {tmp_path}/none.conf: No such file" in error_of(["-c", str(tmp_path / "none.conf")], capsys)


def test_config_file_keys_are_case_insensitive_like_the_command_line(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("PORT = 4000\nttl = 50\nMax_Connections: 12\nsecret = 'quoted'\n")
    config = parse_config(["-c", str(conf)], environ={})
    assert (config.port, config.TTL, config.max_connections, config.secret) == (4000, 50, 12, "quoted")


def test_the_real_command_prints_one_line():
    result = subprocess.run([sys.executable, "-m", "stompbroker", "diag_admin_only=maybe"], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr


def test_default_port_is_the_stomp_convention():
    assert parse_config([], environ={}).port == 61613

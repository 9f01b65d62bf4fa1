"""docs/architecture.md's "Where does X live" table names the broker's modules as they are."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "stompbroker" / "broker"


def _table() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return text.split("## Where does X live", 1)[1].split("\n## ", 1)[0]


def test_every_module_named_exists():
    named = set(re.findall(r"`(\w+)\.py`", _table()))
    assert named, "the table names no modules"
    missing = sorted(name for name in named if not (BROKER / f"{name}.py").exists())
    assert not missing, f"named in docs/architecture.md but not in stompbroker/broker/: {missing}"


def test_every_broker_module_has_a_row():
    named = set(re.findall(r"`(\w+)\.py`", _table()))
    modules = {p.stem for p in BROKER.glob("*.py")} - {"__init__"}
    unnamed = sorted(modules - named)
    assert not unnamed, f"stompbroker/broker/ modules with no row in docs/architecture.md: {unnamed}"


def test_the_reader_modules_named_are_the_reader_modules():
    named = set(re.findall(r"`processes/(reader\w*)\.py`", _table()))
    modules = {p.stem for p in (ROOT / "stompbroker" / "processes").glob("reader*.py")}
    assert named == modules, f"docs/architecture.md names {sorted(named - modules)}, misses {sorted(modules - named)}"

"""The test tree itself: pytest collects tests/ as rootdir-relative modules without packages, so
two test files with one basename stop the whole collection ("import file mismatch"), and a
tests/unit/conftest.py would shadow the `conftest` module the integration tests import. Either
passes unnoticed while only one directory is run; this check fails in any run."""

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_every_python_file_under_tests_has_its_own_basename():
    names = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "node_modules" in path.parts or path.name == "__init__.py":
            continue
        names[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}

"""The import layers of ``stompbroker/`` (docs/architecture.md, "Layers"): every import, at module
level or inside a function, goes from a module to one below it; no import circle anywhere.

Read from the source with ``ast`` (nothing is imported). A failure names the offending import.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stompbroker"

# Bottom first. A part of a layer imports only parts of the layers below it (a part: a subpackage
# of stompbroker/, or one of its top-level modules).
PACKAGE_LAYERS = [
    ["__init__", "settings", "readiness", "titles"],
    ["protocol"],
    ["ipc", "security", "store"],
    ["diag"],
    ["broker"],
    ["cluster", "console"],
    ["processes"],
    ["tools"],
    ["analysis"],
    ["bench", "cli"],
    ["__main__"],
]

# The modules of stompbroker/broker/, bottom first: a module imports only modules of the layers
# below its own.
BROKER_LAYERS = [
    ["vhosts"],
    ["names", "model", "subscriptions", "stale", "selector_lexer", "auth", "priority", "choosing", "lastvalue", "schedule"],
    ["selector_like", "selector_eval", "permissions", "replies", "dedup"],
    ["selector", "bounds"],
    ["queues"],
    ["confirmations", "durables", "temporary", "diagnostics", "acks", "replayseq", "browsing", "scheduling"],
    ["routing"],
    ["subscribing", "transactions", "manage"],
    ["sessions"],
    ["core"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict) -> list[tuple[str, int]]:
    """(imported module of stompbroker, line) for every import in the file, lazy ones included."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:  # `from . import queues` imports the module queues
                full = f"{source}.{alias.name}"
                found.append((full if full in modules else source, node.lineno))
    return [(target, line) for target, line in found if target in modules and target != name]


@functools.cache  # (parsed once for the tests of this file)
def import_graph() -> tuple[dict, dict]:
    """module -> set of modules it imports, and (module, imported) -> line of the first such import."""
    modules = all_modules()
    graph, lines = {}, {}
    for name, path in modules.items():
        graph[name] = set()
        for target, line in imports_of(name, path, modules):
            graph[name].add(target)
            lines.setdefault((name, target), line)
    return graph, lines


def part_of(name: str) -> str:
    """The part of stompbroker/ a module belongs to: its subpackage, or itself at the top."""
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def rank(layers: list[list[str]]) -> dict[str, int]:
    return {member: i for i, layer in enumerate(layers) for member in layer}


def where(name: str, lines: dict, target: str) -> str:
    path = all_modules()[name].relative_to(ROOT)
    return f"{path}:{lines[name, target]} imports {target}"


def upward_imports(graph: dict, lines: dict) -> list[str]:
    parts, broker = rank(PACKAGE_LAYERS), rank(BROKER_LAYERS)
    wrong = []
    for name, targets in graph.items():
        for target in sorted(targets):
            a, b = part_of(name), part_of(target)
            if a != b:
                if a in parts and b in parts and parts[b] >= parts[a]:  # (unknown: see the first test)
                    wrong.append(f"{where(name, lines, target)}: {b} is not below {a}")
            elif a == "broker" and name != "stompbroker.broker" and target != "stompbroker.broker":
                x, y = name.rsplit(".", 1)[1], target.rsplit(".", 1)[1]
                if x in broker and y in broker and broker[y] >= broker[x]:
                    wrong.append(f"{where(name, lines, target)}: broker/{y} is not below broker/{x}")
    return wrong


def cycles(graph: dict) -> list[list[str]]:
    """One circle per strongly connected group of modules that import each other (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [circle_in(graph, set(group)) for group in groups]


def circle_in(graph: dict, group: set) -> list[str]:
    """A path through the group from its first module back to it."""
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph[path[-1]] & group):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return sorted(group)


def test_every_part_and_broker_module_has_a_layer():
    parts = {part_of(name) for name in all_modules()}
    assert parts == set(rank(PACKAGE_LAYERS)), f"parts of stompbroker/ with no layer, or gone: " \
                                               f"{sorted(parts ^ set(rank(PACKAGE_LAYERS)))}"
    broker = {p.stem for p in (PACKAGE / "broker").glob("*.py")} - {"__init__"}
    assert broker == set(rank(BROKER_LAYERS)), f"broker/ modules with no layer, or gone: " \
                                               f"{sorted(broker ^ set(rank(BROKER_LAYERS)))}"


def test_no_import_goes_up():
    graph, lines = import_graph()
    wrong = upward_imports(graph, lines)
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_no_import_circle():
    graph, lines = import_graph()
    found = cycles(graph)
    text = "\n".join(" -> ".join(circle) + "\n    " + "\n    ".join(
        where(a, lines, b) for a, b in zip(circle, circle[1:])) for circle in found)
    assert not found, "import circles:\n" + text


def test_the_checks_name_what_they_find():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    lines = {("stompbroker.broker.queues", "stompbroker.broker.routing"): 7}
    wrong = upward_imports({"stompbroker.broker.queues": {"stompbroker.broker.routing"}}, lines)
    assert wrong == ["stompbroker/broker/queues.py:7 imports stompbroker.broker.routing: "
                     "broker/routing is not below broker/queues"]


def test_the_architecture_doc_lists_these_layers():
    text = (ROOT / "docs" / "architecture.md").read_text().split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    # each numbered line: the layer's names, then ": " and what they are
    listed = [re.findall(r"`([\w/.]+)`", line.split(": ", 1)[0]) for line in text.splitlines()
              if re.match(r"\d+\. ", line)]
    bare = [[name.removesuffix(".py").removesuffix("/").rsplit("/", 1)[-1] for name in layer] for layer in listed]
    assert bare == PACKAGE_LAYERS + BROKER_LAYERS, \
        "docs/architecture.md's Layers lists differ from tests/unit/test_layers.py's"

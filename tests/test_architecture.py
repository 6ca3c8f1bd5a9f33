"""The package layout the README promises (its contributors section), read off the source: import cycles and who may import whom."""
from __future__ import annotations

import ast

import pytest

from conftest import ROOT

PACKAGES = ("amqp_server", "exchanges", "msg_store", "queue_index", "mgmt_http", "mgmt_http.warrenctl", "forwarder",
            "spark")
# The AMQP front end: the broker core (every other amqp_server module) reaches it through amqp_server/ports.py.
FRONT_END = {"channel", "clients", "connection", "consumer_timeout", "server", "__main__"}


def imports(package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (TYPE_CHECKING imports included)."""
    modules = {path.stem: path for path in (ROOT / package.replace(".", "/")).glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found.update([node.module.split(".")[0]] if node.module else (a.name for a in node.names))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(package + "."):
                found.add(node.module[len(package) + 1:].split(".")[0])
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def long_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Simple cycles of three modules or more (a parent/child pair importing each other is allowed)."""
    found = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph[path[-1]]):
            if nxt == path[0] and len(path) > 2:
                found.append(path[:])
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its smallest module
                walk(path + [nxt])

    for start in sorted(graph):
        walk([start])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_longer_than_two_modules(package):
    assert long_cycles(imports(package)) == []


def test_the_broker_core_imports_no_front_end():
    graph = imports("amqp_server")
    leaks = {m: sorted(graph[m] & FRONT_END) for m in graph if m not in FRONT_END and graph[m] & FRONT_END}
    assert leaks == {}


def test_storage_and_routing_know_nothing_of_amqp_frames_or_sockets():
    for package in ("exchanges", "msg_store", "queue_index"):
        for path in (ROOT / package).glob("*.py"):
            assert not top_level_imports(path) & {"amqp_server", "pamqp", "socket", "asyncio"}, path


def top_level_imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    return {n.split(".")[0] for n in names}


def test_warrenctl_speaks_http_only():
    """The command-line client needs none of the broker: it runs wherever its user is."""
    for path in (ROOT / "mgmt_http" / "warrenctl").glob("*.py"):
        assert not top_level_imports(path) & {"amqp_server", "aiohttp", "forwarder", "lmdb"}, path


def test_the_cycle_finder_finds_cycles():
    assert long_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert long_cycles({"a": {"b"}, "b": {"a"}}) == []

"""The package layout the README promises (its contributors section), read off the source: import cycles and who
may import whom."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("amqp_server", "exchanges", "msg_store", "queue_index", "mgmt_http", "mgmt_http.warrenctl", "forwarder",
            "spark", "stream_log")
# The front ends in amqp_server (AMQP, the stream protocol): the broker core (every other amqp_server module, the
# broker/ package's included) reaches them through amqp_server/ports.py.
FRONT_END = {f"amqp_server.{name}" for name in ("amqp091.channel", "frontend.clients", "amqp091.connection",
                                                "amqp091.consumer_timeout", "node.server", "__main__", "stream.reader")}


def module_graph() -> dict[str, set[str]]:
    """Every module of the packages (sub-packages included) -> the modules of the packages it imports, wherever the
    import stands: at the top, in a function, or under TYPE_CHECKING (annotations make cycles as real to a reader
    and a type checker).  ``from package import name`` counts as importing the module ``package.name`` if there is
    one, else the package itself."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                found.update(known(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
                             for alias in node.names)
        graph[name] = {module for module in found if module is not None and module != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each of their modules
    reaches every other through imports, so none can be read, tested or changed alone."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_import_cycle():
    """Of any length, within a package or across packages, annotations included."""
    assert cycles(module_graph()) == []


def test_ports_is_a_leaf():
    """What the core asks of its front ends imports nothing of the project: the core and the front ends both
    import it."""
    assert module_graph()["amqp_server.ports"] == set()


def test_the_broker_core_imports_no_front_end():
    graph = module_graph()
    core = [module for module in graph if module.startswith("amqp_server") and module not in FRONT_END]
    assert core and "amqp_server.broker.queues" in core
    assert {module: sorted(graph[module] & FRONT_END) for module in core if graph[module] & FRONT_END} == {}


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
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"x.a": {"y.b"}, "y.b": {"x.c", "z"}, "x.c": {"x.d"}, "x.d": {"x.a"}, "z": set()}) == [
        ["x.a", "x.c", "x.d", "y.b"]]


def test_the_module_graph_sees_annotations_functions_and_other_packages():
    graph = module_graph()
    assert "amqp_server.queues.ready" in graph["amqp_server.queues.persistence"]  # under TYPE_CHECKING
    assert "amqp_server.amqp091.channel" in graph["amqp_server.amqp091.connection"]  # in a function
    assert "amqp_server.broker" in graph["forwarder.cluster"]  # across packages
    assert "amqp_server.queues.stream_queue" in graph["amqp_server.stream.reader"]  # from a sub-package
    assert "exchanges.delayed" in graph["exchanges"]  # a package's own modules


# The node's persistence (queues/persistence.py) is what every durable queue shares: the message store, the queue
# index and the group commit.  What one type keeps apart is that type's storage, built with the broker and handed to
# its queues: a priority queue's rows keyed by level (priority_queue.RankedRows), the quorum queues' copies
# (replica_store.ReplicaStore), the streams' logs (stream_log).  These words name one type's storage.
TYPE_STORAGE_WORDS = ("replica", "stream", "ranked", "quorum", "priority", "copy_state")


def type_storage_names(source: str) -> list[str]:
    """The names in ``source`` (imports, definitions, attributes, variables) that name one type's storage."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(alias.name for alias in node.names)]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Name):
            names = [node.id]
        else:
            continue
        found += [(node.lineno, name) for name in names if any(word in name.lower() for word in TYPE_STORAGE_WORDS)]
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_persistence_holds_no_type_s_storage():
    assert type_storage_names((ROOT / "amqp_server" / "queues" / "persistence.py").read_text()) == []


def test_the_type_storage_finder_finds_a_type_s_storage():
    source = '''
from stream_log.log import StreamLogs
from .quorum_machine import State
class Persistence:
    def replica_move(self, index_id): pass
    def write(self, queue, entry):
        key = queue.row_key(entry) if queue.ranked else entry.seq
        self.streams.commit()
        return self.copy_state(queue.index_id)
'''
    assert type_storage_names(source) == ["2: StreamLogs", "2: stream_log.log", "3: quorum_machine", "5: replica_move",
                                          "7: ranked", "8: streams", "9: copy_state"]


# The queue types (amqp_server/queues/types/, the interface in queue_type.py), the classes that hold a queue's messages
# (a queue's parts among them) and the proxy of another node's queue: inside them a queue's type and location are
# known.  Everywhere else code asks the type (queue.type: its capabilities, checks, policy keys, HTTP fields) and the
# queue, and does not branch on either.
INSIDE_THE_TYPES = {"amqp_server.queues.queue_type", "amqp_server.queues.queue", "amqp_server.queues.ready_list",
                    "amqp_server.queues.consumers", "amqp_server.queues.expiry", "amqp_server.spark_bridge.queue_reads",
                    "amqp_server.queues.priority_queue", "amqp_server.queues.quorum_queue",
                    "amqp_server.queues.stream_queue", "forwarder.peers.remote_queue"}
# (isinstance against Queue itself tells a queue from an exchange, a binding's destination: neither type nor place)
QUEUE_CLASSES = {"PriorityQueue", "QuorumQueue", "StreamQueue", "RemoteQueue"}
TYPE_NAMES = {"classic", "quorum", "stream", "x-queue-type"}
# The branches that remain (at most five), each asking where a queue lives, for a reason:
KNOWN_BRANCHES = {
    "amqp_server/amqp091/channel.py": 1,  # basic.get and queue.purge of this node's queue answer within the frame's
    # turn, in order with the frames after it; another node's suspend the channel until its node answers
    "amqp_server/stream/manager.py": 1,  # the stream protocol serves the streams of this node (served_here); a
    # client finds another node's through metadata
    "mgmt_http/forward.py": 1,  # another node's management API answers for its queues (by_owner)
}


def type_branches(tree: ast.AST) -> list[int]:
    """The lines that branch on a queue's type or location: isinstance against a queue class, ``.remote``, a
    comparison with a type's name, ``queue_type`` or ``x-queue-type``, or a read of ``x-queue-type``."""
    def names(node: ast.expr) -> set[str]:
        elements = node.elts if isinstance(node, ast.Tuple) else [node]
        return {e.id if isinstance(e, ast.Name) else e.attr for e in elements
                if isinstance(e, (ast.Name, ast.Attribute))}

    def typed(node: ast.expr, names: set[str] = TYPE_NAMES) -> bool:
        return ((isinstance(node, ast.Constant) and node.value in names)
                or (isinstance(node, ast.Attribute) and node.attr == "queue_type"))

    def read(node: ast.expr) -> bool:  # arguments.get("x-queue-type"), arguments["x-queue-type"]
        return typed(node, {"x-queue-type"})

    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2 and names(node.args[1]) & QUEUE_CLASSES):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr == "remote"
              and not (isinstance(node.value, ast.Name) and node.value.id == "request")):  # (aiohttp's peer address)
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(typed(side) for side in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and read(node.args[0])) or (isinstance(node, ast.Subscript) and read(node.slice)):
            lines.append(node.lineno)
    return sorted(set(lines))


def branches_outside_the_types() -> dict[str, list[int]]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package.replace(".", "/")).glob("*.py")) + sorted(
                (ROOT / package.replace(".", "/")).glob("*/*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module in INSIDE_THE_TYPES or module.startswith("amqp_server.queues.types"):
                continue
            lines = type_branches(ast.parse(path.read_text()))
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    return found


def test_code_outside_the_queue_types_asks_the_type_and_does_not_branch_on_it():
    found = branches_outside_the_types()
    assert {path: len(lines) for path, lines in found.items()} == KNOWN_BRANCHES, found
    assert sum(KNOWN_BRANCHES.values()) <= 5


def test_the_branch_finder_finds_branches():
    source = '''
if isinstance(q, (RemoteQueue, Exchange)): pass
if q.remote: pass
if q.args.queue_type == "quorum": pass
if arguments.get("x-queue-type"): pass
if "stream" != kind: pass
ok = isinstance(q, Exchange) and "x-queue-type" in NAMES and REPLICATED in q.type.capabilities
'''
    assert type_branches(ast.parse(source)) == [2, 3, 4, 5, 6, 7]  # (7: "x-queue-type" in NAMES)


def test_the_spark_bridge_reads_a_queue_through_its_record_source():
    """The bridge's read and its HTTP front end ask a queue only what ``RecordSource`` offers (each queue type
    provides it), never the state of its ready list or its tail on disk."""
    source = ast.parse((ROOT / "amqp_server" / "spark_bridge" / "queue_reads.py").read_text())
    protocol = next(node for node in source.body if isinstance(node, ast.ClassDef) and node.name == "RecordSource")
    offered = {node.name for node in protocol.body if isinstance(node, ast.FunctionDef)}
    assert {"offsets", "read_range", "chunk_span", "disk_part", "disk_index", "locate"} <= offered
    for path in (ROOT / "amqp_server" / "spark_bridge" / "record_stream.py", ROOT / "mgmt_http" / "offsets.py"):
        asked = {node.attr for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "queue"}
        assert asked and asked <= offered, (path, sorted(asked - offered))


# -- packages as the architecture draws them ---------------------------------------------------------------------

def package_of(module: str) -> str:
    """The package a module is in (a package's ``__init__`` is the package itself)."""
    path = ROOT / module.replace(".", "/")
    return module if (path / "__init__.py").exists() else module.rpartition(".")[0]


# Modules whose imports are left out of the package graph, each for a reason that names what removes it; the list
# must shrink to nothing (every entry is checked to still be needed).
KNOWN_PACKAGE_CYCLES = {
    "amqp_server.runtime_parameters": "validating a vhost's parameters names the shovel's and federation's "
                                      "components: components register their validation instead",
    "amqp_server.__main__": "python -m amqp_server runs the node (node.server), which sits above the package whose "
                            "modules it starts: the one module of the package that imports upward",
    "amqp_server.frontend.clients": "the node's registry types its flush list as AMQP 0-9-1 connections: a flushable "
                                    "connection protocol in front_end removes it",
}


def package_graph(graph: dict[str, set[str]], left_out: dict[str, str] = KNOWN_PACKAGE_CYCLES) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        edges = packages.setdefault(package_of(module), set())
        if module not in left_out:
            edges.update(package_of(other) for other in imported)
    return {package: edges - {package} for package, edges in packages.items()}


def test_no_package_level_import_cycle():
    """A package reads, tests and changes alone only if no package it imports imports it back, however far round."""
    graph = module_graph()
    assert cycles(package_graph(graph)) == []
    still_needed = {module for module in KNOWN_PACKAGE_CYCLES
                    if cycles(package_graph(graph, {m: r for m, r in KNOWN_PACKAGE_CYCLES.items() if m != module}))}
    assert set(KNOWN_PACKAGE_CYCLES) - still_needed == set(), "no longer in a cycle: take them off the list"


def test_the_package_graph_sees_cycles_through_packages():
    graph = {"a.x": {"b.y"}, "b.y": {"a.z"}, "a.z": set()}
    assert cycles(package_graph(graph, {})) == [["a", "b"]]
    assert cycles(package_graph(graph, {"b.y": "left out"})) == []


# The core (the broker's services, the queues and their types, storage and routing) and what it may not import:
# the front ends (AMQP 0-9-1, AMQP 1.0, the stream protocol, what they share, the HTTP API, the node's programs) and the
# Spark bridge.
CORE_PACKAGES = ("amqp_server.broker", "amqp_server.queues", "amqp_server.queues.types", "msg_store", "queue_index",
                 "exchanges")
CORE_MODULES = {f"amqp_server.{name}" for name in (
    "queues.queue", "queues.queue_type", "queues.queue_args", "queues.ready", "queues.ready_list", "queues.paging",
    "queues.expiry", "queues.consumers", "queues.priority_queue", "queues.quorum_queue", "queues.stream_queue",
    "queues.persistence")}
NOT_FOR_THE_CORE = ("amqp_server.amqp091", "amqp_server.amqp1", "amqp_server.stream", "amqp_server.frontend",
                    "amqp_server.node", "mgmt_http", "amqp_server.spark_bridge")
# What the core still imports of them, each for a reason that names what removes it (checked to be still there).
KNOWN_CORE_IMPORTS: dict[tuple[str, str], str] = {}


def in_core(module: str) -> bool:
    return module in CORE_MODULES or any(module == p or module.startswith(p + ".") for p in CORE_PACKAGES)


def core_imports_of_front_ends(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(module, other) for module, imported in graph.items() if in_core(module) for other in imported
            if any(other == p or other.startswith(p + ".") for p in NOT_FOR_THE_CORE)}


def test_the_core_imports_no_front_end_and_not_the_spark_bridge():
    graph = module_graph()
    assert in_core("amqp_server.broker.queues") and in_core("msg_store.store")
    assert not in_core("amqp_server.amqp091.channel") and not in_core("amqp_server.frontend.front_end")
    assert core_imports_of_front_ends(graph) == set(KNOWN_CORE_IMPORTS)


def test_the_http_api_reads_connections_through_the_front_end_interface():
    """mgmt_http lists connections and channels as ``frontend.ListedConnection`` and ``ListedChannel``."""
    graph = module_graph()
    front_end = {"amqp_server.amqp091.connection", "amqp_server.amqp091.channel", "amqp_server.stream.reader"}
    assert {module: graph[module] & front_end for module in graph
            if module.startswith("mgmt_http") and graph[module] & front_end} == {}


# -- interfaces, not probes --------------------------------------------------------------------------------------

PROBED = ("queue", "connection", "consumer", "message", "confirm")  # (a confirm: the sink a publish's answer goes to)


def probes(tree: ast.AST) -> list[int]:
    """The lines that ask whether a queue, connection, consumer, message or confirm has an attribute (``hasattr``, or
    ``getattr`` with a default) instead of its interface saying so: the object is named for what it is (``queue``,
    ``self.consumer``, ``entry.message``) or is ``self`` in a class named so."""
    lines = []

    def visit(node: ast.AST, classes: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child, (*classes, child.name) if isinstance(child, ast.ClassDef) else classes)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2
                and (node.func.id == "hasattr" or node.func.id == "getattr" and len(node.args) == 3)):
            return
        target = node.args[0]
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        if name == "self" and classes:
            name = classes[-1]
        if any(kind in name.lower() for kind in PROBED):
            lines.append(node.lineno)

    visit(tree, ())
    return sorted(lines)


def test_no_probe_on_a_queue_connection_consumer_or_message():
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
            lines = probes(ast.parse(path.read_text()))
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_probe_finder_finds_probes():
    source = '''
getattr(queue, "node", None)
hasattr(entry.message, "bcc_keys")
getattr(self.connection, "protocol", "AMQP 0-9-1")
class StreamConnection:
    def f(self): return hasattr(self, "channels")
getattr(method, "multiple", False)
getattr(confirm, "moved", None)
getattr(queue, name)
class Other:
    def f(self): return hasattr(self, "x")
'''
    assert probes(ast.parse(source)) == [2, 3, 4, 6, 8]


def test_the_broker_is_a_facade_over_services_that_do_not_stack():
    """``Broker`` has no base; no service of the broker inherits another (each is handed what it depends on), and
    none declares what another provides (no ``NotImplementedError`` stub)."""
    classes = {}
    for path in sorted((ROOT / "amqp_server" / "broker").glob("*.py")):
        tree = ast.parse(path.read_text())
        classes.update({node.name: node for node in tree.body if isinstance(node, ast.ClassDef)})
        stubs = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc is not None
                 and "NotImplementedError" in ast.unparse(node.exc)]
        assert stubs == [], (path, stubs)
    assert classes["Broker"].bases == []
    services = {"Definitions", "Bindings", "Exchanges", "Router", "DeadLetters", "Messages", "Queues", "VHosts",
                "Recovery"}
    assert services <= set(classes)
    assert {name: [ast.unparse(base) for base in node.bases] for name, node in classes.items()
            if any(ast.unparse(base) in classes for base in node.bases)} == {}


def class_bases() -> dict[str, set[str]]:
    """Every class of the packages -> the names of its bases that are classes of the packages too (by name: two
    classes of one name count as one, the deeper)."""
    classes: dict[str, list[ast.ClassDef]] = {}
    for package in PACKAGES:
        for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, []).append(node)

    def name(base: ast.expr) -> str | None:
        base = base.value if isinstance(base, ast.Subscript) else base  # Generic[T], list[Any]
        return base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None

    return {cls: {base for node in nodes for base in map(name, node.bases) if base in classes and base != cls}
            for cls, nodes in classes.items()}


def chain_depth(bases: dict[str, set[str]], cls: str) -> int:
    """How many of the project's classes the longest chain from ``cls`` up through its bases holds."""
    return 1 + max((chain_depth(bases, base) for base in bases[cls]), default=0)


def test_no_class_chain_of_the_projects_own_classes_is_deeper_than_three():
    """A class reads with its base and that one's at most: deeper, a change reaches across files (a queue was a
    chain of eight mixins)."""
    bases = class_bases()
    assert bases["Queue"] == set()  # a queue holds its parts
    deep = {cls: chain_depth(bases, cls) for cls in bases if chain_depth(bases, cls) > 3}
    assert deep == {}


# The queue's classes and its components: their private attributes are theirs alone.
QUEUE_PARTS = {"Queue", "QuorumQueue", "StreamQueue", "RemoteQueue", "ReadyList", "PriorityReadyList",
               "PriorityReady", "Consumers", "Expiry", "RecordSource"}


def private_attributes_shared_across_files(parts: set[str] = QUEUE_PARTS) -> dict[str, list[str]]:
    """The private attributes (``_name``) that the queue's classes define, each with the files that use it, where
    used in more than one: read on another object (``queue._x``) anywhere, or on ``self`` in one of those
    classes (a subclass in another file reaching into its base's state)."""
    trees = {path: ast.parse(path.read_text()) for package in PACKAGES
             for path in (ROOT / package.replace(".", "/")).rglob("*.py")}
    defining = [(path, node) for path, tree in trees.items() for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef) and node.name in parts]

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    names = set()
    for _, cls in defining:
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(node.name):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and private(node.attr)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    inside = {id(node) for _, cls in defining for node in ast.walk(cls)}
    used: dict[str, set[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in names and (
                    not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) or id(node) in inside):
                used.setdefault(node.attr, set()).add(str(path.relative_to(ROOT)))
    return {name: sorted(files) for name, files in used.items() if len(files) > 1}


def test_no_private_attribute_of_the_queue_is_used_in_more_than_one_file():
    assert private_attributes_shared_across_files() == {}


# -- the queue as the one runtime seam ---------------------------------------------------------------------------

def ancestors(bases: dict[str, set[str]], cls: str) -> set[str]:
    return set().union(*({base} | ancestors(bases, base) for base in bases[cls]))


def test_a_queue_of_another_node_is_a_proxy_not_a_queue_of_this_node():
    """``RemoteQueue`` implements ``queue.AnyQueue`` and inherits nothing of the local queue, overriding nothing
    against its grain (no ``type: ignore[override]``)."""
    assert "Queue" not in ancestors(class_bases(), "RemoteQueue")
    assert "ignore[override]" not in (ROOT / "forwarder" / "peers" / "remote_queue.py").read_text()


def test_a_stream_is_a_queue_of_its_own_not_a_classic_queue():
    """``StreamQueue`` provides ``queue.LocalQueue`` itself, composing what it uses (its consumers, its stats), and
    inherits no ready list, expiry, paging or settling of the classic queue."""
    assert "Queue" not in ancestors(class_bases(), "StreamQueue")
    assert "ignore[override]" not in (ROOT / "amqp_server" / "queues" / "stream_queue.py").read_text()


def test_mypy_checks_every_kind_of_queue_against_the_protocol():
    """What makes mypy check it: the proxy assigned to ``type[AnyQueue]``, and each type's ``queue_class``
    declared as a ``type[LocalQueue]`` (a queue of this node: ``AnyQueue`` and what the node asks of such a
    queue), so that a type whose queue lacks an operation fails mypy."""
    declared: dict[str, set[str]] = {}
    for path in [ROOT / "forwarder" / "peers" / "remote_queue.py",
                 *sorted((ROOT / "amqp_server" / "queues" / "types").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and node.value:
                for protocol in ("AnyQueue", "LocalQueue"):
                    if f"type[{protocol}]" in ast.unparse(node.annotation):
                        declared.setdefault(protocol, set()).add(ast.unparse(node.value))
    assert declared == {"AnyQueue": {"RemoteQueue"}, "LocalQueue": {"Queue", "QuorumQueue", "StreamQueue"}}


# -- names -------------------------------------------------------------------------------------------------------

def modules_by_name() -> dict[str, list[str]]:
    """Every module name (a file's, without .py) -> the packages holding a module of that name."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
            found.setdefault(path.stem, []).append(".".join(path.relative_to(ROOT).parent.parts))
    return {name: sorted(set(packages)) for name, packages in found.items()}


# Names more than one package uses on purpose, each for one meaning.  mgmt_http/NAME.py is the HTTP API of the
# broker's service broker/NAME.py: that pair is allowed without a line here.
SHARED_NAMES = {
    "__init__": "a package", "__main__": "a package's program (python -m)",
    "connection": "a protocol's client connection (AMQP 0-9-1, AMQP 1.0)",
    "link": "a link of the shovel and federation kind (links/, federation/)",
    "manager": "what runs a component's objects on this node (shovels, federation links, streams)",
}


def test_amqp_server_holds_at_most_twenty_modules_directly():
    """The rest of the node is in packages named for their job (docs/architecture.md draws them)."""
    assert len(list((ROOT / "amqp_server").glob("*.py"))) <= 20


def test_no_module_name_is_reused_for_another_meaning():
    reused = {name: packages for name, packages in modules_by_name().items()
              if len(packages) > 1 and name not in SHARED_NAMES
              and set(packages) != {"amqp_server.broker", "mgmt_http"}}
    assert reused == {}
    assert set(SHARED_NAMES) <= {name for name, packages in modules_by_name().items() if len(packages) > 1}


def classes_by_name() -> dict[str, list[str]]:
    """Every class the packages define at a module's top level -> the modules defining a class of that name."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    return {name: sorted(set(paths)) for name, paths in found.items()}


def test_no_class_name_is_reused_for_another_meaning():
    """A reader who meets ``Session`` or ``Segment`` knows which one it is; a structural protocol of another
    module's class takes a name of its own too (what it needs of that class)."""
    assert {name: paths for name, paths in classes_by_name().items() if len(paths) > 1} == {}


def test_the_class_name_finder_sees_every_package():
    names = classes_by_name()
    assert names["PeerSession"] == ["forwarder/peers/owner_side.py"]
    assert names["Session"] == ["amqp_server/amqp1/session.py"]
    assert "StreamSegment" in names and "Segment" in names

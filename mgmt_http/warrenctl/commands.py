"""What each ``warrenctl`` command asks the management API, and what it prints.

Every command is ``(api, args, out) -> exit code``; failures raise ``CtlError`` (cli.main prints them).
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any, Callable

from . import values
from .client import ApiClient, ApiError, CtlError, path
from .render import Output

Command = Callable[[ApiClient, argparse.Namespace, Output], int]
DEFAULT_VHOST = "/"
DEFAULT_EXCHANGE_SEGMENT = "amq.default"  # the API's name for "" in paths
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


def vhost_of(args: argparse.Namespace) -> str:
    return args.vhost if getattr(args, "vhost", None) is not None else DEFAULT_VHOST


def _in(vhost: str) -> str:
    return f"in vhost '{vhost}'"


def _rows(data: Any) -> list[dict[str, Any]]:
    """A list answer as rows; a paged answer ({"items": [...]}) as its items."""
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        return data["items"]
    if isinstance(data, list):
        return [row for row in data if isinstance(row, dict)]
    raise CtlError(f"unexpected answer from the API: {json.dumps(data)[:200]}")


# -- status -----------------------------------------------------------------------------------

def status(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    overview = api.get(path("overview"))
    nodes = api.get(path("nodes"))
    health, healthy = _health(api)
    if out.as_json:
        out.json({"overview": overview, "nodes": nodes, "health": health})
        return 0 if healthy else 1
    totals = overview.get("object_totals") or {}
    queue_totals = overview.get("queue_totals") or {}
    out.pairs("Overview", [
        ("node", overview.get("node")),
        ("cluster", overview.get("cluster_name")),
        ("version", overview.get("rabbitmq_version") or overview.get("product_version")),
        ("management", overview.get("management_version")),
        *((name, totals.get(name)) for name in ("connections", "channels", "exchanges", "queues", "consumers")),
        ("messages", queue_totals.get("messages")),
        ("ready", queue_totals.get("messages_ready")),
        ("unacked", queue_totals.get("messages_unacknowledged")),
        ("listeners", ", ".join(f"{x.get('protocol')}:{x.get('port')}" for x in overview.get("listeners") or [])),
    ])
    for node in _rows(nodes):
        out.pairs(f"Node {node.get('name')}", [
            ("running", node.get("running")),
            ("uptime", _uptime(node.get("uptime"))),
            ("memory", _memory(node)),
            ("memory alarm", node.get("mem_alarm")),
            ("disk free", node.get("disk_free")),
            ("disk alarm", node.get("disk_free_alarm")),
            ("file descriptors", node.get("fd_used")),
        ])
    colour = "green" if healthy else "red"
    reason = health.get("reason") if isinstance(health, dict) else None
    out.out.print(f"health: [{colour}]{'ok' if healthy else 'failed'}[/{colour}]" + (f" ({reason})" if reason else ""))
    return 0 if healthy else 1


def _health(api: ApiClient) -> tuple[Any, bool]:
    try:
        health = api.get(path("healthchecks", "node"))
    except ApiError as exc:
        if exc.status in (401, 403, 404):
            raise
        return {"status": "failed", "reason": exc.reason}, False
    return health, isinstance(health, dict) and health.get("status") == "ok"


def _uptime(ms: Any) -> str:
    if not isinstance(ms, (int, float)):
        return ""
    seconds = int(ms) // 1000
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h {seconds % 3600 // 60}m {seconds % 60}s"


def _memory(node: dict[str, Any]) -> str:
    used, limit = node.get("mem_used"), node.get("mem_limit")
    if used is None:
        return ""
    return f"{used:,} of {limit:,} bytes" if isinstance(limit, int) else f"{used:,} bytes"


# -- list -------------------------------------------------------------------------------------

LISTABLE = ("queues", "exchanges", "bindings", "users", "vhosts", "permissions", "policies", "operator-policies",
            "connections", "channels", "consumers")
_GLOBAL = {"users", "vhosts"}  # not per vhost


def list_(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    kind: str = args.kind
    rows = _consumers(api) if kind == "consumers" else _rows(api.get(path(kind)))
    if args.vhost is not None and kind not in _GLOBAL:
        rows = [row for row in rows if _vhost_of_row(row) == args.vhost]
    out.table(kind, rows)
    return 0


def _vhost_of_row(row: dict[str, Any]) -> Any:
    if "vhost" in row:
        return row["vhost"]
    return (row.get("queue") or {}).get("vhost")


def _consumers(api: ApiClient) -> list[dict[str, Any]]:
    """/api/consumers; where that is missing, each busy queue's consumer_details."""
    try:
        return _rows(api.get(path("consumers")))
    except ApiError as exc:
        if exc.status != 404:
            raise
    rows: list[dict[str, Any]] = []
    for queue in _rows(api.get(path("queues"))):
        if queue.get("consumers"):
            detail = api.get(path("queues", queue["vhost"], queue["name"]))
            rows.extend(detail.get("consumer_details") or [])
    return rows


# -- declare ----------------------------------------------------------------------------------

def declare_queue(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    body = {"durable": args.durable, "auto_delete": args.auto_delete, "arguments": values.arguments(args.arg)}
    api.put(path("queues", vhost, args.name), body, not_found=f"no vhost '{vhost}'")
    out.ok(f"queue '{args.name}' declared {_in(vhost)}")
    return 0


def declare_exchange(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    body = {"type": args.type, "durable": args.durable, "auto_delete": args.auto_delete,
            "internal": args.internal, "arguments": values.arguments(args.arg)}
    api.put(path("exchanges", vhost, args.name), body, not_found=f"no vhost '{vhost}'")
    out.ok(f"exchange '{args.name}' ({args.type}) declared {_in(vhost)}")
    return 0


def _binding_path(args: argparse.Namespace, *more: str) -> str:
    kind = "q" if args.destination_type == "queue" else "e"
    return path("bindings", vhost_of(args), "e", args.source or DEFAULT_EXCHANGE_SEGMENT, kind, args.destination,
                *more)


def _binding_missing(args: argparse.Namespace) -> str:
    return (f"no exchange '{args.source}' or {args.destination_type} '{args.destination}' "
            f"{_in(vhost_of(args))}")


def declare_binding(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    body = {"routing_key": args.routing_key, "arguments": values.arguments(args.arg)}
    api.post(_binding_path(args), body, not_found=_binding_missing(args))
    out.ok(f"binding '{args.source}' -> {args.destination_type} '{args.destination}' "
           f"(routing key '{args.routing_key}') declared {_in(vhost_of(args))}")
    return 0


def declare_user(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    tags = ",".join(t.strip() for t in (args.tags or "").split(",") if t.strip())
    body: dict[str, Any] = {"tags": tags}
    if args.password_hash is not None:
        body["password_hash"] = args.password_hash
    else:
        body["password"] = args.new_password
    api.put(path("users", args.name), body)
    out.ok(f"user '{args.name}' declared" + (f" with tags {tags}" if tags else ""))
    return 0


def declare_vhost(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    body = {"description": args.description} if args.description else {}
    api.put(path("vhosts", args.name), body)
    out.ok(f"vhost '{args.name}' declared")
    return 0


def declare_permission(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    body = {"configure": args.configure, "write": args.write, "read": args.read}
    api.put(path("permissions", vhost, args.perm_user), body,
            not_found=f"no user '{args.perm_user}' or vhost '{vhost}'")
    out.ok(f"permissions of user '{args.perm_user}' {_in(vhost)} set: configure '{args.configure}', "
           f"write '{args.write}', read '{args.read}'")
    return 0


POLICY_KINDS = {"policy": "a policy", "operator-policy": "an operator policy"}
_POLICY_PATHS = {"policy": "policies", "operator-policy": "operator-policies"}


def declare_policy(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    body = {"pattern": args.pattern, "definition": args.definition, "priority": args.priority,
            "apply-to": args.apply_to}
    api.put(path(_POLICY_PATHS[args.kind], vhost, args.name), body, not_found=f"no vhost '{vhost}'")
    out.ok(f"{args.kind} '{args.name}' set {_in(vhost)}: pattern '{args.pattern}', "
           f"definition {json.dumps(args.definition)}, priority {args.priority}, apply-to {args.apply_to}")
    return 0


# -- delete -----------------------------------------------------------------------------------

def delete_queue(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    query = {"if-empty": "true" if args.if_empty else None, "if-unused": "true" if args.if_unused else None}
    api.delete(path("queues", vhost, args.name), not_found=f"no queue '{args.name}' {_in(vhost)}", query=query)
    out.ok(f"queue '{args.name}' deleted {_in(vhost)}")
    return 0


def delete_exchange(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    query = {"if-unused": "true" if args.if_unused else None}
    api.delete(path("exchanges", vhost, args.name), not_found=f"no exchange '{args.name}' {_in(vhost)}",
               query=query)
    out.ok(f"exchange '{args.name}' deleted {_in(vhost)}")
    return 0


def delete_binding(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    """Bindings are deleted by their properties key, found by listing the source/destination pair."""
    wanted_args = values.arguments(args.arg)
    existing = _rows(api.get(_binding_path(args), not_found=_binding_missing(args)))
    matches = [b for b in existing if b.get("routing_key", "") == args.routing_key
               and (not args.arg or (b.get("arguments") or {}) == wanted_args)]
    if not matches:
        raise ApiError(404, f"no binding from exchange '{args.source}' to {args.destination_type} "
                            f"'{args.destination}' with routing key '{args.routing_key}' {_in(vhost_of(args))}")
    for binding in matches:
        key = binding.get("properties_key") or _properties_key(args.routing_key)
        api.delete(_binding_path(args, key), not_found="binding vanished while deleting it")
    out.ok(f"binding '{args.source}' -> {args.destination_type} '{args.destination}' "
           f"(routing key '{args.routing_key}') deleted {_in(vhost_of(args))}")
    return 0


def _properties_key(routing_key: str) -> str:
    """RabbitMQ's key for a binding without arguments: the routing key, or '~' when it is empty."""
    return routing_key or "~"


def forget_node(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    api.delete(path("nodes", args.name), not_found=f"no other node '{args.name}' in the cluster")
    out.ok(f"node '{args.name}' forgotten")
    return 0


def add_member(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    api.post(path("queues", "quorum", vhost, args.queue, "replicas", "add"), {"node": args.node},
             not_found=f"no quorum queue '{args.queue}' {_in(vhost)}")
    out.ok(f"node '{args.node}' joins queue '{args.queue}' {_in(vhost)}")
    return 0


def delete_member(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    api.request("DELETE", path("queues", "quorum", vhost, args.queue, "replicas", "delete"), {"node": args.node},
                not_found=f"no quorum queue '{args.queue}' {_in(vhost)}")
    out.ok(f"node '{args.node}' leaves queue '{args.queue}' {_in(vhost)}")
    return 0


def grow(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    api.post(path("queues", "quorum", "replicas", "on", args.node, "grow"),
             {"strategy": args.strategy, "vhost_pattern": args.vhost_pattern, "queue_pattern": args.queue_pattern})
    out.ok(f"node '{args.node}' joins the {'matching' if args.strategy == 'all' else 'even-sized matching'} "
           "quorum queues")
    return 0


def delete_user(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    api.delete(path("users", args.name), not_found=f"no user '{args.name}'")
    out.ok(f"user '{args.name}' deleted")
    return 0


def delete_vhost(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    api.delete(path("vhosts", args.name), not_found=f"no vhost '{args.name}'")
    out.ok(f"vhost '{args.name}' deleted")
    return 0


def delete_permission(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    api.delete(path("permissions", vhost, args.perm_user),
               not_found=f"no permissions for user '{args.perm_user}' {_in(vhost)}")
    out.ok(f"permissions of user '{args.perm_user}' {_in(vhost)} cleared")
    return 0


def delete_policy(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    api.delete(path(_POLICY_PATHS[args.kind], vhost, args.name),
               not_found=f"no {args.kind} '{args.name}' {_in(vhost)}")
    out.ok(f"{args.kind} '{args.name}' cleared {_in(vhost)}")
    return 0


# -- messages ---------------------------------------------------------------------------------

def publish(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    try:
        props = values.properties(args.property, args.header, args.persistent)
    except ValueError as exc:
        raise CtlError(str(exc)) from None
    payload, encoding = _payload(args.body)
    body = {"properties": props, "routing_key": args.routing_key, "payload": payload,
            "payload_encoding": encoding}
    exchange = args.exchange or DEFAULT_EXCHANGE_SEGMENT
    result = api.post(path("exchanges", vhost, exchange, "publish"), body,
                      not_found=f"no exchange '{args.exchange}' {_in(vhost)}")
    routed = bool(result.get("routed")) if isinstance(result, dict) else True
    if out.as_json:
        out.json(result)
    elif routed:
        out.ok("message published")
    else:
        out.warn("message published but NOT routed")
    return 0


def _payload(body: str | None) -> tuple[str, str]:
    """The --body text, else stdin: as a string when it is UTF-8, else base64."""
    if body is not None:
        return body, "string"
    raw = sys.stdin.buffer.read()
    try:
        return raw.decode("utf-8"), "string"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode(), "base64"


def get(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    body = {"count": args.count, "ackmode": args.ackmode, "encoding": args.encoding, "truncate": args.truncate}
    messages = api.post(path("queues", vhost, args.queue, "get"), body,
                        not_found=f"no queue '{args.queue}' {_in(vhost)}")
    out.table("messages", _rows(messages))
    return 0


def peek(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    answer = api.get(path("queues", vhost, args.queue, "peek"), not_found=f"no queue '{args.queue}' {_in(vhost)}",
                     query={"offset": args.offset, "count": args.count})
    messages = answer.get("messages", answer) if isinstance(answer, dict) else answer
    out.table("peeked", _rows(messages), noun="messages")
    return 0


def purge(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    api.delete(path("queues", vhost, args.queue, "contents"), not_found=f"no queue '{args.queue}' {_in(vhost)}")
    out.ok(f"queue '{args.queue}' purged {_in(vhost)}")
    return 0


def move(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    vhost = vhost_of(args)
    body: dict[str, Any] = {"destination": args.to}
    if args.count is not None:
        body["count"] = args.count
    result = api.post(path("queues", vhost, args.queue, "move"), body,
                      not_found=f"no queue '{args.queue}' or '{args.to}' {_in(vhost)}")
    moved = result.get("moved") if isinstance(result, dict) else None
    count = f"{moved} message{'' if moved == 1 else 's'}" if moved is not None else "messages"
    out.ok(f"moved {count} from '{args.queue}' to '{args.to}' {_in(vhost)}", result)
    return 0


# -- definitions ------------------------------------------------------------------------------

def export(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    """Definitions, or with --queue/--all-queues messages to Parquet (:mod:`mgmt_http.warrenctl.export`)."""
    if args.queue or args.all_queues:
        if args.file == "-":
            raise CtlError("a Parquet export needs a directory, not '-'")
        from .export import export_queues  # imports rich.progress only; pyspark once it is needed

        return export_queues(api, args, out, vhost_of(args))
    if args.drain:
        raise CtlError("--drain needs --queue or --all-queues")
    definitions = api.get(path("definitions"))
    text = json.dumps(definitions, indent=2, sort_keys=True) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(args.file).write_text(text)
    except OSError as exc:
        raise CtlError(f"cannot write {args.file}: {exc.strerror or exc}") from None
    counts = ", ".join(f"{len(definitions.get(k) or [])} {k}" for k in
                       ("users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings"))
    out.ok(f"definitions exported to {args.file} ({counts})")
    return 0


def import_(api: ApiClient, args: argparse.Namespace, out: Output) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as exc:
        raise CtlError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    try:
        definitions = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{args.file} is not JSON: {exc}") from None
    if not isinstance(definitions, dict):
        raise CtlError(f"{args.file} is not a definitions object")
    api.post(path("definitions"), definitions)
    out.ok(f"definitions imported from {args.file}")
    return 0

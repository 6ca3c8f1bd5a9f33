"""``warrenctl``: manage a Warren node over its management HTTP API, like rabbitmqadmin.

Connection: --host/--port/--user/--password, else WARREN_MGMT_URL (``http://[user:pass@]host:port``),
WARREN_USER, WARREN_PASSWORD, else 127.0.0.1:15672 as guest/guest.

Exit codes: 0 done; 1 the API refused or failed (one line on stderr: ``warrenctl: 404 Not Found: ...``);
2 bad command line; 3 the API could not be reached.
"""
from __future__ import annotations

import argparse
import os
import urllib.parse
from typing import Mapping, Sequence

from . import commands
from . import values
from .client import ApiClient, CtlError
from .render import Output

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 15672
DEFAULT_USER = "guest"
EXIT_USAGE = 2


# -- the command line -------------------------------------------------------------------------

def _common() -> argparse.ArgumentParser:
    """Options every subcommand also accepts after its name (``list queues --json --vhost v``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--vhost", default=argparse.SUPPRESS, help="virtual host (default /)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print raw JSON")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warrenctl", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--host", help=f"management API host (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, help=f"management API port (default {DEFAULT_PORT})")
    parser.add_argument("--user", "-u", help="user name (default guest, or $WARREN_USER)")
    parser.add_argument("--password", "-p", help="password (default guest, or $WARREN_PASSWORD)")
    parser.add_argument("--vhost", default=None, help="virtual host (default /)")
    parser.add_argument("--json", action="store_true", default=False, help="print raw JSON")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the API")
    common = _common()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _cmd(sub, common, "status", commands.status, "overview and node health")
    _cmd(sub, common, "forget-node", commands.forget_node,
         "remove a stopped node from the cluster, with its queues").add_argument("name")
    _add_quorum(sub, common)
    listing = _cmd(sub, common, "list", commands.list_, "list objects")
    listing.add_argument("kind", choices=commands.LISTABLE)

    _add_declare(sub, common)
    _add_delete(sub, common)
    _add_messages(sub, common)

    exporting = _cmd(sub, common, "export", commands.export,
                     "save definitions to FILE ('-': stdout); with --queue/--all-queues, queues to Parquet "
                     "under the directory FILE (needs pyspark and Java)")
    exporting.add_argument("file", metavar="FILE")
    exporting.add_argument("--queue", action="append", default=[], help="a queue to write (repeatable)")
    exporting.add_argument("--all-queues", action="store_true", help="every queue of the vhost")
    exporting.add_argument("--drain", action="store_true",
                           help="remove what was written, once it is on disk (default: leave the queues alone)")
    exporting.add_argument("--partition-size", type=int, metavar="N",
                           help="messages per Spark partition (default: the data source's, 250000)")
    importing = _cmd(sub, common, "import", commands.import_, "load definitions from FILE ('-': stdin)")
    importing.add_argument("file", metavar="FILE")
    return parser


def _cmd(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, name: str,
         handler: commands.Command, help_text: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
    parser.set_defaults(handler=handler)
    return parser


def _group(sub: argparse._SubParsersAction, name: str, help_text: str, alias: str) -> argparse._SubParsersAction:
    parser = sub.add_parser(name, aliases=[alias], help=help_text, description=help_text)
    return parser.add_subparsers(dest="kind", required=True, metavar="KIND")


def _kv(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    parser.add_argument(flag, action="append", type=values.pair, metavar="K=V", help=help_text)


def _binding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, help="source exchange")
    parser.add_argument("--destination", required=True, help="destination queue or exchange")
    parser.add_argument("--destination-type", choices=("queue", "exchange"), default="queue")
    parser.add_argument("--routing-key", default="")
    _kv(parser, "--arg", "binding argument (repeatable)")


def _add_declare(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    kinds = _group(sub, "declare", "create or update an object (alias: set)", "set")
    queue = _cmd(kinds, common, "queue", commands.declare_queue, "declare a queue")
    queue.add_argument("name")
    queue.add_argument("--durable", action=argparse.BooleanOptionalAction, default=False)
    queue.add_argument("--auto-delete", action=argparse.BooleanOptionalAction, default=False)
    _kv(queue, "--arg", "queue argument, e.g. x-max-length=10 (repeatable)")

    exchange = _cmd(kinds, common, "exchange", commands.declare_exchange, "declare an exchange")
    exchange.add_argument("name")
    exchange.add_argument("--type", required=True, help="direct, fanout, topic, headers, ...")
    exchange.add_argument("--durable", action=argparse.BooleanOptionalAction, default=False)
    exchange.add_argument("--auto-delete", action=argparse.BooleanOptionalAction, default=False)
    exchange.add_argument("--internal", action=argparse.BooleanOptionalAction, default=False)
    _kv(exchange, "--arg", "exchange argument, e.g. alternate-exchange=ae (repeatable)")

    _binding_options(_cmd(kinds, common, "binding", commands.declare_binding, "bind a queue or exchange"))

    user = _cmd(kinds, common, "user", commands.declare_user, "create or update a user")
    user.add_argument("name")
    secret = user.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password", dest="new_password")
    secret.add_argument("--password-hash", help="an already hashed password (as in definitions)")
    user.add_argument("--tags", default="", help="comma-separated, e.g. administrator,monitoring")

    vhost = _cmd(kinds, common, "vhost", commands.declare_vhost, "create a virtual host")
    vhost.add_argument("name")
    vhost.add_argument("--description", default="")

    permission = _cmd(kinds, common, "permission", commands.declare_permission, "set a user's permissions")
    permission.add_argument("--user", dest="perm_user", required=True)
    for kind in ("configure", "write", "read"):
        permission.add_argument(f"--{kind}", required=True, metavar="REGEX")

    for kind, what in commands.POLICY_KINDS.items():
        policy = _cmd(kinds, common, kind, commands.declare_policy, f"set {what}")
        policy.add_argument("name")
        policy.add_argument("--pattern", required=True, metavar="REGEX", help="queue / exchange names it applies to")
        policy.add_argument("--definition", required=True, type=values.json_object, metavar="JSON",
                            help="""e.g. '{"max-length": 10}'""")
        policy.add_argument("--priority", type=int, default=0)
        policy.add_argument("--apply-to", default="all", choices=("all", "queues", "exchanges", "classic_queues",
                                                                   "quorum_queues", "streams"))


def _add_delete(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    kinds = _group(sub, "delete", "delete an object (alias: clear)", "clear")
    queue = _cmd(kinds, common, "queue", commands.delete_queue, "delete a queue")
    queue.add_argument("name")
    queue.add_argument("--if-empty", action="store_true")
    queue.add_argument("--if-unused", action="store_true")
    exchange = _cmd(kinds, common, "exchange", commands.delete_exchange, "delete an exchange")
    exchange.add_argument("name")
    exchange.add_argument("--if-unused", action="store_true")
    _binding_options(_cmd(kinds, common, "binding", commands.delete_binding, "delete a binding"))
    _cmd(kinds, common, "user", commands.delete_user, "delete a user").add_argument("name")
    _cmd(kinds, common, "vhost", commands.delete_vhost, "delete a virtual host").add_argument("name")
    permission = _cmd(kinds, common, "permission", commands.delete_permission, "clear a user's permissions")
    permission.add_argument("--user", dest="perm_user", required=True)
    for kind, what in commands.POLICY_KINDS.items():
        _cmd(kinds, common, kind, commands.delete_policy, f"clear {what}").add_argument("name")


def _add_quorum(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    kinds = _group(sub, "quorum", "change the members of quorum queues (cluster mode)", "qq")
    for name, handler, what in (("add-member", commands.add_member, "a node takes a copy of a queue"),
                                ("delete-member", commands.delete_member, "a node drops its copy of a queue")):
        member = _cmd(kinds, common, name, handler, what)
        member.add_argument("queue")
        member.add_argument("node")
    grow = _cmd(kinds, common, "grow", commands.grow, "a node joins every matching quorum queue")
    grow.add_argument("node")
    grow.add_argument("--strategy", choices=("all", "even"), default="all",
                      help="all queues, or those with an even number of members (default: all)")
    grow.add_argument("--vhost-pattern", default=".*", metavar="REGEX")
    grow.add_argument("--queue-pattern", default=".*", metavar="REGEX")


def _add_messages(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    pub = _cmd(sub, common, "publish", commands.publish, "publish a message (body from stdin without --body)")
    pub.add_argument("--exchange", default="", help="exchange (default: the default exchange)")
    pub.add_argument("--routing-key", default="")
    pub.add_argument("--body", help="message body; read from stdin when omitted")
    _kv(pub, "--property", "message property, e.g. content_type=text/plain, delivery_mode=2 (repeatable)")
    _kv(pub, "--header", "message header (repeatable)")
    pub.add_argument("--persistent", action="store_true", help="delivery_mode=2")

    get = _cmd(sub, common, "get", commands.get, "get messages from a queue")
    get.add_argument("--queue", required=True)
    get.add_argument("--count", type=int, default=1)
    get.add_argument("--ackmode", choices=commands.ACKMODES, default="ack_requeue_true",
                     help="default ack_requeue_true: the messages stay in the queue")
    get.add_argument("--encoding", choices=("auto", "base64"), default="auto")
    get.add_argument("--truncate", type=int, default=None, help="truncate payloads to this many bytes")

    peek = _cmd(sub, common, "peek", commands.peek, "show messages without taking them")
    peek.add_argument("--queue", required=True)
    peek.add_argument("--offset", type=int, default=0)
    peek.add_argument("--count", type=int, default=10)

    purge = _cmd(sub, common, "purge", commands.purge, "remove every ready message from a queue")
    purge.add_argument("--queue", required=True)

    move = _cmd(sub, common, "move", commands.move, "move messages to another queue")
    move.add_argument("--queue", required=True)
    move.add_argument("--to", required=True, help="destination queue")
    move.add_argument("--count", type=int, default=None, help="how many (default all)")


# -- where to connect -------------------------------------------------------------------------

def base_url(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, str, str]:
    """(URL, user, password): the command line beats the environment beats the defaults."""
    parsed = urllib.parse.urlsplit(env.get("WARREN_MGMT_URL", "").strip() or f"http://{DEFAULT_HOST}")
    scheme = parsed.scheme or "http"
    host = args.host or parsed.hostname or DEFAULT_HOST
    port = args.port or parsed.port or DEFAULT_PORT
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    prefix = parsed.path.rstrip("/")
    if prefix.endswith("/api"):
        prefix = prefix[: -len("/api")]
    user = args.user or env.get("WARREN_USER") or urllib.parse.unquote(parsed.username or "") or DEFAULT_USER
    password = args.password if args.password is not None else (
        env.get("WARREN_PASSWORD") or urllib.parse.unquote(parsed.password or "") or DEFAULT_USER)
    return f"{scheme}://{host}:{port}{prefix}", user, password


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url, user, password = base_url(args, os.environ if env is None else env)
    out = Output(as_json=args.json)
    api = ApiClient(url, user, password, timeout=args.timeout)
    try:
        return args.handler(api, args, out)
    except CtlError as exc:
        out.error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130
    except BrokenPipeError:
        return 0

"""``warren-admin``: users, vhosts and permissions, written straight to a node's definition store.

LMDB allows this while the node runs; logins read users and permissions from
the store, so a change applies to the next connection.  delete-vhost deletes
every definition the vhost had (``broker.vhosts.forget_vhost``, as the HTTP API's
deletion does); a running node keeps what it holds in memory until it restarts.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..access_control import AccessControl, Permissions
from ..broker.vhosts import forget_vhost
from ..definition_store import DefinitionStore
from ..queues.policy import Policies


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warren-admin", description="Manage Warren users, vhosts, permissions")
    parser.add_argument("--data-dir", default="warren-data", help="the node's data directory")
    sub = parser.add_subparsers(dest="command", required=True)
    add_user = sub.add_parser("add-user")
    add_user.add_argument("name")
    add_user.add_argument("password")
    add_user.add_argument("--tags", default="", help="comma-separated: administrator, monitoring, ...")
    sub.add_parser("delete-user").add_argument("name")
    sub.add_parser("list-users")
    sub.add_parser("add-vhost").add_argument("name")
    sub.add_parser("delete-vhost").add_argument("name")
    sub.add_parser("list-vhosts")
    perms = sub.add_parser("set-permissions")
    for name in ("vhost", "user", "configure", "write", "read"):
        perms.add_argument(name)
    clear = sub.add_parser("clear-permissions")
    clear.add_argument("vhost")
    clear.add_argument("user")
    args = parser.parse_args(argv)

    store = DefinitionStore(args.data_dir)
    access = AccessControl(store)
    access.bootstrap()
    try:
        if args.command == "add-user":
            access.add_user(args.name, args.password, [t for t in args.tags.split(",") if t])
        elif args.command == "delete-user":
            if not access.delete_user(args.name):
                return _fail(f"no such user: {args.name}")
        elif args.command == "list-users":
            for user in access.users():
                print(f"{user.name}\t[{', '.join(user.tags)}]")
        elif args.command == "add-vhost":
            access.add_vhost(args.name)
        elif args.command == "delete-vhost":
            if not forget_vhost(store, access, Policies(store), args.name):
                return _fail(f"no such vhost: {args.name}")
        elif args.command == "list-vhosts":
            for name in access.vhosts():
                print(name)
        elif args.command == "set-permissions":
            if not access.vhost_exists(args.vhost):
                return _fail(f"no such vhost: {args.vhost}")
            if access.user(args.user) is None:
                return _fail(f"no such user: {args.user}")
            access.set_permissions(args.vhost, args.user, Permissions(args.configure, args.write, args.read))
        elif args.command == "clear-permissions":
            if not access.clear_permissions(args.vhost, args.user):
                return _fail(f"no permissions for {args.user} on {args.vhost}")
    finally:
        store.close()
    return 0


def _fail(reason: str) -> int:
    print(f"warren-admin: {reason}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

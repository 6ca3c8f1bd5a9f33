"""Users, password hashes, vhost permissions: RabbitMQ's internal access control.

Passwords are stored as RabbitMQ stores them (``rabbit_password_hashing_sha256``:
base64 of a 4-byte salt followed by SHA-256(salt + password)), so hashes from
a RabbitMQ definitions export are accepted as they are; so are its SHA-512 and
MD5 (pre-3.6) hashes, each checked with the algorithm its user record names.  Permissions are three
regular expressions (configure, write, read) matched anywhere in the resource
name, as RabbitMQ's ``re:run`` does; the empty string means ``^$``.  Topic permissions
(RabbitMQ's topic authorisation) add, per topic exchange, a write and a read pattern for
the routing keys published to it and bound with on it.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from . import patterns
from .definition_store import DefinitionStore
from .errors import ACCESS_REFUSED, ChannelError, resource_name

DEFAULT_USER = "guest"
DEFAULT_HASHING = "rabbit_password_hashing_sha256"
HASHING_ALGORITHMS = {DEFAULT_HASHING: hashlib.sha256, "rabbit_password_hashing_sha512": hashlib.sha512,
                      "rabbit_password_hashing_md5": hashlib.md5}
# Tags the management plugin knows, as RabbitMQ defines them.
DIRECT_PREFIX = "\x01warren-direct\x01"  # a password that begins so is checked by direct_login only
MANAGEMENT_TAGS = ("administrator", "monitoring", "policymaker", "management")


def loopback_refused(user: User | None, host: str | None, loopback_users_only: bool) -> bool:
    """RabbitMQ's ``loopback_users``: the default user (guest) logs in from loopback only, unless the node allows it
    from anywhere (``loopback_users_only`` off).  True if ``user`` (authenticated) may not log in from ``host`` (the
    peer's address, an IPv6 one with or without its zone); every front end (AMQP, the stream protocol, HTTP) asks
    here."""
    return user is not None and user.name == DEFAULT_USER and loopback_users_only and not _is_loopback(host)


def _is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def hash_password(password: str, salt: bytes | None = None, algorithm: str = DEFAULT_HASHING) -> str:
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + HASHING_ALGORITHMS[algorithm](salt + password.encode()).digest()).decode()


def check_password(password: str, password_hash: str, algorithm: str = DEFAULT_HASHING) -> bool:
    """False for an empty hash: RabbitMQ's passwordless users cannot log in with a password."""
    try:
        raw = base64.b64decode(password_hash)
    except ValueError:
        return False
    return len(raw) > 4 and hmac.compare_digest(hash_password(password, raw[:4], algorithm), password_hash)


def _matches(pattern: str, name: str) -> bool:
    """RabbitMQ's permission match: searched anywhere in the name; the empty pattern means ``^$``; a pattern that
    does not compile (a name expanded into it made it invalid) matches nothing."""
    try:
        compiled = patterns.compile(pattern or "^$")
    except patterns.Error:
        return False
    return patterns.search(compiled, name)


@dataclass(frozen=True)
class Permissions:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    def allows(self, kind: str, name: str) -> bool:
        """``kind`` is configure, write or read; the default exchange is named amq.default."""
        return _matches(getattr(self, kind), name or "amq.default")


def check_permission(permissions: "Permissions | None", user: str, vhost: str, kind: str, resource: str,
                     name: str, class_id: int = 0, method_id: int = 0) -> None:
    """403 ACCESS_REFUSED unless ``permissions`` allow ``kind`` (configure/write/read) on the resource.

    The one permission check: AMQP channels and the HTTP API both call it.
    """
    if permissions is None or not permissions.allows(kind, name):
        raise ChannelError(ACCESS_REFUSED,
                           f"access to {resource_name(resource, name or 'amq.default', vhost)}"
                           f" refused for user '{user}'", class_id, method_id)


@dataclass(frozen=True)
class TopicPermission:
    """The routing keys a user may publish with (write) and bind with (read) on one topic exchange."""
    exchange: str
    write: str = ".*"
    read: str = ".*"


@dataclass(eq=False)
class Principal:
    """Whom a broker operation is done for: a user and its permissions in the operation's vhost.

    Broker operations take one and check it themselves, so AMQP, HTTP and the cluster cannot differ.  The
    permissions and ``topics`` (its topic permissions there, by exchange name) of one ``AccessControl.principal``
    are live: changed in place when an administrator changes them, as RabbitMQ reads them at each check (its
    channel's cache of the last few resources aside), so that a connection already open is held to the new ones.
    """
    name: str
    permissions: Permissions | None
    topics: Mapping[str, TopicPermission] = field(default_factory=dict)

    def check(self, kind: str, resource: str, vhost: str, name: str) -> None:
        if self.permissions is None or not self.permissions.allows(kind, name):
            check_permission(self.permissions, self.name, vhost, kind, resource, name)

    def check_topic(self, kind: str, vhost: str, exchange: str, routing_key: str) -> None:
        """403 unless the topic permission for ``exchange`` (if there is one) lets ``kind`` (write or read) use
        ``routing_key``; ``{username}`` and ``{vhost}`` in its pattern stand for those names, as in RabbitMQ.
        Only topic exchanges are checked: the caller knows the exchange's type."""
        rule = self.topics.get(exchange)
        if rule is None:
            return
        pattern = getattr(rule, kind).replace("{username}", self.name).replace("{vhost}", vhost)
        if not _matches(pattern, routing_key):
            raise ChannelError(ACCESS_REFUSED, f"access to topic '{routing_key}' in exchange '{exchange}' in vhost "
                                               f"'{vhost}' refused for user '{self.name}'")


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    hashing_algorithm: str = DEFAULT_HASHING

    def to_record(self) -> dict:
        return {"password_hash": self.password_hash, "tags": self.tags, "hashing_algorithm": self.hashing_algorithm}

    @classmethod
    def from_record(cls, name: str, record: dict) -> "User":
        return cls(name, record["password_hash"], list(record.get("tags", [])),
                   record.get("hashing_algorithm", DEFAULT_HASHING))


@dataclass
class AuthAttempts:
    """Logins tried on this node, by protocol (``amqp091``, ``http``): RabbitMQ's auth attempt metrics."""

    counts: dict[str, list[int]] = field(default_factory=dict)  # protocol -> [succeeded, failed]

    def record(self, protocol: str, succeeded: bool) -> None:
        self.counts.setdefault(protocol, [0, 0])[0 if succeeded else 1] += 1

    def reset(self) -> None:
        """Forget every count (rabbit_core_metrics:reset_auth_attempt_metrics)."""
        self.counts.clear()


class DefinitionListener(Protocol):
    """Told of every definition written (cluster mode: it becomes the cluster's)."""

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None: ...

    def undefined(self, kind: str, key: str) -> None: ...


class AccessControl:
    """Reads and writes the node-wide definitions in the definition store: users, vhosts, permissions, topic
    permissions, limits and global parameters."""

    def __init__(self, store: DefinitionStore) -> None:
        self.store = store
        self.listener: DefinitionListener | None = None
        self.direct_secret = DIRECT_PREFIX + secrets.token_urlsafe(32)  # see direct_login
        # (vhost, user) -> its topic permissions by exchange: one dict per pair, shared by its principals and
        # changed in place, so that a change applies to connections already open
        self._topics: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        # a permission's key -> the principal of that user in that vhost, shared by its connections (``principal``)
        self._principals: dict[str, Principal] = {}

    def _put(self, kind: str, key: str, record: dict[str, Any]) -> None:
        self.store.put(kind, key, record)
        if kind == "permission" and key in self._principals:
            self._principals[key].permissions = Permissions(record["configure"], record["write"], record["read"])
        if self.listener is not None:
            self.listener.defined(kind, key, record)

    def _delete(self, kind: str, key: str) -> bool:
        found = self.store.delete(kind, key)
        if kind == "permission" and key in self._principals:
            self._principals[key].permissions = None  # (kept: given again, they are its connections' again)
        if self.listener is not None:
            self.listener.undefined(kind, key)
        return found

    def bootstrap(self) -> None:
        """A fresh data directory gets guest/guest with full rights on vhost /, like RabbitMQ."""
        if next(self.store.items("user"), None) is None and next(self.store.items("vhost"), None) is None:
            self.add_vhost("/")
            self.add_user(DEFAULT_USER, DEFAULT_USER, ["administrator"])
            self.set_permissions("/", DEFAULT_USER, Permissions())

    def user(self, name: str) -> User | None:
        record = self.store.get("user", name)
        return None if record is None else User.from_record(name, record)

    def users(self) -> list[User]:
        return [User.from_record(name, record) for name, record in self.store.items("user")]

    def add_user(self, name: str, password: str, tags: list[str] | None = None) -> User:
        user = User(name, hash_password(password), tags or [])
        self._put("user", name, user.to_record())
        return user

    def put_user(self, user: User) -> None:
        """Create or replace a user with an already hashed password (definitions import, HTTP API)."""
        self._put("user", user.name, user.to_record())

    def delete_user(self, name: str) -> bool:
        for key, record in list(self.store.items("permission")):
            if record["user"] == name:
                self._delete("permission", key)
        for record in self.all_topic_permissions():
            if record["user"] == name:
                self.clear_topic_permission(record["vhost"], name, record["exchange"])
        self.set_limits("user_limits", name, {})
        return self._delete("user", name)

    def authenticate(self, name: str, password: str, direct_from: str | None = None) -> User | None:
        """The user, if the password is right; an empty password never logs in (RabbitMQ: "empty password").
        ``direct_from``: the peer's address on an AMQP 0-9-1 login without TLS, the one way this node's own links
        come in; only there, from loopback, is the node's direct secret a password (see direct_login)."""
        if not password:
            return None
        if password.startswith(DIRECT_PREFIX):
            return self.direct_login(name, password) if direct_from is not None and _is_loopback(direct_from) \
                else None
        user = self.user(name)
        if user is None or not check_password(password, user.password_hash, user.hashing_algorithm):
            return None
        return user

    def vhosts(self) -> list[str]:
        return [record["name"] for _, record in self.store.items("vhost")]

    def vhost_exists(self, name: str) -> bool:
        return self.store.get("vhost", vhost_key(name)) is not None

    def add_vhost(self, name: str, **metadata: Any) -> None:
        """Create a vhost, or change its metadata (``description``, ``tags``, ``default_queue_type``: what is
        given replaces what it had, the rest stays)."""
        record = self.store.get("vhost", vhost_key(name)) or {"name": name}
        record.update({key: value for key, value in metadata.items() if key in VHOST_METADATA})
        self._put("vhost", vhost_key(name), record)

    def vhost_metadata(self, name: str) -> dict[str, Any]:
        """``description``, ``tags`` and, if set, ``default_queue_type`` (RabbitMQ's vhost metadata)."""
        record = self.store.get("vhost", vhost_key(name)) or {}
        metadata = {"description": record.get("description", ""), "tags": list(record.get("tags", []))}
        if record.get("default_queue_type"):
            metadata["default_queue_type"] = record["default_queue_type"]
        return metadata

    def delete_vhost(self, name: str) -> bool:
        for key, record in list(self.store.items("permission")):
            if record["vhost"] == name:
                self._delete("permission", key)
        for record in self.all_topic_permissions():
            if record["vhost"] == name:
                self.clear_topic_permission(name, record["user"], record["exchange"])
        self.set_limits("vhost_limits", name, {})
        for record in self.parameters():
            if record["vhost"] == name:
                self.clear_parameter(name, record["component"], record["name"])
        for key, record in list(self.store.items("federation_suffix")):
            if record["vhost"] == name:
                self._delete("federation_suffix", key)
        return self._delete("vhost", vhost_key(name))

    def permissions(self, vhost: str, user: str) -> Permissions | None:
        record = self.store.get("permission", f"{vhost_key(vhost)}/{user}")
        if record is None:
            return None
        return Permissions(record["configure"], record["write"], record["read"])

    def set_permissions(self, vhost: str, user: str, perms: Permissions) -> None:
        self._put("permission", f"{vhost_key(vhost)}/{user}",
                       {"vhost": vhost, "user": user, "configure": perms.configure,
                        "write": perms.write, "read": perms.read})

    def clear_permissions(self, vhost: str, user: str) -> bool:
        return self._delete("permission", f"{vhost_key(vhost)}/{user}")

    # -- limits (checked by limits.Limits) -----------------------------------------------------

    def vhost_limits(self, vhost: str) -> dict[str, int]:
        """The vhost's ``max-connections`` and ``max-queues``, those that are set."""
        return self._limits("vhost_limits", vhost_key(vhost))

    def user_limits(self, user: str) -> dict[str, int]:
        """The user's ``max-connections`` and ``max-channels``, those that are set."""
        return self._limits("user_limits", vhost_key(user))

    def all_limits(self, kind: str) -> list[dict[str, Any]]:
        """``vhost_limits`` or ``user_limits``: records of ``vhost`` (or ``user``) and ``value``."""
        return self.store.records(kind)

    def set_limits(self, kind: str, name: str, value: dict[str, int]) -> None:
        """Replace the limits of vhost or user ``name`` (``kind`` as for ``all_limits``); none left clears them."""
        key = vhost_key(name)
        if value:
            self._put(kind, key, {"vhost" if kind == "vhost_limits" else "user": name, "value": value})
        elif self.store.get(kind, key) is not None:
            self._delete(kind, key)

    def _limits(self, kind: str, key: str) -> dict[str, int]:
        record = self.store.get(kind, key)
        return {} if record is None else record["value"]

    # -- global parameters (RabbitMQ's global runtime parameters: any JSON value by name) ------------

    def global_parameters(self) -> list[dict[str, Any]]:
        return self.store.records("global_parameter")

    def global_parameter(self, name: str) -> dict[str, Any] | None:
        return self.store.get("global_parameter", vhost_key(name))

    def set_global_parameter(self, name: str, value: Any) -> None:
        self._put("global_parameter", vhost_key(name), {"name": name, "value": value})

    def clear_global_parameter(self, name: str) -> bool:
        return self._delete("global_parameter", vhost_key(name))

    # -- runtime parameters (RabbitMQ's per-vhost ones by component: shovels) -------------------

    def parameters(self) -> list[dict[str, Any]]:
        """Each as {vhost, component, name, value, user}: ``user`` set it (what a shovel's ``amqp://`` acts as)."""
        return self.store.records("parameter")

    def parameter(self, vhost: str, component: str, name: str) -> dict[str, Any] | None:
        return self.store.get("parameter", _parameter_key(vhost, component, name))

    def set_parameter(self, vhost: str, component: str, name: str, value: Any, user: str) -> None:
        self._put("parameter", _parameter_key(vhost, component, name),
                  {"vhost": vhost, "component": component, "name": name, "value": value, "user": user})

    def clear_parameter(self, vhost: str, component: str, name: str) -> bool:
        return self._delete("parameter", _parameter_key(vhost, component, name))

    # -- federation: the upstream exchange each exchange link uses (RabbitMQ's rabbit_federation_db, kept in the
    # federated exchange's scratch space) -------------------------------------------------------------------------

    def federation_suffix(self, vhost: str, exchange: str, upstream: str, upstream_exchange: str) -> str | None:
        """The suffix ("A" or "B") of the upstream exchange the link of federated ``exchange`` and ``upstream`` (whose
        exchange is ``upstream_exchange``) bound last, None if none (get_active_suffix)."""
        record = self.store.get("federation_suffix", _suffix_key(vhost, exchange, upstream, upstream_exchange))
        return None if record is None else record["suffix"]

    def set_federation_suffix(self, vhost: str, exchange: str, upstream: str, upstream_exchange: str,
                              suffix: str | None) -> None:
        """Keep ``suffix`` as the link's (set_active_suffix); None forgets it (prune_scratch)."""
        key = _suffix_key(vhost, exchange, upstream, upstream_exchange)
        if suffix is not None:
            self._put("federation_suffix", key, {"vhost": vhost, "exchange": exchange, "upstream": upstream,
                                                 "upstream_exchange": upstream_exchange, "suffix": suffix})
        elif self.store.get("federation_suffix", key) is not None:
            self._delete("federation_suffix", key)

    def direct_login(self, name: str, secret: str) -> User | None:
        """A connection this node made to itself for a user (a shovel's ``amqp://``, RabbitMQ's direct connection,
        which checks no password): it proves itself with this process's secret, which never leaves it."""
        if not hmac.compare_digest(secret.encode(), self.direct_secret.encode()):
            return None
        return self.user(name)

    def cluster_name(self, default: str) -> str:
        """The ``cluster_name`` global parameter (what RabbitMQ's UI and connection.start show), else ``default``."""
        record = self.global_parameter("cluster_name")
        return record["value"] if record is not None and isinstance(record["value"], str) else default

    def principal(self, vhost: str, user: str) -> Principal:
        """``user`` with its permissions and topic permissions in ``vhost``: what its operations there check, kept
        up to date (``Principal``) while the permissions are there."""
        key = f"{vhost_key(vhost)}/{user}"
        permissions = self.permissions(vhost, user)  # (read again: warren-admin writes the store from outside)
        found = self._principals.get(key)
        if found is not None:
            found.permissions = permissions
            return found
        principal = Principal(user, permissions, self.topic_permissions(vhost, user))
        if permissions is not None:  # (one without any is refused; one made later is asked for anew)
            self._principals[key] = principal
        return principal

    def topic_permissions(self, vhost: str, user: str) -> dict[str, TopicPermission]:
        """A user's topic permissions in a vhost, by exchange (the live view: callers must not change it)."""
        rules = self._topics.get((vhost, user))
        if rules is None:
            rules = self._topics[(vhost, user)] = {
                record["exchange"]: _topic(record) for record in self.all_topic_permissions()
                if record["vhost"] == vhost and record["user"] == user}
        return rules

    def all_topic_permissions(self) -> list[dict[str, Any]]:
        """Every topic permission's record: vhost, user, exchange, write, read."""
        return self.store.records("topic_permission")

    def set_topic_permission(self, vhost: str, user: str, rule: TopicPermission) -> None:
        self._put("topic_permission", _topic_key(vhost, user, rule.exchange),
                  {"vhost": vhost, "user": user, "exchange": rule.exchange, "write": rule.write, "read": rule.read})
        if (vhost, user) in self._topics:
            self._topics[(vhost, user)][rule.exchange] = rule

    def clear_topic_permission(self, vhost: str, user: str, exchange: str) -> bool:
        if (vhost, user) in self._topics:
            self._topics[(vhost, user)].pop(exchange, None)
        return self._delete("topic_permission", _topic_key(vhost, user, exchange))

    def clear_topic_permissions(self, vhost: str, user: str) -> bool:
        """All of a user's topic permissions in a vhost (RabbitMQ's HTTP DELETE); False if it had none."""
        exchanges = list(self.topic_permissions(vhost, user))
        for exchange in exchanges:
            self.clear_topic_permission(vhost, user, exchange)
        return bool(exchanges)


VHOST_METADATA = ("description", "tags", "default_queue_type")


def _parameter_key(vhost: str, component: str, name: str) -> str:
    return json.dumps([vhost, component, name])


def _suffix_key(vhost: str, exchange: str, upstream: str, upstream_exchange: str) -> str:
    return json.dumps([vhost, exchange, upstream, upstream_exchange])


def vhost_key(name: str) -> str:
    """Vhost names may hold '/', which separates key parts: escape it."""
    return name.replace("%", "%25").replace("/", "%2F")


def _topic_key(vhost: str, user: str, exchange: str) -> str:
    return f"{vhost_key(vhost)}/{vhost_key(user)}/{exchange}"


def _topic(record: dict[str, Any]) -> TopicPermission:
    return TopicPermission(record["exchange"], record["write"], record["read"])

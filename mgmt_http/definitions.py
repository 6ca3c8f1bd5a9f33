"""/api/definitions: export and import in RabbitMQ's definitions format (whole node, or one vhost)."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from amqp_server import __version__, runtime_parameters
from amqp_server.framing import field_types
from amqp_server.access_control import AccessControl
from amqp_server.broker import Broker
from amqp_server.errors import AMQPError
from amqp_server.broker.limits import USER_LIMITS, VHOST_LIMITS
from amqp_server.logs import untrusted
from amqp_server.queues.policy import OPERATOR_POLICY, POLICY, PolicyError, parse, unserved_keys
from amqp_server.broker.vhost import VHost

from . import auth
from .bindings import vhost_bindings
from .context import Context, ctx
from .http import (bad_request, check_depth, encode, from_amqp, get_bool, get_str, get_table, json_response,
                   no_content)
from .limits import COMPONENT as LIMITS, limit_value, limits_parameter
from .permissions import all_permissions, permissions_from_json, topic_permission_from_json
from .users import parse_tags, user_from_json, user_info
from .vhosts import vhost_metadata

routes = web.RouteTableDef()
log = logging.getLogger("warren.mgmt")
RABBIT_VERSION = "3.10.8"  # the RabbitMQ whose export format this is
TYPED_ARGUMENTS = "typed_arguments"  # Warren's: arguments with their field types, where RabbitMQ's JSON loses them


def _vhost_objects(context: Context, name: str, with_vhost: bool) -> dict[str, list[dict[str, Any]]]:
    vhost = context.vhost(name)
    tag = {"vhost": name} if with_vhost else {}
    queues = [{"name": q.name, **tag, "durable": q.durable, "auto_delete": q.auto_delete,
               **_arguments_out(q.arguments)} for q in list(vhost.queues.values()) if not q.exclusive]
    exchanges = [{"name": e.name, **tag, "type": e.type_name, "durable": e.durable, "auto_delete": e.auto_delete,
                  "internal": e.internal, **_arguments_out(e.arguments)}
                 for e in list(vhost.exchanges.values()) if e.name and not e.name.startswith("amq.")]
    exclusive = {q.name for q in vhost.queues.values() if q.exclusive}
    bindings = [{"source": b["source"], **tag, "destination": b["destination"],
                 "destination_type": b["destination_type"], "routing_key": b["routing_key"],
                 **_arguments_out(b["arguments"])} for b in vhost_bindings(context, vhost)
                if b["source"] and not (b["destination_type"] == "queue" and b["destination"] in exclusive)]
    policies = context.broker.policies  # a vhost's export names the vhost of policies too, as RabbitMQ's does
    parameters = [{"value": {"pattern": p.pattern, "definition": p.definition, "priority": p.priority,
                             "apply-to": p.apply_to}, "vhost": name, "component": OPERATOR_POLICY, "name": p.name}
                  for p in policies.list(OPERATOR_POLICY, name)]
    limits = context.broker.access.vhost_limits(name)
    if limits:  # stored by RabbitMQ as a runtime parameter too
        parameters.append(limits_parameter(name, limits))
    parameters += [runtime_parameters.shown(r, True) for r in context.broker.access.parameters() if r["vhost"] == name]
    return {"parameters": parameters, "policies": [p.to_json() for p in policies.list(POLICY, name)],
            "queues": queues, "exchanges": exchanges, "bindings": bindings}


def _arguments_out(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` as RabbitMQ's export writes them (a timestamp as seconds, a byte array as text…) and, where that
    loses a value's type, ``typed_arguments`` too (``field_types.to_json``), which an import prefers (RabbitMQ
    ignores it)."""
    try:
        typed = field_types.to_json(arguments)
    except (TypeError, ValueError):  # (declared before such arguments were refused)
        return {"arguments": dict(arguments)}
    if typed == orjson.loads(encode(arguments)):
        return {"arguments": dict(arguments)}
    return {"arguments": dict(arguments), TYPED_ARGUMENTS: typed}


def _arguments_in(item: dict[str, Any]) -> dict[str, Any]:
    """An item's arguments: its ``typed_arguments`` while they still read as its ``arguments`` (an edited file's
    ``arguments`` win), else ``arguments`` as RabbitMQ reads them."""
    arguments = get_table(item, "arguments")
    typed = item.get(TYPED_ARGUMENTS)
    if isinstance(typed, dict):
        try:
            value = field_types.from_json(typed)
        except ValueError:
            return arguments
        if orjson.loads(encode(value)) == arguments:
            return value
    return arguments


def _header() -> dict[str, Any]:
    return {"rabbit_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION, "product_name": "Warren",
            "product_version": __version__}


def export_all(request: web.Request) -> dict[str, Any]:
    context = ctx(request)
    access = context.broker.access
    result = _header()
    result["users"] = [user_info(u, access.user_limits(u.name)) for u in access.users()]
    result["vhosts"] = [{"name": name, "limits": [], "metadata": access.vhost_metadata(name)}
                        for name in access.vhosts()]
    result["permissions"] = all_permissions(request)
    result.update({"topic_permissions": access.all_topic_permissions(),
                   "global_parameters": access.global_parameters()})
    objects: dict[str, list] = {"parameters": [], "policies": [], "queues": [], "exchanges": [], "bindings": []}
    for name in access.vhosts():
        for key, items in _vhost_objects(context, name, True).items():
            objects[key].extend(items)
    result.update(objects)
    return result


def _download(request: web.Request, body: dict[str, Any]) -> web.Response:
    headers = None
    if "download" in request.query:
        headers = {"Content-Disposition": f'attachment; filename="{request.query["download"]}"'}
    return json_response(body, headers=headers)


@routes.get("/api/all-configuration")  # RabbitMQ's older name for the same resource
@routes.get("/api/definitions")
async def export(request: web.Request) -> web.Response:
    auth.require_admin(request)
    return _download(request, export_all(request))


@routes.get("/api/definitions/{vhost}")
async def export_vhost(request: web.Request) -> web.Response:
    auth.require_admin(request)
    name = request.match_info["vhost"]
    if not ctx(request).broker.access.vhost_exists(name):
        raise bad_request("vhost_not_found")  # (RabbitMQ's answer here; an import into it is a 404)
    result = _header()
    result.update(_vhost_objects(ctx(request), name, False))
    return _download(request, result)


async def _body(request: web.Request) -> dict[str, Any]:
    """JSON, or a form upload with a ``file`` field as RabbitMQ's UI sends it (see :mod:`csrf`)."""
    if request.content_type == "multipart/form-data":
        form = await request.post()
        field = form.get("file")
        raw = field.file.read() if isinstance(field, web.FileField) else (field or "")
    else:
        raw = await request.read()
    try:
        body = orjson.loads(raw)  # as read_json: its nesting is bounded, json's recursion is not
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"failed to decode JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("definitions must be a JSON object")
    check_depth(body)
    return body


def _items(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = body.get(key) or []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise bad_request(f"{key} must be a list of objects")
    return items


def import_definitions(context: Context, body: dict[str, Any], only_vhost: str | None = None,
                       user: str = "") -> list[dict[str, Any]]:
    """Users, vhosts, permissions (whole-node import only), then policies, runtime parameters, exchanges, queues,
    bindings, once the queues are found to fit the vhosts' ``max-queues`` (``_Import.queue_limits``, after the
    vhosts) — through the same broker operations as AMQP declares, those not there yet (see ``topology``).

    As RabbitMQ does, unknown fields are ignored.  What Warren does not serve — a runtime parameter of a component
    it does not serve (``mqtt-port-to-vhost-mapping``...) or an invalid one, a policy key of a plugin it lacks —
    is skipped rather than kept without effect: the list returned (and the log) says what and why.  Shovels and
    federation links act on this node (``amqp://``) as ``user`` (the importing administrator).
    """
    run = _Import(context.broker, body, only_vhost, user)
    if only_vhost is None:
        run.node_wide()
    else:
        run.queue_limits()
    run.policies()
    run.parameters()
    try:
        run.topology()
    except AMQPError as exc:
        raise from_amqp(exc) from None
    context.broker.links_changed()
    return run.skipped


class _Import:
    """One import, part by part in the order above: what it reads, where, as whom, and what it skipped."""

    def __init__(self, broker: Broker, body: dict[str, Any], only_vhost: str | None, user: str) -> None:
        self.broker, self.access, self.body = broker, broker.access, body
        self.only_vhost, self.user = only_vhost, user
        self.skipped: list[dict[str, Any]] = []

    def node_wide(self) -> None:
        """Global parameters, users, vhosts, permissions and topic permissions."""
        access, body = self.access, self.body
        for item in _items(body, "global_parameters"):
            access.set_global_parameter(get_str(item, "name"), item.get("value"))
        for item in _items(body, "users"):
            name = get_str(item, "name")
            item = dict(item, tags=parse_tags(item.get("tags")))
            access.put_user(user_from_json(name, item))
            if "limits" in item:
                access.set_limits("user_limits", name, _limits(item["limits"], USER_LIMITS, "user-limits"))
        for item in _items(body, "vhosts"):
            self.broker.add_vhost(get_str(item, "name"), **vhost_metadata(item))
        self.queue_limits()
        for item in _items(body, "permissions"):
            vhost, user = _known(access, item)
            access.set_permissions(vhost, user, permissions_from_json(item))
        for item in _items(body, "topic_permissions"):
            vhost, user = _known(access, item)
            access.set_topic_permission(vhost, user, topic_permission_from_json(item))

    def queue_limits(self) -> None:
        """rabbit_definitions:validate_limits: the file's queues not there yet, counted by vhost as they stand
        (``amq.`` names too, which are skipped later), must fit each vhost's ``max-queues`` as its limits are
        before the import; else nothing more is imported.  A vhost import answers the message, a whole-node one
        the term RabbitMQ's answer encodes: ``vhost_limit_exceeded`` and the message's bytes as numbers."""
        adding: dict[str, int] = {}
        for item in _items(self.body, "queues"):
            name, queue = self.only_vhost if self.only_vhost is not None else item.get("vhost"), item.get("name")
            if isinstance(name, str) and self.access.vhost_exists(name) and not (
                    isinstance(queue, str) and queue in self.broker.vhost(name).queues):
                adding[name] = adding.get(name, 0) + 1
        for name, count in sorted(adding.items(), key=lambda added: added[0].encode()):  # (an Erlang map's order)
            exceeded = self.broker.limits.would_exceed_queue_limit(name, count, len(self.broker.vhost(name).queues))
            if exceeded is not None:
                limit, queues = exceeded
                message = (f'Adding {count} queue(s) to virtual host "{name}" would exceed the limit of {limit} '
                           f"queue(s).\n\nThis virtual host currently has {queues} queue(s) defined.\n\n"
                           "Import aborted!")
                raise bad_request(message if self.only_vhost is not None
                                  else ["vhost_limit_exceeded", list(message.encode())])

    def vhost_of(self, item: dict[str, Any]) -> VHost:
        name = self.only_vhost if self.only_vhost is not None else get_str(item, "vhost")
        if not self.access.vhost_exists(name):
            raise bad_request(["no_such_vhost", name])
        return self.broker.vhost(name)

    def skip(self, what: dict[str, Any], reason: str) -> None:
        self.skipped.append({**what, "reason": reason})
        log.warning("definitions import: skipped %s: %s", untrusted(orjson.dumps(what).decode()), untrusted(reason))

    def policies(self) -> None:
        """Policies, less the keys of plugins Warren does not serve."""
        for item in _items(self.body, "policies"):
            vhost = self.vhost_of(item)
            definition = item.get("definition")
            unserved = unserved_keys(definition)  # (a definition that is no dict has none: parse refuses it)
            if unserved and isinstance(definition, dict):
                self.skip({"policy": get_str(item, "name"), "vhost": vhost.name, "keys": unserved},
                          "policy keys of a plugin Warren does not serve" +
                          ("" if len(unserved) < len(definition) else "; nothing else left, policy not imported"))
                if len(unserved) == len(definition):
                    continue
                item = {**item, "definition": {k: v for k, v in definition.items() if k not in unserved}}
            self.broker.policies.put(POLICY, _policy(vhost.name, item, item, False), vhost)

    def parameters(self) -> None:
        """Runtime parameters: vhost limits, operator policies, and the components' (shovels, federation...),
        those Warren does not serve or finds invalid skipped."""
        access = self.access
        for item in _items(self.body, "parameters"):
            component = item.get("component")
            if component not in (LIMITS, OPERATOR_POLICY):
                vhost = self.vhost_of(item)
                name = get_str(item, "name")
                try:
                    runtime_parameters.validate(access, str(component), name, item.get("value"), None)
                except runtime_parameters.ParameterError as exc:
                    self.skip({"parameter": name, "component": component, "vhost": vhost.name},
                              str(exc).replace("Validation failed\n\n", "").strip())
                    continue
                access.set_parameter(vhost.name, str(component), name, item.get("value"), self.user)
            if component == LIMITS:
                access.set_limits("vhost_limits", self.vhost_of(item).name,
                                  _limits(item.get("value"), VHOST_LIMITS, "limits"))
            if item.get("component") == OPERATOR_POLICY:
                vhost = self.vhost_of(item)
                value = item.get("value")
                self.broker.policies.put(
                    OPERATOR_POLICY, _policy(vhost.name, item, value if isinstance(value, dict) else {}, True), vhost)

    def topology(self) -> None:
        """Exchanges, queues, then bindings (one whose ends are not both there skipped, as RabbitMQ's import
        does).  An exchange or queue already there is kept as it is, whatever the file says of it: RabbitMQ's
        import (add_exchange_int, add_queue_int) declares only those that do not exist, and no equivalence is
        checked (that is rabbit_channel's).  As RabbitMQ's, an exchange or queue named with the reserved ``amq.``
        prefix is skipped, not refused: an export holds the server-named queues (``amq.gen-...``) that no declare
        may name, and its import into a fresh node was refused whole (401) once one was there."""
        broker, body, vhost_of = self.broker, self.body, self.vhost_of
        for item in self.named(body, "exchanges"):
            vhost = vhost_of(item)
            if get_str(item, "name") in vhost.exchanges:
                continue
            broker.declare_exchange(vhost, get_str(item, "name"), get_str(item, "type"),
                                    durable=get_bool(item, "durable", True),
                                    auto_delete=get_bool(item, "auto_delete", False),
                                    internal=get_bool(item, "internal", False),
                                    arguments=_arguments_in(item))
        for item in self.named(body, "queues"):
            vhost = vhost_of(item)
            if get_str(item, "name") in vhost.queues:
                continue
            broker.declare_queue(vhost, get_str(item, "name"), durable=get_bool(item, "durable", True),
                                 auto_delete=get_bool(item, "auto_delete", False),
                                 arguments=_arguments_in(item))
        for item in _items(body, "bindings"):
            vhost = vhost_of(item)
            kind = get_str(item, "destination_type", "queue")
            if kind not in ("queue", "exchange"):
                raise bad_request("destination_type must be 'queue' or 'exchange'")
            source, name = get_str(item, "source"), get_str(item, "destination")
            destination = (vhost.queues if kind == "queue" else vhost.exchanges).get(name)
            if destination is None or source not in vhost.exchanges:
                log.warning("definitions import: binding of %s %s to %s skipped: not both there", kind,
                            untrusted(name), untrusted(source))
                continue
            broker.add_binding(vhost, source, destination, get_str(item, "routing_key", ""), _arguments_in(item))


    @staticmethod
    def named(body: dict[str, Any], key: str) -> Iterator[dict[str, Any]]:
        """The exchanges or queues (``key``) of ``body`` but those of a reserved name, skipped with a warning in
        the log alone, as RabbitMQ's import skips them (its answer is still 204)."""
        kind = key[:-1]
        for item in _items(body, key):
            name = get_str(item, "name")
            if name.startswith("amq.") or (kind == "exchange" and not name):
                log.warning("definitions import: %s %s skipped: a reserved name", kind, untrusted(name))
                continue
            yield item


def _known(access: AccessControl, item: dict[str, Any]) -> tuple[str, str]:
    """The (vhost, user) a permission names, both there (refused in RabbitMQ's words if not)."""
    vhost, user = get_str(item, "vhost"), get_str(item, "user")
    if not access.vhost_exists(vhost):
        raise bad_request(["no_such_vhost", vhost])
    if access.user(user) is None:
        raise bad_request(["no_such_user", user])
    return vhost, user


def _limits(value: Any, known: tuple[str, ...], component: str) -> dict[str, int]:
    """A user's ``limits`` or a vhost-limits parameter's ``value``, each checked as the limits API checks it."""
    if value in (None, [], {}):  # (RabbitMQ's export writes a user without limits' as {})
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{component} must be an object")
    return {name: limit_value({"value": v}, name, known, component) for name, v in value.items()}


def _policy(vhost: str, item: dict[str, Any], body: dict[str, Any], operator: bool):
    try:
        return parse(vhost, get_str(item, "name"), body, operator)
    except PolicyError as exc:
        raise bad_request(str(exc)) from None


async def _imported(context: Context, skipped: list[dict[str, Any]]) -> web.Response:
    """204 as RabbitMQ answers, unless something was skipped: then 200 with ``skipped`` (what, and why).  In cluster
    mode once the nodes this one reaches have what was imported (``Broker.agreed``), as every other change."""
    await context.broker.agreed()
    return json_response({"skipped": skipped}) if skipped else no_content()


@routes.post("/api/all-configuration")
@routes.post("/api/definitions")
async def import_all(request: web.Request) -> web.Response:
    login = auth.require_admin(request)
    return await _imported(ctx(request), import_definitions(ctx(request), await _body(request), user=login.name))


@routes.post("/api/definitions/{vhost}")
async def import_vhost(request: web.Request) -> web.Response:
    login = auth.require_admin(request)
    return await _imported(ctx(request), import_definitions(ctx(request), await _body(request),
                                                            auth.require_vhost(request, creating=True), login.name))


__all__ = ["routes", "export_all", "import_definitions"]

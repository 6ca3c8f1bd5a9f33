"""/api/bindings and the binding views of exchanges and queues.

A binding's ``properties_key`` identifies it in URLs as RabbitMQ's does: ``~`` for an
empty routing key without arguments, the quoted routing key without arguments, or
``<quoted key>~<hash of the arguments>``.
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Iterable
from urllib.parse import quote, quote_plus, unquote_plus

from aiohttp import web

from amqp_server.broker.vhost import VHost
from amqp_server.queues.queue import AnyQueue
from exchanges import Exchange

from . import auth
from .context import Context, ctx
from .http import exchange_param, get_arguments, get_str, no_content, not_found, read_json
from .listing import respond, respond_one

routes = web.RouteTableDef()
KINDS = {"q": "queue", "e": "exchange"}


def _quote(value: str) -> str:
    return quote_plus(value).replace("~", "%7E")


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    if not arguments:
        return _quote(routing_key) if routing_key else "~"
    digest = hashlib.sha1(json.dumps(arguments, sort_keys=True, default=str).encode()).digest()[:4]
    return _quote(routing_key) + "~" + _quote(base64.urlsafe_b64encode(digest).decode().rstrip("="))


def binding_info(vhost: str, source: str, destination: AnyQueue | Exchange, routing_key: str,
                 arguments: dict[str, Any]) -> dict[str, Any]:
    return _binding(vhost, source, destination.name, "exchange" if isinstance(destination, Exchange) else "queue",
                    routing_key, arguments)


def _binding(vhost: str, source: str, destination: str, kind: str, routing_key: str,
             arguments: dict[str, Any]) -> dict[str, Any]:
    return {"source": source, "vhost": vhost, "destination": destination, "destination_type": kind,
            "routing_key": routing_key, "arguments": arguments,
            "properties_key": properties_key(routing_key, arguments)}


def vhost_bindings(context: Context, vhost: VHost) -> list[dict[str, Any]]:
    return [binding_info(vhost.name, *binding) for binding in context.broker.all_bindings(vhost)]


def _matching(items: Iterable[dict[str, Any]], **fields: str) -> list[dict[str, Any]]:
    return [item for item in items if all(item[k] == v for k, v in fields.items())]


@routes.get("/api/bindings")
async def list_all(request: web.Request) -> web.Response:
    context = ctx(request)
    items = [b for name in auth.login_vhosts(request) for b in vhost_bindings(context, context.vhost(name))]
    return respond(request, items, ("vhost", "source", "destination", "routing_key"))


@routes.get("/api/bindings/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    context = ctx(request)
    items = vhost_bindings(context, context.vhost(auth.require_vhost(request)))
    return respond(request, items, ("source", "destination", "routing_key"))


@routes.get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}")
async def exchange_bindings(request: web.Request) -> web.Response:
    """The exchange's bindings (none for a missing exchange: RabbitMQ's listings of bindings do not 404)."""
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    name = exchange_param(request.match_info["name"])
    if request.match_info["side"] == "source":
        items = _matching(vhost_bindings(context, vhost), source=name)
    else:
        items = _matching(vhost_bindings(context, vhost), destination=name, destination_type="exchange")
    return respond(request, items, ("source", "destination", "routing_key"))


@routes.get("/api/queues/{vhost}/{name}/bindings")
async def queue_bindings(request: web.Request) -> web.Response:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    name = request.match_info["name"]
    if name in vhost.queues:
        items = _matching(vhost_bindings(context, vhost), destination=name, destination_type="queue")
    else:  # as RabbitMQ: a missing queue still has its implicit default-exchange binding
        items = [_binding(vhost.name, "", name, "queue", name, {})]
    return respond(request, items, ("source", "destination", "routing_key"))


def _endpoints(request: web.Request) -> tuple[Context, VHost, Exchange, AnyQueue | Exchange]:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    source = vhost.exchanges.get(exchange_param(request.match_info["source"]))
    table = vhost.queues if request.match_info["kind"] == "q" else vhost.exchanges
    destination = table.get(request.match_info["destination"])
    if source is None or destination is None:
        raise not_found()
    return context, vhost, source, destination


BETWEEN = "/api/bindings/{vhost}/e/{source}/{kind:q|e}/{destination}"


@routes.get(BETWEEN)
async def list_between(request: web.Request) -> web.Response:
    """Bindings from the source to the destination (none if either is missing, as RabbitMQ's)."""
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    source, destination = exchange_param(request.match_info["source"]), request.match_info["destination"]
    items = _matching(vhost_bindings(context, vhost), source=source, destination=destination,
                      destination_type=KINDS[request.match_info["kind"]])
    return respond(request, items, ("routing_key",))


def _kind(destination: AnyQueue | Exchange) -> str:
    return "exchange" if isinstance(destination, Exchange) else "queue"


@routes.post(BETWEEN)
async def create(request: web.Request) -> web.Response:
    """queue.bind or exchange.bind: a missing source or destination is the broker's 404, as RabbitMQ's."""
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request, creating=True))
    destination = request.match_info["destination"]
    body = await read_json(request)
    routing_key = get_str(body, "routing_key", "")
    arguments = get_arguments(body)
    context.broker.bind(vhost, exchange_param(request.match_info["source"]), KINDS[request.match_info["kind"]],
                        destination, routing_key, arguments, who=auth.principal(request, vhost.name))
    await context.broker.agreed()
    location = quote(destination, safe="") + "/" + properties_key(routing_key, arguments)
    return web.Response(status=201, headers={"Location": location})


def _find(request: web.Request) -> tuple[Context, VHost, Exchange, AnyQueue | Exchange, dict[str, Any]]:
    context, vhost, source, destination = _endpoints(request)
    props = request.match_info["props"]
    for binding in context.broker.all_bindings(vhost):
        info = binding_info(vhost.name, *binding)
        key = info["properties_key"]
        if binding[0] == source.name and binding[1] is destination and props in (key, unquote_plus(key)):
            return context, vhost, source, destination, info
    raise not_found()


@routes.get(BETWEEN + "/{props}")
async def show(request: web.Request) -> web.Response:
    return respond_one(request, _find(request)[4])


@routes.delete(BETWEEN + "/{props}")
async def delete(request: web.Request) -> web.Response:
    context, vhost, source, destination, info = _find(request)
    context.broker.unbind(vhost, source.name, _kind(destination), destination.name, info["routing_key"],
                          info["arguments"], who=auth.principal(request, vhost.name))
    await context.broker.agreed()
    return no_content()

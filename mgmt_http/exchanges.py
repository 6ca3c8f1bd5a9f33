"""/api/exchanges: list, declare, delete, publish."""
from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from amqp_server import errors
from amqp_server.errors import AMQPError
from amqp_server.queues.policy import effective_definition
from amqp_server.publisher_flow import PublisherFlow
from exchanges import DelayedExchange, Exchange

from . import auth
from .context import Context, ctx
from .http import (created_or_updated, exchange_param, get_arguments, get_bool, get_str,
                   json_response, new_name, no_content, not_found, query_is_true, read_json, with_code)
from .listing import respond, respond_one
from .messages import message_from_json
from .rates import EXCHANGE_STATS, message_stats

routes = web.RouteTableDef()


def exchange_info(context: Context, vhost: str, exchange: Exchange) -> dict[str, Any]:
    info = {"name": exchange.name, "vhost": vhost, "type": exchange.type_name, "durable": exchange.durable,
            "auto_delete": exchange.auto_delete, "internal": exchange.internal,
            "arguments": dict(exchange.arguments), "user_who_performed_action": "",
            "policy": exchange.policy.name if exchange.policy else None,
            "operator_policy": exchange.operator_policy.name if exchange.operator_policy else None,
            "effective_policy_definition": effective_definition(exchange.policy, exchange.operator_policy),
            "message_stats": message_stats(exchange, context.sampler.exchange_rates(vhost, exchange.name),
                                           EXCHANGE_STATS)}
    if isinstance(exchange, DelayedExchange):  # the plugin's info item
        info["messages_delayed"] = context.broker.delayed.pending[(vhost, exchange.name)]
    return info


def find_exchange(request: web.Request) -> tuple[Context, str, Exchange]:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    exchange = vhost.exchanges.get(exchange_param(request.match_info["name"]))
    if exchange is None:
        raise not_found()
    return context, vhost.name, exchange


@routes.get("/api/exchanges")
async def list_all(request: web.Request) -> web.Response:
    context = ctx(request)
    items = [exchange_info(context, name, exchange) for name in auth.login_vhosts(request)
             for exchange in list(context.vhost(name).exchanges.values())]
    return respond(request, items)


@routes.get("/api/exchanges/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    return respond(request, [exchange_info(context, vhost.name, e) for e in list(vhost.exchanges.values())])


@routes.get("/api/exchanges/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    """One exchange; per-channel ``incoming``/``outgoing`` are empty, as RabbitMQ's in ``basic`` rates mode."""
    context, vhost, exchange = find_exchange(request)
    return respond_one(request, {**exchange_info(context, vhost, exchange), "incoming": [], "outgoing": []})


@routes.put("/api/exchanges/{vhost}/{name}")
async def declare(request: web.Request) -> web.Response:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request, creating=True))
    name = exchange_param(new_name(request, "name", "exchange"))
    who = auth.principal(request, vhost.name)  # checked by the broker, after the body and the type (rabbit_channel)
    body = await read_json(request)
    type_name = get_str(body, "type", "direct")  # exchange.declare's defaults, as RabbitMQ
    durable = get_bool(body, "durable", False)
    auto_delete = get_bool(body, "auto_delete", False)
    internal = get_bool(body, "internal", False)
    arguments = get_arguments(body)
    existed = name in vhost.exchanges
    await context.broker.declare_exchange_agreed(vhost, name, type_name, durable=durable, auto_delete=auto_delete,
                                                 internal=internal, arguments=arguments, who=who)
    return created_or_updated(not existed)


@routes.delete("/api/exchanges/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    context, vhost, exchange = find_exchange(request)
    context.broker.delete_exchange(context.vhost(vhost), exchange.name, if_unused=query_is_true(request, "if-unused"),
                                   who=auth.principal(request, vhost))
    await context.broker.agreed()
    return no_content()


class _HeldPublish:
    """An HTTP publish the publisher flow holds as it holds a publishing connection (``publisher_flow.Publisher``)."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    def hold(self, alarm: str | None) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()


async def until_released(flow: PublisherFlow) -> None:
    """Wait while an alarm (memory, disk) or a full link holds publishers."""
    while flow.blocked:
        held = _HeldPublish()
        flow.publishing(held)
        try:
            await held.released.wait()
        finally:
            flow.gone(held)


@routes.post("/api/exchanges/{vhost}/{name}/publish")
async def publish(request: web.Request) -> web.Response:
    """Publish one message, as basic.publish does (same permission and message checks): ``{"routed": bool}``.

    A refusal (a missing exchange, no write permission, a user_id that is not the caller's) is 400 with the
    reply code and text basic.publish would get, as RabbitMQ answers it, once the body is read and checked (its
    with_decode, then the channel).  While the publisher flow holds publishers (a memory or disk alarm, a full
    link), the request waits with its body unread, as a publishing connection waits unread (RabbitMQ 3.10's HTTP
    publish goes through its alarms)."""
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    name = exchange_param(request.match_info["name"])
    who = auth.principal(request, vhost.name)
    broker = context.broker
    vhost_name = vhost.name
    try:
        await until_released(context.flow)
        message = message_from_json(name, await read_json(request))
        limit = context.config.message_size_limit
        if message.body_size > limit:  # (rabbit_channel's first check, before the exchange's)
            raise errors.message_too_large(message.body_size, limit)
        exchange = broker.publish_target(vhost, name, who, message.routing_key)
        broker.check_message(vhost, exchange, who, message, auth.login(request).user)
    except AMQPError as exc:
        raise with_code(exc) from None
    routed, _ = broker.publish(vhost, exchange, message)
    broker.vhost_stats(vhost_name).publish += 1
    return json_response({"routed": routed})

"""/api/queues: list, declare, delete, purge, get; Warren's peek and move."""
from __future__ import annotations

from typing import Any, AsyncIterator

from aiohttp import web

from amqp_server import errors
from amqp_server.errors import AMQPError
from amqp_server.frontend.stored_bodies import SEND_FROM_FILE, body_head, forget_left, release_body
from amqp_server.message import RELEASE_FROM
from amqp_server.queues.policy import effective_definition
from amqp_server.queues.queue import AnyQueue, Entry

from . import auth, bulk
from .connections import consumer_info
from .forward import by_owner
from .context import Context, ctx
from .http import (bad_request, created_or_updated, from_channel, get_arguments, get_bool, get_int, get_str,
                   json_response, key_missing, new_name, no_content, not_found, query_is_true, read_json)
from .listing import respond, respond_one
from .messages import entry_to_json
from .rates import QUEUE_STATS, depth_fields, message_stats, queue_depths

routes = web.RouteTableDef()

ACK_MODES = {  # ackmode -> (requeue, reject)
    "ack_requeue_true": (True, False),
    "reject_requeue_true": (True, True),
    "ack_requeue_false": (False, False),
    "reject_requeue_false": (False, True),
}
ENCODINGS = ("auto", "base64")


def queue_info(context: Context, queue: AnyQueue) -> dict[str, Any]:
    """A queue as RabbitMQ's API shows it, from counters the queue keeps (nothing is scanned: listing
    1,000 queues must stay cheap, see benchmarks/mgmt_latency.py)."""
    rates = context.sampler.rates(queue)
    consumers = queue.consumers
    info: dict[str, Any] = {
        "name": queue.name, "vhost": queue.vhost, "durable": queue.durable, "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive, "arguments": dict(queue.arguments), "node": queue.node,
        "type": queue.type.name, "state": "running" if queue.available else "down",
        "policy": queue.policy.name if queue.policy else None,
        "operator_policy": queue.operator_policy.name if queue.operator_policy else None,
        "effective_policy_definition": effective_definition(queue.policy, queue.operator_policy),
        "recoverable_slaves": None,
        "single_active_consumer_tag": queue.active_consumer.tag if queue.active_consumer is not None else None,
        "consumers": len(consumers), "consumer_utilisation": None,
        "consumer_capacity": sum(c.has_credit() for c in consumers) / len(consumers) if consumers else 0,
        "exclusive_consumer_tag": next((c.tag for c in consumers if c.exclusive), None),
        "message_bytes_ready": queue.ready_bytes,
        "message_stats": message_stats(queue.stats, rates, QUEUE_STATS),
    }
    info.update(depth_fields(queue_depths((queue,)), rates))
    queue.type.describe(queue, context, info)
    if queue.exclusive_owner is not None:
        owner = queue.exclusive_owner
        info["owner_pid_details"] = {"name": owner.name, "peer_host": owner.peer[0], "peer_port": owner.peer[1]}
    return info


def find_queue(request: web.Request) -> tuple[Context, AnyQueue]:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise not_found()
    return context, queue


def _stub(queue: AnyQueue) -> dict[str, Any]:
    return {"name": queue.name, "vhost": queue.vhost}


def _listing(request: web.Request, context: Context, queues: list[AnyQueue]) -> web.Response:
    """Sorted by name or paged, only the queues answered are rendered."""
    return respond(request, queues, render=lambda queue: queue_info(context, queue), stub=_stub)


@routes.get("/api/queues")
async def list_all(request: web.Request) -> web.Response:
    context = ctx(request)
    return _listing(request, context, [queue for name in auth.login_vhosts(request)
                                       for queue in list(context.vhost(name).queues.values())])


@routes.get("/api/queues/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    context = ctx(request)
    return _listing(request, context, list(context.vhost(auth.require_vhost(request)).queues.values()))


@routes.get("/api/queues/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    """One queue also lists its consumers; per-channel ``incoming``/``deliveries`` are empty, as RabbitMQ's
    in its (and Warren's) ``basic`` rates mode."""
    context, queue = find_queue(request)
    info = queue_info(context, queue)
    info.update(consumer_details=[consumer_info(c) for c in list(queue.consumers)], incoming=[],
                deliveries=[])
    return respond_one(request, info)


@routes.put("/api/queues/{vhost}/{name}")
async def declare(request: web.Request) -> web.Response:
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request, creating=True))
    name = new_name(request, "name", "queue")
    who = auth.principal(request, vhost.name)
    who.check("configure", "queue", vhost.name, name)  # before the body is read: refusing costs nothing
    body = await read_json(request)
    durable = get_bool(body, "durable", False)  # queue.declare's default, as RabbitMQ
    auto_delete = get_bool(body, "auto_delete", False)
    arguments = get_arguments(body)
    if not name:
        raise bad_request("queue name must not be empty")
    existed = name in vhost.queues
    async with context.broker.declaring(vhost, name, durable=durable, auto_delete=auto_delete, arguments=arguments,
                                        who=who):
        context.broker.declare_queue(vhost, name, durable=durable, auto_delete=auto_delete, arguments=arguments,
                                     who=who)
    return created_or_updated(not existed)


@routes.delete("/api/queues/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    context, queue = find_queue(request)
    await context.broker.delete_anywhere(context.vhost(queue.vhost), queue.name,  # the owner node's too
                                         if_unused=query_is_true(request, "if-unused"),
                                         if_empty=query_is_true(request, "if-empty"),
                                         who=auth.principal(request, queue.vhost))
    await context.broker.agreed()
    return no_content()


@routes.delete("/api/queues/{vhost}/{name}/contents")
async def purge(request: web.Request) -> web.Response:
    context, queue = find_queue(request)
    await context.broker.purge_anywhere(context.vhost(queue.vhost), queue.name,  # the owner node's too
                                        who=auth.principal(request, queue.vhost))
    return no_content()


@routes.post("/api/queues/{vhost}/{name}/actions")
async def actions(request: web.Request) -> web.Response:
    """rabbit_mgmt_wm_queue_actions (administrators): ``sync`` and ``cancel_sync`` of a classic queue's mirrors.
    Warren mirrors no queue, and RabbitMQ answers 204 for a queue without mirrors too (it spawns the sync, or
    ignores cancel_sync's not_mirrored); any other action is its ``{unknown, Action}``.  A missing queue is 404
    (RabbitMQ's handler crashes: 500)."""
    auth.require_admin(request)
    body = await read_json(request)
    if "action" not in body:
        raise key_missing("action")
    find_queue(request)
    if body["action"] not in ("sync", "cancel_sync"):
        raise bad_request(["unknown", body["action"]])
    return no_content()


def _encoding_and_truncate(body: dict[str, Any], default_encoding: str | None) -> tuple[str, int | None]:
    encoding = get_str(body, "encoding", default_encoding)
    if encoding not in ENCODINGS:
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = body.get("truncate")
    if truncate in (None, ""):
        return encoding, None
    return encoding, get_int(body, "truncate", minimum=0)


@routes.post("/api/queues/{vhost}/{name}/get")
async def get(request: web.Request) -> web.StreamResponse:
    """RabbitMQ's "get messages": basic.get ``count`` times, then ack, reject or requeue them all.  Refusals
    read as RabbitMQ's, which makes the gets on a channel (a missing queue is basic.get's 404 text).  A slice
    per loop turn, at most ``bulk.MAX_MESSAGES`` (see :mod:`bulk`); what is taken is held until the end, as on
    RabbitMQ's channel (requeued, a later slice would take it again), then settled a slice per turn too.  A large
    stored body is read from the store's file for its payload (``truncate`` of it only) and not held by what is
    taken."""
    context = ctx(request)
    vhost = context.vhost(auth.require_vhost(request))
    body = await read_json(request)  # the body is checked first, as RabbitMQ does
    count = bulk.capped(get_int(body, "count", minimum=0))
    ackmode = get_str(body, "ackmode")
    if ackmode not in ACK_MODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACK_MODES)}")
    encoding, truncate = _encoding_and_truncate(body, None)
    requeue, reject = ACK_MODES[ackmode]
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        missing = errors.resource_name("queue", request.match_info["name"], vhost.name)
        raise from_channel(errors.not_found(f"no {missing}"))
    who = auth.principal(request, queue.vhost)
    broker = context.broker
    no_ack = ackmode == "ack_requeue_false"  # as RabbitMQ: basic.get with no_ack
    taken: list[Entry] = []

    async def slices() -> AsyncIterator[list[dict[str, Any]]]:
        left = count
        while left > 0:
            items: list[dict[str, Any]] = []
            turn = bulk.Turn()
            while left > 0:
                got, entry = await broker.get_anywhere(vhost, queue.name, no_ack=no_ack, who=who,
                                                       sends_from=SEND_FROM_FILE)
                if entry is None:
                    left = 0
                    break
                left -= 1
                stored = entry.message.body is None  # left in the store for the file (Queue.took)
                item = entry_to_json(entry, encoding, truncate, body_head(entry.message, got, truncate))
                if no_ack:
                    if stored:
                        forget_left(got, entry)
                else:
                    taken.append(entry)
                    if entry.message.body_size >= RELEASE_FROM:
                        release_body(entry, got)
                item["message_count"] = queue.message_count
                items.append(item)
                if not turn.spend(1, entry.message.body_size):
                    break
            yield items
            await bulk.next_turn()
        while taken:  # settled before the answer ends; newest first, so a requeued slice goes to the head at once
            part = taken[-bulk.SLICE:]
            del taken[-bulk.SLICE:]
            broker.settle(queue, part, requeue, reject)
            yield []
            await bulk.next_turn()

    try:
        return await bulk.json_array(request, slices())
    except AMQPError as exc:
        raise from_channel(exc) from None
    finally:
        if taken:  # not answered to the end: nothing may stay unacked without a channel to settle it
            broker.settle(queue, taken, requeue=True)


@routes.get("/api/queues/{vhost}/{name}/peek")
async def peek(request: web.Request) -> web.StreamResponse:
    """Warren: ready messages from ``offset``, leaving order, redelivered flags and counters as they were.  A
    slice per loop turn, at most ``bulk.MAX_MESSAGES``: a queue that changes meanwhile may shift under it.  A
    large stored body is read from the store's file for its payload, ``truncate`` of it only, as ``get`` reads
    it, and a slice's bodies are within its budget of bytes (``bulk.Turn``), as a get's are."""
    context, queue = find_queue(request)
    who = auth.principal(request, queue.vhost)
    context.broker.consumable(context.vhost(queue.vhost), queue.name, None, who)
    answer = await by_owner(request, queue)  # (another node's queue: its node answers, once the caller may read it)
    if answer is not None:
        return answer
    query = dict(request.query)
    offset = get_int(query, "offset", 0, minimum=0)
    count = bulk.capped(get_int(query, "count", 10, minimum=0))
    encoding, truncate = _encoding_and_truncate(query, "auto")

    async def slices() -> AsyncIterator[list[dict[str, Any]]]:
        position, last = offset, None
        while position < offset + count:
            items: list[dict[str, Any]] = []
            turn = bulk.Turn()
            going = True
            while going and position < offset + count:
                wanted = min(bulk.STEP, offset + count - position)
                entries = context.broker.peek(queue, position, wanted, who, after=last)
                for entry in entries:  # (a slice ends at its budget: the next goes on after its last entry)
                    item = entry_to_json(entry, encoding, truncate, body_head(entry.message, queue, truncate))
                    item["position"] = position
                    items.append(item)
                    position += 1
                    last = entry
                    going = turn.spend(1, entry.message.body_size)
                    if not going:
                        break
                else:
                    if len(entries) < wanted:
                        yield items
                        return
            yield items
            await bulk.next_turn()

    return await bulk.json_array(request, slices())


@routes.post("/api/queues/{vhost}/{name}/move")
async def move(request: web.Request) -> web.Response:
    """Warren: move ready messages (all, or ``count``; at most ``bulk.MAX_MESSAGES``) to the tail of
    ``destination`` in the same vhost, a slice per loop turn; ``moved`` says how many."""
    context, queue = find_queue(request)
    body = await read_json(request)
    destination_name = get_str(body, "destination")
    count = get_int(body, "count", minimum=0) if body.get("count") is not None else bulk.MAX_MESSAGES
    vhost = context.vhost(queue.vhost)
    destination = vhost.queues.get(destination_name)
    if destination is None:
        raise not_found(f"no queue '{destination_name}' in vhost '{vhost.name}'")
    who = auth.principal(request, vhost.name)
    moved, left = 0, bulk.capped(count)
    turn = bulk.Turn()
    while left:
        wanted = min(bulk.STEP, left)
        done = context.broker.move_messages(queue, destination, wanted, who)
        moved += done
        left -= done
        if done < wanted:
            break
        if not turn.spend(done, 0):
            await bulk.next_turn()
            turn = bulk.Turn()
    return json_response({"moved": moved, "source": queue.name, "destination": destination.name,
                          "vhost": vhost.name})

"""RabbitMQ 4.x's v2 addresses: ``/exchanges/:exchange/:routing-key``, ``/exchanges/:exchange`` and
``/queues/:queue`` for targets (or a null target and each message's ``to``), ``/queues/:queue`` for sources;
names percent-encoded (RFC 3986) as the RabbitMQ clients write them.  RabbitMQ 3.x's v1 addresses too, which 4.x
still takes: those that name a queue by ``/queue/:queue`` declare it, and the sources ``/exchange/:exchange/:key``
and ``/topic/:key`` consume from a new server-named queue bound there (rabbit_amqp_session's ``ensure_terminus``)."""
from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote

from . import frames
from .frames import Amqp10Error


class TargetAddress(NamedTuple):
    exchange: str  # "" for the default exchange
    routing_key: str | None  # None: the message's subject (``/exchanges/:exchange``)
    declare: bool = False  # v1 ``/queue/:queue``: the queue named by the routing key is declared first


class Source(NamedTuple):
    """What a link to the client consumes: ``queue``, declared first if ``declare``; or, ``exchange`` set, a new
    server-named queue bound to that exchange with ``binding_key``."""
    queue: str | None
    declare: bool = False
    exchange: str | None = None
    binding_key: str = ""


def _name(part: str, address: str) -> str:
    name = unquote(part, errors="strict") if "%" in part else part
    if len(name.encode()) > 255:
        raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}': name longer than 255 bytes")
    return name


def _v1_name(part: str, address: str) -> str:
    if len(part.encode()) > 255:
        raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}': name longer than 255 bytes")
    return part


def target(address: str) -> TargetAddress:
    """Where a message sent to ``address`` goes; ``Amqp10Error`` (invalid-field) for what is not a target."""
    try:
        parts = address.split("/")
        v1 = _v1_target(parts)
        if v1 is not None:
            return v1
        if len(parts) == 3 and parts[0] == "" and parts[1] == "queues" and parts[2]:
            return TargetAddress("", _name(parts[2], address))
        if len(parts) in (3, 4) and parts[0] == "" and parts[1] == "exchanges" and parts[2]:
            exchange = _name(parts[2], address)
            if exchange == "amq.default":
                raise Amqp10Error(frames.INVALID_FIELD, "publishing to the default exchange via the 'amq.default' "
                                  "name is not allowed; use /queues/:queue instead")
            return TargetAddress(exchange, _name(parts[3], address) if len(parts) == 4 else None)
    except UnicodeDecodeError:
        pass
    raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}'")


def _v1_target(parts: list[str]) -> TargetAddress | None:
    """The v1 targets of RabbitMQ 3.x's plugin, which 4.x still takes: ``/exchange/:x/:key``, ``/exchange/:x``
    (the subject as routing key), ``/topic/:key`` (amq.topic), ``/queue/:q`` and ``/amq/queue/:q`` (the default
    exchange), ``/queue`` (the default exchange, the subject as routing key).  Names are not percent-encoded."""
    if not parts or parts[0] != "" or len(parts) < 2:
        return None
    kind, rest = parts[1], parts[2:]
    if kind == "exchange" and len(rest) in (1, 2) and rest[0]:
        return TargetAddress(rest[0], rest[1] if len(rest) == 2 else None)
    if kind == "topic" and len(rest) == 1:
        return TargetAddress("amq.topic", rest[0])
    if kind == "queue" and len(rest) <= 1:
        return TargetAddress("", rest[0], True) if rest and rest[0] else TargetAddress("", None)
    if kind == "amq" and len(rest) == 2 and rest[0] == "queue" and rest[1]:
        return TargetAddress("", rest[1])
    return None


def source(address: str) -> Source:
    """What a link from ``address`` consumes: ``/queues/:queue``, or the v1 ``/amq/queue/:queue`` (an existing
    queue), ``/queue/:queue`` (declared), ``/exchange/:exchange[/:key]`` and ``/topic/:key`` (a new queue bound
    there).  v1 names are not percent-encoded."""
    parts = address.split("/")
    if len(parts) == 4 and parts[:3] == ["", "amq", "queue"] and parts[3]:
        return Source(_v1_name(parts[3], address))
    if len(parts) == 3 and parts[:2] == ["", "queue"] and parts[2]:
        return Source(_v1_name(parts[2], address), declare=True)
    if len(parts) in (3, 4) and parts[:2] == ["", "exchange"] and parts[2]:
        return Source(None, exchange=_v1_name(parts[2], address),
                      binding_key=_v1_name(parts[3], address) if len(parts) == 4 else "")
    if len(parts) == 3 and parts[:2] == ["", "topic"]:
        return Source(None, exchange="amq.topic", binding_key=_v1_name(parts[2], address))
    if len(parts) == 3 and parts[0] == "" and parts[1] == "queues" and parts[2]:
        try:
            return Source(_name(parts[2], address))
        except UnicodeDecodeError:
            pass
    raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}'")

"""RabbitMQ 4.x's v2 addresses: ``/exchanges/:exchange/:routing-key``, ``/exchanges/:exchange`` and
``/queues/:queue`` for targets (or a null target and each message's ``to``), ``/queues/:queue`` for sources;
names percent-encoded (RFC 3986) as the RabbitMQ clients write them."""
from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote

from . import frames
from .frames import Amqp10Error


class Destination(NamedTuple):
    exchange: str  # "" for the default exchange
    routing_key: str | None  # None: the message's subject (``/exchanges/:exchange``)


def _name(part: str, address: str) -> str:
    name = unquote(part, errors="strict") if "%" in part else part
    if len(name.encode()) > 255:
        raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}': name longer than 255 bytes")
    return name


def target(address: str) -> Destination:
    """Where a message sent to ``address`` goes; ``Amqp10Error`` (invalid-field) for what is not a v2 target."""
    try:
        parts = address.split("/")
        if len(parts) == 3 and parts[0] == "" and parts[1] == "queues" and parts[2]:
            return Destination("", _name(parts[2], address))
        if len(parts) in (3, 4) and parts[0] == "" and parts[1] == "exchanges" and parts[2]:
            exchange = _name(parts[2], address)
            if exchange == "amq.default":
                raise Amqp10Error(frames.INVALID_FIELD, "publishing to the default exchange via the 'amq.default' "
                                  "name is not allowed; use /queues/:queue instead")
            return Destination(exchange, _name(parts[3], address) if len(parts) == 4 else None)
    except UnicodeDecodeError:
        pass
    raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}'")


def source(address: str) -> str:
    """The queue a link from ``address`` consumes."""
    parts = address.split("/")
    if len(parts) == 3 and parts[0] == "" and parts[1] == "queues" and parts[2]:
        try:
            return _name(parts[2], address)
        except UnicodeDecodeError:
            pass
    raise Amqp10Error(frames.INVALID_FIELD, f"bad address '{address[:300]}'")

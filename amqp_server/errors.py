"""AMQP exceptions as RabbitMQ sends them: a reply code, a reply text naming the object.

Soft errors close the channel; hard errors close the connection.  Reply texts
follow RabbitMQ's format ``"NAME - detail"`` so that client code (and people)
matching on them keep working.
"""
from __future__ import annotations

from .config import MAX_MESSAGE_SIZE


CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


class AMQPError(Exception):
    """An exception the peer is told about. ``hard`` ones close the connection.

    The reply text is ``NAME - detail``, or the bare NAME without a detail (RabbitMQ's crash replies).
    """

    hard = False

    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.code = code
        self.detail = detail  # the text without the reply name, as RabbitMQ's HTTP API shows most refusals
        self.text = _shortstr_text(f"{REPLY_NAMES[code]} - {detail}" if detail else REPLY_NAMES[code])
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.text)


def _shortstr_text(text: str) -> str:
    """A reply text is a shortstr: RabbitMQ cuts one over 255 bytes to 252 bytes and '...'."""
    raw = text.encode()
    if len(raw) <= 255:
        return text
    return raw[:252].decode(errors="ignore") + "..."


class ChannelError(AMQPError):
    """Closes the channel the offending method arrived on."""


class ConnectionError(AMQPError):  # noqa: A001 - the AMQP name
    """Closes the whole connection."""

    hard = True


class QueueLimitReached(ChannelError):
    """A vhost's ``max-queues`` refused a new queue: 406 in AMQP 0-9-1; AMQP 1.0 tells it apart, as RabbitMQ 4.x's
    queue_limit_exceeded error is amqp:resource-limit-exceeded on an attach and 403 from /management."""

    def __init__(self, detail: str) -> None:
        super().__init__(PRECONDITION_FAILED, detail)


class QueuePropertyRefused(ChannelError):
    """A queue type refused a property (a quorum queue or stream exclusive, auto-deleted or not durable): 406 in
    AMQP 0-9-1; RabbitMQ 4.x's queue types return it as a protocol_error, which /management answers 400."""

    def __init__(self, detail: str) -> None:
        super().__init__(PRECONDITION_FAILED, detail)


def not_found(detail: str) -> ChannelError:
    return ChannelError(NOT_FOUND, detail)


def access_refused(detail: str) -> ChannelError:
    return ChannelError(ACCESS_REFUSED, detail)


def precondition_failed(detail: str) -> ChannelError:
    return ChannelError(PRECONDITION_FAILED, detail)


def message_too_large(size: int, limit: int) -> ChannelError:
    """A publish of ``size`` bytes over ``max_message_size`` (``Config.message_size_limit``), in rabbit_channel's
    check_msg_size words, which name the limit as configured unless it is RabbitMQ's own ceiling."""
    what = "max size" if limit == MAX_MESSAGE_SIZE else "configured max size"
    return precondition_failed(f"message size {size} is larger than {what} {limit}")


def resource_locked(detail: str) -> ChannelError:
    return ChannelError(RESOURCE_LOCKED, detail)


def resource_name(kind: str, name: str, vhost: str) -> str:
    """``queue 'q' in vhost '/'``: how RabbitMQ names a resource in reply texts."""
    return f"{kind} '{name}' in vhost '{vhost}'"

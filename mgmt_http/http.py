"""HTTP helpers shared by the resources: RabbitMQ's error bodies, JSON in and out, path parameters."""
from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

import orjson
from aiohttp import web

from amqp_server import errors
from amqp_server.framing import field_types
from amqp_server.errors import AMQPError

DEFAULT_EXCHANGE_ALIAS = "amq.default"  # how RabbitMQ's API names the default exchange in paths


def jsonable(value: Any) -> Any:
    """AMQP table values (bytes, datetimes, decimals) as JSON values, as RabbitMQ renders them."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode()
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(value.timestamp())
    if isinstance(value, (decimal.Decimal, float)):  # a float subclass too: a field's wire type (orjson skips them)
        return float(value)
    return value


def _default(value: Any) -> Any:
    converted = jsonable(value)
    return str(value) if converted is value else converted


_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS  # datetimes as RabbitMQ's integer seconds


def encode(data: Any) -> bytes:
    """orjson: a listing of 1,000 queues encodes several times faster than with json (benchmarks/mgmt_latency.py)."""
    try:
        return orjson.dumps(data, default=_default, option=_OPTIONS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits (stored by an older version): json writes it
        return json.dumps(data, default=_default).encode()


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return encoded_response(encode(data), status, headers)


def encoded_response(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def error_response(status: int, error: str, reason: Any, headers: dict[str, str] | None = None) -> web.Response:
    return json_response({"error": error, "reason": reason}, status, headers)


class HTTPError(Exception):
    """Raised by handlers; the error middleware turns it into RabbitMQ's ``{"error", "reason"}`` body."""

    def __init__(self, status: int, error: str | None, reason: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers

    def response(self) -> web.Response:
        if self.error is None:  # (RabbitMQ answers a few requests with a bare status)
            return web.Response(status=self.status, headers=self.headers)
        return error_response(self.status, self.error, self.reason, self.headers)


def not_found(reason: str = "Not Found") -> HTTPError:
    return HTTPError(404, "Object Not Found", reason)


def bad_request(reason: Any) -> HTTPError:
    """400; ``reason`` a string, or a list where RabbitMQ answers with an Erlang tuple (``["not_boolean", v]``)."""
    return HTTPError(400, "bad_request", reason)


def not_authorised(reason: str) -> HTTPError:
    """Authenticated but not allowed: RabbitMQ's management plugin answers 401 here too (never 403)."""
    return HTTPError(401, "not_authorised", reason)


def from_amqp(exc: AMQPError) -> HTTPError:
    """A broker operation's refusal as RabbitMQ's management plugin reports those it makes directly (declare,
    delete, bind, purge): the reply text without its name, and an access refusal without a reason."""
    if exc.code == errors.NOT_FOUND:
        return HTTPError(404, "not_found", exc.detail)
    if exc.code == errors.ACCESS_REFUSED:
        return not_authorised("Access refused.")
    return HTTPError(400, "bad_request", exc.detail)


def from_channel(exc: AMQPError) -> HTTPError:
    """A refusal as RabbitMQ's management plugin reports those it meets on a channel (get): the whole text,
    and for any but a missing queue or a refused access, the reply code before it."""
    if exc.code == errors.NOT_FOUND:
        return HTTPError(404, "not_found", exc.text)
    if exc.code == errors.ACCESS_REFUSED:
        return not_authorised(exc.text)
    return with_code(exc)


def with_code(exc: AMQPError) -> HTTPError:
    """400 with the reply code and text (``405 RESOURCE_LOCKED - …``), as RabbitMQ's publish and get say."""
    return bad_request(f"{exc.code} {exc.text}")


def key_missing(key: str) -> HTTPError:
    return bad_request(f"[{{key_missing,{key}}}]")


def no_content() -> web.Response:
    return web.Response(status=204)


def created_or_updated(created: bool) -> web.Response:
    return web.Response(status=201 if created else 204)


DOUBLY_ENCODED = ("invalid payload: the request body JSON-decoded to a string. "
                  "Is the input doubly-JSON-encoded?")  # rabbit_mgmt_util:decode/1's words


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, as rabbit_mgmt_util:decode/1 reads it: an empty body is ``{}``, so are
    ``null``, ``true``, ``false`` and ``undefined`` ("some HTTP API clients include null for payload"), and what a
    request needs of it is then missing as from any ``{}``; a JSON string is refused as doubly encoded, anything
    else that is no object is ``not_json``."""
    raw = await request.read()  # at most the app's client_max_size (--mgmt-max-body-size): larger is a 413
    if not raw.strip() or raw == b"undefined":
        return {}
    try:
        body = orjson.loads(raw)  # several times faster and leaner than json, and it bounds nesting
    except orjson.JSONDecodeError:
        raise bad_request("not_json") from None
    if body is None or isinstance(body, bool):  # an atom, to Erlang
        return {}
    if isinstance(body, str):
        raise bad_request(DOUBLY_ENCODED)
    if not isinstance(body, dict):
        raise bad_request("not_json")
    check_depth(body)
    return body


MAX_JSON_DEPTH = 128  # no body needs as much (AMQP tables stop at 100 levels)
ORJSON_WRITES = 254  # the deepest JSON orjson writes


def check_depth(body: Any) -> None:
    """400 for a body nested deeper than ``MAX_JSON_DEPTH``: kept, it could not be written back (an answer that
    lists it, an export) without failing every time.  orjson checks it, in C: the body is written wrapped
    in as many lists as it may not use (a walk in Python took seconds over a body of millions of empty lists)."""
    wrapped = body
    for _ in range(ORJSON_WRITES - MAX_JSON_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        raise bad_request(f"JSON nested deeper than {MAX_JSON_DEPTH}") from None


def get_bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    """A JSON boolean (or "true"/"false", as RabbitMQ's own UI sends them)."""
    value = body.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad_request(["not_boolean", value])


def get_str(body: dict[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if value is None:
        raise key_missing(key)
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def get_int(body: dict[str, Any], key: str, default: int | None = None, minimum: int | None = None) -> int:
    value = body.get(key, default)
    if value is None:
        raise key_missing(key)
    if isinstance(value, bool):
        raise bad_request(["not_integer", value])
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise bad_request(["not_integer", value]) from None
    if minimum is not None and number < minimum:
        raise bad_request(f"{key} must be at least {minimum}")
    return number


def get_table(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise bad_request(f"{key} must be a JSON object")
    return value


def get_arguments(body: dict[str, Any], key: str = "arguments") -> dict[str, Any]:
    """An AMQP arguments table from JSON, as RabbitMQ's API reads one: no nulls anywhere, and integers are
    ``long`` (what its refusals name)."""
    return _amqp_value(get_table(body, key))


def _amqp_value(value: Any) -> Any:
    if value is None:
        raise bad_request("null_not_allowed")
    if isinstance(value, dict):
        return {k: _amqp_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_amqp_value(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return field_types.Long(value)
    return value


def query_is_true(request: web.Request, name: str) -> bool:
    """A query flag as RabbitMQ's handlers read one: ``<<"true">> =:= qs_val(Name, ReqData)``, the word true only
    (if-empty, if-unused, use_regex)."""
    return request.query.get(name) == "true"


MAX_NAME_BYTES = 255  # an AMQP short string: longer names could never be used by a client


def new_name(request: web.Request, key: str, kind: str) -> str:
    """A name a PUT creates, from the path: RabbitMQ's 400 for one over 255 bytes."""
    name = request.match_info[key]
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise bad_request(f"{kind} should be less than 255 bytes, actually was {size}\n")
    return name


def exchange_param(raw: str) -> str:
    """``amq.default`` in a path means the default exchange ``""``."""
    return "" if raw == DEFAULT_EXCHANGE_ALIAS else raw

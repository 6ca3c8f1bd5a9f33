"""The fallback for any AMQP 0-9-1 broker (RabbitMQ included): at-least-once, not exactly-once.

``spark.read.format("warren").option("protocol", "amqp")`` reads plain AMQP queues with pika:
one partition per queue, each task takes up to ``maxRows`` messages (default 10000) with manual
acks and then closes its channel *without acking*, so every message goes back to its queue
(marked redelivered, as the broker requeues it): a browse.  There are no offsets, so a retried
task may see different messages (others may have consumed meanwhile); ``offset`` is the
message's position in what this task read.

``spark.drain(spark, protocol="amqp", ...)`` consumes on the driver with manual acks held open,
builds the DataFrame, materialises it (``write`` or ``localCheckpoint``) and only then acks
(``multiple``) and closes.  A failure before the ack requeues everything: at-least-once, a
message may be read twice if the driver dies between materialising and acking.

``load()`` connects and passively declares each queue, so an unreachable broker, a failed login,
a refused vhost or a missing queue fail there with one line starting ``warren (amqp):``; a
missing read permission shows at the first action (a passive declare does not check it).

Options: ``url`` (``amqp://user:pass@host:5672/vhost``; ``user``, ``password``, ``vhost`` override
its parts), ``queue`` (comma-separated), ``maxRows``, ``bodyFormat`` (binary|text), ``timeout``.
"""
from __future__ import annotations

import datetime
import json
from typing import Any, Callable, Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StringType, StructType

from .common import WarrenError, base_schema, int_option, option

DEFAULT_MAX_ROWS = 10_000


def amqp_schema(options: Any) -> StructType:
    """Runs at ``load()``: refuses a drain, and checks the broker, the login and that each queue
    exists (a passive declare; read permission shows only at the first action)."""
    if str(option(options, "mode", "browse")).lower() == "drain":
        raise ValueError("warren (amqp): mode=drain has no offsets to pin over plain AMQP; drain with "
                         "spark.drain(spark, protocol='amqp', ...), which acks after materialising")
    try:
        check_queues(options)
    except WarrenError as exc:
        raise exc.with_traceback(None) from None  # Spark shows this text: keep it to the reason
    text = str(option(options, "bodyFormat", "binary")).lower() in ("text", "json")
    return base_schema(StringType() if text else None)


def connect(options: Any) -> Any:
    """A pika BlockingConnection, or a :class:`WarrenError` saying in one line why there is none."""
    import pika
    from pika import exceptions

    params = _parameters(options)
    where = f"{params.host}:{params.port}"
    user = params.credentials.username
    try:
        return pika.BlockingConnection(params)
    except exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 403:
            raise WarrenError(f"warren (amqp): login failed for user '{user}' at {where}") from None
        raise WarrenError(f"warren (amqp): {where} refused: {exc.reply_text}") from None
    except (exceptions.ProbableAuthenticationError, exceptions.AuthenticationError):
        raise WarrenError(f"warren (amqp): login failed for user '{user}' at {where}") from None
    except exceptions.ProbableAccessDeniedError:
        raise WarrenError(f"warren (amqp): access refused: user '{user}' may not use vhost "
                          f"'{params.virtual_host}'") from None
    except exceptions.AMQPConnectionError:
        raise WarrenError(f"warren (amqp): cannot reach {where}") from None


def check_queues(options: Any) -> None:
    from pika import exceptions

    connection = connect(options)
    try:
        for queue in _queues(options):
            try:
                connection.channel().queue_declare(queue, passive=True)
            except exceptions.ChannelClosedByBroker as exc:
                vhost = _parameters(options).virtual_host
                if exc.reply_code == 404:
                    raise WarrenError(f"warren (amqp): queue '{queue}' not found in vhost '{vhost}'") from None
                raise WarrenError(f"warren (amqp): queue '{queue}' in vhost '{vhost}': {exc.reply_text}") from None
    finally:
        connection.close()


def _parameters(options: Any) -> Any:
    import pika

    url = str(option(options, "url", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    params = pika.URLParameters(url)
    user, password = option(options, "user"), option(options, "password")
    if user is not None or password is not None:
        params.credentials = pika.PlainCredentials(str(user or "guest"), str(password or "guest"))
    vhost = option(options, "vhost")
    if vhost is not None:
        params.virtual_host = str(vhost)
    timeout = float(option(options, "timeout", 30))
    params.socket_timeout = params.blocked_connection_timeout = timeout
    params.heartbeat = 0
    return params


def _queues(options: Any) -> list[str]:
    raw = option(options, "queue")
    if not raw:
        raise ValueError("warren (amqp): set the option 'queue'")
    return [q.strip() for q in str(raw).split(",") if q.strip()]


def _row(queue: str, position: int, method: Any, props: Any, body: bytes, text: bool) -> tuple:
    headers = None
    if props.headers:
        headers = {str(k): (v if isinstance(v, str) or v is None else
                            v.decode("utf-8", "replace") if isinstance(v, bytes) else
                            json.dumps(v, default=str)) for k, v in props.headers.items()}
    stamp = props.timestamp
    if stamp is not None:
        stamp = datetime.datetime.fromtimestamp(int(stamp), datetime.timezone.utc)
    return (queue, position, body.decode("utf-8", "replace") if text else bytes(body), method.exchange,
            method.routing_key, headers, props.content_type, props.content_encoding, props.delivery_mode,
            props.priority, props.correlation_id, props.reply_to, props.expiration, props.message_id, stamp,
            props.type, props.user_id, props.app_id, bool(method.redelivered))


def consume(channel: Any, queue: str, max_rows: int, text: bool) -> tuple[list[tuple], int]:
    """Up to ``max_rows`` messages by basic.get with manual ack: (rows, last delivery tag)."""
    rows: list[tuple] = []
    last_tag = 0
    while len(rows) < max_rows:
        method, props, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            break
        rows.append(_row(queue, len(rows), method, props, body, text))
        last_tag = method.delivery_tag
    return rows, last_tag


class QueuePartition(InputPartition):
    def __init__(self, queue: str) -> None:
        super().__init__(queue)
        self.queue = queue


class AmqpBatchReader(DataSourceReader):
    def __init__(self, options: Any, schema: StructType) -> None:
        self.queues = _queues(options)
        self.max_rows = int_option(options, "maxRows", DEFAULT_MAX_ROWS)
        self.text = str(option(options, "bodyFormat", "binary")).lower() in ("text", "json")
        self.options = {key: option(options, key) for key in ("url", "user", "password", "vhost", "timeout")}
        self.schema = schema

    def partitions(self) -> list[QueuePartition]:
        return [QueuePartition(queue) for queue in self.queues]

    def read(self, partition: QueuePartition) -> Iterator[tuple]:  # type: ignore[override]  # Spark passes what partitions() made
        options = {k: v for k, v in self.options.items() if v is not None}
        connection = connect(options)
        try:
            rows, _ = consume(connection.channel(), partition.queue, self.max_rows, self.text)
        finally:
            connection.close()  # unacked: every message goes back to the queue
        names = self.schema.fieldNames()
        full = base_schema().fieldNames()
        picks = [full.index(name) for name in names]
        for row in rows:
            yield tuple(row[i] for i in picks)


def drain_amqp(spark: Any, write: Callable[[Any], Any] | None = None, **options: Any) -> Any:
    """Consume (acks held), build and materialise the DataFrame, then ack: at-least-once."""
    opts = {k: v for k, v in options.items() if v is not None and k != "mode"}
    max_rows = int(opts.get("maxRows", DEFAULT_MAX_ROWS))
    text = str(opts.get("bodyFormat", "binary")).lower() in ("text", "json")
    schema = amqp_schema(opts)
    connection = connect(opts)
    try:
        channel = connection.channel()
        rows: list[tuple] = []
        tags: list[int] = []
        for queue in _queues(opts):
            got, last = consume(channel, queue, max_rows - len(rows), text)
            rows.extend(got)
            if last:
                tags.append(last)
        df = spark.createDataFrame(rows, schema)
        result = write(df) if write is not None else df.localCheckpoint(eager=True)
        if tags:
            channel.basic_ack(max(tags), multiple=True)  # one channel: its tags grow across queues
        return result
    finally:
        connection.close()

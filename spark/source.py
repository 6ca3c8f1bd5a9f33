"""``spark.read.format("warren")`` / ``spark.readStream.format("warren")``: queues as DataFrames.

Reads go through the management port (``mgmt_http/offsets.py``, the broker side in ``amqp_server/spark_bridge/``):
each ready message of a queue has an *offset* (its per-queue sequence number, stable across broker restarts for
durable queues), ``/records`` returns offset ranges as Arrow IPC without changing the queue, and ``/commit``
removes everything below an offset (idempotent, monotonic).

Batch
    ``load()`` runs :meth:`WarrenDataSource.schema` (in a Python worker), which checks the broker,
    login, permission and every queue, and *pins* each queue's ``[head, tail)`` in the offset
    column's metadata (``df.schema["offset"].metadata["warren"]``).  Every action and every task
    retry reads those offsets, split every ``partitionSize`` into partitions; with a
    user-given ``.schema(...)`` the range is pinned at the first action instead.  ``mode=browse``
    (the default) leaves the queue as it is.  ``mode=drain`` reads exactly like browse and removes
    nothing by itself: removal is :func:`spark.drain.commit` (``commit(df)``), called once the data is
    materialised, up to the pinned end; :func:`spark.drain.drain` does load, materialise and commit
    in one call.  A source cannot remove during ``read()`` honestly: Spark re-reads on every action
    and retry and never tells it when the data is safe (see :mod:`spark.drain`).
Errors
    A missing queue or vhost, a failed login, a refused permission or an unreachable broker raise
    :class:`WarrenError` at ``load()`` with one line starting ``warren:``.  PySpark reports it as an
    ``AnalysisException`` ``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source
    instance: ...`` (a prefix a source cannot change) followed by that line — by a short Python
    traceback first unless ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` is true;
    :func:`error_reason` extracts the line.
Streaming
    Offsets are ``{queue: next offset}``.  ``initialOffset`` is each queue's head,
    ``latestOffset`` its tail, capped by ``maxRowsPerTrigger`` (offsets, summed over queues).
    With ``mode=drain``, ``commit(end)`` removes what the query has processed — Spark calls it
    one batch late, again after a restart, and never for the last ``AvailableNow`` batch (that
    batch's messages stay in the queue until the next run commits them); with ``mode=browse``
    nothing is removed and the checkpoint alone tracks the position.  ``Trigger.AvailableNow``
    is supported.

Exactly once holds when this reader is the queue's only consumer (publishers can be many).
Messages that AMQP consumers hold unacked are not visible to a read; if they are requeued
later, behind a committed offset, the next commit covering them removes them unread.
A queue that is deleted and declared again starts its offsets again from 0: a streaming
checkpoint taken before that is stale.

Options (case-insensitive): ``url`` (management endpoint, ``http://127.0.0.1:15672``), ``user``,
``password`` (guest/guest), ``vhost`` (``/``), ``queue`` (comma-separated) or ``queuePattern``
(a regex searched in queue names of the vhost, resolved at ``load()``),
``mode`` (browse|drain), ``partitionSize`` (offsets per partition at most, 250000: a Spark task costs
tenths of a second, so small partitions are slow), ``partitionBytes`` (bodies per partition, about;
64 MiB), ``minPartitions`` (at least this many in all, to keep every core busy: the planning machine's
core count), ``maxRowsPerTrigger``, ``bodyFormat``
(binary|text|json; json with ``bodySchema`` — a DDL string such as ``"id INT, name STRING"`` —
makes ``body`` a struct of that schema, parsed per message with invalid JSON giving null; json
without ``bodySchema`` is text, use ``from_json``),
``timeout`` (seconds per HTTP call, 60), ``protocol`` (http|amqp, see :mod:`spark.amqp`).
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StringType, StructType

try:
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # PySpark before 4.2: no admission control, AvailableNow reads everything
    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]  # stand-ins, never called
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]  # a base that adds nothing

from .common import WarrenError, base_schema, int_option, option, parse_body_schema

DEFAULT_URL = "http://127.0.0.1:15672"
DEFAULT_PARTITION_SIZE = 250_000
DEFAULT_PARTITION_BYTES = 64 << 20
PAGE_ROWS = 1_000_000  # the server's cap on one /records answer


# -- options and the HTTP client ---------------------------------------------------------------

@dataclass
class Settings:
    url: str
    user: str
    password: str
    vhost: str
    queues: list[str] | None
    pattern: str | None
    mode: str
    partition_size: int
    partition_bytes: int
    min_partitions: int
    max_rows: int | None
    body_format: str
    body_schema: str | None
    timeout: float

    @classmethod
    def from_options(cls, options: Any) -> "Settings":
        queues = option(options, "queue")
        pattern = option(options, "queuePattern")
        if not queues and not pattern:
            raise ValueError("warren: set the option 'queue' (comma-separated) or 'queuePattern'")
        mode = str(option(options, "mode", "browse")).lower()
        if mode not in ("browse", "drain"):
            raise ValueError("warren: mode must be browse or drain")
        body_format = str(option(options, "bodyFormat", "binary")).lower()
        if body_format not in ("binary", "text", "json"):
            raise ValueError("warren: bodyFormat must be binary, text or json")
        max_rows = int_option(options, "maxRowsPerTrigger", None)
        size = int_option(options, "partitionSize", DEFAULT_PARTITION_SIZE)
        size_bytes = int_option(options, "partitionBytes", DEFAULT_PARTITION_BYTES)
        min_partitions = int_option(options, "minPartitions", os.cpu_count() or 1)
        return cls(url=str(option(options, "url", DEFAULT_URL)).rstrip("/"), user=str(option(options, "user", "guest")),
                   password=str(option(options, "password", "guest")), vhost=str(option(options, "vhost", "/")),
                   queues=[q.strip() for q in str(queues).split(",") if q.strip()] if queues else None,
                   pattern=str(pattern) if pattern and not queues else None, mode=mode, partition_size=size,
                   partition_bytes=size_bytes, min_partitions=min_partitions,
                   max_rows=max_rows, body_format=body_format,
                   body_schema=option(options, "bodySchema"), timeout=float(option(options, "timeout", 60)))

    def schema(self, ranges: dict[str, list[int]] | None = None) -> StructType:
        """The DataFrame's schema; ``ranges`` (from :meth:`Client.pin`) go in the offset column's metadata,
        without the password: ``df.schema`` is for everyone to see."""
        pin = None
        if ranges is not None:
            pin = {"url": self.url, "vhost": self.vhost, "user": self.user, "mode": self.mode, "ranges": ranges}
        if self.body_format == "binary":
            return base_schema(None, pin)
        if self.body_format == "json" and self.body_schema:
            return base_schema(parse_body_schema(self.body_schema), pin)
        return base_schema(StringType(), pin)


class RecordsApi:
    """The management API's offsets, records and commit endpoints (stdlib HTTP, basic auth)."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        token = base64.b64encode(f"{settings.user}:{settings.password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"}

    def _path(self, queue: str, what: str) -> str:
        q = urllib.parse.quote
        return f"{self.s.url}/api/queues/{q(self.s.vhost, safe='')}/{q(queue, safe='')}/{what}"

    def _open(self, url: str, body: dict | None = None, queue: str | None = None) -> Any:
        data = None
        headers = dict(self.headers)
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
        try:
            return urllib.request.urlopen(request, timeout=self.s.timeout)
        except urllib.error.HTTPError as exc:
            challenged = "WWW-Authenticate" in exc.headers  # 401 + challenge: who are you? (else: you may not)
            detail = exc.read().decode(errors="replace")
            raise self._refused(exc.code, challenged, detail, url, queue) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            text = "timed out" if isinstance(reason, TimeoutError) else getattr(reason, "strerror", None) or reason
            raise WarrenError(f"warren: cannot reach the management API at {self.s.url}: {text}") from None

    def _refused(self, status: int, challenged: bool, detail: str, url: str, queue: str | None) -> WarrenError:
        """An error answer as one line saying what is wrong in the user's terms (options, names).

        RabbitMQ's management API answers "not allowed" with 401 too, only without the challenge."""
        where = f"in vhost '{self.s.vhost}'"
        if status == 401 and challenged:
            message = (f"warren: login failed for user '{self.s.user}' at {self.s.url} "
                       "(check the options user and password)")
        elif status in (401, 403):
            what = f"queue '{queue}' {where}" if queue else f"vhost '{self.s.vhost}'"
            message = f"warren: access refused: user '{self.s.user}' may not read {what}"
        elif status == 404 and queue is not None and self._vhost_exists():
            message = f"warren: queue '{queue}' not found {where}"
        elif status == 404:
            message = f"warren: vhost '{self.s.vhost}' not found at {self.s.url}"
        else:
            message = f"warren: {status} from {url}: {' '.join(detail.split())[:300]}"
        return WarrenError(message, status)

    def _vhost_exists(self) -> bool:
        """Tells a missing queue from a missing vhost: the API answers both with a bare 404."""
        try:
            self._open(f"{self.s.url}/api/vhosts/{urllib.parse.quote(self.s.vhost, safe='')}").close()
        except WarrenError as exc:
            return exc.status != 404
        return True

    def _json(self, url: str, body: dict | None = None, queue: str | None = None) -> Any:
        with self._open(url, body, queue) as response:
            return json.loads(response.read())

    def queue_names(self) -> list[str]:
        if self.s.queues:
            return list(self.s.queues)
        names = self._json(f"{self.s.url}/api/queues/{urllib.parse.quote(self.s.vhost, safe='')}?columns=name")
        regex = re.compile(self.s.pattern or "")
        return sorted(item["name"] for item in names if regex.search(item["name"]))

    def offsets(self, queue: str) -> dict[str, int]:
        return self._json(self._path(queue, "offsets"), queue=queue)

    def commit(self, queue: str, offset: int) -> dict[str, int]:
        return self._json(self._path(queue, "commit"), {"offset": int(offset)}, queue=queue)

    def pin(self) -> tuple[dict[str, list[int]], dict[str, float]]:
        """Each queue's ``[head, tail)`` now (what a batch read will read, on every action and retry), and its
        mean body size, for planning partitions."""
        ranges, sizes = {}, {}
        for queue in self.queue_names():
            offsets = self.offsets(queue)
            ranges[queue] = [offsets["head"], offsets["tail"]]
            count = offsets.get("messages") or 0
            sizes[queue] = offsets.get("bytes", 0) / count if count else 0.0
        return ranges, sizes

    def records(self, queue: str, start: int, end: int, columns: list[str] | None = None) -> Iterator[Any]:
        """Record batches of ``[start, end)``, paging through the server's per-answer cap; of ``columns`` and
        the offset (None: all), so that the broker decodes and sends no other."""
        import pyarrow as pa

        params = {"end": end, "limit": PAGE_ROWS, "body": "binary" if self.s.body_format == "binary" else "text"}
        if columns is not None:
            params["columns"] = ",".join(["offset", *(name for name in columns if name != "offset")])
        while start < end:
            query = urllib.parse.urlencode({"start": start, **params})
            count, last = 0, -1
            with self._open(f"{self._path(queue, 'records')}?{query}", queue=queue) as response:
                for batch in pa.ipc.open_stream(response):
                    if batch.num_rows:
                        count += batch.num_rows
                        last = batch.column("offset")[-1].as_py()
                        yield batch
            if count < PAGE_ROWS:
                return
            start = last + 1


# -- partitions and reading --------------------------------------------------------------------

class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of one queue: what one task reads, the same on every retry."""

    def __init__(self, queue: str, start: int, end: int) -> None:
        super().__init__((queue, start, end))
        self.queue = queue
        self.start = start
        self.end = end


def plan(ranges: dict[str, list[int]], sizes: dict[str, float], settings: Settings) -> list[OffsetRange]:
    """Partitions of each queue's range: at most ``partitionSize`` offsets and about ``partitionBytes`` of bodies
    each, and at least ``minPartitions`` in all (every core busy), spread over the queues by their size."""
    total = sum(max(end - start, 0) for start, end in ranges.values())
    parts: list[OffsetRange] = []
    for queue, (start, end) in sorted(ranges.items()):
        n = end - start
        if n <= 0:
            continue
        count = max(math.ceil(n / settings.partition_size),
                    math.ceil(n * sizes.get(queue, 0.0) / settings.partition_bytes),
                    math.ceil(settings.min_partitions * n / total))
        step = math.ceil(n / min(count, n))
        parts.extend(OffsetRange(queue, s, min(s + step, end)) for s in range(start, end, step))
    return parts


def read_range(settings: Settings, schema: StructType, part: OffsetRange) -> Iterator[Any]:
    """Record batches of one range, in the exact Arrow schema Spark expects for ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    names = target.names
    parse_json = (settings.body_format == "json" and "body" in names
                  and isinstance(schema["body"].dataType, StructType))
    narrow = None if set(names) >= set(base_schema().fieldNames()) else names  # a .schema(...) of a few columns
    for batch in RecordsApi(settings).records(part.queue, part.start, part.end, narrow):
        if parse_json:
            batch = _parse_bodies(batch, target.field("body").type)
        batch = batch.select(names)
        if not batch.schema.equals(target):
            batch = batch.cast(target)
        yield batch


def _parse_bodies(batch: Any, body_type: Any) -> Any:
    import pyarrow as pa

    values = []
    for text in batch.column("body").to_pylist():
        try:
            value = json.loads(text) if text is not None else None
        except ValueError:
            value = None
        values.append(value if isinstance(value, dict) else None)
    try:
        column = pa.array(values, body_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # one odd value must not fail the batch: row by row
        column = pa.array([_coerce(v, body_type) for v in values], body_type)
    index = batch.schema.get_field_index("body")
    return batch.set_column(index, pa.field("body", body_type), column)


def _coerce(value: Any, body_type: Any) -> Any:
    import pyarrow as pa

    try:
        pa.array([value], body_type)
        return value
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


# -- batch -------------------------------------------------------------------------------------

class WarrenBatchReader(DataSourceReader):
    def __init__(self, settings: Settings, schema: StructType, ranges: dict[str, list[int]],
                 sizes: dict[str, float]) -> None:
        self.settings = settings
        self.schema = schema
        self.ranges = ranges
        self.sizes = sizes

    def partitions(self) -> list[OffsetRange]:
        return plan(self.ranges, self.sizes, self.settings) or [OffsetRange("", 0, 0)]

    def read(self, partition: OffsetRange) -> Iterator[Any]:  # type: ignore[override]  # Spark passes what partitions() made
        if partition.start >= partition.end:
            return iter(())
        return read_range(self.settings, self.schema, partition)


# -- streaming ---------------------------------------------------------------------------------

class WarrenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: Settings, schema: StructType) -> None:
        self.settings = settings
        self.schema = schema
        self.queues = RecordsApi(settings).queue_names()  # fixed for the life of the query
        self.target: dict[str, int] | None = None  # AvailableNow: nothing beyond this

    def initialOffset(self) -> dict[str, int]:
        client = RecordsApi(self.settings)
        return {queue: client.offsets(queue)["head"] for queue in self.queues}

    def getDefaultReadLimit(self) -> Any:
        if self.settings.max_rows and ReadMaxRows is not None:
            return ReadMaxRows(self.settings.max_rows)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        client = RecordsApi(self.settings)
        self.target = {queue: client.offsets(queue)["tail"] for queue in self.queues}

    def _tails(self) -> dict[str, int]:
        if self.target is not None:
            return dict(self.target)
        client = RecordsApi(self.settings)
        return {queue: client.offsets(queue)["tail"] for queue in self.queues}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict[str, int]:
        tails = self._tails()
        start = start or {}
        budget = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif limit is None and self.settings.max_rows:
            budget = self.settings.max_rows
        end: dict[str, int] = {}
        for queue in self.queues:
            begin = int(start.get(queue, 0))
            if tails[queue] < begin:
                raise WarrenError(f"warren: offsets of queue '{queue}' went back ({tails[queue]} < {begin}): the "
                                  "queue was deleted and declared again, or was not durable; start the query "
                                  "with a new checkpoint")
            tail = tails[queue]
            if budget is not None:
                take = min(tail - begin, budget)
                budget -= take
                tail = begin + take
            end[queue] = tail
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._tails()

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        return plan({queue: [int(start.get(queue, 0)), int(end[queue])] for queue in end}, {}, self.settings)

    def read(self, partition: OffsetRange) -> Iterator[Any]:  # type: ignore[override]  # Spark passes what partitions() made
        if partition.start >= partition.end:
            return iter(())
        return read_range(self.settings, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Spark has processed everything below ``end``: drain mode removes it (idempotent on the broker)."""
        if self.settings.mode != "drain":
            return
        client = RecordsApi(self.settings)
        for queue, offset in end.items():
            client.commit(queue, int(offset))


# -- the data source ---------------------------------------------------------------------------

class WarrenDataSource(DataSource):
    """``format("warren")``: see this module's docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "warren"

    def _protocol(self) -> str:
        return str(option(self.options, "protocol", "http")).lower()

    def schema(self) -> StructType:
        """Runs at ``load()`` (in a Python worker): checks the broker, queues, login and permission
        now, and pins each queue's range, so errors surface at ``load()`` and every action reads
        the same offsets."""
        if self._protocol() == "amqp":
            from .amqp import amqp_schema

            return amqp_schema(self.options)
        settings = Settings.from_options(self.options)
        try:
            self.ranges, self.sizes = RecordsApi(settings).pin()
        except WarrenError as exc:
            raise exc.with_traceback(None) from None  # Spark shows this text: keep it to the reason
        return settings.schema(self.ranges)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self._protocol() == "amqp":
            from .amqp import AmqpBatchReader

            return AmqpBatchReader(self.options, schema)
        settings = Settings.from_options(self.options)
        # Spark hands reader() the instance schema() ran on (pickled), so load()'s ranges are here;
        # with a user-given .schema(...) schema() never ran: pin now, at planning.
        ranges, sizes = getattr(self, "ranges", None), getattr(self, "sizes", {})
        if ranges is None:
            ranges, sizes = RecordsApi(settings).pin()
        return WarrenBatchReader(settings, schema, ranges, sizes)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self._protocol() == "amqp":
            raise ValueError("warren: protocol=amqp supports batch reads only")
        return WarrenStreamReader(Settings.from_options(self.options), schema)

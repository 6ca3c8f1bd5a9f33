"""Draining a queue from a batch read, in two phases: pin and read, then remove what was pinned.

A batch source cannot drain by itself: Spark tells it neither when the data is safe (written, or
checkpointed) nor how many times an action will re-read it (each action reads again; a failed
task is retried).  Removing during ``read()`` would lose messages on any failure after it and
give a second action different rows.  So ``mode=drain`` only *pins* the range at ``load()`` and
:func:`commit` — called by the user, or by :func:`drain` — removes it once the data is materialised.
"""
from __future__ import annotations

from typing import Any, Callable

from .common import WarrenError, pinned
from .source import RecordsApi, Settings, WarrenDataSource


def commit(df: Any, password: str = "guest") -> dict[str, int]:
    """Remove what ``df`` — a batch DataFrame loaded with ``mode=drain`` — was pinned to read.

    Call it after materialising ``df`` (a write, or ``localCheckpoint(eager=True)``).  Each queue is
    committed up to the end of the range ``load()`` fixed, so messages published since stay.
    Idempotent.  ``password`` is not kept in ``df.schema``, so pass it again (default guest).
    Returns ``{queue: messages removed}``.
    """
    if df.isStreaming:
        raise WarrenError("warren: commit() is for batch DataFrames; a streaming query with mode=drain "
                          "commits as Spark completes each micro-batch")
    pin = pinned(df.schema)
    if not pin or pin.get("mode") != "drain":
        raise WarrenError("warren: commit() needs the DataFrame that load() returned with mode=drain "
                          "(and no .schema(...): load() pins the range in the offset column's metadata)")
    ranges: dict[str, list[int]] = pin["ranges"]
    if not ranges:
        return {}
    settings = Settings.from_options({"url": pin["url"], "vhost": pin["vhost"], "user": pin["user"],
                                      "password": password, "queue": ",".join(ranges), "mode": "drain"})
    client = RecordsApi(settings)
    return {queue: client.commit(queue, end)["removed"] for queue, (_, end) in ranges.items()}


def drain(spark: Any, write: Callable[[Any], Any] | None = None, **options: Any) -> Any:
    """Both phases in one call: load with ``mode=drain``, materialise, then :func:`commit`.

    Materialising is ``write(df)`` when given (e.g. ``lambda df: df.write.parquet(path)``: the data is
    safe on storage before anything leaves the queue), else ``df.localCheckpoint(eager=True)``
    (kept by the executors; lost if one dies after the commit — use ``write`` when that matters).
    A failure before the commit leaves every message in the queue.  Returns the checkpointed
    DataFrame, or with ``write`` what ``write`` returned (the lazy DataFrame would read an empty
    range once committed).  ``protocol="amqp"`` drains a plain AMQP queue instead
    (:func:`spark.amqp.drain_amqp`, at-least-once).
    """
    if str(options.get("protocol", "http")).lower() == "amqp":
        from .amqp import drain_amqp

        return drain_amqp(spark, write=write, **options)
    spark.dataSource.register(WarrenDataSource)
    opts = {k: str(v) for k, v in options.items() if v is not None}
    opts["mode"] = "drain"
    df = spark.read.format("warren").options(**opts).load()
    result = write(df) if write is not None else df.localCheckpoint(eager=True)
    commit(df, password=opts.get("password", "guest"))
    return result

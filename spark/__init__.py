"""Warren queues as Spark DataFrames: a PySpark (4.x) Python Data Source, batch and streaming.

    from spark import WarrenDataSource, drain
    spark.dataSource.register(WarrenDataSource)
    df = (spark.read.format("warren").option("url", "http://127.0.0.1:15672")
          .option("queue", "orders").load())                    # browse: the queue stays as it is
    df = drain(spark, url="http://127.0.0.1:15672", queue="orders")   # read, materialise, then remove

See :mod:`spark.source` for options and delivery semantics, :mod:`spark.amqp` for the fallback
that reads any AMQP 0-9-1 broker (at-least-once).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .source import Client, Settings, WarrenDataSource, base_schema

__all__ = ["WarrenDataSource", "drain", "base_schema", "register"]


def register(spark: Any) -> None:
    spark.dataSource.register(WarrenDataSource)


def drain(spark: Any, write: Callable[[Any], Any] | None = None, **options: Any) -> Any:
    """Two-phase drain: fix each queue's ``[head, tail)`` now, read it, materialise, then commit.

    Materialising is ``write(df)`` when given (e.g. ``lambda df: df.write.parquet(path)``: the data is
    safe on storage before anything leaves the queue), else ``df.localCheckpoint(eager=True)``
    (kept by the executors; lost if one dies after the commit — use ``write`` when that matters).
    Only then is each queue committed up to the end of its range, so a failure before the commit
    leaves every message in the queue, and messages published meanwhile (beyond the range) stay.
    Returns the checkpointed DataFrame, or with ``write`` what ``write`` returned (the lazy DataFrame
    itself would read an empty range once committed).
    ``protocol="amqp"`` drains a plain AMQP queue instead (see :func:`spark.amqp.drain_amqp`).
    """
    if str(options.get("protocol", "http")).lower() == "amqp":
        from .amqp import drain_amqp

        return drain_amqp(spark, write=write, **options)
    register(spark)
    opts = {k: str(v) for k, v in options.items() if v is not None}
    opts["mode"] = "drain"
    settings = Settings.from_options(opts)
    client = Client(settings)
    ranges = {}
    for queue in client.queue_names():
        offsets = client.offsets(queue)
        ranges[queue] = [offsets["head"], offsets["tail"]]
    opts["offsetRanges"] = json.dumps(ranges)
    df = spark.read.format("warren").options(**opts).load()
    if write is not None:
        result = write(df)
    else:
        result = df.localCheckpoint(eager=True)
    for queue, (_, end) in ranges.items():
        client.commit(queue, end)
    return result

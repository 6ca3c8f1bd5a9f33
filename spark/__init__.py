"""Warren queues as Spark DataFrames: a PySpark (4.x) Python Data Source, batch and streaming.

    from spark import WarrenDataSource, commit, drain
    spark.dataSource.register(WarrenDataSource)
    df = (spark.read.format("warren").option("url", "http://127.0.0.1:15672")
          .option("queue", "orders").load())                    # browse: the queue stays as it is
    df = drain(spark, url="http://127.0.0.1:15672", queue="orders")   # read, materialise, then remove

See :mod:`spark.source` for options and delivery semantics, :mod:`spark.drain` for why draining
is two-phase, :mod:`spark.amqp` for the fallback that reads any AMQP 0-9-1 broker (at-least-once).
"""
from __future__ import annotations

from typing import Any

from .drain import commit, drain
from .common import WarrenError, base_schema, error_reason
from .source import WarrenDataSource

__all__ = ["WarrenDataSource", "WarrenError", "base_schema", "commit", "drain", "error_reason", "register"]


def register(spark: Any) -> None:
    spark.dataSource.register(WarrenDataSource)

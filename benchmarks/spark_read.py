#!/usr/bin/env python3
"""Spark read benchmark: a queue backlog into a DataFrame ``count()``, Warren's source vs the AMQP fallback.

Against a running node (``--port`` AMQP, ``--mgmt-port`` management API):

1. declares a transient queue ``warren-bench.spark`` (deleted first and at the end) and publishes
   ``--messages`` (1,000,000) ``--size`` (16) byte messages with publisher confirms (the raw-socket
   publisher of amqp_load.py);
2. starts a local SparkSession (``local[--cores]``, driver memory 4g) and times
   ``spark.read.format("warren")...load().count()`` ``--runs`` (3) times: rows/s of each run (the first
   includes starting Spark's Python workers), partitions (``--partition-size`` offsets each, default
   250000); ``load()`` (which pins the ranges) is timed apart; then ``toPandas()`` of ``offset, body``;
   then the same two on a Python data source that yields the queue's first record batch over and over from
   memory, as many rows in as many partitions (PySpark's own ceiling for a Python data source of this schema:
   what its Python workers and JVM take, with no broker), and on a Parquet file of the same rows (Spark's
   own reader, which needs no Python at all); and ``count()`` with a ``.schema(...)`` of ``offset, body`` and of
   ``offset`` alone (the broker sends only those columns);
3. with ``--amqp-rows N``: times the AMQP fallback (``protocol=amqp``, basic.get with pika,
   one partition per queue, requeued afterwards) reading ``N`` messages of the same queue;
4. with ``--baseline``: times, in a fresh SparkSession of its own (another process), the first action on a
   Python data source that reads nothing: PySpark's own cost of a first action (planning in Python, starting
   its Python workers), which Warren's first action includes.

    ./run.sh --amqp-port 5701 --mgmt-port 15701 --data-dir /tmp/bench-node &
    .venv/bin/python benchmarks/spark_read.py --port 5701 --mgmt-port 15701 --messages 1000000 --size 16
    .venv/bin/python benchmarks/spark_read.py --port 5701 --mgmt-port 15701 --messages 100000 --size 4096 \\
        --amqp-rows 20000

Spark start-up (5-10 s) is not in any figure.  Output is a table, or JSON with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from amqp_load import Connection, publish_confirmed  # noqa: E402 (after sys.path takes this folder)

QUEUE = "warren-bench.spark"
NARROW = {"offset+body": "offset long, body binary", "offset": "offset long"}  # counted with these schemas too


def fill(args: argparse.Namespace) -> float:
    """Publish the backlog; messages/s until the last confirm."""
    conn = Connection(args.host, args.port, args.user, args.password, args.vhost)
    conn.channel_open(1)
    conn.queue_delete(1, QUEUE)
    conn.queue_declare(1, QUEUE, durable=args.persistent)
    conn.confirm_select(1)
    result = publish_confirmed(conn, QUEUE, b"x" * args.size, args.messages, persistent=args.persistent,
                               timeout=args.timeout)
    conn.close()
    return args.messages / result["confirmed_s"]


def delete_queue(args: argparse.Namespace) -> None:
    conn = Connection(args.host, args.port, args.user, args.password, args.vhost)
    conn.channel_open(1)
    conn.queue_delete(1, QUEUE)
    conn.close()


def session(args: argparse.Namespace):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark import WarrenDataSource

    spark = (SparkSession.builder.master(f"local[{args.cores}]").appName("warren-spark-read")
             .config("spark.driver.memory", "4g").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(WarrenDataSource)
    return spark


def baseline(args: argparse.Namespace) -> dict:
    """``load()`` and a first ``count()`` of a Python data source of 40 rows in a fresh session, as the Warren
    source's partitions would be planned (4 of them): what PySpark itself takes on a first action."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Trivial(DataSource):
        @classmethod
        def name(cls) -> str:
            return "trivial"

        def schema(self) -> str:
            return "x long"

        def reader(self, schema):
            return TrivialReader()

    class TrivialReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(4)]

        def read(self, partition):
            import pyarrow as pa
            yield pa.record_batch([pa.array(range(10), pa.int64())], names=["x"])

    spark = session(args)
    try:
        spark.dataSource.register(Trivial)
        return time_count(spark.read.format("trivial").load)
    finally:
        spark.stop()


def register_memory_source(spark, url: str, user: str, password: str, rows: int, partitions: int) -> None:
    """``format("warren-memory")``: the queue's first rows as one record batch of the size Warren serves from disk
    (``DEFAULT_BATCH_ROWS``, or about ``BATCH_BYTES`` of bodies), in the source's schema, yielded from memory until
    each partition has its share of ``rows``."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from amqp_server.spark_bridge.record_stream import BATCH_BYTES, DEFAULT_BATCH_ROWS
    from spark.source import RecordsApi, Settings, read_range, OffsetRange

    settings = Settings.from_options({"url": url, "user": user, "password": password, "queue": QUEUE})
    offsets = RecordsApi(settings).offsets(QUEUE)
    first = offsets["head"]
    schema = settings.schema()
    size = min(DEFAULT_BATCH_ROWS, max(1, BATCH_BYTES * offsets["messages"] // max(1, offsets["bytes"])))
    table = pa.Table.from_batches(list(read_range(settings, schema, OffsetRange(QUEUE, first, first + size))))
    batch = table.combine_chunks().to_batches()[0]  # one batch of the size Warren serves from disk
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    stream = sink.getvalue().to_pybytes()
    share = rows // partitions

    class MemoryReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(share + (rows % partitions if i == 0 else 0)) for i in range(partitions)]

        def read(self, partition):
            one = pa.ipc.open_stream(stream).read_next_batch()
            left = partition.value
            while left > 0:
                yield one.slice(0, min(left, one.num_rows))
                left -= one.num_rows

    class Memory(DataSource):
        @classmethod
        def name(cls) -> str:
            return "warren-memory"

        def schema(self):
            return schema

        def reader(self, schema):
            return MemoryReader()

    spark.dataSource.register(Memory)


def time_count(load) -> dict:
    started = time.perf_counter()
    df = load()
    loaded = time.perf_counter()
    rows = df.count()
    done = time.perf_counter()
    return {"rows": rows, "load_s": round(loaded - started, 3), "count_s": round(done - loaded, 3),
            "rows_per_s": round(rows / (done - loaded)), "partitions": df.rdd.getNumPartitions()}


def time_pandas(load) -> dict:
    """``toPandas()`` of ``offset, body``: the rows cross from Spark's JVM to this Python process too."""
    df = load().select("offset", "body")
    started = time.perf_counter()
    frame = df.toPandas()
    done = time.perf_counter()
    return {"rows": len(frame), "to_pandas_s": round(done - started, 3),
            "rows_per_s": round(len(frame) / (done - started))}


def run(args: argparse.Namespace) -> dict:
    result: dict = {"messages": args.messages, "size": args.size, "cores": args.cores,
                    "partition_size": args.partition_size}
    if args.baseline:
        command = [sys.executable, os.path.abspath(__file__), "--only-baseline", "--cores", str(args.cores)]
        first = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        result["pyspark_first_action_s"] = round(first["load_s"] + first["count_s"], 2)
    result["publish_per_s"] = round(fill(args))
    spark = session(args)
    try:
        url = f"http://{args.host}:{args.mgmt_port}"

        def warren():  # a reader of its own each time: .schema(...) changes the reader it is called on
            return (spark.read.format("warren").option("url", url).option("user", args.user)
                    .option("password", args.password).option("vhost", args.vhost).option("queue", QUEUE)
                    .option("partitionSize", args.partition_size))

        reader = warren()
        result["warren"] = [time_count(reader.load) for _ in range(args.runs)]
        warm = result["warren"][1:] or result["warren"]  # the first action also starts Spark's Python workers
        result["warren_first_action_s"] = round(result["warren"][0]["load_s"] + result["warren"][0]["count_s"], 2)
        result["warren_median_rows_per_s"] = statistics.median(r["rows_per_s"] for r in warm)
        result["warren_mb_per_s"] = round(result["warren_median_rows_per_s"] * args.size / 1e6, 1)
        result["warren_pandas"] = [time_pandas(reader.load) for _ in range(args.runs)]
        for name, schema in NARROW.items():  # a .schema(...) of few columns: the broker sends only those
            result[name] = [time_count(warren().schema(schema).load) for _ in range(args.runs)]
        register_memory_source(spark, url, args.user, args.password, args.messages,
                               result["warren"][-1]["partitions"])
        memory = spark.read.format("warren-memory")
        result["memory"] = [time_count(memory.load) for _ in range(args.runs)]
        result["memory_pandas"] = [time_pandas(memory.load) for _ in range(args.runs)]
        with tempfile.TemporaryDirectory() as parquet:  # the same rows from a Parquet file: Spark's own reader
            reader.load().write.mode("overwrite").parquet(parquet)
            result["parquet"] = [time_count(lambda: spark.read.parquet(parquet)) for _ in range(args.runs)]
            result["parquet_pandas"] = [time_pandas(lambda: spark.read.parquet(parquet)) for _ in range(args.runs)]
        if args.amqp_rows:
            vhost = "%2F" if args.vhost == "/" else args.vhost
            amqp = (spark.read.format("warren").option("protocol", "amqp").option("queue", QUEUE)
                    .option("url", f"amqp://{args.user}:{args.password}@{args.host}:{args.port}/{vhost}")
                    .option("maxRows", args.amqp_rows))
            result["amqp"] = [time_count(amqp.load)]
    finally:
        spark.stop()
        if not args.keep:
            delete_queue(args)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672, help="AMQP port")
    ap.add_argument("--mgmt-port", type=int, default=15672, help="management API port")
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--vhost", default="/")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=16, help="body size in bytes")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--partition-size", type=int, default=250_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--persistent", action="store_true", help="a durable queue of persistent messages")
    ap.add_argument("--amqp-rows", type=int, default=0, help="also time the AMQP fallback reading this many")
    ap.add_argument("--timeout", type=float, default=1800.0, help="publish timeout (s)")
    ap.add_argument("--keep", action="store_true", help="keep the queue")
    ap.add_argument("--baseline", action="store_true", help="also time PySpark's own first action (see 4.)")
    ap.add_argument("--only-baseline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.only_baseline:
        print(json.dumps(baseline(args)))
        return 0
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.messages:,} x {args.size} B, publish {result['publish_per_s']:,} msg/s, local[{args.cores}]")
    print(f"  warren count after the first: median {result['warren_median_rows_per_s']:,} rows/s = "
          f"{result['warren_mb_per_s']} MB/s of bodies; "
          f"first action (load + count) {result['warren_first_action_s']} s")
    if "pyspark_first_action_s" in result:
        print(f"  PySpark's own first action (a Python data source reading nothing, fresh session): "
              f"{result['pyspark_first_action_s']} s")
    for name in ("warren", *NARROW, "memory", "parquet", "amqp"):
        for i, r in enumerate(result.get(name, []), 1):
            print(f"  {name:11} count run {i}: {r['rows']:,} rows in {r['count_s']:.2f} s = {r['rows_per_s']:,} rows/s "
                  f"({r['partitions']} partitions; load() {r['load_s']:.2f} s)")
    for name in ("warren_pandas", "memory_pandas", "parquet_pandas"):
        for i, r in enumerate(result.get(name, []), 1):
            print(f"  {name:14} toPandas(offset, body) run {i}: {r['rows']:,} rows in {r['to_pandas_s']:.2f} s = "
                  f"{r['rows_per_s']:,} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

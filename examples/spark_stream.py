"""Streaming: a Warren queue into parquet files, exactly once, resumable from the checkpoint.

    ./run.sh &
    .venv/bin/python examples/spark_stream.py --out /tmp/warren-out --checkpoint /tmp/warren-ckpt
    # run it again after publishing more: it carries on where the checkpoint says

``--mode drain`` removes what the query has processed (one micro-batch late, as Spark commits);
``--mode browse`` leaves the queue alone.  ``--available-now`` processes what is there and stops.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:15672")
    parser.add_argument("--queue", default="spark-demo")
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--mode", choices=("browse", "drain"), default="drain")
    parser.add_argument("--max-rows", type=int, default=10000, help="maxRowsPerTrigger")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--seconds", type=float, default=30, help="how long to run without --available-now")
    args = parser.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark import WarrenDataSource

    spark = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "2g")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(WarrenDataSource)

    stream = (spark.readStream.format("warren").option("url", args.url).option("queue", args.queue)
              .option("mode", args.mode).option("maxRowsPerTrigger", args.max_rows)
              .option("bodyFormat", "text").load())
    writer = (stream.select("queue", "offset", "body", "routing_key", "timestamp").writeStream
              .format("parquet").option("path", args.out).option("checkpointLocation", args.checkpoint))
    if args.available_now:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="1 second").start()
        query.awaitTermination(args.seconds)
        query.stop()
    print(query.lastProgress and {k: query.lastProgress[k] for k in ("batchId", "numInputRows")})
    print(f"{spark.read.parquet(args.out).count()} rows in {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()

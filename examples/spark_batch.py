"""Batch: read a Warren queue into a DataFrame (browse), then drain it (read, materialise, commit).

    ./run.sh &                                   # a local node: AMQP 5672, management 15672
    .venv/bin/python examples/spark_batch.py --publish 1000

Needs Java 17+ and ``pip install -e '.[spark]'``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:15672")
    parser.add_argument("--amqp-port", type=int, default=5672)
    parser.add_argument("--queue", default="spark-demo")
    parser.add_argument("--publish", type=int, default=0, help="publish this many JSON messages first")
    parser.add_argument("--drain", action="store_true", help="then remove what was read")
    args = parser.parse_args()

    if args.publish:
        import json

        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.amqp_port))
        channel = connection.channel()
        channel.queue_declare(args.queue, durable=True)
        for i in range(args.publish):
            channel.basic_publish("", args.queue, json.dumps({"id": i, "amount": i * 1.5}).encode(),
                                  pika.BasicProperties(content_type="application/json", delivery_mode=2))
        connection.close()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark import WarrenDataSource, drain

    spark = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "2g")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(WarrenDataSource)

    df = (spark.read.format("warren").option("url", args.url).option("queue", args.queue)
          .option("bodyFormat", "json").option("bodySchema", "id INT, amount DOUBLE").load())
    started = time.monotonic()
    count = df.count()
    print(f"{count} messages, count() in {time.monotonic() - started:.2f}s")
    df.select("offset", "body.id", "body.amount", "content_type").show(5)
    df.groupBy("content_type").count().show()

    if args.drain:
        drained = drain(spark, url=args.url, queue=args.queue)
        print(f"drained {drained.count()} messages")
    spark.stop()


if __name__ == "__main__":
    main()

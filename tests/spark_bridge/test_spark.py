"""The Spark bridge against a real SparkSession (local[2]) and a private node: batch, drain, streaming, auth."""
from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from conftest import CLIENT, ROOT, starts, unavailable
from support import channel_on, drain, publish_pipelined, publish_to

publish = partial(publish_to, declare=True)

if shutil.which("java") is None:
    unavailable("java is not installed: no SparkSession (test.sh installs default-jre-headless)")

pika = pytest.importorskip("pika")
pytest.importorskip("pyspark")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="session")
@starts(CLIENT)
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark import WarrenDataSource

    session = (SparkSession.builder.master("local[2]").appName("warren-tests")
               .config("spark.driver.memory", "2g").config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true").getOrCreate())
    session.dataSource.register(WarrenDataSource)
    yield session
    session.stop()


@pytest.fixture
def node(start_broker):
    return start_broker()


def mgmt(node) -> str:
    return f"http://127.0.0.1:{node.mgmt_port}"


def api(node, path: str, body: dict | None = None, user: str | None = "guest", password: str = "guest"):
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(mgmt(node) + path, headers=headers, method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def reader(spark, node, queue: str, **options):
    r = spark.read.format("warren").option("url", mgmt(node)).option("queue", queue)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def test_batch_browse_reads_every_message_and_leaves_queue(spark, node):
    publish(node, "orders", [f"m{i}".encode() for i in range(50)], content_type="text/plain", delivery_mode=2,
            headers={"k": "v", "n": 7, "nested": {"a": [1, 2]}}, priority=3, correlation_id="c",
            reply_to="r", message_id="id", timestamp=1700000000, type="t", app_id="app")
    df = reader(spark, node, "orders")
    assert [f.name for f in df.schema.fields] == [
        "queue", "offset", "body", "exchange", "routing_key", "headers", "content_type", "content_encoding",
        "delivery_mode", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
        "type", "user_id", "app_id", "redelivered"]
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(50))
    assert [bytes(r.body) for r in rows] == [f"m{i}".encode() for i in range(50)]
    row = rows[7]
    assert row.queue == "orders" and row.exchange == "" and row.routing_key == "orders"
    assert row.headers == {"k": "v", "n": "7", "nested": '{"a":[1,2]}'}
    assert (row.content_type, row.delivery_mode, row.priority, row.correlation_id, row.reply_to,
            row.message_id, row.type, row.app_id, row.redelivered) == (
        "text/plain", 2, 3, "c", "r", "id", "t", "app", False)
    assert int(row.timestamp.replace(tzinfo=__import__("datetime").timezone.utc).timestamp()) == 1700000000
    assert api(node, "/api/queues/%2F/orders/offsets").items() >= {"head": 0, "tail": 50, "committed": 0}.items()
    assert reader(spark, node, "orders").count() == 50  # browse is repeatable


def test_bodies_of_every_size_are_read_byte_exact(spark, node):
    from test_large_bodies import SIZES, body

    publish(node, "sizes", [body(size) for size in SIZES], delivery_mode=2)
    rows = reader(spark, node, "sizes").orderBy("offset").collect()
    assert [len(r.body) for r in rows] == SIZES
    assert all(bytes(r.body) == body(size) for r, size in zip(rows, SIZES))


def test_multiple_partitions_and_text_and_json(spark, node):
    publish(node, "p", [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(100)])
    publish(node, "p2", [b"x"] * 10)
    df = reader(spark, node, "p,p2", partitionSize=30)
    assert df.rdd.getNumPartitions() == 5  # 4 ranges of p, 1 of p2
    assert df.count() == 110
    assert sorted(r.offset for r in df.where("queue = 'p'").collect()) == list(range(100))
    text = reader(spark, node, "p", bodyFormat="text").orderBy("offset").first()
    assert text.body == '{"id": 0, "name": "n0"}'
    parsed = reader(spark, node, "p", bodyFormat="json", bodySchema="id INT, name STRING")
    assert parsed.where("body.id = 42").select("body.name").first()[0] == "n42"
    pattern = spark.read.format("warren").option("url", mgmt(node)).option("queuePattern", "^p").load()
    assert pattern.count() == 110


def test_drain_removes_exactly_what_was_read(spark, node):
    from spark import drain

    publish(node, "work", [str(i).encode() for i in range(40)], delivery_mode=2)
    df = drain(spark, url=mgmt(node), queue="work", partitionSize=16)
    publish(node, "work", [b"late"] * 5, delivery_mode=2)  # after the range was fixed: stays
    assert sorted(r.offset for r in df.collect()) == list(range(40))
    assert df.count() == 40  # materialised: the same answer again
    assert api(node, "/api/queues/%2F/work/offsets").items() >= {"head": 40, "tail": 45, "committed": 40}.items()
    rest = reader(spark, node, "work").collect()
    assert [bytes(r.body) for r in rest] == [b"late"] * 5


def test_mode_drain_pins_at_load_and_removes_on_commit(spark, node, tmp_path):
    from spark import WarrenError, commit

    publish(node, "jobs", [str(i).encode() for i in range(30)], delivery_mode=2)
    df = reader(spark, node, "jobs", mode="drain", partitionSize=10)
    assert df.schema["offset"].metadata["warren"]["ranges"] == {"jobs": [0, 30]}
    assert "password" not in df.schema["offset"].metadata["warren"]
    publish(node, "jobs", [b"late"] * 4, delivery_mode=2)  # after load(): not in the pinned range
    df.write.parquet(str(tmp_path / "jobs"))
    assert df.count() == 30  # every action reads the pinned range; nothing removed yet
    assert api(node, "/api/queues/%2F/jobs/offsets")["head"] == 0
    assert commit(df) == {"jobs": 30}
    assert commit(df) == {"jobs": 0}  # idempotent
    assert api(node, "/api/queues/%2F/jobs/offsets").items() >= {"head": 30, "tail": 34, "committed": 30}.items()
    assert sorted(int(bytes(r.body)) for r in spark.read.parquet(str(tmp_path / "jobs")).collect()) == list(range(30))
    with pytest.raises(WarrenError, match="mode=drain"):
        commit(reader(spark, node, "jobs"))  # a browse DataFrame is never committed
    from spark import base_schema

    given = spark.read.format("warren").schema(base_schema()).option("url", mgmt(node)).option("queue", "jobs")
    assert given.option("mode", "drain").load().count() == 4  # pinned at the action: the late ones
    copied = spark.read.format("warren").schema(df.schema).option("url", mgmt(node)).option("queue", "jobs").load()
    assert copied.count() == 4  # an old DataFrame's schema does not bring back its range
    with pytest.raises(WarrenError, match="mode=drain"):
        commit(given.load())


def _load_error(spark, node_url: str, queue: str, **options) -> str:
    """The error ``load()`` itself raises (no action is run), as a one-line Warren reason."""
    from spark import error_reason

    r = spark.read.format("warren").option("url", node_url).option("queue", queue)
    for key, value in options.items():
        r = r.option(key, str(value))
    with pytest.raises(Exception) as exc:
        r.load()
    text = str(exc.value)
    assert "JVM stacktrace" not in text and "Traceback" not in text, text
    first = text.splitlines()[0]
    reason = error_reason(exc.value)
    assert reason is not None and first.endswith(reason), text  # the reason is on the first line
    return reason


def test_load_fails_early_with_a_one_line_reason(spark, node):
    from conftest import free_port

    publish(node, "secret", [b"s"])
    url = mgmt(node)
    assert _load_error(spark, url, "nope") == "warren: queue 'nope' not found in vhost '/'"
    assert _load_error(spark, url, "secret", vhost="elsewhere") == (
        f"warren: vhost 'elsewhere' not found at {url}")
    assert _load_error(spark, url, "secret", password="wrong") == (
        f"warren: login failed for user 'guest' at {url} (check the options user and password)")
    assert node.admin("add-user", "writer", "pw", "--tags", "management").returncode == 0
    assert node.admin("set-permissions", "/", "writer", ".*", ".*", "^$").returncode == 0
    assert _load_error(spark, url, "secret", user="writer", password="pw") == (
        "warren: access refused: user 'writer' may not read queue 'secret' in vhost '/'")
    closed = f"http://127.0.0.1:{free_port()}"
    assert _load_error(spark, closed, "secret") == (
        f"warren: cannot reach the management API at {closed}: Connection refused")
    stream = spark.readStream.format("warren").option("url", url).option("queue", "nope")
    with pytest.raises(Exception, match="warren: queue 'nope' not found in vhost '/'"):
        stream.load()


BATCH = 15  # rows per micro-batch: the first two runs below take more than one


def _stream(spark, node, checkpoint: Path, out: Path, **options) -> None:
    s = (spark.readStream.format("warren").option("url", mgmt(node)).option("queue", "events")
         .option("mode", "drain"))
    for key, value in options.items():
        s = s.option(key, str(value))
    query = (s.load().select("queue", "offset", "body").writeStream.format("parquet")
             .option("checkpointLocation", str(checkpoint)).option("path", str(out))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(90)
    assert query.exception() is None


def test_streaming_available_now_restart_exactly_once(spark, node, tmp_path):
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
    publish(node, "events", [f"a{i}".encode() for i in range(30)], delivery_mode=2)
    _stream(spark, node, checkpoint, out, maxRowsPerTrigger=BATCH, partitionSize=5)
    first = spark.read.parquet(str(out)).collect()
    assert sorted(r.offset for r in first) == list(range(30))
    publish(node, "events", [f"b{i}".encode() for i in range(25)], delivery_mode=2)
    _stream(spark, node, checkpoint, out, maxRowsPerTrigger=BATCH, partitionSize=5)  # restarted from the checkpoint
    node.stop()  # the broker restarts too: offsets carry on
    node.start()
    publish(node, "events", [f"c{i}".encode() for i in range(7)], delivery_mode=2)
    _stream(spark, node, checkpoint, out, maxRowsPerTrigger=BATCH, partitionSize=5)
    rows = spark.read.parquet(str(out)).collect()
    offsets = sorted(r.offset for r in rows)
    assert offsets == list(range(62))  # every offset exactly once, none missing
    assert sorted(bytes(r.body) for r in rows) == sorted(
        [f"a{i}".encode() for i in range(30)] + [f"b{i}".encode() for i in range(25)]
        + [f"c{i}".encode() for i in range(7)])
    # drain: everything committed is gone; only the last batch (Spark never commits it) can remain
    state = api(node, "/api/queues/%2F/events/offsets")
    assert state["tail"] == 62 and 62 - BATCH <= state["head"] <= 62


def test_streaming_drain_reads_what_is_published_after_a_broker_kill(spark, start_broker, tmp_path):
    """A drain query reads a durable queue's transient messages (offsets 0..9, its checkpoint at 10); the broker is
    killed, which keeps none of them: the confirmed persistent messages published after its restart are read by
    the restarted query, none skipped below the checkpoint nor removed unread by its commit."""
    node = start_broker()
    with channel_on(node, confirm=True) as channel:
        channel.queue_declare("events", durable=True)
        for i in range(10):
            channel.basic_publish("", "events", f"t{i}".encode(), pika.BasicProperties(delivery_mode=1))
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
    _stream(spark, node, checkpoint, out)
    assert spark.read.parquet(str(out)).count() == 10
    node.kill()
    node.start()
    publish_to(node, "events", [f"p{i}".encode() for i in range(15)], delivery_mode=2)
    _stream(spark, node, checkpoint, out)
    read = [bytes(r.body) for r in spark.read.parquet(str(out)).collect()]
    assert sorted(b for b in read if b.startswith(b"p")) == sorted(f"p{i}".encode() for i in range(15)), (
        read, api(node, "/api/queues/%2F/events/offsets"))


def test_streaming_memory_sink_browse(spark, node):
    publish(node, "ticks", [b"t"] * 12)
    query = (spark.readStream.format("warren").option("url", mgmt(node)).option("queue", "ticks").load()
             .writeStream.format("memory").queryName("ticks_view").trigger(availableNow=True).start())
    assert query.awaitTermination(90)
    assert spark.sql("select count(*) from ticks_view").first()[0] == 12
    assert api(node, "/api/queues/%2F/ticks/offsets")["head"] == 0  # browse: nothing removed


def test_endpoints_require_auth_and_read_permission(node):
    publish(node, "secret", [b"s"])
    with pytest.raises(urllib.error.HTTPError) as exc:
        api(node, "/api/queues/%2F/secret/offsets", user=None)
    assert exc.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as exc:
        api(node, "/api/queues/%2F/secret/offsets", password="wrong")
    assert exc.value.code == 401
    assert node.admin("add-user", "writer", "pw", "--tags", "management").returncode == 0
    assert node.admin("set-permissions", "/", "writer", ".*", ".*", "^$").returncode == 0
    for path, body in (("offsets", None), ("records", None), ("commit", {"offset": 1})):
        with pytest.raises(urllib.error.HTTPError) as exc:
            api(node, f"/api/queues/%2F/secret/{path}", body, user="writer", password="pw")
        assert exc.value.code == 401  # RabbitMQ answers 401 for "not allowed" too
    assert node.admin("add-user", "reader", "pw", "--tags", "management").returncode == 0
    assert node.admin("set-permissions", "/", "reader", "", "", "^secret$").returncode == 0
    assert api(node, "/api/queues/%2F/secret/offsets", user="reader", password="pw")["tail"] == 1
    with pytest.raises(urllib.error.HTTPError) as exc:
        api(node, "/api/queues/%2F/missing/offsets")
    assert exc.value.code == 404


def test_amqp_fallback_browse_and_drain(spark, node):
    from spark import drain

    publish(node, "plain", [f"p{i}".encode() for i in range(20)])
    url = f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"
    df = spark.read.format("warren").option("protocol", "amqp").option("url", url).option("queue", "plain").load()
    assert sorted(bytes(r.body) for r in df.collect()) == sorted(f"p{i}".encode() for i in range(20))
    assert api(node, "/api/queues/%2F/plain/offsets")["tail"] == 20  # requeued, still there
    assert _load_error(spark, url, "nope", protocol="amqp") == "warren (amqp): queue 'nope' not found in vhost '/'"
    bad = f"amqp://guest:wrong@127.0.0.1:{node.port}/%2F"
    assert _load_error(spark, bad, "plain", protocol="amqp") == (
        f"warren (amqp): login failed for user 'guest' at 127.0.0.1:{node.port}")
    drained = drain(spark, protocol="amqp", url=url, queue="plain")
    assert drained.count() == 20
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    assert connection.channel().queue_declare("plain", passive=True).method.message_count == 0
    connection.close()


def test_partitions_by_offsets_bytes_and_cores():
    from spark.source import Settings, plan

    settings = Settings.from_options({"queue": "a,b", "partitionSize": "1000", "partitionBytes": "4096",
                                      "minPartitions": "8"})
    parts = plan({"a": [0, 3000], "b": [10, 20]}, {"a": 1.0, "b": 1024.0}, settings)
    by_queue = {q: [(p.start, p.end) for p in parts if p.queue == q] for q in ("a", "b")}
    assert len(by_queue["a"]) == 8  # 3 by offsets, but 8 cores, and a holds nearly every offset
    assert by_queue["a"][0] == (0, 375) and by_queue["a"][-1][1] == 3000
    assert by_queue["b"] == [(10, 14), (14, 18), (18, 20)]  # 10 KiB of bodies, 4 KiB a partition
    covered = sorted((p.queue, s) for p in parts for s in range(p.start, p.end))
    assert covered == sorted([("a", i) for i in range(3000)] + [("b", i) for i in range(10, 20)])  # each once


def _records(node, queue: str, query: str) -> list:
    import pyarrow as pa

    request = urllib.request.Request(f"{mgmt(node)}/api/queues/%2F/{queue}/records?{query}",
                                     headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        return list(pa.ipc.open_stream(response.read()))


def test_records_of_the_columns_asked_for_from_memory_and_from_disk(start_broker):
    """``columns=``: batches of those columns only, in the schema's order, whether the rows come from memory or
    from a reader process (the queue's window is 16); an unknown column is a 400 naming it."""
    node = start_broker("--queue-window", "16")
    publish_pipelined(node, "few", [f"m{i}".encode() for i in range(3000)], declare=True, delivery_mode=2,
                      content_type="text/plain")
    batches = _records(node, "few", "columns=body,content_type,offset")
    assert {tuple(b.schema.names) for b in batches} == {("offset", "body", "content_type")}
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(3000))
    assert [bytes(v) for b in batches for v in b.column("body").to_pylist()] == [f"m{i}".encode() for i in range(3000)]
    assert {v for b in batches for v in b.column("content_type").to_pylist()} == {"text/plain"}
    assert len(batches) > 1  # the window's 16 from memory, the rest from disk
    bare = _records(node, "few", "columns=offset,redelivered")  # no part of a payload read
    assert {tuple(b.schema.names) for b in bare} == {("offset", "redelivered")}
    assert [o for b in bare for o in b.column("offset").to_pylist()] == list(range(3000))
    text = _records(node, "few", "columns=body&body=text&start=2990")
    assert [v for b in text for v in b.column("body").to_pylist()] == [f"m{i}" for i in range(2990, 3000)]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _records(node, "few", "columns=offset,bogus")
    assert refused.value.code == 400 and "unknown column 'bogus'" in refused.value.read().decode()


def test_records_of_messages_with_header_names_that_are_not_utf8(start_broker):
    """A field table's names are octets: a message whose header name (or a nested table's) is not UTF-8, which AMQP
    takes and delivers, is read with those bytes replaced by U+FFFD, as its values and routing keys are, from memory
    and from a reader process alike (the queue's window is 16); it failed its whole batch."""
    node = start_broker("--queue-window", "16")
    publish_pipelined(node, "odd", [f"m{i}".encode() for i in range(40)], declare=True, delivery_mode=2,
                      headers={b"k\xff": "v", "t": {b"n\xfe": b"x\xfd", "s": "\u00e9"}})
    rows = [row for b in _records(node, "odd", "columns=offset,headers") for row in b.to_pylist()]
    assert [row["offset"] for row in rows] == list(range(40))
    assert {tuple(row["headers"]) for row in rows} == {
        (("k\ufffd", "v"), ("t", json.dumps({"n\ufffd": "x\ufffd", "s": "\u00e9"}, separators=(",", ":"),
                                         ensure_ascii=False)))}


def test_a_schema_of_a_few_columns_reads_only_those(spark, node):
    """A ``.schema(...)`` of a few of the source's columns: the rows are right, and only those columns (with the
    offset, for paging) are asked of the broker."""
    publish(node, "narrow", [f"m{i}".encode() for i in range(50)], delivery_mode=2)
    df = (spark.read.format("warren").schema("body binary, redelivered boolean").option("url", mgmt(node))
          .option("queue", "narrow").load())
    assert sorted(bytes(r.body) for r in df.collect()) == sorted(f"m{i}".encode() for i in range(50))
    assert df.count() == 50 and df.columns == ["body", "redelivered"]
    from spark.source import RecordsApi, Settings

    seen = []
    settings = Settings.from_options({"url": mgmt(node), "queue": "narrow"})
    for batch in RecordsApi(settings).records("narrow", 0, 50, ["body", "redelivered"]):
        seen.append(tuple(batch.schema.names))
    assert set(seen) == {("offset", "body", "redelivered")}


def test_records_limit_and_batches_through_gone_entries(node):
    """/records: ``limit`` rows from ``start`` in batches of ``batch``, skipping what a commit removed."""
    publish(node, "lim", [f"m{i}".encode() for i in range(100)])
    api(node, "/api/queues/%2F/lim/commit", {"offset": 5})
    batches = _records(node, "lim", "start=0&limit=25&batch=7")
    assert [b.num_rows for b in batches] == [7, 7, 7, 4]
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(5, 30))
    assert [bytes(b) for b in batches[0].column("body").to_pylist()][:2] == [b"m5", b"m6"]


@pytest.mark.parametrize("kind, gone, shown", [
    ("classic", "transient", "records"),  # transient messages of a durable queue: not in the index to rebuild from
    ("classic", "transient", "offsets"),  # the tail alone shown, no message
    ("classic", "acked", "records"),  # persistent ones, removed since
    ("quorum", "acked", "records"),
])
def test_offsets_shown_to_a_reader_are_never_given_again_after_a_kill(start_broker, kind, gone, shown):
    """A reader was shown offsets 0..9 of a durable queue (by ``/records``, or the tail by ``/offsets``); the node
    is killed (nothing saved at a shutdown) with none of those messages left in its index: the messages published
    after the restart get offsets above 10, not 0..9 again (a reader's checkpoint at 10 would skip them)."""
    node = start_broker()
    arguments = {"x-queue-type": "quorum"} if kind == "quorum" else {}
    with channel_on(node, confirm=True) as channel:
        channel.queue_declare("d", durable=True, arguments=arguments)
        for i in range(10):
            channel.basic_publish("", "d", f"t{i}".encode(),
                                  pika.BasicProperties(delivery_mode=1 if gone == "transient" else 2))
    if shown == "records":
        assert [o for b in _records(node, "d", "") for o in b.column("offset").to_pylist()] == list(range(10))
    else:
        assert api(node, "/api/queues/%2F/d/offsets")["tail"] == 10
    if gone == "acked":
        with channel_on(node) as channel:
            assert len(drain(channel, "d", settle="ack")) == 10
        publish_to(node, "sync", [b"s"], declare=True, delivery_mode=2)  # its confirm: the acks are on disk too
    node.kill()
    node.start()
    publish_to(node, "d", [f"p{i}".encode() for i in range(3)], delivery_mode=2)
    rows = [row for b in _records(node, "d", "columns=offset,body") for row in b.to_pylist()]
    after = {row["body"]: row["offset"] for row in rows}  # (a message of before the kill kept: at its offset)
    assert {f"p{i}".encode() for i in range(3)} <= after.keys() and len(set(after.values())) == len(rows), rows
    new = [after[f"p{i}".encode()] for i in range(3)]
    assert min(new) >= 10, rows
    assert api(node, "/api/queues/%2F/d/offsets")["tail"] > max(new)


@pytest.mark.timeout(300)
def test_streaming_100k_row_batches_exactly_once_across_a_broker_kill(spark, start_broker, tmp_path):
    """Drain mode, micro-batches of 100,000 rows; the broker is killed (SIGKILL) once the first batch is
    committed by the sink, then restarted: the query, restarted from its checkpoint, ends with every offset exactly
    once."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from amqp_load import Connection, publish_confirmed  # a raw-socket publisher: 250,000 in seconds

    node = start_broker()
    total, batch = 250_000, 100_000
    conn = Connection("127.0.0.1", node.port, "guest", "guest", "/")
    conn.channel_open(1)
    conn.queue_declare(1, "events", durable=True)
    conn.confirm_select(1)
    publish_confirmed(conn, "events", b"e" * 16, total, persistent=True, timeout=60)
    conn.close()
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"

    def kill_once_a_batch_is_written() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "_spark_metadata" / "0").exists():  # batch 0 committed
            time.sleep(0.02)
        node.kill()

    killer = threading.Thread(target=kill_once_a_batch_is_written)
    killer.start()
    query = (spark.readStream.format("warren").option("url", mgmt(node)).option("queue", "events")
             .option("mode", "drain").option("maxRowsPerTrigger", str(batch)).load()
             .select("queue", "offset", "body").writeStream.format("parquet")
             .option("checkpointLocation", str(checkpoint)).option("path", str(out))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except Exception:  # the broker went away under the query: it stops with an error
        pass
    killer.join()
    assert not query.isActive
    written = spark.read.parquet(str(out)).count()
    assert 0 < written < total  # killed mid-stream
    node.start()
    _stream(spark, node, checkpoint, out, maxRowsPerTrigger=batch)
    offsets = spark.read.parquet(str(out)).select("offset")
    assert offsets.count() == total
    assert offsets.distinct().count() == total
    assert offsets.agg({"offset": "min"}).first()[0] == 0 and offsets.agg({"offset": "max"}).first()[0] == total - 1


@pytest.mark.parametrize("key", ["partitionSize", "partitionBytes", "minPartitions", "maxRowsPerTrigger"])
@pytest.mark.parametrize("value", ["0", "-3", "ten", "1.5"])
def test_whole_number_options_are_checked(key, value):
    from spark.source import Settings

    with pytest.raises(ValueError, match=f"warren: {key} must be a whole number of at least 1, not '{value}'"):
        Settings.from_options({"queue": "q", key: value})

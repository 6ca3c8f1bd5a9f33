"""``warrenctl export --queue Q DIR``: queues to Parquet through a local Spark and the ``warren`` source.

Each queue becomes a Parquet dataset ``DIR/<queue>`` (the name %-quoted) with the source's columns.
The default is a browse: the queue stays as it is.  ``--drain`` is the source's two-phase drain:
``load()`` pins each queue's offset range, the write puts it on disk, and only then is the
range committed (removed), so a failure anywhere before leaves every message in its queue.
Names are checked over the API before Spark starts (a few seconds) so a typo fails at once.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .client import ApiClient, CtlError, path
from .render import Output

POLL_SECONDS = 0.25


@dataclass
class Exported:
    queue: str
    path: str
    rows: int
    removed: int | None  # with --drain: messages the commit removed


def export_queues(api: ApiClient, args: argparse.Namespace, out: Output, vhost: str) -> int:
    names = _queue_names(api, args, vhost)
    target = Path(args.file)
    dests = {name: target / urllib.parse.quote(name, safe="") for name in names}
    for dest in dests.values():
        if dest.exists():
            raise CtlError(f"{dest} already exists")
    spark = _session()
    try:
        results = _export_all(spark, api, args, out, vhost, dests)
    finally:
        spark.stop()
    if out.as_json:
        out.json([asdict(result) for result in results])
        return 0
    for r in results:
        removed = "" if r.removed is None else f", {r.removed} removed from the queue"
        out.ok(f"queue '{r.queue}': {r.rows} messages written to {r.path}{removed}")
    return 0


def _queue_names(api: ApiClient, args: argparse.Namespace, vhost: str) -> list[str]:
    if args.all_queues:
        rows = api.get(path("queues", vhost), not_found=f"no vhost '{vhost}'", query={"columns": "name"})
        return sorted(row["name"] for row in rows)
    for name in args.queue:
        api.get(path("queues", vhost, name), not_found=f"no queue '{name}' in vhost '{vhost}'")
    return list(dict.fromkeys(args.queue))


def _session() -> Any:
    """A quiet local SparkSession on loopback, or a one-line reason why there can be none."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise CtlError("export needs pyspark: pip install 'warren[spark]'") from None
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        raise CtlError("export needs Java 17+ for Spark: java is not on PATH and JAVA_HOME is not set")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[*]").appName("warrenctl-export")
             .config("spark.driver.memory", "2g").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _export_all(spark: Any, api: ApiClient, args: argparse.Namespace, out: Output, vhost: str,
                dests: dict[str, Path]) -> list[Exported]:
    from spark import WarrenDataSource, commit, error_reason
    from spark.common import pinned

    spark.dataSource.register(WarrenDataSource)
    options = {"url": api.base_url.rstrip("/"), "user": api.user, "password": api.password, "vhost": vhost,
               "mode": "drain" if args.drain else "browse", "timeout": str(api.timeout)}
    if args.partition_size:
        options["partitionSize"] = str(args.partition_size)
    results: list[Exported] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
               TimeElapsedColumn())
    with Progress(*columns, console=out.err, disable=out.as_json) as progress:
        overall = progress.add_task(f"{len(dests)} queue{'' if len(dests) == 1 else 's'}", total=len(dests))
        for i, (name, dest) in enumerate(dests.items()):
            try:
                df = spark.read.format("warren").options(queue=name, **options).load()
                pin = pinned(df.schema)
                assert pin is not None  # load() pins the ranges it reads
                start, end = pin["ranges"][name]
                task = progress.add_task(f"'{name}'", total=end - start)
                group = f"warrenctl-export-{i}"
                with _Tracker(spark, group, progress, task, end - start):
                    spark.sparkContext.setJobGroup(group, f"export queue {name}")
                    df.write.parquet(str(dest))
                rows = _rows_written(dest)
                progress.update(task, total=rows, completed=rows)
                removed = commit(df, password=api.password)[name] if args.drain else None
            except Exception as exc:  # Spark's errors: the source's one-line reason, else Spark's first line
                text = str(exc).strip()
                first = text.splitlines()[0] if text else type(exc).__name__
                raise CtlError(error_reason(exc) or f"queue '{name}': {first}") from None
            progress.advance(overall)
            results.append(Exported(name, str(dest), rows, removed))
    return results


def _rows_written(dest: Path) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(str(dest), format="parquet").count_rows()


class _Tracker:
    """Moves a queue's bar as Spark finishes tasks: each task is one offset range of the queue."""

    def __init__(self, spark: Any, group: str, progress: Progress, task: TaskID, total: int) -> None:
        self.status = spark.sparkContext.statusTracker()
        self.group, self.progress, self.task, self.total = group, progress, task, total
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_Tracker":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            done = tasks = 0
            for job_id in self.status.getJobIdsForGroup(self.group):
                job = self.status.getJobInfo(job_id)
                for stage_id in job.stageIds if job else ():
                    stage = self.status.getStageInfo(stage_id)
                    if stage:
                        done += stage.numCompletedTasks
                        tasks += stage.numTasks
            if tasks:
                self.progress.update(self.task, completed=self.total * done // tasks)

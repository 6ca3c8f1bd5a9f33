"""The nemesis (``benchmarks/nemesis.py``) on a short seeded schedule of its generator: etcd and three nodes,
each in a network namespace of its own, confirming publishers (not mandatory) on every node and a consumer
that moves to the next node after any error, while faults of lengths drawn from 0.3-11 s hit the cluster, two
at once in some steps: etcd killed during a pause of the leader and during its kill, the leader cut off from
everything but its clients while a follower is dead (no side with a majority), the leader cut from the
followers, etcd frozen during a follower's pause; and queues are declared, bound and deleted.  Every confirmed
message is delivered without restarting anything (nothing lost, nothing stranded), the queue is in every
node's view every time it is asked, every node has the definitions as they were answered, nothing was
confirmed by a side without a majority, and publishers were slowed, not flooded with nacks, while no leader
was known."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, unavailable

sys.path.insert(0, str(ROOT / "benchmarks"))
import nemesis  # noqa: E402 (after sys.path takes benchmarks/)

if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("etcd") is None:
    unavailable("the nemesis needs root, iproute2 (ip netns) and etcd")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(480)]

SEED, SECONDS = 76, 60  # six steps, 65 s: four of them two faults at once, one with no majority for 2.6 s
IN_FLIGHT = 100


def test_the_schedule_has_overlapping_faults_and_no_majority_for_a_while() -> None:
    faults = nemesis.random_schedule(SEED, SECONDS, nemesis.KINDS)
    steps: dict[int, list[str]] = {}
    for fault in faults:
        steps.setdefault(fault.step, []).append(fault.kind)
    assert sum(1 for kinds in steps.values() if len(kinds) == 2) >= 3, steps
    assert any(tuple(kinds) in nemesis.NO_MAJORITY or tuple(kinds[::-1]) in nemesis.NO_MAJORITY
               for kinds in steps.values()), steps
    assert len({fault.seconds for fault in faults}) == len(faults)  # drawn, not picked from a few values


def test_a_short_nemesis_loses_and_strands_no_confirmed_message(tmp_path: Path) -> None:
    prefix = f"wt{os.getpid()}"
    try:
        run = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "nemesis.py"), "--seed", str(SEED), "--seconds", str(SECONDS),
             "--rate", "800", "--in-flight", str(IN_FLIGHT), "--drain", "60", "--hog", "off", "--no-recover",
             "--prefix", prefix, "--data", str(tmp_path), "--json"],
            capture_output=True, text=True, timeout=450, cwd=ROOT)
    finally:
        nemesis.Network.remove(prefix)  # (the run removes them itself, unless it was killed)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    summary = {key: report[key] for key in ("confirmed", "lost", "lost_runs", "stranded", "stranded_runs",
                                            "duplicates", "longest_confirm_gap", "minority_confirms",
                                            "no_majority", "queue_missing_sample", "nacked", "left_in_queue")}
    assert report["no_majority_seconds"] >= 1, (summary, report["nemesis"])
    assert report["confirmed"] > 1_000, summary  # tens of thousands at rest; a machine at load 30 confirms little
    assert report["lost"] == 0 and report["stranded"] == 0 and report["left_in_queue"] == 0, summary
    assert report["queue_missing_seen"] == 0 and report["queue_missing_on"] == [], summary
    assert report["views"] > 100, summary  # the watcher did ask
    definitions = report["definitions"]  # queues declared, bound and deleted meanwhile: as answered, on every node
    assert definitions["made"] > 10 and not definitions["nodes_disagree"], definitions
    assert definitions["missing"] == [] and definitions["resurrected"] == [], definitions
    assert report["minority_confirms"] == 0, summary
    # while no leader is known a publish waits for one: nacks come a window at a time, not at the publish rate
    assert all(p["max_nacks_per_second"] <= 3 * IN_FLIGHT for p in report["publishers"].values()), report["publishers"]

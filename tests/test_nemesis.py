"""The nemesis (``benchmarks/nemesis.py``) on a short seeded schedule: etcd and three nodes, each in a network
namespace of its own, confirming publishers on every node and a consumer moving between them, while the leader
is cut from the followers, a node from etcd, the leader's frames to a follower are lost, etcd is frozen, the
leader is killed and paused, and queues are declared, bound and deleted.  Every confirmed message is delivered,
the queue is there on every node, every node has the definitions as they were answered, nothing was confirmed
by a side without a majority, and publishers were slowed, not flooded with nacks, while no leader was known."""
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

KINDS = ["cut-leader-from-followers", "cut-node-from-etcd", "cut-asymmetric", "freeze-etcd", "kill-leader-fast",
         "pause-leader-long"]
IN_FLIGHT = 100


def test_a_short_nemesis_loses_no_confirmed_message(tmp_path: Path) -> None:
    prefix = f"wt{os.getpid()}"
    try:
        run = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "nemesis.py"), "--seed", "27", "--seconds", "65",
             "--kinds", ",".join(KINDS), "--rate", "800", "--in-flight", str(IN_FLIGHT), "--drain", "60",
             "--prefix", prefix, "--data", str(tmp_path), "--json"],
            capture_output=True, text=True, timeout=450, cwd=ROOT)
    finally:
        nemesis.Network.remove(prefix)  # (the run removes them itself, unless it was killed)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    summary = {key: report[key] for key in ("confirmed", "lost", "lost_sample", "duplicates", "longest_confirm_gap",
                                            "minority_confirms", "queue_missing_on", "nacked")}
    assert {fault["kind"] for fault in report["faults"]} == set(KINDS), report["faults"]
    assert report["confirmed"] > 10_000, summary
    assert report["lost"] == 0, summary
    assert report["queue_missing_on"] == [], summary
    definitions = report["definitions"]  # queues declared, bound and deleted meanwhile: as answered, on every node
    assert definitions["made"] > 20 and not definitions["nodes_disagree"], definitions
    assert definitions["missing"] == [] and definitions["resurrected"] == [], definitions
    assert report["minority_confirms"] == 0, summary
    # while no leader is known a publish waits for one: nacks come a window at a time, not at the publish rate
    assert all(p["max_nacks_per_second"] <= 3 * IN_FLIGHT for p in report["publishers"].values()), report["publishers"]
    assert report["longest_confirm_gap"] < 10, summary

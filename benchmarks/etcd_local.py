"""A single-member etcd for the cluster benchmarks: its command line, and a wait for it to answer healthy."""
from __future__ import annotations

import json
import shutil
import time
import urllib.request


def command(name: str, data: str, url: str, peer: str) -> list[str]:
    """The etcd of one member ``name`` keeping ``data``, serving clients at ``url`` and its peer at ``peer``."""
    return [shutil.which("etcd") or "etcd", "--name", name, "--data-dir", data, "--listen-client-urls", url,
            "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{name}={peer}"]


def healthy(url: str, seconds: float) -> bool:
    """Whether the etcd at ``url`` answers healthy within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as reply:
                if json.load(reply).get("health") == "true":
                    return True
        except OSError:
            time.sleep(0.1)
    return False

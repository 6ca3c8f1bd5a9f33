"""Facts about this process and host for /api/nodes, /api/overview and /metrics."""
from __future__ import annotations

import os
import resource
import shutil


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fd_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def fd_total() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def disk_free(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0

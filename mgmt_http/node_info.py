"""Facts about this process and host for /api/nodes, /api/overview and /metrics."""
from __future__ import annotations

import os
import resource
from amqp_server.disk_monitor import free_space
from amqp_server.memory import memory_used

__all__ = ["disk_free", "fd_total", "fd_used", "memory_used"]


def fd_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def fd_total() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def disk_free(path: str) -> int:
    try:
        return free_space(path)
    except OSError:
        return 0

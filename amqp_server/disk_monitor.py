"""The disk alarm, RabbitMQ's ``rabbit_disk_monitor``: while the file system of the data directory has less free
space than ``disk_free_limit`` (50 MB by default), publishers are held (``publisher_flow.DISK``, told
``connection.blocked`` "low on disk"), so that a full disk stops publishes before it fails the message store's
writes."""
from __future__ import annotations

import asyncio
import logging
import shutil

from .publisher_flow import DISK, PublisherFlow

log = logging.getLogger("warren")

MIN_INTERVAL = 0.1  # s between checks at least (rabbit_disk_monitor's min_check_interval, 100 ms)
MAX_INTERVAL = 10.0  # and at most (max_check_interval), the interval while the alarm stands
FILL_RATE = 250_000_000  # bytes a second: between checks, twice the time the space above the limit lasts at this rate


def free_space(path: str) -> int:
    """Bytes free to an unprivileged writer on ``path``'s file system (``df -kP``'s "Available", as RabbitMQ
    reads it); OSError if it cannot be read."""
    return shutil.disk_usage(path).free


class DiskMonitor:
    """Checks the data directory's free space, sooner the closer it is to the limit, and sets or clears the alarm."""

    def __init__(self, path: str, limit: int, flow: PublisherFlow) -> None:
        self.path = path
        self.limit = limit
        self.flow = flow

    def check(self) -> float:
        """Measure, set or clear the alarm: the seconds until the next check (rabbit_disk_monitor's ``interval``)."""
        free = free_space(self.path)
        alarmed = free < self.limit
        if alarmed != self.flow.alarmed(DISK):
            log.warning("free disk space is %s. Free bytes: %d. Limit: %d",
                        "insufficient" if alarmed else "sufficient", free, self.limit)
            if alarmed:
                self.flow.block(DISK)
            else:
                self.flow.unblock(DISK)
        if alarmed:
            return MAX_INTERVAL
        return max(MIN_INTERVAL, min(MAX_INTERVAL, 2 * (free - self.limit) / FILL_RATE))

    def poll(self) -> float:
        """``check``; one that fails (the directory unreadable) is logged and tried again after the longest interval."""
        try:
            return self.check()
        except OSError as exc:
            log.error("cannot read the free disk space of %s: %s", self.path, exc)
            return MAX_INTERVAL

    async def run(self, interval: float) -> None:
        """Check every ``interval`` (as the last check set it) until cancelled."""
        while True:
            await asyncio.sleep(interval)
            interval = self.poll()

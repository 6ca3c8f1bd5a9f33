"""The broker's one clock for expiry and schedules: epoch milliseconds, as message TTLs and x-death count."""
from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)

"""Background tasks stopped for sure: a cancellation can be lost, and a stop must not wait on it for good."""
from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_AFTER = 1.0  # seconds a cancelled task has to end before it is cancelled again


async def stop_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel ``tasks`` and return once each has ended, whatever it ended with.  Python 3.11's
    ``asyncio.wait_for`` returns its result when a cancel meets its completion, dropping the cancel (aetcd waits
    for a watch so, a link for its connection), and a loop that retries then goes on: a task that has not ended
    after ``RECANCEL_AFTER`` is cancelled again."""
    pending = {task for task in tasks if task is not None and not task.done()}
    ended = {task for task in tasks if task is not None} - pending
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER)
        ended |= done
    for task in ended:
        if not task.cancelled():
            task.exception()  # retrieved: a stopped task's error is nobody's to raise

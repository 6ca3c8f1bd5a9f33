"""How much memory the node holds, as the memory alarm and the management API count it."""
from __future__ import annotations

import os
import resource

# Memory that grows faster than the once-a-second check (a large message arriving, output piling up for a
# client that does not read) checks the memory alarm each time it grows by this much.
MEMORY_CHECK_BYTES = 8 * 1024 * 1024


def memory_used() -> int:
    """Resident memory the process itself holds: its anonymous pages.  File-backed resident pages (the
    queue index's LMDB map, pages of segment files read) are the page cache's, which the kernel takes back
    when it needs them, so they neither count towards the memory alarm nor show in ``mem_used``."""
    try:
        with open("/proc/self/statm") as handle:
            fields = handle.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

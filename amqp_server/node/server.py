"""``warren-server``: start a node, hold its data directory, stop cleanly on SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import gc
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Sequence

from .. import __version__, config as config_module, logs, tls
from ..frontend import front_end as frontend
from ..broker import Broker
from ..frontend.clients import Clients
from ..config import Config
from ..amqp091.connection import Connection
from ..disk_monitor import DiskMonitor
from ..memory import memory_used
from ..queues.persistence import Persistence
from ..publisher_flow import MEMORY, PublisherFlow
from ..federation import Federation
from ..shovel import Shovels

if TYPE_CHECKING:
    from aiohttp import web

    import forwarder

    from ..stream.manager import StreamManager

log = logging.getLogger("warren")
MEMORY_CHECK_INTERVAL = 1.0
# Collect the youngest generation every 50,000 allocations, not 700: far fewer short-lived messages and
# entries get promoted to the oldest generation just by being in flight, so full collections — 0.1-0.6 s
# each over a million message store index entries — stay rare (routing 200,000 stored delayed messages:
# 4 full collections, 1 s in all, before; none after).
GC_THRESHOLDS = (50_000, 20, 10)
# Worker threads (the Spark bridge's Arrow encoding, fsyncs) hold the GIL for at most this long before the
# event loop may take it back: Python's default, 5 ms, would be an AMQP client's latency while one runs.
GIL_SWITCH_INTERVAL = 0.0002


class DataDirLocked(RuntimeError):
    pass


def lock_data_dir(data_dir: str) -> int:
    """One node per data directory: a second start fails while the first holds the lock."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, "warren.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DataDirLocked(f"data directory {os.path.abspath(data_dir)} is in use by another Warren node "
                            f"(pid {owner}); stop it first or choose another --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _trim() -> None:
    """glibc's malloc_trim: return free heap pages to the OS (large freed bodies otherwise keep RSS up)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Node:
    """The running broker: listener, client connections, memory and disk alarms, shutdown."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clients = Clients(config)
        self.broker = Broker(config.data_dir, config.node_name,
                             Persistence(config.data_dir, config.segment_size, config.message_cache_bytes,
                                         config.compaction_threshold), config.segment_size, self.clients,
                             config.queue_window, config.definitions_max_size)
        self.server: asyncio.base_events.Server | None = None
        self.tls_server: frontend.TlsListener | None = None  # AMQPS, when a certificate is configured
        self.mgmt: web.AppRunner | None = None  # the management plugin's aiohttp runner, when enabled
        self.cluster: forwarder.Cluster | None = None  # in cluster mode
        self.stream_server: asyncio.AbstractServer | None = None  # the stream protocol, when enabled
        self.streams: StreamManager | None = None  # its streams
        self.shovels: Shovels | None = None  # its dynamic shovels, once it listens
        self.federation: Federation | None = None  # its federation links, once it listens
        self.flow = PublisherFlow()
        self.flow.recheck = self.check_memory
        self.disk = DiskMonitor(config.data_dir, config.disk_free_limit, self.flow)
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # the alarms stand before any client connects, as RabbitMQ's monitors start before its listeners
        self.check_memory()
        self._disk_task = asyncio.create_task(self.disk.run(self.disk.poll()))
        if self.config.cluster_etcd:
            import forwarder

            self.cluster = forwarder.Cluster(self.broker, self.config, self.flow)
            await self.cluster.start()
        if self.config.mgmt_enabled:  # first: once AMQP accepts connections, the API answers too
            import mgmt_http

            self.mgmt = await mgmt_http.start(self.broker, self.config, self.flow, self.clients)
            log.info("management HTTP API on %s:%d", self.config.bind, self.config.mgmt_port)
        context = tls.amqp_context(self.config)
        if context is not None:  # before plain AMQP, so that a node answering on one answers on both
            self.tls_server = await frontend.listen_tls(lambda: Connection(self.broker, self.config, self.flow,
                                                                           self.clients),
                                                        self.config.bind, self.config.tls_port, context,
                                                        self.clients.handshakes)
            log.info("AMQPS on %s:%d (verify: %s)", self.config.bind, self.config.tls_port, self.config.tls_verify)
        self.server = await loop.create_server(lambda: Connection(self.broker, self.config, self.flow, self.clients),
                                               self.config.bind, self.config.amqp_port, reuse_address=True,
                                               backlog=1024)
        if self.config.stream_enabled:
            from ..stream import reader

            self.stream_server, self.streams = await reader.start(self.broker, self.config, self.flow, self.clients)
            log.info("stream protocol on %s:%d", self.config.bind, self.config.stream_port)
        self.shovels = self.broker.shovels = Shovels(self.broker, self.config.bind, self.config.amqp_port)
        self.shovels.start()
        self.federation = self.broker.federation = Federation(self.broker, self.config.bind, self.config.amqp_port)
        self.federation.start()
        self._memory_task = asyncio.create_task(self._watch_memory())
        log.info("Warren %s node %s: AMQP on %s:%d, data in %s", __version__, self.config.node_name,
                 self.config.bind, self.config.amqp_port, os.path.abspath(self.config.data_dir))

    async def _watch_memory(self) -> None:
        broker = self.broker
        while True:
            await asyncio.sleep(MEMORY_CHECK_INTERVAL)
            try:
                rss = self.check_memory()
                if rss > self.config.memory_limit * self.config.paging_ratio:
                    broker.pager.page_out(broker.local_queues())
                broker.pager.housekeeping()
            except Exception:  # the alarm must keep being checked whatever one pass met
                log.exception("memory check failed")

    def check_memory(self) -> int:
        """Set or clear the memory alarm; the RSS. Every second, and whenever a publisher has sent another
        8 MiB of a message or a client that does not read has another 8 MiB waiting for it
        (memory.MEMORY_CHECK_BYTES): fast publishers outrun the clock."""
        limit = self.config.memory_limit
        rss = memory_used()
        alarmed = self.flow.alarmed(MEMORY)
        if rss > limit and not alarmed:
            log.warning("memory alarm set: %d bytes used, limit %d; blocking publishers", rss, limit)
            self.flow.block(MEMORY)  # also a publisher in the middle of a message: it is read no further
        elif rss > limit:
            for connection in list(self.clients.connections):
                if connection.reading_paused:
                    connection.drop_if_peer_gone()
            _trim()  # freed message bodies may sit in malloc's heap, holding the alarm on: give them back
        elif alarmed:
            log.warning("memory alarm cleared: %d bytes used, limit %d", rss, limit)
            self.flow.unblock(MEMORY)
        return rss

    def stop(self) -> None:
        self._stopped.set()

    async def run_until_stopped(self) -> None:
        await self._stopped.wait()
        log.info("shutting down")
        self._memory_task.cancel()
        self._disk_task.cancel()
        if self.server is not None:
            self.server.close()
        if self.stream_server is not None:
            self.stream_server.close()
        if self.tls_server is not None:
            self.tls_server.close()
        if self.mgmt is not None:
            await self.mgmt.cleanup()
        if self.shovels is not None:
            await self.shovels.stop()
        if self.federation is not None:
            await self.federation.stop()
        self.clients.close_all("broker shutdown")
        await asyncio.sleep(0.1)
        if self.cluster is not None:
            await self.cluster.stop()
        self.broker.close()


class StartFailed(Exception):
    """The node could not start (a port taken, the data directory unreadable): what ``main`` reports as such; an
    error once it runs is not one."""


async def serve(config: Config) -> None:
    try:
        node = Node(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, node.stop)
        await node.start()
    except OSError as exc:
        raise StartFailed(str(exc)) from exc
    await node.run_until_stopped()


def main(argv: Sequence[str] | None = None) -> int:
    config = config_module.load(argv)
    if config.cluster_etcd and not config.cluster_secret:
        print("warren-server: --cluster-secret is required with --cluster-etcd", file=sys.stderr)
        return 2
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    logs.setup(config.log_level)
    try:
        lock = lock_data_dir(config.data_dir)
    except DataDirLocked as exc:
        log.error("%s", exc)
        return 1
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(config))
    except StartFailed as exc:
        log.error("cannot start: %s", exc)
        return 1
    except Exception as exc:  # noqa: BLE001 - whatever stopped the running node is said as that, not as a start
        log.critical("the node stopped on an error: %s: %s", type(exc).__name__, exc)
        return 1
    finally:
        os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cluster definitions and members against a real etcd, in-process: a node's LMDB mirror becomes etcd's state on
start and after every broken or quiet watch (a full read, whatever etcd compacted meanwhile), and survives names
too long for the store's keys."""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Coroutine, Iterator

import aetcd
import pytest

from amqp_server.definition_store import DefinitionStore
from forwarder.metadata import etcd as etcd_client, membership, mirror as metadata
from forwarder.metadata.membership import ALIVE_PREFIX, MEMBERS_PREFIX, Membership
from forwarder.metadata.mirror import Metadata, etcd_key
from forwarder.metadata.signing import MAC_FIELD, Signer
from conftest import CLUSTER, starts
from test_cluster import Cuttable, Etcd

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def run() -> Iterator[Callable[[Coroutine[Any, Any, None]], None]]:
    """One event loop for the module's scenarios: gRPC's asyncio channels (aetcd) can hang when closed in a
    later test's loop."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


@pytest.fixture
@starts(CLUSTER)
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    server = Etcd(tmp_path / "etcd")
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def admin_of(etcd: Etcd) -> AsyncIterator[aetcd.Client]:
    """Another client of the same etcd: what the rest of the cluster does."""
    client = aetcd.Client(port=etcd.port, timeout=5)
    try:
        yield client
    finally:
        await client.close()


class Node:
    """A node's metadata: its mirror in its own store, and the definitions its broker has (what ``apply`` made)."""

    def __init__(self, tmp: Path, etcd: Etcd, signer: Signer | None = None, name: str = "node") -> None:
        self.store = DefinitionStore(str(tmp / name))
        self.client = aetcd.Client(port=etcd.port, timeout=5)
        self.broker: dict[tuple[str, str], dict[str, Any]] = {}
        self.metadata = Metadata(self.client, self.store, self.apply, signer)

    def apply(self, kind: str, key: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        if new is None:
            self.broker.pop((kind, key), None)
        else:
            self.broker[(kind, key)] = new

    async def start(self) -> None:
        """As ``Cluster.start``: the mirror first, then etcd's state."""
        for kind, key, record in self.metadata.mirrored():
            self.apply(kind, key, record, None)
        self.metadata.start()
        await asyncio.wait_for(self.metadata.caught_up.wait(), 10)

    async def stop(self) -> None:
        await self.metadata.stop()
        await self.client.close()
        self.store.close()


@contextlib.asynccontextmanager
async def node_and_admin(tmp_path: Path, etcd: Etcd) -> AsyncIterator[tuple[Node, aetcd.Client]]:
    created = Node(tmp_path, etcd)
    try:
        async with admin_of(etcd) as admin:
            yield created, admin
    finally:
        await created.stop()


def queue(name: str, **extra: Any) -> tuple[str, str, dict[str, Any]]:
    key = json.dumps(["/", name])
    return "queue", key, {"vhost": "/", "name": name, "durable": True, "node": "n1", **extra}


async def put(client: aetcd.Client, kind: str, key: str, record: dict[str, Any]) -> int:
    return (await client.put(etcd_key(kind, key), json.dumps(record).encode())).header.revision


async def held(client: aetcd.Client) -> dict[tuple[str, str], dict[str, Any]]:
    """The definitions etcd holds, as a broker would have them."""
    prefix = len(metadata.DEF_PREFIX)
    return {tuple(kv.key[prefix:].decode().split("/", 1)): json.loads(kv.value)
            for kv in await client.get_prefix(metadata.DEF_PREFIX)}


async def watched(node: Node, admin: aetcd.Client) -> None:
    """Once the node's watch runs: it applied a definition made after its full read."""
    probe = queue("probe")
    await put(admin, *probe)

    async def applied() -> bool:
        return probe[:2] in node.broker

    await until(applied, "the watch runs")


async def until(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


def test_on_start_the_mirror_becomes_etcd_s_state(tmp_path, etcd, run):
    """What the mirror has and etcd has not is deleted; what etcd has differently or the mirror lacks is applied."""

    async def scenario() -> None:
        async with node_and_admin(tmp_path, etcd) as (node, admin):
            gone, changed, new = queue("gone"), queue("changed"), queue("new")
            node.metadata._mirror(etcd_key(*gone[:2]), gone[2], 1)
            node.metadata._mirror(etcd_key(*changed[:2]), changed[2], 1)
            await put(admin, *changed[:2], {**changed[2], "arguments": {"x-max-length": 5}})
            await put(admin, *new)
            await node.start()
            assert node.broker == await held(admin)
            assert sorted(key for _, key, _ in node.metadata.mirrored()) == sorted([changed[1], new[1]])

    run(scenario())


def test_only_definitions_signed_with_the_cluster_secret_are_applied(tmp_path, etcd, run, caplog):
    """A node signs what it writes; a record put without the cluster secret (unsigned, or signed with another) is
    logged and not applied, neither while watching nor on a full read, and does not replace the one the node had.
    A record this node applied before definitions were signed is taken on its next start, and signed."""

    async def scenario() -> None:
        secret = Signer(b"the cluster secret")
        writer, reader = Node(tmp_path, etcd, secret, "writer"), Node(tmp_path, etcd, secret, "reader")
        old = Node(tmp_path, etcd, None, "old")  # (a node from before signing: its mirror holds what it applied)
        try:
            async with admin_of(etcd) as admin:
                before = queue("from-before")
                await put(admin, *before)
                await old.start()
                await old.stop()
                upgraded = Node(tmp_path, etcd, secret, "old")  # the same node, upgraded
                await upgraded.start()
                assert before[:2] in upgraded.broker
                await reader.start()
                await writer.start()
                signed = queue("signed")
                writer.metadata.put(*signed)
                await writer.metadata.written()
                value = json.loads((await admin.get(etcd_key(*signed[:2]))).value)
                assert MAC_FIELD in value

                async def signed_everywhere() -> bool:
                    stored = await admin.get(etcd_key(*before[:2]))
                    return signed[:2] in reader.broker and MAC_FIELD in json.loads(stored.value)

                await until(signed_everywhere, "a signed record is applied and the old one signed again")
                assert before[:2] in reader.broker
                planted, forged = queue("planted"), queue("forged")
                await put(admin, *planted)
                await admin.put(etcd_key(*forged[:2]), Signer(b"another secret").seal(etcd_key(*forged[:2]), forged[2]))
                await put(admin, *signed[:2], {**signed[2], "arguments": {"x-max-length": 1}})
                probe = queue("probe-signed")  # once it is applied, the watch has passed what came before
                writer.metadata.put(*probe)

                async def probed() -> bool:
                    return probe[:2] in reader.broker

                await until(probed, "the watch passes the planted records")
                assert planted[:2] not in reader.broker and forged[:2] not in reader.broker
                assert reader.broker[signed[:2]] == signed[2]
                restarted = Node(tmp_path, etcd, secret, "late")
                try:
                    await restarted.start()  # a full read refuses them too
                    assert planted[:2] not in restarted.broker and forged[:2] not in restarted.broker
                    assert signed[:2] not in restarted.broker  # (overwritten unsigned: none to keep)
                finally:
                    await restarted.stop()
                await upgraded.stop()
        finally:
            await writer.stop()
            await reader.stop()
        refusals = [r.getMessage() for r in caplog.records if "not signed with the cluster secret" in r.getMessage()]
        assert any("planted" in line for line in refusals) and any("forged" in line for line in refusals)

    run(scenario())


def test_a_broken_watch_reads_everything_again_whatever_etcd_compacted(tmp_path, etcd, monkeypatch, run):
    """etcd restarts (the watch breaks); before the node watches again, definitions are deleted, changed and made,
    and the history compacted: the node's next read is a full one, and its broker has etcd's state."""

    async def scenario() -> None:
        async with node_and_admin(tmp_path, etcd) as (node, admin):
            monkeypatch.setattr(metadata, "RETRY_INTERVAL", 5.0)
            kept, deleted, changed = queue("kept"), queue("deleted"), queue("changed")
            for definition in (kept, deleted, changed):
                await put(admin, *definition)
            await node.start()
            await watched(node, admin)
            etcd.kill()
            etcd.start()
            await admin.delete(etcd_key(*deleted[:2]))
            await put(admin, *changed[:2], {**changed[2], "arguments": {"x-max-length": 5}})
            revision = await put(admin, *queue("made"))
            await admin.compact(revision)

            async def same() -> bool:
                return node.broker == await held(admin)

            await until(same, "the node has etcd's definitions")
            assert node.metadata.reloads >= 2

    run(scenario())


def test_the_mirror_is_current_only_from_a_full_read_with_its_watch_on(tmp_path, etcd, monkeypatch, run):
    """Not before the first full read; no longer once the watch breaks (etcd restarts), until etcd is read again:
    current again, the mirror has what etcd took meanwhile (a publish routed nowhere may trust it then)."""

    async def scenario() -> None:
        async with node_and_admin(tmp_path, etcd) as (node, admin):
            monkeypatch.setattr(metadata, "RETRY_INTERVAL", 0.5)
            current = node.metadata.current
            assert not current.is_set()
            await node.start()
            await asyncio.wait_for(current.wait(), 10)
            await watched(node, admin)
            read = asyncio.Event()  # the node's next full read waits for it
            get_prefix = node.client.get_prefix

            async def held_read(*args: Any, **kwargs: Any) -> Any:
                await read.wait()
                return await get_prefix(*args, **kwargs)

            node.client.get_prefix = held_read
            etcd.kill()

            async def stale() -> bool:
                return not current.is_set()

            await until(stale, "the broken watch makes the mirror stale", timeout=10)
            etcd.start()
            made = queue("made while the watch was broken")
            await put(admin, *made)
            await asyncio.sleep(2 * metadata.RETRY_INTERVAL)
            assert not current.is_set()  # etcd answers again, but the node has not read it yet
            read.set()
            await asyncio.wait_for(current.wait(), 15)
            assert made[:2] in node.broker

    run(scenario())


def test_a_watch_quiet_while_etcd_changes_is_found_and_everything_read_again(tmp_path, etcd, monkeypatch, run):
    """A watch whose stream ended without an error (aetcd then delivers nothing more): the periodic comparison of
    etcd's keys with the mirror's finds a change that stays unapplied, and reads everything again."""

    async def scenario() -> None:
        async with node_and_admin(tmp_path, etcd) as (node, admin):
            monkeypatch.setattr(metadata, "CHECK_INTERVAL", 0.3)
            real_watch = node.client.watch_prefix

            class Quiet:
                async def __aiter__(self):
                    await asyncio.Event().wait()
                    yield

                async def cancel(self) -> None:
                    pass

            async def quiet_once(*args: Any, **kwargs: Any) -> Any:
                node.client.watch_prefix = real_watch
                return Quiet()

            node.client.watch_prefix = quiet_once
            await node.start()
            await put(admin, *queue("later"))

            async def applied() -> bool:
                return ("queue", queue("later")[1]) in node.broker

            await until(applied, "the definition made meanwhile is applied", timeout=5)
            assert node.metadata.reloads == 2

    run(scenario())


def test_a_name_too_long_for_the_store_s_keys_is_mirrored_and_started_from(tmp_path, etcd, run):
    """A queue of 85 three-byte characters: escaped, its etcd key is over the store's key limit (kept under its
    hash).  Its mirror entry still names it, so a restart reads it back (a node used to fail to start)."""

    async def scenario() -> None:
        async with admin_of(etcd) as admin:
            long = queue("\u6c34" * 85)
            await put(admin, *long)
            first = Node(tmp_path, etcd)
            await first.start()
            await first.stop()
            again = Node(tmp_path, etcd)
            try:
                assert [(kind, key) for kind, key, _ in again.metadata.mirrored()] == [long[:2]]
                await again.start()
                assert again.broker == {long[:2]: long[2]}
            finally:
                await again.stop()

    run(scenario())


def test_members_are_read_again_after_a_broken_watch_whatever_etcd_compacted(tmp_path, etcd, monkeypatch, run):
    async def scenario() -> None:
        async with admin_of(etcd) as admin:
            monkeypatch.setattr(membership, "RETRY_INTERVAL", 5.0)
            joined: dict[str, dict[str, Any]] = {}
            seen: list[str] = []

            def join(name: str, address: dict[str, Any]) -> None:
                joined[name] = address
                seen.append(name)

            def leave(name: str) -> None:
                joined.pop(name, None)

            client = aetcd.Client(port=etcd.port, timeout=5)
            members = Membership(client, "a", "run-a", {"name": "a"}, join, leave, lambda name: None)
            await admin.put(MEMBERS_PREFIX + b"b", json.dumps({"name": "b"}).encode())
            try:
                await members.start()
                await admin.put(MEMBERS_PREFIX + b"live", json.dumps({"name": "live"}).encode())
                await admin.delete(MEMBERS_PREFIX + b"live")

                async def watching() -> bool:  # (the watch runs: it saw a member come and go)
                    return list(joined) == ["b"] and seen == ["b", "live"]

                await until(watching, "the watch runs")
                etcd.kill()
                etcd.start()
                await admin.delete(MEMBERS_PREFIX + b"b")
                reply = await admin.put(MEMBERS_PREFIX + b"c", json.dumps({"name": "c"}).encode())
                await admin.compact(reply.header.revision)

                async def caught_up() -> bool:
                    return list(joined) == ["c"]

                await until(caught_up, "node b left and node c joined")
            finally:
                await members.stop()
                await client.close()

    run(scenario())


def test_a_member_is_down_once_etcd_holds_no_alive_key_of_it(etcd, run):
    """A node holds its alive key under a lease while it runs and revokes it as it stops: another node hears of
    a member without one (already at start, or once it goes) as down, and of none that holds one."""

    async def scenario() -> None:
        async with admin_of(etcd) as admin:
            lapsed: list[str] = []
            client = aetcd.Client(port=etcd.port, timeout=5)
            b_client = aetcd.Client(port=etcd.port, timeout=5)
            await admin.put(MEMBERS_PREFIX + b"gone", json.dumps({"name": "gone"}).encode())
            a = Membership(client, "a", "run-a", {"name": "a"}, lambda name, address: None, lambda name: None,
                           lapsed.append)
            b = Membership(b_client, "b", "run-b", {"name": "b"}, lambda name, address: None, lambda name: None,
                           lambda name: None)
            try:
                await b.start()
                await a.start()
                assert lapsed == ["gone"] and (await admin.get(ALIVE_PREFIX + b"b")).value == b"run-b"
                assert a.alive == {"b"}
                await b.stop()

                async def b_down() -> bool:
                    return lapsed == ["gone", "b"]

                await until(b_down, "node b taken for down")
                assert await admin.get(ALIVE_PREFIX + b"b") is None and not a.alive
            finally:
                await a.stop()
                await client.close()
                await b_client.close()

    run(scenario())


def test_a_watch_made_after_one_that_timed_out_follows_its_own_keys(etcd, run):
    """etcd frozen: a watch's create times out and the next one's waits.  Once etcd answers, the late answer to
    the first is not taken for the second's (aetcd takes the next answer for the watch it waits for): the second
    follows its own keys, not the first's.  A node's leader watch once followed the definitions so, and never
    heard that the leader's key went."""

    async def first_timed_out(client: etcd_client.EtcdClient) -> asyncio.Future[Any] | None:
        """etcd stopped, a watch of /first/ timed out and one of /second/ waits: that one; None if etcd answered
        the first after all (it had not stopped yet: once in about 25 runs on a loaded machine)."""
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            try:
                first = await client.watch_prefix(b"/first/")
            except aetcd.WatchTimeoutError:
                second = asyncio.ensure_future(client.watch_prefix(b"/second/"))
                await asyncio.sleep(0.3)
                return second
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        await first.cancel()
        return None

    async def scenario() -> None:
        client = etcd_client.EtcdClient("127.0.0.1", etcd.port, None, None, None, timeout=1)
        async with admin_of(etcd) as admin:
            try:
                await client.put(b"/warm", b"up")
                for _ in range(3):
                    if (second := await first_timed_out(client)) is not None:
                        break
                assert second is not None, "etcd answered a watch's create while stopped, three times"
                watch = await asyncio.wait_for(second, 10)
                await admin.put(b"/first/key", b"1")
                await admin.put(b"/second/key", b"2")
                event = await asyncio.wait_for(anext(aiter(watch)), 5)
                assert event.kv.key == b"/second/key"
            finally:
                await client.close()

    run(scenario())


class _CreatedOnCue:
    """An etcd client, as far as the mirror uses it at start, whose watch is created when the test says, and
    waited for as aetcd waits for one (``asyncio.wait_for``)."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()  # a watch create was sent
        self.created = asyncio.Event()  # etcd answered it

    async def get_prefix(self, prefix: bytes, keys_only: bool = False) -> Any:
        return _Reply()

    async def watch_prefix(self, prefix: bytes, **options: Any) -> Any:
        self.asked.set()
        await asyncio.wait_for(self.created.wait(), 5)
        return _Quiet()


class _Reply(list):
    header = type("Header", (), {"revision": 1})


class _Quiet:
    """A watch on which nothing happens."""

    def __aiter__(self) -> _Quiet:
        return self

    async def __anext__(self) -> Any:
        await asyncio.Event().wait()


def test_a_stop_that_meets_a_watch_s_creation_ends_the_mirror(tmp_path, run):
    """The stop's cancel comes just as etcd answers the watch create: Python 3.11's ``wait_for`` returns the
    answer and drops the cancel, and the mirror goes on to follow the watch.  The stop cancels again, and ends
    (it once waited for good: the cluster tests' first test hung so, one run in a few)."""

    async def scenario() -> None:
        client = _CreatedOnCue()
        store = DefinitionStore(str(tmp_path / "store"))
        mirror = Metadata(client, store, lambda *change: None, None)
        try:
            mirror.start()
            await asyncio.wait_for(client.asked.wait(), 5)
            client.created.set()
            await asyncio.wait_for(mirror.stop(), 5)
        finally:
            store.close()

    run(scenario())


def test_another_node_reaches_a_change_made_here_once_its_watch_applied_it(tmp_path, etcd, run):
    """A change made here (a put, a create, a delete) is ``made`` at its revision; another node's ``reached`` of
    that revision returns only once its watch applied the change, and at once for a revision it has passed."""

    async def scenario() -> None:
        here, there = Node(tmp_path, etcd, name="here"), Node(tmp_path, etcd, name="there")
        try:
            await here.start()
            await there.start()
            kind, key, record = queue("made-here")
            here.metadata.put(kind, key, record)
            await here.metadata.written()
            put_at = here.metadata.made
            assert put_at > 0
            await asyncio.wait_for(there.metadata.reached(put_at), 10)
            assert there.broker[(kind, key)] == record  # applied before ``reached`` returned
            created = queue("created-here")
            await here.metadata.create(*created)
            assert here.metadata.made > put_at
            await asyncio.wait_for(there.metadata.reached(here.metadata.made), 10)
            assert created[:2] in there.broker
            here.metadata.delete(kind, key)
            await here.metadata.written()
            await asyncio.wait_for(there.metadata.reached(here.metadata.made), 10)
            assert (kind, key) not in there.broker
            await asyncio.wait_for(there.metadata.reached(put_at), 0.01)  # (passed: no wait)
            pending = asyncio.ensure_future(there.metadata.reached(here.metadata.made + 1))
            await asyncio.sleep(0.3)
            assert not pending.done()  # nothing made that far yet
            async with admin_of(etcd) as admin:
                await put(admin, *queue("later"))
            await asyncio.wait_for(pending, 10)
        finally:
            await here.stop()
            await there.stop()

    run(scenario())


def test_a_node_hears_etcd_again_within_a_second_of_its_return(etcd, run):
    """After 10 s without etcd (a restart, a cut), a node's client reaches it again within a second of its return:
    gRPC's own backoff (1 s, then 1.6 times longer each try) made it up to 6.5 s, during which a queue whose leader
    had died meanwhile elected none."""
    proxy = Cuttable(etcd.port)
    client = etcd_client.EtcdClient("127.0.0.1", proxy.port, None, None, None, timeout=5)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        async def answers() -> bool:
            try:
                await asyncio.wait_for(client.get(b"probe"), 1.0)
                return True
            except (aetcd.ClientError, asyncio.TimeoutError):
                return False

        assert await answers()
        proxy.cut()
        away = loop.time() + 10.5
        while loop.time() < away:
            assert not await answers()
            await asyncio.sleep(0.2)
        proxy.restore()
        back = loop.time()
        while not await answers():
            assert loop.time() - back < 10, "etcd never heard again"
            await asyncio.sleep(0.05)
        assert loop.time() - back < 1.5
        await client.close()

    try:
        run(scenario())
    finally:
        proxy.close()

"""Each of the core's services in-process (amqp_server/broker/): built alone with what it depends on where that
is little (definitions, bindings, exchanges, routing), else through the core that builds them all.  No sockets,
no frames: the rules every front end relies on, in milliseconds.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from amqp_server import errors
from amqp_server.access_control import Permissions, Principal, TopicPermission, User
from amqp_server.broker import Broker
from amqp_server.broker.bindings import Bindings
from amqp_server.broker.definitions import Definitions
from amqp_server.broker.exchanges import Exchanges
from amqp_server.broker.routing import Router
from amqp_server.definition_store import DefinitionStore
from amqp_server.broker.direct_reply import ReplyConsumers
from amqp_server.errors import ChannelError, ConnectionError
from amqp_server.queues.policy import Policies
from amqp_server.records import Record, name_key
from amqp_server.spark_bridge.commit import Commit
from amqp_server.broker.vhost import VHost

from support import Target, consume, drain_local, local, message, publish_local

NOBODY = Principal("nobody", None)


class Cluster:
    """What the definitions service tells the cluster, recorded."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str]] = []  # (defined/undefined, kind, key)
        self.agreed: list[Record] = []
        self.writes = 0

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None:
        self.told.append(("defined", kind, key))

    def undefined(self, kind: str, key: str) -> None:
        self.told.append(("undefined", kind, key))

    async def written(self) -> None:
        self.writes += 1

    async def agree(self, record: Record) -> None:
        self.agreed.append(record)


@pytest.fixture
def store(tmp_path) -> Iterator[DefinitionStore]:
    store = DefinitionStore(str(tmp_path / "definitions"))
    yield store
    store.close()


@pytest.fixture
def definitions(store: DefinitionStore) -> Definitions:
    return Definitions(store)


@pytest.fixture
def exchanges(definitions: Definitions, store: DefinitionStore) -> Exchanges:
    return Exchanges(Bindings(definitions), definitions, Policies(store))


# -- definitions ---------------------------------------------------------------------------------------------

async def test_definitions_keep_durable_ones_and_tell_the_cluster_of_every_one(definitions, store):
    from amqp_server.records import ExchangeRecord
    durable, transient = ExchangeRecord("/", "d", "direct", True), ExchangeRecord("/", "t", "direct", False)
    definitions.define(durable, True)
    definitions.define(transient, False)  # not kept: no cluster to tell either
    assert store.get("exchange", durable.key) is not None and store.get("exchange", transient.key) is None
    cluster = definitions.cluster = Cluster()
    await definitions.agreed()
    definitions.undefine(durable, True)
    definitions.define(transient, False)
    assert store.get("exchange", durable.key) is None
    assert cluster.told == [("undefined", "exchange", durable.key), ("defined", "exchange", transient.key)]
    assert cluster.writes == 1


def test_definitions_refuse_a_clients_definition_past_the_store_size_not_an_imports(tmp_path):
    store = DefinitionStore(str(tmp_path / "small"), max_size=2000)
    try:
        definitions = Definitions(store)
        with pytest.raises(ChannelError) as full:
            definitions.check_room("queue 'q'", {"x-big": "y" * 4000}, NOBODY)
        assert full.value.code == errors.PRECONDITION_FAILED and "cannot declare queue 'q'" in full.value.detail
        definitions.check_room("queue 'q'", {"x-big": "y" * 4000}, None)  # an administrator's import
    finally:
        store.close()


# -- bindings and exchanges: built with a definition store and nothing else ------------------------------------

def test_exchanges_declare_with_rabbitmqs_equivalence_and_keep_the_durable_ones(exchanges, store):
    vhost = VHost("/")
    exchange = exchanges.declare_exchange(vhost, "x", "topic", durable=True)
    assert exchanges.declare_exchange(vhost, "x", "topic", durable=True) is exchange
    assert store.get("exchange", name_key("/", "x")) is not None
    with pytest.raises(ChannelError) as inequivalent:
        exchanges.declare_exchange(vhost, "x", "fanout", durable=True)
    assert inequivalent.value.detail == ("inequivalent arg 'type' for exchange 'x' in vhost '/': received 'fanout' "
                                       "but current is 'topic'")
    with pytest.raises(ChannelError) as reserved:
        exchanges.declare_exchange(vhost, "amq.new", "direct")
    assert reserved.value.code == errors.ACCESS_REFUSED
    with pytest.raises(ConnectionError) as unknown:
        exchanges.declare_exchange(vhost, "y", "no-such-type")
    assert unknown.value.code == errors.COMMAND_INVALID
    with pytest.raises(ChannelError) as missing:
        exchanges.declare_exchange(vhost, "absent", "direct", passive=True)
    assert missing.value.code == errors.NOT_FOUND


def test_deleting_an_exchange_takes_its_bindings_both_ways_and_its_definition(exchanges, store):
    vhost = VHost("/")
    bindings = exchanges.bindings
    exchanges.declare_exchange(vhost, "up", "fanout", durable=True)
    exchanges.declare_exchange(vhost, "mid", "fanout", durable=True)
    exchanges.declare_exchange(vhost, "down", "fanout", durable=True)
    bindings.add_binding(vhost, "up", vhost.exchanges["mid"], "")
    bindings.add_binding(vhost, "mid", vhost.exchanges["down"], "")
    assert vhost.e2e_bindings == 2 and len(list(store.items("binding"))) == 2
    with pytest.raises(ChannelError) as in_use:
        exchanges.delete_exchange(vhost, "mid", if_unused=True)
    assert in_use.value.code == errors.PRECONDITION_FAILED
    exchanges.delete_exchange(vhost, "mid")
    assert "mid" not in vhost.exchanges and vhost.e2e_bindings == 0 and vhost.sources == {}
    assert list(store.items("binding")) == [] and {r["name"] for _, r in store.items("exchange")} == {"up", "down"}
    exchanges.delete_exchange(vhost, "mid")  # idempotent, as RabbitMQ


def test_an_auto_delete_exchange_goes_with_its_last_binding_and_its_own_bindings_with_it(exchanges):
    vhost = VHost("/")
    bindings = exchanges.bindings
    exchanges.declare_exchange(vhost, "src", "direct")
    exchanges.declare_exchange(vhost, "auto", "direct", auto_delete=True)
    exchanges.declare_exchange(vhost, "sink", "fanout")
    bindings.add_binding(vhost, "src", vhost.exchanges["auto"], "a")
    bindings.add_binding(vhost, "auto", vhost.exchanges["sink"], "k")
    bindings.add_binding(vhost, "auto", vhost.exchanges["sink"], "l")
    bindings.remove_binding(vhost, "auto", vhost.exchanges["sink"], "k")
    assert "auto" in vhost.exchanges  # one binding left
    bindings.remove_binding(vhost, "auto", vhost.exchanges["sink"], "l")
    assert "auto" not in vhost.exchanges  # and the binding to it from src went with it
    assert not vhost.exchanges["src"].has_bindings and vhost.e2e_bindings == 0 and vhost.sources == {}
    bindings.remove_binding(vhost, "auto", vhost.exchanges["sink"], "l")  # nothing to unbind is no error


def test_binding_checks_permissions_the_default_exchange_and_the_ends_in_rabbitmqs_order(exchanges):
    vhost = VHost("/")
    bindings = exchanges.bindings
    with pytest.raises(ChannelError) as refused:
        bindings.bind(vhost, "amq.direct", "exchange", "nowhere", "", who=NOBODY)
    assert refused.value.code == errors.ACCESS_REFUSED  # write on the destination, before it is looked for
    with pytest.raises(ChannelError) as default:
        bindings.bind(vhost, "", "exchange", "amq.fanout", "")
    assert default.value.detail == "operation not permitted on the default exchange"
    with pytest.raises(ChannelError) as source:
        bindings.bind(vhost, "missing", "exchange", "also-missing", "")
    assert source.value.detail == "no exchange 'missing' in vhost '/'"  # the source is told first
    bindings.bind(vhost, "amq.direct", "exchange", "amq.fanout", "k")
    listed = [(source, destination.name, key) for source, destination, key, _ in bindings.all(vhost)]
    assert listed == [("amq.direct", "amq.fanout", "k")]  # (no queue: no default-exchange binding)


async def test_agreeing_an_exchange_asks_the_cluster_only_in_cluster_mode_and_only_for_a_new_one(exchanges):
    vhost = VHost("/")
    await exchanges.agree_exchange(vhost, "x", "direct")  # no cluster: nothing to agree
    cluster = exchanges.definitions.cluster = Cluster()
    await exchanges.agree_exchange(vhost, "x", "direct", durable=True)
    await exchanges.agree_exchange(vhost, "amq.direct", "direct")
    with pytest.raises(ConnectionError) as refused:  # declare's error, before the cluster is asked
        await exchanges.agree_exchange(vhost, "y", "no-such-type")
    assert refused.value.code == 503
    assert [record.key for record in cluster.agreed] == [name_key("/", "x")]


# -- routing: built with the reply-to consumers and a stand-in for the delayed exchange ---------------------------

class NoDelays:
    def defer(self, *args: Any) -> None:
        raise AssertionError("no delayed exchange here")


def test_routing_by_cc_and_bcc_reaches_each_queue_once_and_strips_bcc(core, vhost):
    for name in ("a", "b", "c"):
        core.declare_queue(vhost, name)
    router = Router(ReplyConsumers(), NoDelays())  # type: ignore[arg-type]  # (never deferred here)
    sent = message(routing_key="a", headers={"CC": ["b", "a"], "BCC": ["c"]})
    assert sorted(queue.name for queue in router.route(vhost, vhost.exchange(""), sent)) == ["a", "b", "c"]
    assert "BCC" not in (sent.headers or {}) and sent.bcc_keys == ("c",)


def test_routing_follows_exchange_to_exchange_bindings_and_alternate_exchanges(core, vhost):
    core.declare_exchange(vhost, "alt", "fanout")
    core.declare_exchange(vhost, "main", "direct", arguments={"alternate-exchange": "alt"})
    core.declare_exchange(vhost, "e2e", "fanout")
    for name in ("caught", "direct", "via-e2e"):
        core.declare_queue(vhost, name)
    core.bind(vhost, "alt", "queue", "caught", "")
    core.bind(vhost, "main", "queue", "direct", "k")
    core.bind(vhost, "main", "exchange", "e2e", "k")
    core.bind(vhost, "e2e", "queue", "via-e2e", "")
    main = vhost.exchange("main")

    def routed(key: str) -> list[str]:
        return sorted(q.name for q in core.router.route(vhost, main, message(routing_key=key, exchange="main")))
    assert routed("k") == ["direct", "via-e2e"] and routed("other") == ["caught"]


def test_a_cc_message_goes_to_one_queue_of_a_consistent_hash_exchange_hashed_on_its_first_key(core, vhost):
    """rabbit_exchange_type_consistent_hash:route/2 hashes the message's routing keys list, of which
    jump_consistent_hash/2 takes the head (the routing key): CC/BCC keys add no bucket, no queue."""
    core.declare_exchange(vhost, "chx", "x-consistent-hash")
    for i in range(4):
        core.declare_queue(vhost, f"q{i}")
        core.bind(vhost, "chx", "queue", f"q{i}", "1")
    chx = vhost.exchange("chx")
    for i in range(20):
        alone = list(core.router.route(vhost, chx, message(routing_key=f"k{i}", exchange="chx")))
        with_cc = list(core.router.route(vhost, chx, message(routing_key=f"k{i}", exchange="chx",
                                                             headers={"CC": [f"c{j}" for j in range(20)]})))
        assert with_cc == alone and len(alone) == 1


def test_unbinding_any_binding_of_a_queue_takes_it_off_a_consistent_hash_ring_until_it_is_bound_again(core, vhost):
    """rabbit_exchange_type_consistent_hash:remove_binding/1 removes every bucket of the destination, whichever of
    its bindings went; add_binding/3 puts a destination with no bucket back, at the end of the ring."""
    core.declare_exchange(vhost, "chx", "x-consistent-hash")
    for name in ("a", "b"):
        core.declare_queue(vhost, name)
    for name, weight in (("a", "1"), ("a", "2"), ("b", "1")):
        core.bind(vhost, "chx", "queue", name, weight)
    core.unbind(vhost, "chx", "queue", "a", "2")
    chx = vhost.exchange("chx")

    def reached() -> set[str]:
        return {queue.name for i in range(200)
                for queue in core.router.route(vhost, chx, message(routing_key=f"key{i}", exchange="chx"))}
    assert reached() == {"b"}
    core.bind(vhost, "chx", "queue", "a", "3")
    assert reached() == {"a", "b"}


def test_a_cc_message_goes_to_one_queue_of_a_local_random_exchange(core, vhost):
    """The random exchanges' route/2 ignore the routing keys: one queue picked per message, whatever CC adds."""
    core.declare_exchange(vhost, "lr", "x-local-random")
    for i in range(4):
        core.declare_queue(vhost, f"q{i}")
        core.bind(vhost, "lr", "queue", f"q{i}", "")
    lr = vhost.exchange("lr")
    counts = {len(list(core.router.route(vhost, lr, message(routing_key="k", exchange="lr",
                                                            headers={"CC": [f"c{j}" for j in range(20)]}))))
              for _ in range(20)}
    assert counts == {1}


def test_a_delayed_message_goes_at_once_to_its_delayed_exchanges_alternate_exchange_too(core, vhost):
    """rabbit_exchange:route1/3 calls process_alternate/2 with the type's answer; the delayed plugin's route/2
    answers [] for a message it delays, so the alternate exchange gets it at publish time (and the exchange routes
    it again when due)."""
    core.declare_exchange(vhost, "alt", "fanout")
    core.declare_queue(vhost, "caught")
    core.bind(vhost, "alt", "queue", "caught", "")
    core.declare_exchange(vhost, "dx", "x-delayed-message",
                          arguments={"x-delayed-type": "direct", "alternate-exchange": "alt"})
    core.declare_queue(vhost, "q")
    core.bind(vhost, "dx", "queue", "q", "k")
    routed = core.router.route(vhost, vhost.exchange("dx"),
                               message(routing_key="k", exchange="dx", headers={"x-delay": 60000}))
    assert [queue.name for queue in routed] == ["caught"]
    assert core.delayed.pending == {("/", "dx"): 1}


async def test_a_queue_the_publish_reaches_at_once_beside_a_delayed_exchange_gets_the_x_delay_as_sent(core, vhost):
    """The plugin negates x-delay on the copy it routes when due (swap_delay_header); a queue the same publish
    reached at once, through another binding of an upstream exchange, gets the message as published."""
    core.declare_exchange(vhost, "up", "fanout")
    core.declare_exchange(vhost, "dx", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    for name in ("now", "later"):
        core.declare_queue(vhost, name)
    core.bind(vhost, "up", "queue", "now", "")
    core.bind(vhost, "up", "exchange", "dx", "")
    core.bind(vhost, "dx", "queue", "later", "")
    assert core.publish(vhost, vhost.exchange("up"), message(routing_key="k", exchange="up",
                                                             headers={"x-delay": 60000})) == (True, False)
    entry = core.get_local(vhost, "now", no_ack=True)[1]
    assert entry is not None and entry.message.headers["x-delay"] == 60000


def test_a_cc_message_goes_by_each_key_through_a_delayed_exchange_over_a_direct_one(core, vhost):
    """The delayed plugin's route/2 routes a message it does not delay with its underlying type's: by every key."""
    core.declare_exchange(vhost, "dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    for name in ("a", "b"):
        core.declare_queue(vhost, name)
        core.bind(vhost, "dx", "queue", name, name)
    routed = core.router.route(vhost, vhost.exchange("dx"), message(routing_key="a", exchange="dx",
                                                                   headers={"CC": ["b"]}))
    assert sorted(queue.name for queue in routed) == ["a", "b"]


# -- messages ------------------------------------------------------------------------------------------------

async def test_publish_answers_routed_and_rejected_as_the_queues_took_it(core, vhost):
    core.declare_queue(vhost, "one", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    default = vhost.exchange("")
    assert core.messages.publish(vhost, default, message(routing_key="one")) == (True, False)
    assert core.messages.publish(vhost, default, message(routing_key="one")) == (True, True)  # full: rejected
    assert core.messages.publish(vhost, default, message(routing_key="nowhere")) == (False, False)
    assert default.publish_in == 3 and default.publish_out == 2


GUEST = User("guest", "")


async def test_messages_check_user_id_and_expiration_as_rabbitmq(core, vhost):
    default = vhost.exchange("")
    with pytest.raises(ChannelError) as user_id:
        core.messages.check_message(vhost, default, None, message(routing_key="q", user_id="mallory"), GUEST)
    assert user_id.value.detail == "user_id property set to 'mallory' but authenticated user was 'guest'"
    core.messages.check_message(vhost, default, None, message(routing_key="q", user_id="mallory"),
                                User("guest", "", ["impersonator"]))  # rabbit_channel check_user_id_header
    with pytest.raises(ChannelError) as expiration:
        core.messages.check_message(vhost, default, None, message(routing_key="q", expiration="-1"), GUEST)
    assert expiration.value.detail == "invalid expiration '-1': {value_negative,-1}"


async def test_moving_messages_keeps_their_order_and_stops_at_a_full_destination(core, vhost):
    core.declare_queue(vhost, "from")
    core.declare_queue(vhost, "to", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    publish_local(core, vhost, "from", b"1", b"2", b"3")
    source, destination = vhost.queues["from"], vhost.queues["to"]
    assert core.messages.move_messages(source, destination) == 2
    assert drain_local(core, vhost, "to") == [b"1", b"2"] and drain_local(core, vhost, "from") == [b"3"]
    with pytest.raises(ChannelError):
        core.messages.move_messages(source, source)


# -- dead letters --------------------------------------------------------------------------------------------

async def test_a_rejected_message_goes_to_the_dead_letter_exchange_with_its_death_recorded(core, vhost):
    core.declare_queue(vhost, "work", arguments={"x-dead-letter-exchange": "amq.fanout"})
    core.declare_queue(vhost, "dead")
    core.bind(vhost, "amq.fanout", "queue", "dead", "")
    publish_local(core, vhost, "work", b"poison")
    queue, entry = core.get_local(vhost, "work", no_ack=False)
    assert entry is not None
    core.nack_taken([(entry, queue, None)], requeue=False)
    _, dead = core.get_local(vhost, "dead", no_ack=True)
    assert dead is not None and dead.message.body == b"poison"
    death = dead.message.headers["x-death"][0]
    assert (death["queue"], death["reason"], death["count"]) == ("work", "rejected", 1)


async def test_dead_letters_no_queue_takes_are_handed_back(core, vhost):
    core.declare_queue(vhost, "work", arguments={"x-dead-letter-exchange": "amq.direct"})
    publish_local(core, vhost, "work", b"lost")
    queue, entry = core.get_local(vhost, "work", no_ack=False)
    assert entry is not None
    assert core.dead_letters.dead_letter(queue, [entry], "rejected") == [entry]  # routed nowhere
    core.declare_queue(vhost, "plain")
    assert core.dead_letters.dead_letter(vhost.queues["plain"], [entry], "expired") == [entry]  # no DLX


# -- queues --------------------------------------------------------------------------------------------------

class Owner:
    """A connection that owns exclusive queues (ports.ExclusiveOwner)."""

    def __init__(self, name: str) -> None:
        self.name, self.vhost_name, self.peer = name, "/", ("127.0.0.1", 1)
        self.exclusive_queues: set = set()

    def force_close(self, reason: str) -> None:
        pass


async def test_an_exclusive_queue_is_locked_to_others_and_goes_with_its_connection(core, vhost):
    owner, other = Owner("mine"), Owner("theirs")
    core.queues.declare_queue(vhost, "x", exclusive=True, owner=owner)
    with pytest.raises(ChannelError) as locked:
        core.queues.consumable(vhost, "x", owner=other)
    assert locked.value.code == errors.RESOURCE_LOCKED
    with pytest.raises(ChannelError):
        core.queues.declare_queue(vhost, "x", passive=True, owner=other)
    core.queues.connection_closed(owner)
    assert "x" not in vhost.queues and owner.exclusive_queues == set()


async def test_queue_redeclaration_checks_equivalence_in_rabbitmqs_words(core, vhost):
    core.queues.declare_queue(vhost, "q", durable=True, arguments={"x-max-length": 5})
    with pytest.raises(ChannelError) as durable:
        core.queues.declare_queue(vhost, "q", durable=False, arguments={"x-max-length": 5})
    assert durable.value.detail == ("inequivalent arg 'durable' for queue 'q' in vhost '/': received 'false' but "
                                  "current is 'true'")
    with pytest.raises(ChannelError) as argument:
        core.queues.declare_queue(vhost, "q", durable=True)
    assert argument.value.detail == ("inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but "
                                   "current is the value '5' of type 'signedint'")


async def test_an_auto_delete_queue_goes_with_its_last_consumer_and_its_bindings_with_it(core, vhost):
    core.queues.declare_queue(vhost, "auto", auto_delete=True)
    core.bind(vhost, "amq.direct", "queue", "auto", "k")
    target = Target()
    first, second = consume(core, vhost, "auto", target, "a"), consume(core, vhost, "auto", target, "b")
    core.queues.remove_consumer(first)
    assert "auto" in vhost.queues
    core.queues.remove_consumer(second)
    assert "auto" not in vhost.queues and not vhost.exchanges["amq.direct"].has_bindings


async def test_queue_index_ids_are_never_reused(core, vhost):
    first = core.queues.declare_queue(vhost, "a", durable=True).index_id
    core.queues.delete_queue(vhost, "a")
    assert core.queues.declare_queue(vhost, "a", durable=True).index_id > first


async def test_a_queue_whose_storage_fails_to_go_is_deleted_whole_not_brought_back_by_a_restart(tmp_path, monkeypatch):
    """Its storage raising as it goes (a bug, a disk) leaves no definition behind: gone from memory but kept in
    the store, the queue came back at the next start."""
    data = str(tmp_path / "data")
    core = Broker(data)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    queue = local(vhost.queues["q"])

    def failing() -> None:
        raise OSError("the disk")

    monkeypatch.setattr(queue, "drop_all", failing)
    with pytest.raises(OSError):
        core.queues.delete_queue(vhost, "q")
    assert "q" not in vhost.queues
    core.close()
    core = Broker(data)
    try:
        assert "q" not in core.vhost("/").queues
    finally:
        core.close()


async def test_a_stream_taken_with_a_segment_size_below_the_floor_segments_at_the_floor(core, vhost):
    """RabbitMQ takes any segment size (rabbitmq-amqp-python-client's test declares 200), so Warren does; its log
    segments at ``MIN_SEGMENT_BYTES`` all the same, or a client would have a file made per chunk."""
    from amqp_server.queues.queue_args import MIN_SEGMENT_BYTES
    from amqp_server.queues.stream_queue import StreamQueue
    big = 2 * MIN_SEGMENT_BYTES
    for name, size, segments in (("tiny", 200, MIN_SEGMENT_BYTES), ("big", big, big)):
        queue = core.declare_queue(vhost, name, durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": size})
        assert isinstance(queue, StreamQueue) and queue.arguments["x-stream-max-segment-size-bytes"] == size
        assert queue.log.segment_bytes == segments


# -- vhosts --------------------------------------------------------------------------------------------------

async def test_deleting_a_vhost_removes_what_it_had_from_memory_and_the_store(core):
    vhost = core.add_vhost("v")
    core.declare_exchange(vhost, "x", "direct", durable=True)
    core.declare_queue(vhost, "q", durable=True)
    core.bind(vhost, "x", "queue", "q", "k")
    core.virtual_hosts.delete_vhost("v")
    assert "v" not in core.vhosts
    assert all(record["vhost"] != "v" for kind in ("exchange", "queue", "binding")
               for _, record in core.store.items(kind))
    with pytest.raises(ConnectionError) as gone:
        core.virtual_hosts.vhost("v")
    assert gone.value.code == errors.NOT_ALLOWED


async def test_warren_admin_delete_vhost_leaves_no_queue_or_policy_to_come_back(tmp_path):
    """warren-admin delete-vhost deletes what rabbit_vhost:delete/2 does, everything the vhost had (the sweep
    VHosts.delete_vhost runs): the vhost made again has neither the old policy nor, after a restart, the old
    queue."""
    from amqp_server.node import admin
    from amqp_server.queues.policy import Policy
    data = str(tmp_path / "data")
    core = Broker(data)
    vhost = core.add_vhost("v")
    core.declare_queue(vhost, "old", durable=True)
    core.virtual_hosts.set_policy("policy", Policy("v", "old-policy", ".*", {"max-length": 1}, 0, "queues"))
    core.close()
    assert admin.main(["--data-dir", data, "delete-vhost", "v"]) == 0
    core = Broker(data)
    core.add_vhost("v")  # made again, empty
    policies = [p.name for p in core.policies.list("policy", "v")]
    core.close()
    core = Broker(data)
    try:
        queues = list(core.vhost("v").queues)
    finally:
        core.close()
    assert (policies, queues) == ([], [])


async def test_a_policy_sending_dead_letters_needs_write_on_that_exchange(core):
    from amqp_server.queues.policy import Policy
    policy = Policy("/", "p", ".*", {"dead-letter-exchange": "dlx"}, 0, "queues")
    with pytest.raises(ChannelError) as refused:
        core.virtual_hosts.set_policy("policy", policy, who=NOBODY)
    assert refused.value.code == errors.ACCESS_REFUSED


# -- recovery and the Spark bridge's commit ---------------------------------------------------------------------

async def test_a_restart_recovers_durable_definitions_and_the_offsets_committed(tmp_path):
    data = str(tmp_path / "data")
    core = Broker(data)
    vhost = core.vhost("/")
    core.declare_exchange(vhost, "x", "direct", durable=True)
    core.declare_queue(vhost, "q", durable=True)
    core.declare_queue(vhost, "transient")
    core.bind(vhost, "x", "queue", "q", "k")
    for body in (b"1", b"2", b"3"):
        core.publish(vhost, vhost.exchange("x"), message(body, "k", "x", delivery_mode=2))
    queue = local(vhost.queues["q"])
    assert await Commit(core).commit_offset(queue, 2) == 2
    tail = queue.next_seq
    await asyncio.sleep(0)
    core.close()
    core = Broker(data)
    try:
        vhost = core.vhost("/")
        assert "transient" not in vhost.queues and local(vhost.queues["q"]).committed == 2
        assert local(vhost.queues["q"]).next_seq >= tail
        assert [q.name for q in core.route(vhost, vhost.exchange("x"), message(routing_key="k", exchange="x"))] == ["q"]
        assert drain_local(core, vhost, "q") == [b"3"]
    finally:
        core.close()


# -- more of each service: what a front end relies on and no client test pins alone ------------------------------

def test_a_binding_is_kept_only_when_both_ends_are_durable_and_never_to_an_exclusive_queue(exchanges, store):
    vhost = VHost("/")
    bindings = exchanges.bindings
    exchanges.declare_exchange(vhost, "durable", "fanout", durable=True)
    exchanges.declare_exchange(vhost, "transient", "fanout")
    exchanges.declare_exchange(vhost, "sink", "fanout", durable=True)
    bindings.add_binding(vhost, "durable", vhost.exchanges["sink"], "kept")
    bindings.add_binding(vhost, "transient", vhost.exchanges["sink"], "not kept")
    assert [record["routing_key"] for _, record in store.items("binding")] == ["kept"]
    bindings.add_binding(vhost, "durable", vhost.exchanges["sink"], "kept")  # again: one binding, one record
    assert len(list(store.items("binding"))) == 1 and vhost.e2e_bindings == 2


def test_unbinding_what_is_not_there_is_no_error_but_the_default_exchange_is_refused(exchanges):
    vhost = VHost("/")
    bindings = exchanges.bindings
    bindings.unbind(vhost, "amq.direct", "queue", "no-such-queue", "k")
    bindings.unbind(vhost, "no-such-exchange", "exchange", "amq.fanout", "k")
    with pytest.raises(ChannelError) as default:
        bindings.remove_binding(vhost, "", vhost.exchanges["amq.fanout"], "k")
    assert default.value.code == errors.ACCESS_REFUSED


def test_bindings_list_the_default_exchanges_implicit_binding_of_every_queue(core, vhost):
    core.declare_queue(vhost, "q")
    core.bind(vhost, "amq.topic", "queue", "q", "a.#", {"x-k": 1})
    listed = [(source, destination.name, key, arguments) for source, destination, key, arguments
              in core.bindings.all(vhost)]
    assert listed == [("", "q", "q", {}), ("amq.topic", "q", "a.#", {"x-k": 1})]


def test_routing_through_an_exchange_cycle_reaches_each_queue_once_and_ends(core, vhost):
    core.declare_exchange(vhost, "a", "fanout")
    core.declare_exchange(vhost, "b", "fanout")
    core.bind(vhost, "a", "exchange", "b", "")
    core.bind(vhost, "b", "exchange", "a", "")
    core.declare_queue(vhost, "q")
    core.bind(vhost, "a", "queue", "q", "")
    core.bind(vhost, "b", "queue", "q", "")
    assert [queue.name for queue in core.router.route(vhost, vhost.exchange("a"), message())] == ["q"]


def test_an_alternate_exchange_that_does_not_exist_leaves_the_message_unroutable(core, vhost):
    core.declare_exchange(vhost, "x", "direct", arguments={"alternate-exchange": "missing"})
    core.declare_exchange(vhost, "e2e", "fanout")
    core.bind(vhost, "x", "exchange", "e2e", "k")  # exchange-to-exchange bindings: the router's own walk
    assert list(core.router.route(vhost, vhost.exchange("x"), message(routing_key="other", exchange="x"))) == []
    assert core.publish(vhost, vhost.exchange("x"), message(routing_key="other", exchange="x")) == (False, False)


def test_the_default_exchange_routes_cc_keys_only_to_queues_that_exist(core, vhost):
    core.declare_queue(vhost, "a")
    routed = core.router.route(vhost, vhost.exchange(""), message(routing_key="a", headers={"CC": ["gone"]}))
    assert [queue.name for queue in routed] == ["a"]


async def test_publishing_to_an_internal_exchange_is_refused_in_rabbitmqs_words(core, vhost):
    core.declare_exchange(vhost, "inside", "fanout", internal=True)
    with pytest.raises(ChannelError) as refused:
        core.messages.check_publish(vhost, vhost.exchange("inside"), NOBODY, "")
    assert refused.value.code == errors.ACCESS_REFUSED  # write permission first: nobody has none
    with pytest.raises(ChannelError) as internal:
        core.messages.check_publish(vhost, vhost.exchange("inside"), None, "")
    assert internal.value.detail == "cannot publish to internal exchange 'inside' in vhost '/'"


async def test_get_purge_and_peek_answer_for_the_queue_and_only_get_takes(core, vhost):
    core.declare_queue(vhost, "q")
    assert core.get_local(vhost, "q", no_ack=True)[1] is None
    publish_local(core, vhost, "q", b"1", b"2", b"3")
    queue = vhost.queues["q"]
    assert [entry.message.body for entry in core.messages.peek(queue, 1, 5)] == [b"2", b"3"]
    assert queue.message_count == 3
    _, entry = core.get_local(vhost, "q", no_ack=True)
    assert entry is not None and entry.message.body == b"1"
    assert core.messages.purge_local(vhost, "q") == 2 and queue.message_count == 0
    with pytest.raises(ChannelError) as missing:
        core.messages.purge_local(vhost, "absent")
    assert missing.value.code == errors.NOT_FOUND


async def test_moving_a_count_moves_only_that_many_from_the_head(core, vhost):
    core.declare_queue(vhost, "from")
    core.declare_queue(vhost, "to")
    publish_local(core, vhost, "from", b"1", b"2", b"3", b"4")
    assert core.messages.move_messages(vhost.queues["from"], vhost.queues["to"], count=3) == 3
    assert drain_local(core, vhost, "to") == [b"1", b"2", b"3"] and drain_local(core, vhost, "from") == [b"4"]


async def test_settling_requeues_in_place_rejects_to_the_dead_letter_exchange_and_acks_drop(core, vhost):
    core.declare_queue(vhost, "work", arguments={"x-dead-letter-exchange": "amq.fanout"})
    core.declare_queue(vhost, "dead")
    core.bind(vhost, "amq.fanout", "queue", "dead", "")
    publish_local(core, vhost, "work", b"a", b"b", b"c")
    taken = [(core.get_local(vhost, "work", no_ack=False)[1], vhost.queues["work"], None) for _ in range(3)]
    core.settle_taken([taken[0]], requeue=True)
    core.settle_taken([taken[1]], requeue=False, reject=True)
    core.settle_taken([taken[2]], requeue=False)
    assert drain_local(core, vhost, "work") == [b"a"] and drain_local(core, vhost, "dead") == [b"b"]


async def test_a_dead_letter_routing_key_replaces_the_messages_and_the_death_counts_per_queue_and_reason(core, vhost):
    core.declare_queue(vhost, "work", arguments={"x-dead-letter-exchange": "amq.direct",
                                                  "x-dead-letter-routing-key": "dlq"})
    core.declare_queue(vhost, "dlq")
    core.bind(vhost, "amq.direct", "queue", "dlq", "dlq")
    publish_local(core, vhost, "work", b"m")
    queue, entry = core.get_local(vhost, "work", no_ack=False)
    assert entry is not None and core.dead_letters.dead_letter(queue, [entry], "rejected") == []
    _, dead = core.get_local(vhost, "dlq", no_ack=False)
    assert dead is not None and dead.message.routing_key == "dlq"
    assert core.dead_letters.dead_letter(queue, [dead], "rejected") == []  # from work again: its count goes up
    _, twice = core.get_local(vhost, "dlq", no_ack=True)
    assert twice is not None
    (death,) = twice.message.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == ("work", "rejected", 2)
    assert death["routing-keys"] == ["work"]  # the key it was first published with


async def test_deleting_a_queue_if_unused_or_if_empty_refuses_as_rabbitmq_and_else_counts_what_it_had(core, vhost):
    core.declare_queue(vhost, "q")
    publish_local(core, vhost, "q", b"1", b"2")
    consumer = consume(core, vhost, "q", Target(), "c", prefetch=1)
    with pytest.raises(ChannelError) as in_use:
        core.queues.delete_queue(vhost, "q", if_unused=True)
    assert (in_use.value.code, in_use.value.detail) == (errors.PRECONDITION_FAILED, "queue 'q' in vhost '/' in use")
    with pytest.raises(ChannelError) as both:  # if-empty is checked first (rabbit_amqqueue_process)
        core.queues.delete_queue(vhost, "q", if_unused=True, if_empty=True)
    assert both.value.detail == "queue 'q' in vhost '/' not empty"
    core.queues.remove_consumer(consumer)
    with pytest.raises(ChannelError) as not_empty:
        core.queues.delete_queue(vhost, "q", if_empty=True)
    assert not_empty.value.detail == "queue 'q' in vhost '/' not empty"
    assert core.queues.delete_queue(vhost, "q") == 1 and "q" not in vhost.queues  # the ready: one is held
    assert core.queues.delete_queue(vhost, "q") == 0  # idempotent


async def test_a_queue_name_with_the_reserved_prefix_is_refused_unless_the_server_named_it(core, vhost):
    with pytest.raises(ChannelError) as reserved:
        core.queues.declare_queue(vhost, "amq.mine")
    assert reserved.value.detail == "queue name 'amq.mine' contains reserved prefix 'amq.*'"
    assert core.queues.declare_queue(vhost, "amq.gen-1", server_named=True).name == "amq.gen-1"


async def test_an_exclusive_consumer_wants_the_queue_alone_and_nobody_joins_it(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    first = consume(core, vhost, "q", target, "first", exclusive=True)
    with pytest.raises(ChannelError) as joined:
        consume(core, vhost, "q", target, "second")
    assert joined.value.code == errors.ACCESS_REFUSED
    assert joined.value.detail == "queue 'q' in vhost '/' in exclusive use"
    core.queues.remove_consumer(first)
    consume(core, vhost, "q", target, "plain")
    with pytest.raises(ChannelError):
        consume(core, vhost, "q", target, "exclusive", exclusive=True)


async def test_a_policy_applies_to_the_queues_it_matches_and_no_others(core, vhost):
    from amqp_server.queues.policy import Policy
    core.virtual_hosts.set_policy("policy", Policy("/", "cap", "^capped", {"max-length": 1}, 0, "queues"))
    core.declare_queue(vhost, "capped")
    core.declare_queue(vhost, "free")
    publish_local(core, vhost, "capped", b"1", b"2")
    publish_local(core, vhost, "free", b"1", b"2")
    assert drain_local(core, vhost, "capped") == [b"2"]  # drop-head: the newest kept
    assert drain_local(core, vhost, "free") == [b"1", b"2"]


async def test_a_policy_with_a_key_the_queue_type_does_not_support_does_not_apply_to_it(core, vhost):
    """rabbit_policy:matches/2 -> rabbit_queue_type:is_policy_applicable/2 (3.10.8): a policy with any key of the
    type's unsupported_policies (rabbit_classic_queue's lists delivery-limit) does not match the queue at all, and
    the next by priority applies; a quorum queue, which supports delivery-limit, takes the first."""
    from amqp_server.queues.policy import Policy
    core.virtual_hosts.set_policy("policy", Policy("/", "hi", "^q", {"max-length": 1, "delivery-limit": 5}, 10,
                                                   "queues"))
    core.virtual_hosts.set_policy("policy", Policy("/", "lo", "^q", {"max-length": 2}, 0, "queues"))
    core.declare_queue(vhost, "q")
    core.declare_queue(vhost, "qq", durable=True, arguments={"x-queue-type": "quorum"})
    publish_local(core, vhost, "q", b"1", b"2", b"3")
    assert (vhost.queues["q"].policy.name, vhost.queues["qq"].policy.name) == ("lo", "hi")
    assert drain_local(core, vhost, "q") == [b"2", b"3"]


async def test_a_policy_pattern_matches_the_names_bytes_as_erlang_re_does(core, vhost):
    """rabbit_policy:matches/2 runs re:run(Name, Pattern, [{capture, none}]) on the name's binary without the
    ``unicode`` option: '.' is one byte, and \\w a Latin-1 letter of one byte (the first byte of é's two, C3, is Ã,
    the second, A9, ©), so neither '^caf.$' nor '^\\w+$' matches 'café' (5 bytes), and 'é' in a pattern is its bytes."""
    from amqp_server.queues.policy import Policy
    core.virtual_hosts.set_policy("policy", Policy("/", "dot", "^caf.$", {"max-length": 1}, 2, "queues"))
    core.virtual_hosts.set_policy("policy", Policy("/", "word", "^\\w+$", {"max-length": 1}, 1, "queues"))
    core.declare_queue(vhost, "café")
    assert vhost.queues["café"].policy is None
    core.virtual_hosts.set_policy("policy", Policy("/", "bytes", "^caf..$", {"max-length": 1}, 0, "queues"))
    assert vhost.queues["café"].policy == core.policies.get("policy", "/", "bytes")


def test_permission_and_topic_patterns_match_the_names_bytes_as_erlang_re_does():
    """rabbit_auth_backend_internal:check_resource_access and check_topic_access run re:run without ``unicode``
    too: a pattern's '.' is one byte of the name or routing key."""
    assert not Permissions(configure="^caf.$").allows("configure", "café")
    assert Permissions(configure="^caf..$").allows("configure", "café")
    who = Principal("u", Permissions(), {"t": TopicPermission("t", write="^caf.$")})
    with pytest.raises(ChannelError) as refused:
        who.check_topic("write", "/", "t", "café")
    assert refused.value.code == errors.ACCESS_REFUSED


async def test_a_new_vhost_has_the_standard_exchanges_and_an_unknown_one_is_not_allowed(core):
    vhost = core.add_vhost("fresh")
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} <= set(vhost.exchanges)
    assert core.virtual_hosts.vhost("fresh") is vhost
    with pytest.raises(ConnectionError) as unknown:
        core.virtual_hosts.vhost("never-made")
    assert (unknown.value.code, unknown.value.detail) == (errors.NOT_ALLOWED, "vhost never-made not found")


async def test_a_restart_takes_back_the_stored_delayed_messages(tmp_path):
    """A durable delayed exchange's messages wait on in the store across a clean restart, counted for their
    exchange (the schedule claims them back as the store recovers), a transient one too: the plugin keeps every
    delivery in disc_copies tables (internal_delay_message/4), whatever its delivery_mode."""
    data = str(tmp_path / "data")
    first = Broker(data)
    vhost = first.vhost("/")
    first.declare_exchange(vhost, "later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    for body, mode in ((b"kept", 2), (b"too", 2), (b"transient", 1)):
        first.publish(vhost, vhost.exchange("later"), message(body, "q", "later", delivery_mode=mode,
                                                              headers={"x-delay": 600_000}))
    assert first.delayed.pending == {("/", "later"): 3}
    await asyncio.sleep(0)
    first.close()
    again = Broker(data)
    try:
        assert again.delayed.pending == {("/", "later"): 3}
    finally:
        again.close()


async def test_a_transient_delayed_message_on_a_durable_exchange_is_routed_when_due_after_a_clean_restart(tmp_path):
    """The plugin re-arms its stored deliveries at boot (init/1 -> recover/0, go -> maybe_delay_first/0), a
    transient one's too: after a clean restart it is routed when due."""
    data = str(tmp_path / "data")
    first = Broker(data)
    vhost = first.vhost("/")
    first.declare_exchange(vhost, "dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    first.declare_queue(vhost, "q", durable=True)
    first.bind(vhost, "dx", "queue", "q", "k")
    assert first.publish(vhost, vhost.exchange("dx"), message(b"transient", "k", "dx", headers={"x-delay": 300}))[0]
    await asyncio.sleep(0)
    first.close()
    again = Broker(data)
    try:
        vhost = again.vhost("/")
        await asyncio.sleep(0.8)
        assert drain_local(again, vhost, "q") == [b"transient"]
    finally:
        again.close()


async def test_a_restart_keeps_persistent_messages_of_durable_queues_and_exchange_to_exchange_bindings(tmp_path):
    data = str(tmp_path / "data")
    first = Broker(data)
    vhost = first.vhost("/")
    first.declare_exchange(vhost, "up", "fanout", durable=True)
    first.declare_exchange(vhost, "down", "direct", durable=True)
    first.declare_queue(vhost, "q", durable=True)
    first.bind(vhost, "up", "exchange", "down", "")
    first.bind(vhost, "down", "queue", "q", "")
    first.publish(vhost, vhost.exchange("up"), message(b"kept", "", "up", delivery_mode=2))
    first.publish(vhost, vhost.exchange("up"), message(b"lost", "", "up"))
    await asyncio.sleep(0)
    first.close()
    again = Broker(data)
    try:
        vhost = again.vhost("/")
        assert drain_local(again, vhost, "q") == [b"kept"]
        routed = again.route(vhost, vhost.exchange("up"), message(routing_key="", exchange="up"))
        assert [queue.name for queue in routed] == ["q"]
    finally:
        again.close()


QUEUE_TYPES = pytest.mark.parametrize("queue_type", ["classic", "quorum"])


@QUEUE_TYPES
async def test_a_requeue_past_a_drop_head_limit_drops_from_the_head(core, vhost, queue_type):
    """rabbit_amqqueue_process's requeue_and_run (maybe_drop_head), as rabbit_fifo's return (checkout, then
    evaluate_limit): a requeue that takes the queue past x-max-length drops from the head at once."""
    core.declare_queue(vhost, "q", durable=True, arguments={"x-max-length": 2, "x-queue-type": queue_type})
    publish_local(core, vhost, "q", b"1")
    queue, taken = core.get_local(vhost, "q", no_ack=False)
    assert taken is not None
    publish_local(core, vhost, "q", b"2", b"3")
    core.settle(queue, [taken], requeue=True)
    assert queue.message_count == 2
    assert len(drain_local(core, vhost, "q")) == 2


@QUEUE_TYPES
@pytest.mark.parametrize("limit", [{"x-max-length": 0}, {"x-max-length-bytes": 3}])
async def test_a_drop_head_limit_leaves_a_waiting_consumer_what_it_takes_at_once(core, vhost, queue_type, limit):
    """rabbit_amqqueue_process's deliver_or_enqueue tries a delivery first and drops the head only for a message
    none took (as rabbit_fifo checks its limit after the checkout): a message over the limit on its own still
    goes to a consumer with credit."""
    core.declare_queue(vhost, "q", durable=True, arguments={**limit, "x-queue-type": queue_type})
    target = Target()
    consume(core, vhost, "q", target, "c", prefetch=10)
    publish_local(core, vhost, "q", b"1234", b"5678")
    assert target.bodies("c") == [b"1234", b"5678"]

"""PublisherFlow in-process: a publisher is released only when every reason to hold it is gone."""
from __future__ import annotations

from amqp_server.publisher_flow import DISK, MEMORY, PublisherFlow, alarm_on, link


class FakePublisher:
    """Records what the flow told it, as a connection would act on it."""

    def __init__(self) -> None:
        self.reading = True
        self.alarm: str | None = None  # the connection.blocked text a client was last told

    def hold(self, alarm: str | None) -> None:
        self.reading = False
        self.alarm = alarm

    def release(self) -> None:
        self.reading = True
        self.alarm = None


def test_memory_alarm_cleared_while_a_link_is_full_keeps_the_publisher_held():
    flow, publisher = PublisherFlow(), FakePublisher()
    flow.publishing(publisher)
    flow.block(link("n2"))
    assert not publisher.reading and publisher.alarm is None  # flow, as RabbitMQ's: no connection.blocked
    flow.block(MEMORY)
    assert publisher.alarm == "low on memory"
    flow.unblock(MEMORY)
    assert not publisher.reading, "released while the link is still full"
    assert publisher.alarm is None  # connection.unblocked: the alarm is over
    flow.unblock(link("n2"))
    assert publisher.reading


def test_link_drained_during_an_alarm_keeps_the_publisher_blocked():
    flow, publisher = PublisherFlow(), FakePublisher()
    flow.publishing(publisher)
    flow.block(MEMORY)
    flow.block(link("n2"))
    flow.unblock(link("n2"))
    assert not publisher.reading and publisher.alarm == "low on memory"
    flow.unblock(MEMORY)
    assert publisher.reading


def test_reasons_are_counted_once_and_named():
    flow, publisher = PublisherFlow(), FakePublisher()
    flow.publishing(publisher)
    flow.block(link("n2"))
    flow.block(link("n2"))
    flow.block(link("n3"))
    flow.block(DISK)
    assert flow.reasons == ["link to n2", "link to n3", "disk"]
    assert flow.alarm() == "low on disk"  # rabbit_reader's blocked_by_message: "low on " and the resources
    flow.block(MEMORY)
    assert flow.alarm() == "low on disk & memory"
    flow.unblock(MEMORY)
    flow.unblock(link("n2"))
    flow.unblock(DISK)
    assert not publisher.reading
    flow.unblock(link("n3"))
    assert publisher.reading and not flow.blocked
    flow.unblock(link("n3"))  # clearing what is not set changes nothing
    assert publisher.reading


def test_a_new_publisher_is_held_at_once_and_a_gone_one_is_forgotten():
    flow, first, late = PublisherFlow(), FakePublisher(), FakePublisher()
    flow.publishing(first)
    flow.block(MEMORY)
    flow.publishing(late)
    assert not late.reading and late.alarm == "low on memory"
    flow.gone(first)
    flow.unblock(MEMORY)
    assert late.reading and not first.reading  # first was not told: it is closed


def test_a_publish_holds_its_connection_only_while_the_reasons_of_that_time_stand():
    """rabbit_reader's publish_received and maybe_unblock: a connection is held once it publishes during an
    alarm, until no reason is left; the next alarm holds it only at its next publish."""
    flow, publisher = PublisherFlow(), FakePublisher()
    flow.published(publisher)
    flow.block(MEMORY)
    assert publisher.reading, "held for a publish sent before the alarm"
    flow.published(publisher)
    assert not publisher.reading and publisher.alarm == "low on memory"
    flow.block(link("n2"))
    flow.unblock(MEMORY)
    assert not publisher.reading and publisher.alarm is None
    flow.unblock(link("n2"))
    assert publisher.reading
    flow.block(MEMORY)
    assert publisher.reading, "the last alarm's publish holds it in this one"


def test_another_node_s_alarm_holds_publishers_under_its_resource_s_name():
    """rabbit_alarm tells every node's readers of any node's alarm; blocked_by_message names each resource once."""
    flow, publisher = PublisherFlow(), FakePublisher()
    flow.block(alarm_on(DISK, "n2"), DISK)
    flow.published(publisher)
    assert not publisher.reading and publisher.alarm == "low on disk"
    assert not flow.alarmed(DISK)  # not this node's: the local health check passes
    flow.block(DISK)
    assert flow.alarm() == "low on disk"
    flow.unblock(DISK)
    flow.unblock(alarm_on(DISK, "n2"))
    assert publisher.reading

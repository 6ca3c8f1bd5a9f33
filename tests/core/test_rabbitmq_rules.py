"""Rules of RabbitMQ's that a client can see, in-process: what a declaration checks when the exchange or queue is
there already, what a headers binding is and what it matches, and the ``x-first-death-*`` headers."""
from __future__ import annotations

from decimal import Decimal

import pytest

from amqp_server.access_control import Permissions, Principal
from amqp_server.errors import ChannelError
from support import message, publish_local


def routed(core, vhost, exchange: str, msg) -> set[str]:
    return {queue.name for queue in core.route(vhost, vhost.exchange(exchange), msg)}


async def test_declaring_an_exchange_again_needs_no_permission_on_its_alternate(core, vhost):
    """rabbit_channel checks read on the exchange and write on its alternate exchange when it makes the exchange,
    not when it is declared again: an application allowed its own exchange alone declares it at each start."""
    core.declare_exchange(vhost, "ae-target", "fanout")
    core.declare_exchange(vhost, "with-ae", "direct", arguments={"alternate-exchange": "ae-target"})
    app = Principal("app", Permissions(configure="^with-ae$", write="^with-ae$", read="^with-ae$"))
    core.declare_exchange(vhost, "with-ae", "direct", arguments={"alternate-exchange": "ae-target"}, who=app)
    with pytest.raises(ChannelError) as refused:  # a new one does need it
        core.declare_exchange(vhost, "with-ae", "direct", arguments={"alternate-exchange": "other"},
                              who=Principal("app", Permissions(configure=".*", write="^with-ae$", read=".*")))
    assert refused.value.code == 406  # (declared already: inequivalent, its permission not asked)
    with pytest.raises(ChannelError) as refused:
        core.declare_exchange(vhost, "new-ae", "direct", arguments={"alternate-exchange": "ae-target"},
                              who=Principal("app", Permissions(configure=".*", write="^new-ae$", read=".*")))
    assert refused.value.code == 403


async def test_declaring_a_queue_again_needs_no_permission_on_its_dead_letter_exchange(core, vhost):
    """As for an exchange's alternate: read on the queue and write on its dead-letter exchange are checked when
    the queue is made."""
    core.declare_queue(vhost, "app-q", arguments={"x-dead-letter-exchange": "amq.fanout"})
    app = Principal("app", Permissions(configure="^app-q$", write="^app-q$", read="^nothing$"))
    core.declare_queue(vhost, "app-q", arguments={"x-dead-letter-exchange": "amq.fanout"}, who=app)
    with pytest.raises(ChannelError) as refused:
        core.declare_queue(vhost, "new-q", arguments={"x-dead-letter-exchange": "amq.fanout"},
                           who=Principal("app", Permissions(configure=".*", write="^new-q$", read=".*")))
    assert refused.value.code == 403


async def test_declaring_the_default_exchange_is_refused_as_such_before_any_permission(core, vhost):
    """rabbit_channel's order: the type, the default exchange, then configure permission."""
    app = Principal("app", Permissions(configure="^nothing$"))
    with pytest.raises(ChannelError) as refused:
        core.declare_exchange(vhost, "", "direct", who=app)
    assert refused.value.detail == "operation not permitted on the default exchange"


@pytest.mark.parametrize("bound, header, matches", [
    (True, True, True), (True, 1, False), (1, 1, True), (1, 1.0, True), ("pdf", "pdf", True),
    ("pdf", bytearray(b"pdf"), True), (bytearray(b"pdf"), "pdf", True), ("pdf", "pdg", False),
    (1, Decimal(1), False)])
async def test_a_headers_binding_matches_values_as_erlang_compares_them(core, vhost, bound, header, matches):
    """rabbit_exchange_type_headers matches a value with ``PV == DV``: a string and a byte array of the same bytes
    are one binary (Go's []byte and Java's byte[] go as byte arrays), and the long 1 is the double 1.0; but true is
    not 1, nor a decimal 1 the long 1, which Python finds equal."""
    core.declare_exchange(vhost, "hx", "headers")
    core.declare_queue(vhost, "hq")
    core.bind(vhost, "hx", "queue", "hq", "", {"x-match": "all", "f": bound})
    assert routed(core, vhost, "hx", message(b"m", "", "hx", headers={"f": header})) == ({"hq"} if matches else set())


async def test_headers_bindings_whose_arguments_differ_in_type_alone_are_two(core, vhost):
    """A binding's identity is its typed argument table: ``{f: true}`` and ``{f: 1}`` are two bindings, and
    unbinding one leaves the other."""
    core.declare_exchange(vhost, "hb", "headers")
    core.declare_queue(vhost, "hbq")
    core.bind(vhost, "hb", "queue", "hbq", "", {"x-match": "any", "f": True})
    core.bind(vhost, "hb", "queue", "hbq", "", {"x-match": "any", "f": 1})
    assert routed(core, vhost, "hb", message(b"m", "", "hb", headers={"f": 1})) == {"hbq"}
    core.unbind(vhost, "hb", "queue", "hbq", "", {"x-match": "any", "f": True})
    assert routed(core, vhost, "hb", message(b"m", "", "hb", headers={"f": 1})) == {"hbq"}
    assert routed(core, vhost, "hb", message(b"m", "", "hb", headers={"f": True})) == set()


def rejected_into(core, vhost, queue: str, headers: dict) -> dict:
    """The headers of a message published to ``queue`` with ``headers``, rejected, as its dead letter has them."""
    core.declare_queue(vhost, queue, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    core.declare_queue(vhost, "dead")
    publish_local(core, vhost, queue, b"m", headers=headers)
    taken, entry = core.get_local(vhost, queue, no_ack=False)
    core.nack_taken([(entry, taken, None)], requeue=False)
    _, dead = core.get_local(vhost, "dead", no_ack=True)
    return dead.message.headers


async def test_the_first_death_headers_are_set_when_a_message_has_no_x_death(core, vhost):
    """rabbit_dead_letter sets ``x-first-death-*`` when the message has no ``x-death`` header, over any it
    carries (a consumer that dropped ``x-death`` and published it again starts its history anew)."""
    headers = rejected_into(core, vhost, "w", {"x-first-death-queue": "stale", "x-first-death-reason": "expired",
                                               "x-first-death-exchange": "old"})
    assert [headers[f"x-first-death-{name}"] for name in ("queue", "reason", "exchange")] == ["w", "rejected", ""]


async def test_the_first_death_headers_are_not_added_to_a_message_with_an_x_death(core, vhost):
    headers = rejected_into(core, vhost, "w", {"x-death": [{"queue": "elsewhere", "reason": "expired", "count": 1}]})
    assert "x-first-death-queue" not in headers
    assert [death["queue"] for death in headers["x-death"]] == ["w", "elsewhere"]


async def test_a_dead_letters_headers_are_sorted_by_name_as_rabbitmq_writes_them(core, vhost):
    """rabbit_dead_letter writes x-death and x-first-death-* with rabbit_misc:set_table_value, which sorts the
    table by name; an x-death entry counted again is sorted too (sort_field_table), a new one keeps its order."""
    headers = rejected_into(core, vhost, "w", {"zz": 1, "aa": 2})
    assert list(headers) == ["aa", "x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
                             "zz"]
    assert list(headers["x-death"][0]) == ["count", "reason", "queue", "time", "exchange", "routing-keys"]
    again = rejected_into(core, vhost, "w2", {"x-death": [{"reason": "rejected", "queue": "w2", "count": 1}]})
    assert list(again["x-death"][0]) == ["count", "queue", "reason"]

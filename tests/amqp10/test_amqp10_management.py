"""The /management node as RabbitMQ 4.x's rabbit_amqp_management answers it, driven by Proton's event API so a
session the node ends shows as the condition it ended with (the blocking clients wait on for a response)."""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from amqp_server.access_control import Permissions
from support import Running, start

proton = pytest.importorskip("proton")
from proton import Message, symbol  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container, LinkOption  # noqa: E402


@pytest.fixture
def node(tmp_path: Any) -> Any:
    running = start(tmp_path)
    yield running
    running.stop()


class _Paired(LinkOption):
    def apply(self, link: Any) -> None:
        link.properties = {symbol("paired"): True}
        if link.is_sender:
            link.target.address = "/management"
        else:
            link.source.address = "/management"


class _Requests(MessagingHandler):
    """Sends each request once the link pair is up; keeps each response, or the condition the session ended with."""

    def __init__(self, url: str, requests: list[tuple[str, str, Any]]) -> None:
        super().__init__()
        self.url, self.requests = url, list(requests)
        self.answers: list[tuple[str, Any]] = []
        self.ended: tuple[str, str] | None = None
        self.sent = False

    def on_start(self, event: Any) -> None:
        connection = event.container.connect(self.url, allowed_mechs="PLAIN")
        event.container.create_sender(connection, name="mgmt", options=_Paired())
        event.container.create_receiver(connection, name="mgmt", options=_Paired())

    def on_sendable(self, event: Any) -> None:
        if not self.sent:
            self.sent = True
            for path, method, body in self.requests:
                event.sender.send(Message(id=str(uuid.uuid4()), address=path, subject=method, reply_to="$me",
                                          body=body, inferred=False))

    def on_message(self, event: Any) -> None:
        self.answers.append((event.message.subject, event.message.body))
        if len(self.answers) == len(self.requests):
            event.connection.close()

    def on_session_remote_close(self, event: Any) -> None:
        condition = event.session.remote_condition
        self.ended = (condition.name, condition.description) if condition is not None else ("", "")
        event.connection.close()


def _ask(node: Running, requests: list[tuple[str, str, Any]], user: str = "guest",
         password: str = "guest") -> _Requests:
    handler = _Requests(f"amqp://{user}:{password}@127.0.0.1:{node.port}", requests)
    container = Container(handler)
    container.timeout = 10
    container.run()
    return handler


def test_an_authorization_failure_ends_the_session_with_unauthorized_access(node):
    """rabbit_amqp_session ``check_resource_access`` turns access_refused into a protocol_error: the session ends
    with amqp:unauthorized-access and RabbitMQ's text, it is no 403 response (the session went on, and the
    client's next request on it would be taken)."""
    node.call(lambda: node.node.broker.access.add_user("reader", "secret"))
    node.call(lambda: node.node.broker.access.set_permissions("/", "reader", Permissions(configure="^$")))
    handler = _ask(node, [("/queues/not-mine", "PUT", {}), ("/queues/not-mine", "GET", None)], "reader", "secret")
    assert handler.answers == []
    assert handler.ended == ("amqp:unauthorized-access",
                             "access to queue 'not-mine' in vhost '/' refused for user 'reader'")
    assert node.call(lambda: "not-mine" not in node.node.broker.vhosts["/"].queues)


def test_errors_of_purge_delete_and_bindings_are_400_and_a_declarations_precondition_409(node):
    """rabbit_amqp_management's purge and binding handlers catch every ``amqp_error`` as 400 (a missing queue too:
    it was 404); a declaration's precondition_failed is 409 and GET of a missing queue 404."""
    handler = _ask(node, [
        ("/queues/missing/messages", "DELETE", None),
        ("/bindings", "POST", {"source": "amq.direct", "destination_queue": "missing", "binding_key": "k",
                               "arguments": {}}),
        ("/queues/q", "PUT", {}),
        ("/queues/q", "PUT", {"arguments": {"x-queue-type": "quorum"}}),
        ("/queues/missing", "GET", None),
    ])
    assert handler.ended is None
    assert handler.answers == [
        ("400", "no queue 'missing' in vhost '/'"),
        ("400", "no queue 'missing' in vhost '/'"),
        ("201", handler.answers[2][1]),
        ("409", "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type "
                "'longstr' but current is none"),
        ("404", "queue 'missing' in vhost '/' not found"),
    ]


def test_a_body_with_a_field_rabbitmq_does_not_know_is_refused_400_quoting_it(node):
    """rabbit_amqp_management's decode_queue / decode_exchange / decode_binding refuse an unknown key or a value of
    the wrong type with 400 and the entry as Erlang prints it, and args_amqp_to_amqpl an argument whose key is no
    string (they were taken, the unknown key ignored); nothing is declared or bound."""
    binding = {"source": "amq.direct", "destination_queue": "q", "binding_key": "k", "arguments": {}}
    handler = _ask(node, [
        ("/queues/q", "PUT", {"durable": True, "foo": True}),
        ("/queues/q", "PUT", {"durable": 1}),
        ("/queues/q", "PUT", {"arguments": {7: "seven"}}),
        ("/exchanges/e", "PUT", {"type": "fanout", "bar": [1.5, "é\n", b"\x00\x01"]}),
        ("/queues/q", "PUT", {}),
        ("/bindings", "POST", {**binding, "extra": None}),
        ("/bindings?src=amq.direct&dstq=q&key=k", "GET", None),
    ])
    assert handler.ended is None
    assert [status for status, _ in handler.answers] == ["400"] * 4 + ["201", "400", "200"]
    assert [answer for answer in handler.answers if answer[0] != "201"] == [
        ("400", 'bad queue property {{utf8,<<"foo">>},true}'),
        ("400", 'bad queue property {{utf8,<<"durable">>},{long,1}}'),
        ("400", 'unsupported argument {{long,7},{utf8,<<"seven">>}}'),
        ("400", 'bad exchange property {{utf8,<<"bar">>},{list,[{double,1.5},{utf8,<<"é\\n"/utf8>>},'
                '{binary,<<0,1>>}]}}'),
        ("400", 'bad binding field {{utf8,<<"extra">>},null}'),
        ("200", []),
    ]
    assert node.call(lambda: "e" not in node.node.broker.vhosts["/"].exchanges)


def test_the_vhosts_queue_limit_is_403(node):
    """rabbit_amqp_management answers the queue type's queue_limit_exceeded with 403 (it was 409)."""
    node.call(lambda: node.node.broker.access.set_limits("vhost_limits", "/", {"max-queues": 0}))
    handler = _ask(node, [("/queues/over", "PUT", {})])
    assert handler.answers == [("403", "cannot declare queue 'over': queue limit in vhost '/' (0) is reached")]


def test_a_property_the_queue_type_refuses_is_400(node):
    """A quorum queue or stream exclusive, auto-deleted or not durable: RabbitMQ 4.x's queue type returns
    {protocol_error, ...} (rabbit_queue_type_util's checks), which PUT /queues answers 400 (it was 409)."""
    handler = _ask(node, [
        ("/queues/qq", "PUT", {"exclusive": True, "arguments": {"x-queue-type": "quorum"}}),
        ("/queues/s", "PUT", {"durable": False, "arguments": {"x-queue-type": "stream"}}),
    ])
    assert handler.answers == [("400", "invalid property 'exclusive-owner' for queue 'qq' in vhost '/'"),
                               ("400", "invalid property 'non-durable' for queue 's' in vhost '/'")]


def test_purging_a_stream_is_400_in_rabbit_amqp_managements_words(node):
    """rabbit_queue_type:purge of a stream answers {error, not_supported}: 400 'purge not supported by ~ts' (it was
    0-9-1's queue.purge text)."""
    handler = _ask(node, [("/queues/s", "PUT", {"arguments": {"x-queue-type": "stream"}}),
                          ("/queues/s/messages", "DELETE", None)])
    assert handler.answers[1] == ("400", "purge not supported by queue 's' in vhost '/'")

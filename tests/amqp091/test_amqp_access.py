"""Logins, vhosts and permissions through pika, and an error kept within its channel or connection, checked
against what RabbitMQ 3.10 does.  Reply codes and reply texts follow rabbit_channel and rabbit_access_control."""
from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import (ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError,
                             ProbableAuthenticationError)

from conftest import connect
from support import AsyncClose, call, channel_closed

pytestmark = pytest.mark.timeout(20)

V = "vhost '/'"


# -- auth -----------------------------------------------------------------------------------------

def test_bad_password_refused(broker):
    with pytest.raises(ProbableAuthenticationError) as exc:
        connect(broker, "guest", "wrong")
    assert "403" in str(exc.value)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(exc.value)


def test_unknown_user_refused(broker, uid):
    with pytest.raises(ProbableAuthenticationError) as exc:
        connect(broker, "nobody-" + uid, "x")
    assert "403" in str(exc.value)


def _user(broker, uid, perms=(".*", ".*", ".*"), vhost="/", tags=""):
    name = "u" + uid[-6:]
    assert broker.admin("add-user", name, "pw", "--tags", tags).returncode == 0
    if perms is not None:
        result = broker.admin("set-permissions", vhost, name, *perms)
        assert result.returncode == 0, result.stderr
    return name


def test_new_user_can_connect(broker, uid):
    name = _user(broker, uid)
    with connect(broker, name, "pw") as c:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x")
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"


def test_user_without_vhost_permissions(broker, uid):
    name = _user(broker, uid, perms=None)
    with pytest.raises(ProbableAccessDeniedError) as exc:
        connect(broker, name, "pw")
    assert "530" in str(exc.value)
    assert f"NOT_ALLOWED - access to vhost '/' refused for user '{name}'" in str(exc.value)


def test_unknown_vhost(broker, uid):
    with pytest.raises(ProbableAccessDeniedError) as exc:
        connect(broker, vhost="nope-" + uid)
    assert "530" in str(exc.value)
    assert f"NOT_ALLOWED - vhost nope-{uid} not found" in str(exc.value)


def test_other_vhost_is_isolated(broker, uid):
    vhost = "vh-" + uid
    assert broker.admin("add-vhost", vhost).returncode == 0
    assert broker.admin("set-permissions", vhost, "guest", ".*", ".*", ".*").returncode == 0
    with connect(broker, vhost=vhost) as c:
        ch = c.channel()
        ch.queue_declare(uid)
        ch.exchange_declare("amq.direct", passive=True)
    with connect(broker) as c:
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_declare(uid, passive=True)
        channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}' in {V}")


def test_permission_regexes(broker, uid):
    # configure: only ok-*, write: ok-* and the amq.direct exchange, read: ok-* and amq.direct
    name = _user(broker, uid, perms=("^ok-", "^(ok-.*|amq\\.direct)$", "^(ok-.*|amq\\.direct)$"))
    refused = "ACCESS_REFUSED - access to {kind} '{res}' in vhost '/' refused for user '%s'" % name
    with connect(broker, name, "pw") as c:
        ch = c.channel()
        ok_q = "ok-" + uid
        ch.queue_declare(ok_q, auto_delete=True, exclusive=True)
        ch.queue_bind(ok_q, "amq.direct", "k")
        ch.basic_publish("amq.direct", "k", b"x")
        ch.basic_consume(ok_q, lambda *a: None)

        # configure refused on a queue
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_declare("no-" + uid)
        channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
        # configure refused on an exchange
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().exchange_declare("no-" + uid, "direct")
        channel_closed(exc, 403, refused.format(kind="exchange", res="no-" + uid))
        # write refused on an exchange (publish)
        c2 = c.channel()
        closed = AsyncClose(c2)
        c2.basic_publish("amq.fanout", "k", b"x")
        closed.wait(403, refused.format(kind="exchange", res="amq.fanout"))
        # read refused on an exchange (bind source)
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_bind(ok_q, "amq.topic", "k")
        channel_closed(exc, 403, refused.format(kind="exchange", res="amq.topic"))
        # write on the default exchange is refused (amq.default does not match)
        c3 = c.channel()
        closed = AsyncClose(c3)
        c3.basic_publish("", ok_q, b"x")
        closed.wait(403, refused.format(kind="exchange", res="amq.default"))

    # read refused on a queue (consume / get), write refused on a queue (bind)
    assert broker.admin("set-permissions", "/", name, ".*", "^ok-", "^ok-").returncode == 0
    with connect(broker) as admin:
        admin.channel().queue_declare("no-" + uid)
    try:
        with connect(broker, name, "pw") as c:
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().basic_get("no-" + uid)
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().basic_consume("no-" + uid, lambda *a: None)
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().queue_bind("no-" + uid, "ok-x", "k")
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().queue_purge("no-" + uid)
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
    finally:
        with connect(broker) as admin:
            admin.channel().queue_delete("no-" + uid)


@pytest.mark.warren_only("changes permissions through the HTTP API")
def test_a_permission_changed_while_connected_holds_from_the_next_check(broker, uid):
    """rabbit_channel checks each resource against the user's permissions as they are now (its cache of the
    last 12 resources aside): a connection open before an administrator narrowed or cleared them is held to the
    new ones, and to the old ones again once they are given back."""
    name = _user(broker, uid)
    refused = "ACCESS_REFUSED - access to queue '{res}' in vhost '/' refused for user '%s'" % name
    path = f"/api/permissions/%2F/{name}"
    with connect(broker, name, "pw") as c:
        c.channel().queue_declare("before-" + uid, auto_delete=True)
        assert call(broker, "PUT", path, {"configure": "^ok-", "write": ".*", "read": ".*"}).status == 204
        c.channel().queue_declare("ok-" + uid, auto_delete=True)
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_declare("no-" + uid)
        channel_closed(exc, 403, refused.format(res="no-" + uid))
        assert call(broker, "DELETE", path).status == 204
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_declare("ok-2-" + uid)
        channel_closed(exc, 403, refused.format(res="ok-2-" + uid))
        assert call(broker, "PUT", path, {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
        c.channel().queue_declare("again-" + uid, auto_delete=True)


# -- isolation ------------------------------------------------------------------------------------

def test_publish_write_permission_checked_before_exchange_exists(broker, uid):
    """rabbit_channel basic.publish: check_write_permitted(ExchangeName, ...) before rabbit_exchange:lookup_or_die: a
    missing exchange the user may not write to is 403, not 404; one it may write to is 404."""
    name = _user(broker, uid, perms=(".*", "^(amq\\.default|may-.*)$", ".*"))
    with connect(broker, name, "pw") as c:
        ch = c.channel()
        closed = AsyncClose(ch)
        ch.basic_publish("missing-" + uid, "k", b"x")
        closed.wait(403, f"ACCESS_REFUSED - access to exchange 'missing-{uid}' in {V} refused for user '{name}'")
        ch = c.channel()
        closed = AsyncClose(ch)
        ch.basic_publish("may-" + uid, "k", b"x")
        closed.wait(404, f"NOT_FOUND - no exchange 'may-{uid}' in {V}")


def test_impersonator_may_publish_with_any_user_id(broker, uid):
    """rabbit_channel check_user_id_header: a user tagged impersonator may publish with someone else's user_id."""
    name = _user(broker, uid, tags="impersonator")
    with connect(broker, name, "pw") as c:
        ch = c.channel()
        ch.confirm_delivery()
        ch.queue_declare(uid, exclusive=True)
        ch.basic_publish("", uid, b"x", pika.BasicProperties(user_id="someone-else"))
        _, props, body = ch.basic_get(uid, auto_ack=True)
    assert props is not None and (body, props.user_id) == (b"x", "someone-else")


def test_channel_error_does_not_disturb_other_connection(broker, uid):
    with connect(broker) as good, connect(broker) as bad:
        gch = good.channel()
        gch.queue_declare(uid)
        got = []
        gch.basic_consume(uid, lambda c, m, p, b: got.append(b), auto_ack=True)
        bch = bad.channel()
        with pytest.raises(ChannelClosedByBroker):
            bch.queue_declare(uid + "-missing", passive=True)
        bad.channel().basic_publish("", uid, b"after-error")
        with pytest.raises(ConnectionClosedByBroker):
            bad.channel().exchange_declare(uid + "-x", "bogus-type")
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            good.process_data_events(0.05)
        assert got == [b"after-error"]
        assert good.is_open and gch.is_open
        gch.queue_delete(uid)


def test_channel_error_does_not_disturb_other_channel(conn, uid):
    good = conn.channel()
    good.queue_declare(uid)
    with pytest.raises(ChannelClosedByBroker):
        conn.channel().queue_declare(uid + "-missing", passive=True)
    good.basic_publish("", uid, b"x")
    assert good.basic_get(uid, auto_ack=True)[2] == b"x"
    good.queue_delete(uid)

"""The management web UI in a real (headless) Chromium, driven as a person would: log in, click, type,
read what the page shows.  The broker's state is checked through the HTTP API and pika.  Every test
also asserts that the page loaded nothing from off the host and logged no console errors."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, urlparse

import pika
import pika.exceptions
import pytest

from conftest import CLIENT, INTEGRATION, BrokerProcess, connect, free_port, starts, unavailable
from support import call, q
from test_tls import PKI

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    unavailable(f"{CHROMIUM} is not installed (apt-get install chromium); test.sh installs it")

from playwright.sync_api import Browser, FilePayload, Locator, Page, expect, sync_playwright  # noqa: E402 (after the check that Chromium is there)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 15_000
TOTAL_COLOR = (0x8E, 0x9A, 0xA8)  # the "Total" series in pages.js COLORS, drawn over the others

pytestmark = pytest.mark.timeout(120)
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI.create(tmp_path_factory.mktemp("ui-pki"))


@pytest.fixture(scope="module")
@starts(INTEGRATION)
def node(tmp_path_factory: pytest.TempPathFactory, pki: PKI) -> Iterator[BrokerProcess]:
    """A node of this module's own, so the overview's totals are only what these tests make; it listens
    for AMQPS too (a client certificate optional), for the connection page's TLS details."""
    broker = BrokerProcess(tmp_path_factory.mktemp("ui") / "data", extra=[
        "--tls-port", str(free_port()), "--tls-certfile", pki.server_cert, "--tls-keyfile", pki.server_key,
        "--tls-cacertfile", pki.cafile, "--tls-verify", "verify_peer"]).start()
    yield broker
    broker.stop()


def tls_port(node: BrokerProcess) -> int:
    return int(node.extra[node.extra.index("--tls-port") + 1])


@pytest.fixture(scope="module")
@starts(CLIENT)
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                                              timeout=60_000)
        yield chromium
        chromium.close()


class UI:
    """One logged-in browser tab on the node's UI, recording every request and console error."""

    def __init__(self, page: Page, node: BrokerProcess) -> None:
        self.page = page
        self.node = node
        self.base = f"http://127.0.0.1:{node.mgmt_port}/"
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def login(self, user: str = "guest", password: str = "guest") -> None:
        self.page.goto(self.base)
        expect(self.page.locator("#login-view")).to_be_visible()
        self.page.fill("#login-username", user)
        self.page.fill("#login-password", password)
        self.page.click("#login-submit")
        expect(self.page.locator("#app-view")).to_be_visible()
        expect(self.page.locator("#current-user")).to_have_text(user)
        self.wait_for_page("")

    def go(self, route: str) -> None:
        """Open a page by its address and wait until its data is shown."""
        self.page.evaluate("(r) => { location.hash = r; }", route)
        self.wait_for_page(route)

    def wait_for_page(self, route: str) -> None:
        self.page.wait_for_function("""(r) => {
            const main = document.getElementById("main");
            return main.dataset.route === r && !main.hasAttribute("aria-busy");
        }""", arg=route)

    def confirm(self) -> None:
        self.page.locator(".modal .modal-actions button").last.click()
        expect(self.page.locator(".modal")).to_have_count(0)

    def dismiss_banners(self) -> None:
        """Close the banners shown, so that the next success banner is the next action's."""
        for close in self.page.locator("#banners .close").all():
            close.click()
        expect(self.page.locator("#banners .banner")).to_have_count(0)

    def success(self, text: str | re.Pattern) -> None:
        expect(self.page.locator(".banner-success")).to_contain_text(text)

    def stat(self, key: str) -> Locator:
        return self.page.locator(f"[data-stat={key}] .value")

    def off_host(self) -> list[str]:
        hosts = []
        for url in self.requests:
            parsed = urlparse(url[len("blob:"):] if url.startswith("blob:") else url)
            if parsed.scheme != "data" and parsed.hostname != "127.0.0.1":
                hosts.append(url)
        return hosts


@pytest.fixture
def ui(browser: Browser, node: BrokerProcess) -> Iterator[UI]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(TIMEOUT_MS)
    session = UI(context.new_page(), node)
    session.login()
    # Off: pages change only on what the test does (the overview test turns it back on), so no periodic
    # refresh of a page races the test's own delete into a 404 in the console
    session.page.select_option("#refresh-interval", "0")
    yield session
    context.close()
    assert session.requests, "the page made no requests at all"
    assert session.off_host() == [], "the UI loaded something from off the host"
    assert session.errors == [], "the browser console logged errors"


def api_get(node: BrokerProcess, path: str):
    response = call(node, "GET", path)
    assert response.status == 200, (path, response.status, response.raw)
    return response.json


def depth(node: BrokerProcess, queue: str, vhost: str = "/") -> int:
    return api_get(node, f"/api/queues/{q(vhost)}/{q(queue)}")["messages_ready"]


def amqp(node: BrokerProcess, name: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, client_properties={"connection_name": name}, blocked_connection_timeout=10,
        socket_timeout=10))


def total_line_top(ui: UI) -> int | None:
    """The topmost row of the queued-messages chart's plot area drawn in the Total colour (None: not drawn).
    The plot area leaves out the axis labels (charts.js pads 46 px left, 14 right, 24 below)."""
    return ui.page.eval_on_selector("canvas[data-chart=depth]", """(c, rgb) => {
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        for (let y = 0; y < c.height - 24; y++)
          for (let x = 47; x < c.width - 14; x++) {
            const i = (y * c.width + x) * 4;
            if (Math.abs(d[i] - rgb[0]) < 5 && Math.abs(d[i + 1] - rgb[1]) < 5 && Math.abs(d[i + 2] - rgb[2]) < 5
                && d[i + 3] > 200) return y;
          }
        return null;
    }""", list(TOTAL_COLOR))


def declare_queue_in_ui(ui: UI, name: str) -> None:
    ui.go("#/queues")
    ui.page.fill("#q-name", name)
    ui.page.select_option("#q-durable", "false")
    ui.page.click("#q-add")
    ui.success(f"Queue {name} declared")
    expect(ui.page.locator(f"table[data-table=queues] a[data-queue='{name}']")).to_be_visible()


def publish_in_ui(ui: UI, payload: str) -> None:
    ui.dismiss_banners()
    ui.page.fill("#pub-payload", payload)
    ui.page.click("#pub-submit")
    ui.success("Message published")


def delete_queue_in_ui(ui: UI, name: str) -> None:
    ui.go(f"#/queues/%2F/{q(name)}")
    expect(ui.page.locator("#main h1")).to_contain_text(name)
    ui.page.click("#queue-delete")
    ui.confirm()
    ui.wait_for_page("#/queues")
    ui.success(f"Queue {name} deleted")
    expect(ui.page.locator(f"table[data-table=queues] a[data-queue='{name}']")).to_have_count(0)


def delete_row(ui: UI, row: Locator, action: str, message: str) -> None:
    """Click a table row's delete button, confirm, and see the row go."""
    row.locator(f"[data-action={action}]").click()
    ui.confirm()
    ui.success(message)
    expect(row).to_have_count(0)


# -- overview ------------------------------------------------------------------------------------


def test_overview_charts_draw_and_follow_the_broker(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    page.select_option("#refresh-interval", "2000")
    rates = page.locator("canvas[data-chart=rates]")
    queued = page.locator("canvas[data-chart=depth]")
    expect(rates).to_be_visible()
    expect(queued).to_be_visible()
    expect(queued).to_have_attribute("aria-label", re.compile(r"Total 0\b"))
    baseline = total_line_top(ui)
    assert baseline is not None, "the Total series is not drawn at all"

    with amqp(node, f"overview-{uid}") as connection:
        channel = connection.channel()
        channel.queue_declare(uid, auto_delete=False)
        for i in range(40):
            channel.basic_publish("", uid, f"m{i}".encode())
        expect(ui.stat("connections")).to_have_text("1")
        expect(queued).to_have_attribute("aria-label", re.compile(r"Ready 40\b.*Total 40\b"))
        expect(ui.stat("messages_ready")).to_have_text("40")
        raised = total_line_top(ui)
        assert raised is not None and raised < baseline - 40, (baseline, raised)
        # the publish rate is sampled every 5 s; the chart shows it once a sample has seen the publishes
        expect(rates).to_have_attribute("aria-label", re.compile(r"Publish [1-9][\d.]*/s"), timeout=20_000)
        expect(page.locator("[data-chart=queue-depths]")).to_have_attribute("aria-label", re.compile(uid))
        channel.queue_delete(uid)
    expect(queued).to_have_attribute("aria-label", re.compile(r"Total 0\b"))


def test_overview_lists_nodes_with_their_alarms_for_monitoring_users(browser: Browser, start_broker, uid: str):
    """As RabbitMQ's overview: for users who may monitor, each node's descriptors, memory and disk against their
    watermarks, an alarm marked; a management user's overview has no Nodes (nor asks for /api/nodes)."""
    node = start_broker("--disk-free-limit", str(1 << 60))  # more than any disk has free: the disk alarm is on
    user = f"mgmt-{uid}"
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"}).status == 201
    assert call(node, "PUT", f"/api/permissions/%2F/{q(user)}", {"configure": ".*", "write": ".*",
                                                                 "read": ".*"}).status == 201
    for who, password in (("guest", "guest"), (user, "pw")):
        context = browser.new_context()
        context.set_default_timeout(TIMEOUT_MS)
        try:
            session = UI(context.new_page(), node)
            session.login(who, password)
            row = session.page.locator("table[data-table=nodes] tbody tr")
            if who == "guest":
                expect(row).to_have_count(1)
                expect(row.locator("td[data-col=name]")).to_have_text(api_get(node, "/api/overview")["node"])
                expect(row.locator("td[data-col=disk_free] [data-alarm]")).to_have_text("disk alarm")
                expect(row.locator("td[data-col=disk_free]")).to_contain_text("low watermark")
                expect(row.locator("td[data-col=mem_used] [data-alarm]")).to_have_count(0)
                expect(row.locator("td[data-col=mem_used]")).to_contain_text("high watermark")
                expect(row.locator("td[data-col=uptime]")).to_have_text(re.compile(r"^\d+m \d+s$"))
            else:
                expect(session.page.locator("#nodes")).to_be_hidden()
                assert not [r for r in session.requests if r.endswith("/api/nodes")]
            assert session.off_host() == [] and session.errors == [], (session.off_host(), session.errors)
        finally:
            context.close()


# -- queues --------------------------------------------------------------------------------------


def test_queue_declare_publish_peek_get_move_purge_delete(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    source, target = f"src/{uid} #1", f"dst-{uid}"  # a name that needs encoding in paths and hashes
    declare_queue_in_ui(ui, source)
    declare_queue_in_ui(ui, target)
    assert api_get(node, f"/api/queues/%2F/{q(source)}")["durable"] is False
    ui.go("#/")  # refreshing is off: opening the overview loads fresh totals all the same
    expect(ui.stat("queues")).to_have_text(str(len(api_get(node, "/api/queues"))))
    ui.go("#/queues")

    page.click(f"table[data-table=queues] a[data-queue='{source}']")
    expect(page.locator("#main h1")).to_contain_text(source)
    expect(ui.stat("messages_ready")).to_have_text("0")
    publish_in_ui(ui, "hello from the UI")
    expect(ui.stat("messages_ready")).to_have_text("1")
    assert depth(node, source) == 1

    page.click("#peek-submit")
    card = page.locator("#peek-result [data-message]")
    expect(card).to_have_count(1)
    expect(card.locator("pre.payload")).to_have_text("hello from the UI")
    expect(card).to_contain_text("first delivery")
    ui.go("#/queues")
    ui.go(f"#/queues/%2F/{q(source)}")  # opened afresh: the peeked message is still there
    expect(ui.stat("messages_ready")).to_have_text("1")
    peeked = api_get(node, f"/api/queues/%2F/{q(source)}/peek")
    assert len(peeked) == 1 and peeked[0]["redelivered"] is False, peeked

    page.select_option("#get-ackmode", "ack_requeue_true")
    page.click("#get-submit")
    expect(page.locator("#get-result [data-message] pre.payload")).to_have_text("hello from the UI")
    expect(ui.stat("messages_ready")).to_have_text("1")
    page.select_option("#get-ackmode", "ack_requeue_false")
    page.click("#get-submit")
    expect(page.locator("#get-result [data-message]")).to_contain_text("redelivered")
    expect(ui.stat("messages_ready")).to_have_text("0")
    assert depth(node, source) == 0

    for i in range(3):
        publish_in_ui(ui, f"move me {i}")
    expect(ui.stat("messages_ready")).to_have_text("3")
    page.fill("#move-destination", target)
    page.fill("#move-count", "2")
    page.click("#move-submit")
    ui.success(f"Moved 2 messages to {target}")
    expect(ui.stat("messages_ready")).to_have_text("1")
    assert depth(node, target) == 2
    page.fill("#move-count", "")
    page.click("#move-submit")
    ui.success(f"Moved 1 message to {target}")
    expect(ui.stat("messages_ready")).to_have_text("0")
    assert [m["payload"] for m in api_get(node, f"/api/queues/%2F/{q(target)}/peek")] == [
        "move me 0", "move me 1", "move me 2"]

    ui.go(f"#/queues/%2F/{q(target)}")
    expect(ui.stat("messages_ready")).to_have_text("3")
    page.click("#queue-purge")
    ui.confirm()
    ui.success(f"Queue {target} purged")
    expect(ui.stat("messages_ready")).to_have_text("0")
    assert depth(node, target) == 0

    delete_queue_in_ui(ui, target)
    delete_queue_in_ui(ui, source)
    assert call(node, "GET", f"/api/queues/%2F/{q(source)}").status == 404
    assert call(node, "GET", f"/api/queues/%2F/{q(target)}").status == 404


def test_an_action_that_succeeds_takes_down_the_last_ones_refusal(ui: UI, node: BrokerProcess, uid: str):
    """A refused declare, corrected and sent again: the page shows that it worked, and no longer the refusal
    (it stayed up beside the success, as if the second declare had been refused too)."""
    page = ui.page
    name = f"retried-{uid}"
    ui.go("#/queues")
    page.fill("#q-name", name)
    page.select_option("#q-durable", "false")
    page.click("#queue-form [data-hint=x-max-length]")
    page.keyboard.type("-1")
    page.click("#q-add")
    expect(page.locator("#banners .banner-error")).to_contain_text("x-max-length")
    assert [e for e in ui.errors if "400 (Bad Request)" not in e] == []  # only the browser noting the refusal
    ui.errors.clear()
    page.locator("#queue-form [data-kv-value]").first.fill("10")
    page.click("#q-add")
    ui.success(f"Queue {name} declared")
    expect(page.locator("#banners .banner-error")).to_have_count(0)
    assert api_get(node, f"/api/queues/%2F/{q(name)}")["arguments"] == {"x-max-length": 10}
    assert call(node, "DELETE", f"/api/queues/%2F/{q(name)}").status == 204


def test_a_thousand_queues_are_listed_a_page_at_a_time(ui: UI, node: BrokerProcess, uid: str):
    """1,000 queues: the list shows 100 rows at a time, as RabbitMQ's, with pages to go through and a page size
    to choose; the filter and the sort go over all of them (every row was rendered on every refresh, so sorting
    or typing in the filter held the page for a second and more)."""
    page = ui.page
    vhost = f"bulk-{uid}"
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, vhost,
                                                               socket_timeout=30)) as connection:
            channel = connection.channel()
            for i in range(1000):
                channel.queue_declare(f"q-{i:04d}")
        ui.go("#/queues")
        page.select_option("[data-filter=vhost]", vhost)
        rows = page.locator("table[data-table=queues] tbody tr")
        names = page.locator("table[data-table=queues] tbody a[data-queue]")
        expect(rows).to_have_count(100)
        expect(page.locator("[data-page-of]")).to_have_text("Page 1 of 10")
        expect(page.locator("[data-page-range]")).to_have_text("1–100 of 1,000")
        expect(names.first).to_have_text("q-0000")
        page.click("[data-page=next]")
        expect(names.first).to_have_text("q-0100")
        expect(page.locator("[data-page-of]")).to_have_text("Page 2 of 10")
        page.click("table[data-table=queues] th[data-col=name]")  # sorted over all 1,000, descending
        expect(names.first).to_have_text("q-0899")
        page.fill("[data-filter=name]", "q-09")  # the filter goes back to the first page of what matches
        expect(page.locator("[data-page-of]")).to_be_hidden()
        expect(rows).to_have_count(100)
        expect(names.first).to_have_text("q-0999")
        expect(page.locator("#main .count")).to_have_text("(100 of 1,000)")
        page.fill("[data-filter=name]", "")
        page.select_option("[data-page-size]", "500")
        expect(rows).to_have_count(500)
        expect(page.locator("[data-page-of]")).to_have_text("Page 1 of 2")
    finally:
        assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_queue_argument_hints_are_typed_and_consumers_show_activity(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    name = f"hinted-{uid}"
    ui.go("#/queues")
    page.fill("#q-name", name)
    page.select_option("#q-durable", "false")
    for hint, value in (("x-max-length", "10"), ("x-overflow", "reject-publish"), ("x-single-active-consumer", "true")):
        page.click(f"#queue-form [data-hint={hint}]")  # fills the key and type, focuses the value
        page.keyboard.type(value)
    expect(page.locator("#queue-form [data-kv-type]").nth(0)).to_have_value("number")
    page.click("#q-add")
    ui.success(f"Queue {name} declared")
    arguments = api_get(node, f"/api/queues/%2F/{q(name)}")["arguments"]
    assert arguments == {"x-max-length": 10, "x-overflow": "reject-publish", "x-single-active-consumer": True}
    assert type(arguments["x-max-length"]) is int

    with amqp(node, f"consumers-{uid}") as connection:
        channel = connection.channel()
        first = channel.basic_consume(name, lambda *_: None, arguments={"x-priority": 5})
        second = channel.basic_consume(name, lambda *_: None)
        ui.go(f"#/queues/%2F/{q(name)}")
        expect(ui.stat("consumers")).to_have_text("2")
        def row(tag: str) -> Locator:
            return page.locator(f"table[data-table=queue-consumers] tbody tr[data-key='{tag}']")
        expect(row(first).locator("td[data-col=activity_status]")).to_have_text("single active")
        expect(row(first).locator("td[data-col=priority]")).to_have_text("5")
        expect(row(second).locator("td[data-col=activity_status]")).to_have_text("waiting")
    delete_queue_in_ui(ui, name)


def test_a_quorum_queue_shows_its_leader_and_members(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    name = f"quorum-{uid}"
    ui.go("#/queues")
    page.fill("#q-name", name)
    for hint, value in (("x-queue-type", "quorum"), ("x-delivery-limit", "3")):
        page.click(f"#queue-form [data-hint={hint}]")
        page.keyboard.type(value)
    page.click("#q-add")
    ui.success(f"Queue {name} declared")
    info = api_get(node, f"/api/queues/%2F/{q(name)}")
    assert (info["type"], info["arguments"]) == ("quorum", {"x-queue-type": "quorum", "x-delivery-limit": 3})
    ui.go(f"#/queues/%2F/{q(name)}")
    expect(page.locator("#queue-leader")).to_have_text(info["leader"])
    expect(page.locator(f"#queue-members [data-member='{info['leader']}']")).to_have_class(re.compile(r"\bok\b"))
    delete_queue_in_ui(ui, name)


def test_a_stream_is_declared_with_its_retention_and_shows_its_member(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    name = f"stream-{uid}"
    ui.go("#/queues")
    page.fill("#q-name", name)
    for hint, value in (("x-queue-type", "stream"), ("x-max-age", "7D")):
        page.click(f"#queue-form [data-hint={hint}]")
        page.keyboard.type(value)
    page.click("#q-add")
    ui.success(f"Queue {name} declared")
    info = api_get(node, f"/api/queues/%2F/{q(name)}")
    assert (info["type"], info["arguments"]) == ("stream", {"x-queue-type": "stream", "x-max-age": "7D"})
    ui.go(f"#/queues/%2F/{q(name)}")
    expect(page.locator(f"#queue-members [data-member='{info['node']}']")).to_have_class(re.compile(r"\bok\b"))
    delete_queue_in_ui(ui, name)


# -- connections and channels --------------------------------------------------------------------


def test_connections_and_channels_pages_and_close(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    connection = amqp(node, f"client-{uid}")
    try:
        connection.channel()
        name = next(c["name"] for c in api_get(node, "/api/connections")
                    if c.get("user_provided_name") == f"client-{uid}")
        ui.go("#/channels")
        expect(page.locator("table[data-table=channels] tbody")).to_contain_text(f"{name} (1)")

        ui.go("#/connections")
        row = page.locator("table[data-table=connections] tbody tr", has_text=f"client-{uid}")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("Pika")
        expect(row.locator("td[data-col=ssl]")).to_have_text("no")
        row.locator("[data-action=close-connection]").click()
        ui.confirm()
        ui.success("closed")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=5)
        assert closed.value.reply_code == 320
        assert closed.value.reply_text == "CONNECTION_FORCED - Closed via management UI"
        ui.go("#/channels")
        expect(page.locator("table[data-table=channels] tbody")).to_contain_text("No open channels")
        ui.go("#/connections")
        expect(page.locator("table[data-table=connections] tbody")).to_contain_text("No client connections")
    finally:
        if connection.is_open:
            connection.close()


def test_one_virtual_host_chosen_filters_every_list(ui: UI, node: BrokerProcess, uid: str):
    """As RabbitMQ's virtual host selector: the one chosen on a page is the one the next page's list shows (and
    its declare form's), connections and channels included (those two had no filter: every vhost's showed)."""
    page = ui.page
    vhost = f"chosen-{uid}"
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201
    assert call(node, "PUT", f"/api/queues/{q(vhost)}/in-{uid}", {"durable": False}).status == 201
    assert call(node, "PUT", f"/api/queues/%2F/out-{uid}", {"durable": False}).status == 201
    inside = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, vhost, client_properties={"connection_name": f"in-{uid}"}, socket_timeout=10))
    outside = amqp(node, f"out-{uid}")
    try:
        inside.channel()
        outside.channel()
        ui.go("#/queues")
        expect(page.locator(f"a[data-queue='out-{uid}']")).to_have_count(1)
        page.select_option("[data-filter=vhost]", vhost)
        expect(page.locator(f"a[data-queue='out-{uid}']")).to_have_count(0)
        expect(page.locator(f"a[data-queue='in-{uid}']")).to_have_count(1)
        ui.go("#/exchanges")
        expect(page.locator("[data-filter=vhost]")).to_have_value(vhost)
        expect(page.locator("table[data-table=exchanges] tbody tr td[data-col=vhost]", has_text="/")).to_have_count(0)
        expect(page.locator("#ex-vhost")).to_have_value(vhost)
        ui.go("#/connections")
        expect(page.locator("[data-filter=vhost]")).to_have_value(vhost)
        expect(page.locator("table[data-table=connections] tbody tr")).to_have_count(1)
        expect(page.locator("table[data-table=connections] tbody")).to_contain_text(f"in-{uid}")
        ui.go("#/channels")
        expect(page.locator("[data-filter=vhost]")).to_have_value(vhost)
        expect(page.locator("table[data-table=channels] tbody td[data-col=vhost]")).to_have_text([vhost])
        page.select_option("[data-filter=vhost]", "")
        expect(page.locator("table[data-table=channels] tbody td[data-col=vhost]", has_text="/")).not_to_have_count(0)
    finally:
        inside.close()
        outside.close()
        assert call(node, "DELETE", f"/api/queues/%2F/out-{uid}").status == 204
        assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_channel_page_shows_its_details_and_consumers(ui: UI, node: BrokerProcess, uid: str):
    """As RabbitMQ's channel page, reached from the channels list and from a queue's consumer: the channel's
    connection, mode, prefetch and unacked count, and its consumers with their queues (there was no such page)."""
    page = ui.page
    queue = f"chan-{uid}"
    with amqp(node, f"chan-{uid}") as connection:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=False)
        channel.basic_qos(prefetch_count=3)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"held")
        tag = channel.basic_consume(queue, lambda *_: None)
        connection.process_data_events(time_limit=0.5)  # the message delivered, unacked
        name = next(c["name"] for c in api_get(node, "/api/channels")
                    if c["connection_details"]["name"] in
                    [x["name"] for x in api_get(node, "/api/connections") if x.get("user_provided_name") == queue])
        route = "#/channels/" + quote(name, safe="!*'()")  # as encodeURIComponent escapes it
        ui.go(f"#/queues/%2F/{q(queue)}")
        page.locator(f"table[data-table=queue-consumers] a[data-channel='{name}']").click()
        ui.wait_for_page(route)
        expect(page.locator("#main h1")).to_have_text(f"Channel {name}")
        details = page.locator("#main table.kv").first
        expect(details).to_contain_text("confirm")
        expect(page.locator("[data-field=prefetch_count]")).to_have_text("3")
        expect(page.locator("[data-field=messages_unacknowledged]")).to_have_text("1")
        row = page.locator("table[data-table=channel-consumers] tbody tr")
        expect(row).to_have_count(1)
        expect(row.locator("td[data-col=consumer_tag]")).to_have_text(tag)
        row.locator(f"a[data-queue='{queue}']").click()
        ui.wait_for_page(f"#/queues/%2F/{q(queue)}")
        ui.go("#/channels")
        page.locator(f"table[data-table=channels] a[data-channel='{name}']").click()
        ui.wait_for_page(route)
        page.locator("#main table.kv a[data-connection]").click()
        expect(page.locator("table[data-table=connection-channels] a[data-channel]")).to_have_text("1")
        channel.queue_delete(queue)


def test_an_amqp10_connection_page_shows_its_sessions_and_links(ui: UI, node: BrokerProcess, uid: str):
    from proton.utils import BlockingConnection

    page = ui.page
    with amqp(node, f"setup-{uid}") as setup:
        setup.channel().queue_declare(f"q-{uid}")
    proton = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=10, allowed_mechs="PLAIN")
    try:
        proton.create_sender(f"/queues/q-{uid}", name=f"sender-{uid}")
        proton.create_receiver(f"/queues/q-{uid}", name=f"receiver-{uid}", credit=3)
        name = next(c["name"] for c in api_get(node, "/api/connections") if c["protocol"] == "AMQP 1.0")
        ui.go(f"#/connections/{quote(name, safe='')}")
        sessions = page.locator("#connection-sessions")
        expect(sessions.locator("[data-session='0']")).to_contain_text("Session on channel 0")
        expect(sessions.locator("table[data-table=incoming-links] tbody")).to_contain_text(f"sender-{uid}")
        expect(sessions.locator("table[data-table=outgoing-links] tbody")).to_contain_text(f"receiver-{uid}")
        expect(page.locator("table[data-table=connection-channels]")).to_be_hidden()
    finally:
        proton.close()


def test_tls_connection_shows_protocol_cipher_and_certificate(ui: UI, node: BrokerProcess, pki: PKI, uid: str):
    page = ui.page
    params = pika.ConnectionParameters(
        "127.0.0.1", tls_port(node), ssl_options=pika.SSLOptions(pki.client_context("ui-client"), "localhost"),
        client_properties={"connection_name": f"tls-{uid}"}, connection_attempts=3, retry_delay=0.5, socket_timeout=10)
    with pika.BlockingConnection(params) as connection:
        connection.channel()
        info = next(c for c in api_get(node, "/api/connections") if c.get("user_provided_name") == f"tls-{uid}")
        assert info["ssl"] is True and info["ssl_protocol"].startswith("tlsv1"), info
        ui.go("#/connections")
        row = page.locator("table[data-table=connections] tbody tr", has_text=f"tls-{uid}")
        expect(row.locator("td[data-col=ssl]")).to_have_text(info["ssl_protocol"])
        row.locator(f"a[data-connection='{info['name']}']").click()
        tls = page.locator("#connection-tls")
        expect(tls).to_contain_text(info["ssl_cipher"])
        expect(tls).to_contain_text("CN=ui-client")
        expect(page.locator("table[data-table=connection-channels] tbody tr")).to_have_count(1)
        page.click("#connection-close")
        ui.confirm()
        ui.wait_for_page("#/connections")
        ui.success("closed")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
            connection.process_data_events(time_limit=5)


# -- exchanges -----------------------------------------------------------------------------------


def test_exchange_declare_bind_publish_unbind_delete(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    exchange, queue = f"ex-{uid}", f"bound-{uid}"
    assert call(node, "PUT", f"/api/queues/%2F/{q(queue)}", {"durable": False}).status == 201

    ui.go("#/exchanges")
    page.fill("#ex-name", exchange)
    page.select_option("#ex-type", "topic")
    page.click("#ex-add")
    ui.success(f"Exchange {exchange} declared")
    link = page.locator(f"table[data-table=exchanges] a[data-exchange='{exchange}']")
    expect(link).to_be_visible()
    assert api_get(node, f"/api/exchanges/%2F/{q(exchange)}")["type"] == "topic"

    link.click()
    expect(page.locator("#main h1")).to_contain_text(exchange)
    page.fill("#bind-target", queue)
    page.fill("#bind-routing-key", "orders.*")
    page.click("#bind-submit")
    ui.success(f"Bound {queue} to {exchange}")
    row = page.locator("table[data-table=exchange-bindings] tbody tr", has_text=queue)
    expect(row).to_contain_text("orders.*")
    assert [b["routing_key"] for b in api_get(node, f"/api/exchanges/%2F/{q(exchange)}/bindings/source")] == [
        "orders.*"]

    page.fill("#pub-routing-key", "orders.new")
    publish_in_ui(ui, "routed through a topic")
    assert depth(node, queue) == 1
    page.fill("#pub-routing-key", "invoices.new")
    page.fill("#pub-payload", "goes nowhere")
    page.click("#pub-submit")
    expect(page.locator(".banner-warn")).to_contain_text("not routed")
    assert depth(node, queue) == 1

    row.locator("[data-action=unbind]").click()
    ui.success(f"Unbound {queue} from {exchange}")
    expect(page.locator("table[data-table=exchange-bindings] tbody")).to_contain_text("No bindings")

    page.click("#exchange-delete")
    ui.confirm()
    ui.wait_for_page("#/exchanges")
    ui.success(f"Exchange {exchange} deleted")
    expect(link).to_have_count(0)
    assert call(node, "GET", f"/api/exchanges/%2F/{q(exchange)}").status == 404
    assert call(node, "DELETE", f"/api/queues/%2F/{q(queue)}").status == 204


def test_names_with_markup_and_escapes_show_as_text_and_their_bindings_unbind(ui: UI, node: BrokerProcess, uid: str):
    """Names and routing keys with ``/``, ``%``, ``+``, spaces, unicode and markup: each page shows them as text
    (markup run as HTML would make elements, or a console error as the page's policy refused its script), and
    Unbind removes such a binding, as RabbitMQ's UI does by sending its ``properties_key`` escaped as a path
    segment (it was sent as it is, so the node read another key and answered 404)."""
    page = ui.page
    vhost = f"v/%2F ü <b>{uid}</b>"
    name = f"<img src=x onerror=alert(1)> a/b %41+☃ {uid}"
    keys = ["<i>key</i> a+b c/d %2F ☃", "100%", "plain"]
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201  # (its creator may use it)
    try:
        assert call(node, "PUT", f"/api/queues/{q(vhost)}/{q(name)}", {"durable": False}).status == 201
        assert call(node, "PUT", f"/api/exchanges/{q(vhost)}/{q(name)}", {"type": "topic"}).status == 201
        for key in keys:  # each with arguments too: "<quoted key>~<hash>"
            for arguments in ({}, {"<u>arg</u>": key}):
                assert call(node, "POST", f"/api/bindings/{q(vhost)}/e/{q(name)}/q/{q(name)}",
                            {"routing_key": key, "arguments": arguments}).status == 201
        ui.go("#/queues")
        expect(page.locator("table[data-table=queues] a[data-queue]", has_text=name)).to_have_text(name)
        ui.go(f"#/queues/{q(vhost)}/{q(name)}")
        expect(page.locator("#main h1")).to_have_text(f"Queue {name}")
        expect(page.locator(".crumbs b")).to_have_text(vhost)
        rows = page.locator("table[data-table=queue-bindings] tbody tr", has=page.locator("[data-action=unbind]"))
        expect(rows).to_have_count(2 * len(keys))
        expect(page.locator("#main img, #main b > b, #main i, #main u")).to_have_count(0)
        for _ in range(2 * len(keys)):
            ui.dismiss_banners()
            rows.first.locator("[data-action=unbind]").click()
            ui.success(f"Unbound {name} from {name}")
        expect(rows).to_have_count(0)
        assert api_get(node, f"/api/exchanges/{q(vhost)}/{q(name)}/bindings/source") == []
    finally:
        assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_an_address_typed_with_a_bare_percent_opens_its_queue(ui: UI, node: BrokerProcess, uid: str):
    """A queue's address typed by hand, its name's "%" not escaped: the queue's page opens (decoding the address
    threw, uncaught, and the page before stayed)."""
    name = f"50% off {uid}"
    assert call(node, "PUT", f"/api/queues/%2F/{q(name)}", {"durable": False}).status == 201
    ui.page.evaluate("(r) => { location.hash = r; }", f"#/queues/%2F/{name}")
    expect(ui.page.locator("#main h1")).to_have_text(f"Queue {name}")
    expect(ui.page.locator("#main")).not_to_have_attribute("aria-busy", "true")
    assert call(node, "DELETE", f"/api/queues/%2F/{q(name)}").status == 204


def test_exchange_types_come_from_the_node(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    exchange = f"with-ae-{uid}"
    ui.go("#/exchanges")
    types = [t["name"] for t in api_get(node, "/api/overview")["exchange_types"]]
    expect(page.locator("#ex-type option")).to_have_text(types)
    expect(page.locator("#exchange-form [data-hint=x-delayed-type]")).to_be_visible()
    page.fill("#ex-name", exchange)
    page.click("#exchange-form [data-hint=alternate-exchange]")
    page.keyboard.type("amq.fanout")
    page.click("#ex-add")
    ui.success(f"Exchange {exchange} declared")
    assert api_get(node, f"/api/exchanges/%2F/{q(exchange)}")["arguments"] == {"alternate-exchange": "amq.fanout"}
    assert call(node, "DELETE", f"/api/exchanges/%2F/{q(exchange)}").status == 204


# -- admin ---------------------------------------------------------------------------------------


def test_users_and_permissions(ui: UI, browser: Browser, node: BrokerProcess, uid: str):
    page = ui.page
    user, vhost = f"user-{uid}", f"vh-{uid}"
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}").status == 201

    ui.go("#/admin/users")
    page.fill("#user-name", user)
    page.fill("#user-password", "s3cret")
    page.locator("#user-form .quick-add button", has_text="management").click()
    expect(page.locator("#user-tags")).to_have_value("management")
    page.click("#user-add")
    ui.success(f"User {user} added")
    row = page.locator("table[data-table=users] tbody tr", has_text=user)
    expect(row).to_contain_text("management")
    assert api_get(node, f"/api/users/{q(user)}")["tags"] == ["management"]
    assert api_get(node, f"/api/permissions/%2F/{q(user)}")["configure"] == ".*"  # the form's default grant

    page.click("[data-subtab=permissions]")
    page.select_option("#perm-user", user)
    page.select_option("#perm-vhost", vhost)
    page.fill("#perm-configure", "^$")
    page.fill("#perm-read", "^orders")
    page.click("#perm-set")
    ui.success(f"Permissions of {user} on {vhost} set")
    perm_row = page.locator("table[data-table=permissions] tbody tr", has_text=user).filter(has_text=vhost)
    expect(perm_row).to_contain_text("^orders")
    assert api_get(node, f"/api/permissions/{q(vhost)}/{q(user)}")["read"] == "^orders"

    other = browser.new_context()  # the new user logs in: the UI is theirs to use, but not its admin pages
    other.set_default_timeout(TIMEOUT_MS)
    try:
        session = UI(other.new_page(), node)
        session.page.goto(session.base)
        session.page.fill("#login-username", user)
        session.page.fill("#login-password", "wrong")
        session.page.click("#login-submit")
        expect(session.page.locator("#login-error")).to_have_text("Wrong username or password.")
        assert [e for e in session.errors if "401 (Unauthorized)" not in e] == []  # the browser notes the 401
        session.errors.clear()
        session.login(user, "s3cret")
        expect(session.page.locator("canvas[data-chart=depth]")).to_be_visible()
        expect(session.page.locator("#nav a[data-tab=admin]")).to_be_hidden()
        session.go("#/admin/users")
        expect(session.page.locator("#main")).to_contain_text("for users tagged administrator")
        session.go("#/queues")
        expect(session.page.locator("#q-vhost option")).to_have_text(["/", vhost])  # "/" granted on adding
        assert session.off_host() == [] and session.errors == [], (session.off_host(), session.errors)
    finally:
        other.close()

    perm_row.locator("[data-action=clear-permissions]").click()
    ui.success("cleared")
    expect(perm_row).to_have_count(0)
    page.click("[data-subtab=users]")
    delete_row(ui, row, "delete-user", f"User {user} deleted")
    assert call(node, "GET", f"/api/users/{q(user)}").status == 404
    assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_topic_permissions_are_set_and_cleared(ui: UI, node: BrokerProcess, uid: str):
    """Topic permissions, as on RabbitMQ's user page: set per (user, vhost, exchange), listed, cleared; the broker
    applies them to a publish (there was no way to see or set them in the UI)."""
    page = ui.page
    user = f"topic-{uid}"
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": ""}).status == 201
    assert call(node, "PUT", f"/api/permissions/%2F/{q(user)}", {"configure": ".*", "write": ".*",
                                                                 "read": ".*"}).status == 201
    try:
        ui.go("#/admin/permissions")
        page.select_option("#topic-user", user)
        page.select_option("#topic-vhost", "/")
        expect(page.locator("#topic-exchange")).to_have_value("amq.topic")
        page.fill("#topic-write", "^orders\\.")
        page.fill("#topic-read", "^$")
        page.click("#topic-set")
        ui.success(f"Topic permission of {user} on amq.topic in / set")
        row = page.locator("table[data-table=topic-permissions] tbody tr", has_text=user)
        expect(row.locator("td[data-col=write]")).to_have_text("^orders\\.")
        assert api_get(node, f"/api/topic-permissions/%2F/{q(user)}") == [
            {"user": user, "vhost": "/", "exchange": "amq.topic", "write": "^orders\\.", "read": "^$"}]
        credentials = pika.PlainCredentials(user, "pw")
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, credentials=credentials,
                                                               socket_timeout=10)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()  # each publish waits for its answer
            channel.basic_publish("amq.topic", "orders.new", b"allowed")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                channel.basic_publish("amq.topic", "invoices.new", b"refused")
            assert refused.value.reply_code == 403
        row.locator("[data-action=clear-topic-permission]").click()  # as its permissions' Clear: no dialog
        ui.success(f"Topic permission of {user} on amq.topic in / cleared")
        expect(row).to_have_count(0)
        assert call(node, "GET", f"/api/topic-permissions/%2F/{q(user)}").status == 404
    finally:
        assert call(node, "DELETE", f"/api/users/{q(user)}").status == 204


def test_a_user_is_edited_in_place(ui: UI, node: BrokerProcess, uid: str):
    """As RabbitMQ's "Update this user": the user's name and tags into the form, a password typed again or none,
    the user's permissions left alone (there was no way to edit a user: adding them again with the password left
    empty took their password away)."""
    page = ui.page
    user, vhost = f"edited-{uid}", f"edited-vh-{uid}"
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "old", "tags": "management"}).status == 201
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201
    assert call(node, "PUT", f"/api/permissions/{q(vhost)}/{q(user)}", {"configure": "", "write": "",
                                                                         "read": "x"}).status == 201
    try:
        ui.go("#/admin/users")
        row = page.locator(f"table[data-table=users] tbody tr[data-key='{user}']")
        row.locator("[data-action=edit-user]").click()
        expect(page.locator("#user-name")).to_have_value(user)
        expect(page.locator("#user-tags")).to_have_value("management")
        expect(page.locator("#user-password-mode")).to_have_value("password")
        expect(page.locator("#user-grant")).not_to_be_checked()
        page.click("#user-add")
        expect(page.locator("#banners .banner-error")).to_contain_text("Please specify a password.")
        assert call(node, "GET", "/api/whoami", auth=(user, "old")).status == 200  # nothing was sent

        page.fill("#user-password", "new")
        page.fill("#user-tags", "monitoring")
        page.click("#user-add")
        ui.success(f"User {user} updated")
        expect(row).to_contain_text("monitoring")
        assert call(node, "GET", "/api/whoami", auth=(user, "new")).status == 200
        assert call(node, "GET", "/api/whoami", auth=(user, "old")).status == 401
        assert api_get(node, f"/api/users/{q(user)}")["tags"] == ["monitoring"]
        assert [(p["vhost"], p["read"]) for p in api_get(node, f"/api/users/{q(user)}/permissions")] == [(vhost, "x")]

        row.locator("[data-action=edit-user]").click()
        page.select_option("#user-password-mode", "none")
        expect(page.locator("#user-password")).to_be_hidden()
        page.click("#user-add")
        ui.success(f"User {user} updated")
        assert api_get(node, f"/api/users/{q(user)}")["password_hash"] == ""
        row.locator("[data-action=edit-user]").click()
        expect(page.locator("#user-password-mode")).to_have_value("none")
    finally:
        assert call(node, "DELETE", f"/api/users/{q(user)}").status == 204
        assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_a_user_without_a_management_tag_is_refused_with_rabbitmqs_reason(browser: Browser, node: BrokerProcess,
                                                                         uid: str):
    """A user with no tag the UI admits gets RabbitMQ's reason (rabbit_mgmt_util's "Not management user"), not
    "wrong password", and stays on the login form; a wrong password says so."""
    user = f"plain-{uid}"
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": ""}).status == 201
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        session = UI(context.new_page(), node)
        page = session.page
        page.goto(session.base)
        for password, message in (("pw", f"{user} may not log in here: Not management user"),
                                  ("nope", "Wrong username or password.")):
            page.fill("#login-username", user)
            page.fill("#login-password", password)
            page.click("#login-submit")
            expect(page.locator("#login-error")).to_have_text(message)
            expect(page.locator("#app-view")).to_be_hidden()
        assert [e for e in session.errors if "401 (Unauthorized)" not in e] == []  # the browser notes the 401s
    finally:
        context.close()
    assert call(node, "DELETE", f"/api/users/{q(user)}").status == 204


def test_refused_action_keeps_the_session_and_changed_password_ends_it(browser: Browser, node: BrokerProcess,
                                                                       uid: str):
    user, vhost, queue = f"ro-{uid}", f"ro-vh-{uid}", f"keep-{uid}"
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}").status == 201
    assert call(node, "PUT", f"/api/queues/{q(vhost)}/{q(queue)}", {"durable": False}).status == 201
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"}).status == 201
    assert call(node, "PUT", f"/api/permissions/{q(vhost)}/{q(user)}",
                {"configure": "^$", "write": ".*", "read": ".*"}).status == 201
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        session = UI(context.new_page(), node)
        session.login(user, "pw")
        session.go(f"#/queues/{q(vhost)}/{q(queue)}")
        session.page.click("#queue-delete")
        session.confirm()
        expect(session.page.locator("#banners .banner-error")).to_contain_text("Delete queue")
        expect(session.page.locator("#app-view")).to_be_visible()  # refused, not logged out
        assert call(node, "GET", f"/api/queues/{q(vhost)}/{q(queue)}").status == 200

        assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "changed", "tags": "management"}).status == 204
        session.page.click("#peek-submit")
        expect(session.page.locator("#login-view")).to_be_visible()
        expect(session.page.locator("#login-error")).to_contain_text("Your session ended")
        assert session.off_host() == []
        refusals = re.compile(r"Failed to load resource: the server responded with a status of 40[13]")
        assert [e for e in session.errors if not refusals.match(e)] == []  # only the browser noting them
    finally:
        context.close()
    assert call(node, "DELETE", f"/api/users/{q(user)}").status == 204
    assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_policies_add_edit_apply_and_delete(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    name, operator, target = f"limit-{uid}", f"cap-{uid}", f"pol-{uid}"
    assert call(node, "PUT", f"/api/queues/%2F/{q(target)}", {"durable": False}).status == 201
    assert call(node, "PUT", f"/api/exchanges/%2F/{q(target)}", {"type": "fanout", "durable": False}).status == 201

    ui.go("#/admin/policies")
    page.fill("#policy-name", name)
    page.fill("#policy-pattern", f"^pol-{uid}$")
    page.fill("#policy-priority", "1")
    page.click("#policy-form [data-hint=max-length]")
    page.keyboard.type("5")
    page.click("#policy-form [data-hint=overflow]")
    page.keyboard.type("reject-publish")
    page.click("#policy-add")
    ui.success(f"Policy {name} set in /")
    row = page.locator("table[data-table=policies] tbody tr", has_text=name)
    expect(row).to_contain_text("max-length: 5")
    shown = api_get(node, f"/api/policies/%2F/{q(name)}")
    assert shown == {"vhost": "/", "name": name, "pattern": f"^pol-{uid}$", "apply-to": "all", "priority": 1,
                     "definition": {"max-length": 5, "overflow": "reject-publish"}}

    ui.go("#/queues")  # applied: the queue list names the policy, the queue's page shows it and what it sets
    listed = page.locator("table[data-table=queues] tbody tr", has=page.locator(f"a[data-queue='{target}']"))
    expect(listed.locator("[data-policy-tag]")).to_have_text(name)
    ui.go(f"#/queues/%2F/{q(target)}")
    expect(page.locator("a[data-policy]")).to_have_text(name)
    effective = page.locator("[data-effective-policy]")
    expect(effective).to_have_text(json.dumps({"max-length": 5, "overflow": "reject-publish"}, separators=(",", ":")))
    ui.go(f"#/exchanges/%2F/{q(target)}")
    expect(page.locator("a[data-policy]")).to_have_text(name)
    expect(effective).to_have_text(json.dumps({"max-length": 5, "overflow": "reject-publish"}, separators=(",", ":")))

    ui.go("#/admin/policies")  # edit as raw JSON
    row.locator("[data-action=edit-policy]").click()
    expect(page.locator("#policy-name")).to_have_value(name)
    page.check("#policy-mode-json")
    expect(page.locator("#policy-definition-json")).to_have_value(re.compile(r'"max-length": 5'))
    page.fill("#policy-definition-json", '{"max-length": 7}')
    page.click("#policy-add")
    ui.success(f"Policy {name} set in /")
    expect(row).to_contain_text("max-length: 7")
    assert api_get(node, f"/api/policies/%2F/{q(name)}")["definition"] == {"max-length": 7}
    page.fill("#policy-name", f"bad-{uid}")  # refused: the reason as RabbitMQ's UI shows it
    page.fill("#policy-pattern", "^nothing$")
    page.click("#policy-form [data-hint=overflow]")
    page.keyboard.type("drop-tail")
    page.click("#policy-add")
    expect(page.locator("#banners .banner-error")).to_contain_text('<<"drop-tail">> is not a valid overflow value')
    assert [e for e in ui.errors if "400 (Bad Request)" not in e] == []  # only the browser noting the refusal
    ui.errors.clear()

    page.fill("#operator-policy-name", operator)  # an operator policy's lower limit wins
    page.fill("#operator-policy-pattern", f"^pol-{uid}$")
    page.click("#operator-policy-form [data-hint=max-length]")
    page.keyboard.type("3")
    page.click("#operator-policy-add")
    ui.success(f"Operator policy {operator} set in /")
    assert api_get(node, f"/api/operator-policies/%2F/{q(operator)}")["definition"] == {"max-length": 3}
    ui.go(f"#/queues/%2F/{q(target)}")
    expect(effective).to_have_text('{"max-length":3}')
    expect(page.locator("a[data-policy]")).to_have_text([name, operator])

    ui.go("#/admin/policies")
    delete_row(ui, row, "delete-policy", f"Policy {name} deleted")
    delete_row(ui, page.locator("table[data-table=operator-policies] tbody tr", has_text=operator),
               "delete-operator-policy", f"Operator policy {operator} deleted")
    assert call(node, "GET", f"/api/policies/%2F/{q(name)}").status == 404
    ui.go(f"#/queues/%2F/{q(target)}")
    expect(page.locator("a[data-policy]")).to_have_count(0)
    expect(effective).to_have_count(0)
    assert call(node, "DELETE", f"/api/queues/%2F/{q(target)}").status == 204
    assert call(node, "DELETE", f"/api/exchanges/%2F/{q(target)}").status == 204


def test_policymaker_sees_policies_only(browser: Browser, node: BrokerProcess, uid: str):
    user = f"pm-{uid}"
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "policymaker"}).status == 201
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert call(node, "PUT", f"/api/permissions/%2F/{q(user)}", everything).status == 201
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        session = UI(context.new_page(), node)
        session.login(user, "pw")
        expect(session.page.locator("#nav a[data-tab=admin]")).to_be_visible()
        session.go("#/admin/users")
        expect(session.page.locator("[data-subtab]")).to_have_text(["Policies"])
        expect(session.page.locator("table[data-table=policies]")).to_be_visible()
        expect(session.page.locator("table[data-table=operator-policies]")).to_have_count(0)  # administrators only
        assert session.off_host() == [] and session.errors == [], (session.off_host(), session.errors)
    finally:
        context.close()
    assert call(node, "DELETE", f"/api/users/{q(user)}").status == 204


def test_vhosts_page_add_and_delete(ui: UI, node: BrokerProcess, uid: str):
    page = ui.page
    vhost = f"vhost-{uid}"
    ui.go("#/admin/vhosts")
    expect(page.locator("table[data-table=vhosts] tbody")).to_contain_text("/")
    page.fill("#vhost-name", vhost)
    page.click("#vhost-add")
    ui.success(f"Virtual host {vhost} added")
    row = page.locator("table[data-table=vhosts] tbody tr", has_text=vhost)
    expect(row).to_have_count(1)
    assert call(node, "GET", f"/api/vhosts/{q(vhost)}").status == 200

    ui.go("#/queues")  # the new vhost is offered where queues are declared
    expect(page.locator("#q-vhost option", has_text=vhost)).to_have_count(1)
    ui.go("#/admin/vhosts")
    delete_row(ui, row, "delete-vhost", f"Virtual host {vhost} deleted")
    assert call(node, "GET", f"/api/vhosts/{q(vhost)}").status == 404


def test_limits_page_sets_and_clears_vhost_and_user_limits(ui: UI, node: BrokerProcess, uid: str):
    """Admin > Limits, as RabbitMQ's: each virtual host's and user's limits listed, set and cleared."""
    page = ui.page
    vhost, user = f"limited <v> {uid}", f"limited-{uid}"
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201
    assert call(node, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": ""}).status == 201
    try:
        ui.go("#/admin/limits")
        page.select_option("#vhost-limit-vhost", vhost)
        page.select_option("#vhost-limit-name", "max-queues")
        page.fill("#vhost-limit-value", "many")
        page.click("#vhost-limit-set")
        expect(page.locator("#banners .banner-error")).to_contain_text(
            'max-queues should be a number, actually was "many"')
        page.fill("#vhost-limit-value", "3")
        page.click("#vhost-limit-set")
        ui.success(f"Limit max-queues of {vhost} set")
        row = page.locator("table[data-table=vhost-limits] tbody tr", has_text=vhost)
        expect(row.locator("td[data-col=value]")).to_have_text("3")
        assert api_get(node, f"/api/vhost-limits/{q(vhost)}") == [{"vhost": vhost, "value": {"max-queues": 3}}]

        page.select_option("#user-limit-user", user)
        page.select_option("#user-limit-name", "max-channels")
        page.fill("#user-limit-value", "7")
        page.click("#user-limit-set")
        ui.success(f"Limit max-channels of {user} set")
        user_row = page.locator("table[data-table=user-limits] tbody tr", has_text=user)
        expect(user_row.locator("td[data-col=name]")).to_have_text("max-channels")
        assert api_get(node, f"/api/user-limits/{q(user)}") == [{"user": user, "value": {"max-channels": 7}}]

        delete_row(ui, row, "clear-vhost-limit", f"Limit max-queues of {vhost} cleared")
        delete_row(ui, user_row, "clear-user-limit", f"Limit max-channels of {user} cleared")
        assert api_get(node, f"/api/vhost-limits/{q(vhost)}") == []
        assert api_get(node, f"/api/user-limits/{q(user)}") == []
    finally:
        assert call(node, "DELETE", f"/api/users/{q(user)}").status == 204
        assert call(node, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


def test_definitions_export_and_import(ui: UI, node: BrokerProcess, uid: str, tmp_path: Path):
    page = ui.page
    kept, imported = f"kept-{uid}", f"imported-{uid}"
    assert call(node, "PUT", f"/api/queues/%2F/{q(kept)}", {"durable": True}).status == 201
    ui.go("#/admin/definitions")
    with page.expect_download(timeout=TIMEOUT_MS) as download:
        page.click("#definitions-export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert download.value.suggested_filename.endswith(".json")
    assert kept in [queue["name"] for queue in exported["queues"]]
    assert {"users", "vhosts", "permissions", "exchanges", "bindings"} <= set(exported)

    page.set_input_files("#definitions-file", files=[FilePayload(name="broken.json", mimeType="application/json",
                                                                 buffer=b'{"queues": [')])
    page.click("#definitions-import")
    expect(page.locator("#banners .banner-error")).to_contain_text("broken.json is not valid JSON")

    exported["queues"].append({"name": imported, "vhost": "/", "durable": True, "auto_delete": False,
                               "arguments": {"x-max-length": 5}})
    exported["parameters"].append({"vhost": "/", "component": "mqtt-port-to-vhost-mapping", "name": f"up-{uid}",
                                   "value": {"1883": "/"}})
    upload = tmp_path / "definitions.json"
    upload.write_text(json.dumps(exported))
    page.set_input_files("#definitions-file", str(upload))
    page.click("#definitions-import")
    ui.success("Definitions imported from definitions.json. Skipped, as Warren does not serve them: "
               f"mqtt-port-to-vhost-mapping up-{uid} in / (component mqtt-port-to-vhost-mapping not found)")
    assert api_get(node, f"/api/queues/%2F/{q(imported)}")["arguments"] == {"x-max-length": 5}
    for name in (kept, imported):
        assert call(node, "DELETE", f"/api/queues/%2F/{q(name)}").status == 204


def test_federation_status_page_lists_a_link_and_restarts_it(ui: UI, node: BrokerProcess):
    upstream = {"value": {"uri": "amqp://", "exchange": "ui-fed-upstream"}}
    policy = {"pattern": "^ui-fed-x$", "apply-to": "exchanges", "definition": {"federation-upstream": "ui-up"}}
    connection = connect(node)
    connection.channel().exchange_declare("ui-fed-x", "fanout")
    connection.close()
    assert call(node, "PUT", "/api/parameters/federation-upstream/%2F/ui-up", upstream).status == 201
    assert call(node, "PUT", "/api/policies/%2F/ui-fed", policy).status == 201
    try:
        row = running_row(ui, "federation", "federation-links", "ui-up", "[data-federation-state=running]")
        expect(row).to_contain_text("exchange ui-fed-x")
        expect(row).to_contain_text("ui-fed-upstream")
        row.locator("[data-action=restart-federation-link]").click()
        ui.success("Federation link ui-up restarted.")
    finally:
        call(node, "DELETE", "/api/policies/%2F/ui-fed")
        call(node, "DELETE", "/api/parameters/federation-upstream/%2F/ui-up")
        call(node, "DELETE", "/api/exchanges/%2F/ui-fed-x")


def test_a_page_on_another_origin_cannot_act_with_cached_credentials(browser: Browser, node: BrokerProcess, uid: str):
    """A page served from another origin makes the requests a page may make without the node's leave, each
    posting definitions that add an administrator, while the browser holds the guest's Basic credentials
    for the node (it answers the node's 401 challenge with them): a text/plain form, a multipart form with
    a ``file`` field, and a no-cors fetch.  Each was taken before; now each is refused and nobody is added."""
    import http.server
    import threading

    target = f"http://127.0.0.1:{node.mgmt_port}/api/definitions"
    names = {kind: f"{uid}-{kind}" for kind in ("plain", "multipart", "fetch")}

    def definitions(name: str) -> str:
        return json.dumps({"users": [{"name": name, "password": "pw", "tags": "administrator"}]})

    def escaped(text: str) -> str:
        return text.replace("&", "&amp;").replace("'", "&#39;")

    plain = definitions(names["plain"])[:-1]  # the form writes name=value: the "=" goes into a string
    pages = {
        "/plain": f"""<form method=post enctype=text/plain action='{target}'>
                      <input name='{escaped(plain + ',"x":"')}' value='"}}'></form>
                      <script>document.forms[0].submit()</script>""",
        "/multipart": f"""<form method=post enctype=multipart/form-data action='{target}'>
                          <input name=file value='{escaped(definitions(names["multipart"]))}'></form>
                          <script>document.forms[0].submit()</script>""",
        "/fetch": f"""<script>fetch('{target}', {{method: 'POST', mode: 'no-cors', credentials: 'include',
                      headers: {{'Content-Type': 'text/plain'}}, body: {json.dumps(definitions(names["fetch"]))}}})
                      .then(() => {{ document.title = 'sent'; }}, () => {{ document.title = 'sent'; }})</script>""",
    }

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path not in pages:  # (the favicon)
                self.send_error(404)
                return
            body = f"<!doctype html><html><body>{pages[self.path]}</body></html>".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    context = browser.new_context(http_credentials={"username": "guest", "password": "guest"})
    answered: list[int] = []  # the node's answers to the pages' posts (its 401 challenges aside)
    context.on("response", lambda response: answered.append(response.status)
               if response.url == target and response.status != 401 else None)
    try:
        for number, path in enumerate(pages, start=1):
            page = context.new_page()  # (a tab each: a form's answer navigates its tab)
            page.goto(f"http://127.0.0.1:{attacker.server_address[1]}{path}", wait_until="commit")
            for _ in range(TIMEOUT_MS // 100):
                if len(answered) >= number:
                    break
                page.wait_for_timeout(100)
            assert len(answered) == number, f"{path}: the page's post never reached the node"
    finally:
        context.close()
        attacker.shutdown()
    assert answered == [415, 415, 415]
    for kind, name in names.items():
        assert call(node, "GET", f"/api/users/{q(name)}").status == 404, f"the {kind} page added an administrator"


def running_row(ui: UI, section: str, table: str, name: str, running: str) -> Locator:
    """The row of ``name`` on an Admin status page once it shows ``running`` (a link starts within a second or so:
    the page is refreshed until it does)."""
    row = ui.page.locator(f"[data-table={table}] tbody tr", has_text=name)
    for _ in range(50):
        ui.go(f"#/admin/{section}")
        if row.locator(running).count():
            break
        ui.page.wait_for_timeout(200)
        ui.go("#/admin")
    expect(row.locator(running)).to_be_visible()
    return row


def test_shovel_status_page_lists_a_shovel_and_restarts_it(ui: UI, node: BrokerProcess):
    value = {"src-uri": "amqp://", "src-queue": "ui-shovel-src", "dest-uri": "amqp://", "dest-queue": "ui-shovel-dest"}
    assert call(node, "PUT", "/api/parameters/shovel/%2F/ui-shovel", {"value": value}).status == 201
    try:
        row = running_row(ui, "shovels", "shovels", "ui-shovel", "[data-shovel-state=running]")
        expect(row).to_contain_text("queue ui-shovel-src")
        row.locator("[data-action=restart-shovel]").click()
        ui.success("Shovel ui-shovel restarted.")
    finally:
        call(node, "DELETE", "/api/parameters/shovel/%2F/ui-shovel")

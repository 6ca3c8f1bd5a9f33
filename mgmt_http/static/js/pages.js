/* Pages: overview, connections, channels, exchanges, queues.  Each page is {el, refresh(first)}; the app
   mounts el once and calls refresh(true) now and refresh(false) on every tick, so forms keep what the
   user typed. */
"use strict";
(function (W) {
  const { h, api, act, replace, fmtNum, fmtRate, fmtBytes, get, rate, enc } = W;
  const pages = (W.pages = {});
  const COLORS = { publish: "#2b6777", deliver: "#d08c2f", ack: "#5b8f3a", redeliver: "#a3485a",
    ready: "#2b6777", unacked: "#d08c2f", total: "#8e9aa8" };
  const DEFAULT_EX = "amq.default";
  W.OVERFLOW_MODES = ["drop-head", "reject-publish", "reject-publish-dlx"];
  W.LEADER_LOCATORS = ["client-local", "balanced"];

  function pageHead(title, ...rest) {
    return h("div.page-head", h("h1", title), ...rest);
  }
  // One virtual host chosen for every page's lists and forms, as with RabbitMQ's selector: kept for the tab.
  const VHOST_KEY = "warren.vhost";
  const chosenVhost = () => sessionStorage.getItem(VHOST_KEY) || "";
  function vhostFilter(onChange) {
    const sel = h("select", { "data-filter": "vhost", "aria-label": "Virtual host", on: { change: () => {
      sessionStorage.setItem(VHOST_KEY, sel.value);
      onChange();
    } } });
    const fill = (vhosts) => {
      replace(sel, h("option", { value: "" }, "All virtual hosts"), vhosts.map((v) => h("option", { value: v.name }, v.name)));
      sel.value = vhosts.some((v) => v.name === chosenVhost()) ? chosenVhost() : "";
    };
    return { el: sel, fill, get value() { return sel.value; } };
  }
  function searchBox(table) {
    return h("input", { type: "search", placeholder: "Filter by name…", "data-filter": "name", "aria-label": "Filter by name",
      on: { input: (e) => table.setFilter(e.target.value) } });
  }
  function countLabel() {
    const el = h("span.count");
    return { el, set(shown, total) { el.textContent = shown === total ? `(${fmtNum(total)})` : `(${fmtNum(shown)} of ${fmtNum(total)})`; } };
  }
  async function vhostNames() {
    const vhosts = await api("GET", "vhosts?columns=name");
    W.state.vhosts = vhosts;
    return vhosts;
  }
  function vhostSelect(attrs) {
    const names = (W.state.vhosts || [{ name: "/" }]).map((v) => v.name);
    return W.select(attrs, names, names.includes(chosenVhost()) ? chosenVhost() : names.includes("/") ? "/" : names[0]);
  }
  function exchangePath(vhost, name) { return `${enc(vhost)}/${enc(name === "" ? DEFAULT_EX : name)}`; }
  function exchangeLink(vhost, name) {
    return h("a", { href: `#/exchanges/${exchangePath(vhost, name)}`, "data-exchange": name }, name === "" ? "(AMQP default)" : name);
  }
  function queueLink(vhost, name) {
    return h("a", { href: `#/queues/${enc(vhost)}/${enc(name)}`, "data-queue": name }, name);
  }
  function connectionLink(name, label) {
    return h("a", { href: `#/connections/${enc(name)}`, "data-connection": name }, label || name);
  }
  function channelLink(name, label) {
    return h("a", { href: `#/channels/${enc(name)}`, "data-channel": name }, label || name);
  }
  // Policy names link to the policies page for those who may see it.
  function policyName(name) {
    return W.isPolicymaker() ? h("a", { href: "#/admin/policies", "data-policy": name }, name) : name;
  }
  // As RabbitMQ's lists show them: the policy's name beside the features.
  function policyTags(x) {
    return [["policy", "policy"], ["operator_policy", "operator policy"]].map(([key, title]) =>
      (x[key] ? h("span.tag.accent", { title, "data-policy-tag": x[key] }, x[key]) : null));
  }
  function policyRows(x) {
    return [
      ["Policy", x.policy ? policyName(x.policy) : h("span.muted", "none")],
      x.operator_policy ? ["Operator policy", policyName(x.operator_policy)] : null,
      Object.keys(x.effective_policy_definition || {}).length
        ? ["Effective policy definition", h("span.mono", { "data-effective-policy": "" }, JSON.stringify(x.effective_policy_definition))] : null,
    ];
  }
  W.exchangeLink = exchangeLink;
  W.queueLink = queueLink;

  /* ====================== Overview ====================== */
  pages.overview = function () {
    const rates = new W.LineChart("rates", [
      { key: "publish", label: "Publish", color: COLORS.publish },
      { key: "deliver", label: "Deliver / get", color: COLORS.deliver },
      { key: "ack", label: "Ack", color: COLORS.ack },
      { key: "redeliver", label: "Redeliver", color: COLORS.redeliver },
    ], { format: fmtRate, unit: "/s", label: "Message rates" });
    const depth = new W.LineChart("depth", [
      { key: "ready", label: "Ready", color: COLORS.ready },
      { key: "unacked", label: "Unacked", color: COLORS.unacked },
      { key: "total", label: "Total", color: COLORS.total },
    ], { fill: true, integer: true, label: "Queued messages" });
    const perQueue = new W.BarChart("queue-depths", [
      { key: "ready", label: "Ready", color: COLORS.ready },
      { key: "unacked", label: "Unacked", color: COLORS.unacked },
    ], { limit: 8, empty: "No queues hold messages", label: "Deepest queues" });
    const cards = h("div.stats");
    const nodeInfo = h("div");
    const listeners = W.dataTable("listeners", [
      { key: "protocol", label: "Protocol" },
      { key: "ip_address", label: "Bound to" },
      { key: "port", label: "Port", num: true, render: (r) => String(r.port) },
    ], { empty: "No listeners" });
    // As RabbitMQ's overview, for monitoring users (GET /api/nodes is theirs): resources against their alarm limits.
    const used = (n, key, total) => `${fmtNum(n[key])} / ${fmtNum(n[total])}`;
    const alarm = (on, text) => (on ? h("span.tag.alarm", { "data-alarm": text }, text) : null);
    const nodes = W.dataTable("nodes", [
      { key: "name", label: "Name", render: (n) => h("span.mono", n.name) },
      { key: "fd_used", label: "File descriptors", num: true, render: (n) => used(n, "fd_used", "fd_total") },
      { key: "sockets_used", label: "Socket descriptors", num: true, render: (n) => used(n, "sockets_used", "sockets_total") },
      { key: "mem_used", label: "Memory", num: true, render: (n) => [alarm(n.mem_alarm, "memory alarm"),
        `${fmtBytes(n.mem_used)} / ${fmtBytes(n.mem_limit)} high watermark`] },
      { key: "disk_free", label: "Disk space", num: true, render: (n) => [alarm(n.disk_free_alarm, "disk alarm"),
        `${fmtBytes(n.disk_free)} free / ${fmtBytes(n.disk_free_limit)} low watermark`] },
      { key: "uptime", label: "Uptime", num: true, render: (n) => fmtUptime(n.uptime) },
      { key: "type", label: "Info", render: (n) => [h("span.tag", n.type), h("span.tag", { title: "Message rates" }, n.rates_mode)] },
    ], { empty: "No nodes", rowKey: (n) => n.name });
    const nodesPanel = h("section.panel", { id: "nodes", hidden: true }, h("div.panel-head", h("h2", "Nodes")), h("div.panel-body.flush", nodes.el));
    const el = h("div",
      pageHead("Overview", h("span.subtitle", "Totals, message rates and queue depths, refreshed live")),
      cards, nodesPanel,
      h("div.grid-2",
        h("section.panel", h("div.panel-head", h("h2", "Message rates")), rates.el),
        h("section.panel", h("div.panel-head", h("h2", "Queued messages")), depth.el)),
      h("div.grid-2",
        h("section.panel", h("div.panel-head", h("h2", "Deepest queues"), h("span.spacer"), h("a", { href: "#/queues" }, "All queues →")),
          h("div.panel-body", { style: "padding-bottom:0" }, perQueue.el)),
        h("section.panel", h("div.panel-head", h("h2", "Node")), h("div.panel-body", nodeInfo),
          h("div.panel-body.flush", listeners.el))));
    function card(label, value, key, accent) {
      return h("div.stat" + (accent ? ".accent" : ""), { "data-stat": key }, h("div.label", label), h("div.value", fmtNum(value)));
    }
    return {
      el,
      async refresh(first) {
        if (first) await W.loadOverview();  // the last tick's may be old, or ticks may be off
        const ov = W.state.overview;
        const ot = ov.object_totals || {};
        const qt = ov.queue_totals || {};
        replace(cards,
          card("Connections", ot.connections, "connections"),
          card("Channels", ot.channels, "channels"),
          card("Exchanges", ot.exchanges, "exchanges"),
          card("Queues", ot.queues, "queues"),
          card("Consumers", ot.consumers, "consumers"),
          card("Ready", qt.messages_ready, "messages_ready", true),
          card("Unacked", qt.messages_unacknowledged, "messages_unacknowledged", true),
          card("Total messages", qt.messages, "messages", true));
        rates.setPoints(W.history);
        depth.setPoints(W.history);
        replace(nodeInfo, W.kvTable([
          ["Node", h("span.mono", ov.node || "")],
          ["Product", `${ov.product_name || "Warren"} ${ov.product_version || ""}`],
          ["RabbitMQ compatibility", ov.rabbitmq_version || ""],
          ["Cluster", ov.cluster_name || ""],
          ["Management API", ov.management_version || ""],
        ]));
        listeners.update(ov.listeners || []);
        nodesPanel.hidden = !W.isMonitor();
        if (W.isMonitor()) nodes.update(await api("GET", "nodes"));
        const queues = await api("GET", "queues?columns=name,vhost,messages_ready,messages_unacknowledged,messages");
        const deepest = queues.filter((q) => (q.messages || 0) > 0)
          .sort((a, b) => (b.messages || 0) - (a.messages || 0))
          .map((q) => ({ label: q.vhost === "/" ? q.name : `${q.vhost} / ${q.name}`,
            parts: { ready: q.messages_ready || 0, unacked: q.messages_unacknowledged || 0 } }));
        perQueue.setItems(deepest);
      },
    };
  };

  // As RabbitMQ's fmt_uptime: the two largest units.
  function fmtUptime(ms) {
    const s = Math.floor((ms || 0) / 1000);
    const [d, hr, m] = [Math.floor(s / 86400), Math.floor((s % 86400) / 3600), Math.floor((s % 3600) / 60)];
    return d ? `${d}d ${hr}h` : hr ? `${hr}h ${m}m` : `${m}m ${s % 60}s`;
  }

  /* ====================== Connections ====================== */
  pages.connections = function () {
    const count = countLabel();
    const vf = vhostFilter(() => page.refresh());
    const table = W.dataTable("connections", [
      { key: "name", label: "Name", render: (c) => connectionLink(c.name, c.user_provided_name ? [c.user_provided_name, " ", h("span.muted", `(${c.name})`)] : c.name) },
      { key: "vhost", label: "Virtual host" },
      { key: "user", label: "User" },
      { key: "peer", label: "Client", value: (c) => `${c.peer_host}:${c.peer_port}`, render: (c) => h("span.mono", `${c.peer_host}:${c.peer_port}`) },
      { key: "client", label: "Client library", value: (c) => clientName(c) },
      { key: "ssl", label: "TLS", value: (c) => (c.ssl ? c.ssl_protocol : ""), render: (c) => tlsTag(c) },
      { key: "protocol", label: "Protocol" },
      { key: "channels", label: "Channels", num: true },
      { key: "state", label: "State", render: (c) => h("span.tag" + (c.state === "running" ? ".ok" : ".warn"), c.state) },
      { key: "connected_at", label: "Connected at", render: (c) => W.fmtTime(c.connected_at) },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (c) => h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "close-connection", on: { click: (e) => close(e.target, c) } }, "Close") },
    ], { empty: "No client connections.", filterFields: ["name", "user", "user_provided_name", "peer_host"], onRender: (s, t) => count.set(s, t) });
    async function close(button, c) {
      if (await closeConnection(button, c.name)) await page.refresh();
    }
    const page = {
      el: h("div", pageHead("Connections"), h("section.panel",
        h("div.panel-head", h("h2", "All connections"), count.el, h("span.spacer"), h("div.filter-bar", vf.el, searchBox(table))),
        h("div.panel-body.flush", table.el))),
      async refresh() {
        vf.fill(await vhostNames());
        table.update(await api("GET", vf.value ? `vhosts/${enc(vf.value)}/connections` : "connections"));
      },
    };
    return page;
  };

  function clientName(c) {
    const p = c.client_properties || {};
    return [p.product, p.version].filter(Boolean).join(" ");
  }
  function tlsTag(c) {
    return c.ssl ? h("span.tag.ok", { title: [c.ssl_protocol, c.ssl_cipher, c.peer_cert_subject].filter(Boolean).join(" · "), "data-tls": c.ssl_protocol }, c.ssl_protocol || "TLS")
      : h("span.muted", "no");
  }
  // Force-closes a connection after asking; resolves true once closed.
  async function closeConnection(button, name) {
    if (!await W.confirmDialog("Close connection", [`Force-close connection `, h("b", name), "? The client gets connection.close (320 CONNECTION_FORCED)."], "Close connection")) return false;
    return !!await act(button, async () => {
      await api("DELETE", `connections/${enc(name)}`, undefined, { headers: { "X-Reason": "Closed via management UI" } });
      return true;
    }, `Connection ${name} closed.`);
  }

  /* ====================== Connection detail ====================== */
  pages.connection = function (name) {
    const info = h("div");
    const tlsInfo = h("div", { id: "connection-tls" });
    const props = h("div");
    const channels = W.dataTable("connection-channels", [
      { key: "number", label: "Channel", num: true, render: (c) => channelLink(c.name, String(c.number)) },
      { key: "state", label: "State", render: (c) => h("span.tag" + (c.state === "running" ? ".ok" : ".warn"), c.state) },
      { key: "prefetch_count", label: "Prefetch", num: true },
      { key: "consumer_count", label: "Consumers", num: true },
      { key: "messages_unacknowledged", label: "Unacked", num: true },
      { key: "mode", label: "Mode", value: (c) => (c.confirm ? "C" : "") + (c.transactional ? "T" : "") },
    ], { sortKey: "number", sortDir: 1, empty: "No open channels." });
    const channelsPanel = h("section.panel", h("div.panel-head", h("h2", "Channels")), h("div.panel-body.flush", channels.el));
    const sessions = h("div", { id: "connection-sessions" });
    const sessionsPanel = h("section.panel", { hidden: true }, h("div.panel-head", h("h2", "Sessions")), h("div.panel-body", sessions));
    const close = h("button.btn.btn-danger", { type: "button", id: "connection-close", on: { click: async () => {
      if (await closeConnection(close, name)) W.navigate("#/connections", `Connection ${name} closed.`);
    } } }, "Force close");
    return {
      el: h("div",
        pageHead(h("span", h("span.muted", "Connection "), name), h("span.spacer"), h("a", { href: "#/connections" }, "← All connections")),
        h("div.grid-2",
          h("section.panel", h("div.panel-head", h("h2", "Details")), h("div.panel-body", info)),
          h("section.panel", h("div.panel-head", h("h2", "TLS")), h("div.panel-body", tlsInfo))),
        channelsPanel, sessionsPanel,
        h("section.panel", h("div.panel-head", h("h2", "Client properties")), h("div.panel-body", props)),
        h("section.panel", h("div.panel-head", h("h2", "Close this connection")), h("div.panel-body.danger-zone", close))),
      async refresh() {
        const c = await api("GET", `connections/${enc(name)}`);
        replace(info, W.kvTable([
          c.user_provided_name ? ["Client-provided name", c.user_provided_name] : null,
          ["Virtual host", c.vhost], ["User", c.user], ["Client", h("span.mono", `${c.peer_host}:${c.peer_port}`)],
          ["Client library", clientName(c)], ["Protocol", c.protocol], ["Authentication", c.auth_mechanism],
          ["State", h("span.tag" + (c.state === "running" ? ".ok" : ".warn"), c.state)],
          ["Heartbeat", `${fmtNum(c.timeout)} s`], ["Frame max", `${fmtNum(c.frame_max)} bytes`], ["Channel max", fmtNum(c.channel_max)],
          ["Connected at", W.fmtTime(c.connected_at)],
        ]));
        replace(tlsInfo, c.ssl ? W.kvTable([
          ["Protocol", c.ssl_protocol], ["Key exchange", c.ssl_key_exchange], ["Cipher", c.ssl_cipher], ["Hash", c.ssl_hash],
          ["Peer certificate", c.peer_cert_subject ? h("span.mono", c.peer_cert_subject) : h("span.muted", "none presented")],
          c.peer_cert_subject ? ["Issuer", h("span.mono", c.peer_cert_issuer)] : null,
          c.peer_cert_subject ? ["Valid", h("span.mono", c.peer_cert_validity)] : null,
        ]) : h("span.muted", "This connection does not use TLS."));
        const p = c.client_properties || {};
        replace(props, W.kvTable(Object.entries(p).map(([k, v]) => [k, h("span.mono", typeof v === "object" ? JSON.stringify(v) : String(v))])));
        const amqp10 = c.protocol === "AMQP 1.0";
        channelsPanel.hidden = amqp10;
        sessionsPanel.hidden = !amqp10;
        if (amqp10) replace(sessions, sessionList(await api("GET", `connections/${enc(name)}/sessions`)));
        else channels.update(await api("GET", `connections/${enc(name)}/channels`));
      },
    };
  };

  // An AMQP 1.0 connection's sessions, each with its windows and its links both ways.
  function sessionList(list) {
    if (!list.length) return h("span.muted", "No sessions on this connection.");
    const links = (title, rows, incoming) => rows.length ? [h("h3", `${title} (${rows.length})`), h("table.list", { "data-table": incoming ? "incoming-links" : "outgoing-links" },
      h("thead", h("tr", ["Handle", "Name", incoming ? "Target address" : "Source address", incoming ? "snd-settle-mode" : "Queue",
        "Delivery count", "Credit", incoming ? "Unconfirmed" : "Settled"].map((t) => h("th", t)))),
      h("tbody", rows.map((l) => h("tr", [l.handle, l.link_name, l[incoming ? "target_address" : "source_address"] ?? "",
        incoming ? l.snd_settle_mode : l.queue_name, l.delivery_count, l.credit,
        incoming ? l.unconfirmed_messages : (l.send_settled ? "yes" : "no")].map((v) => h("td", String(v)))))))] : [];
    return h("div", list.map((s) => h("div.session", { "data-session": String(s.channel_number) },
      h("h3", `Session on channel ${s.channel_number}`),
      W.kvTable([["Incoming window", fmtNum(s.incoming_window)], ["Remote incoming window", fmtNum(s.remote_incoming_window)],
        ["Remote outgoing window", fmtNum(s.remote_outgoing_window)], ["Next incoming id", fmtNum(s.next_incoming_id)],
        ["Next outgoing id", fmtNum(s.next_outgoing_id)], ["Unsettled deliveries", fmtNum(s.outgoing_unsettled_deliveries)]]),
      ...links("Incoming links", s.incoming_links, true), ...links("Outgoing links", s.outgoing_links, false))));
  }

  /* ====================== Channels ====================== */
  pages.channels = function () {
    const count = countLabel();
    const vf = vhostFilter(() => page.refresh());
    const table = W.dataTable("channels", [
      { key: "name", label: "Channel", render: (c) => channelLink(c.name) },
      { key: "vhost", label: "Virtual host" },
      { key: "user", label: "User" },
      { key: "mode", label: "Mode", value: (c) => (c.confirm ? "C" : "") + (c.transactional ? "T" : ""),
        render: (c) => [c.confirm ? h("span.tag", { title: "confirm" }, "C") : null, c.transactional ? h("span.tag", { title: "transactional" }, "T") : null] },
      { key: "state", label: "State", render: (c) => h("span.tag" + (c.state === "running" ? ".ok" : ".warn"), c.state) },
      { key: "prefetch_count", label: "Prefetch", num: true },
      { key: "consumer_count", label: "Consumers", num: true },
      { key: "messages_unacknowledged", label: "Unacked", num: true },
      { key: "messages_unconfirmed", label: "Unconfirmed", num: true },
      { key: "publish_rate", label: "Publish", num: true, value: (c) => rate(c, "publish"), render: (c) => fmtRate(rate(c, "publish")) },
      { key: "deliver_rate", label: "Deliver / get", num: true, value: (c) => rate(c, "deliver_get"), render: (c) => fmtRate(rate(c, "deliver_get")) },
      { key: "ack_rate", label: "Ack", num: true, value: (c) => rate(c, "ack"), render: (c) => fmtRate(rate(c, "ack")) },
    ], { empty: "No open channels.", filterFields: ["name", "user"], onRender: (s, t) => count.set(s, t) });
    const page = {
      el: h("div", pageHead("Channels"), h("section.panel",
        h("div.panel-head", h("h2", "All channels"), count.el, h("span.spacer"), h("div.filter-bar", vf.el, searchBox(table))),
        h("div.panel-body.flush", table.el))),
      async refresh() {
        vf.fill(await vhostNames());
        table.update(await api("GET", vf.value ? `vhosts/${enc(vf.value)}/channels` : "channels"));
      },
    };
    return page;
  };

  /* ====================== Channel detail ====================== */
  pages.channel = function (name) {
    const info = h("div");
    const rates = h("div");
    const consumers = W.dataTable("channel-consumers", [
      { key: "consumer_tag", label: "Consumer tag", render: (c) => h("span.mono", c.consumer_tag) },
      { key: "queue", label: "Queue", value: (c) => c.queue.name, render: (c) => queueLink(c.queue.vhost, c.queue.name) },
      { key: "ack_required", label: "Ack required" },
      { key: "exclusive", label: "Exclusive" },
      { key: "prefetch_count", label: "Prefetch count", num: true },
      { key: "activity_status", label: "Activity status", render: (c) => h("span.tag" + (c.active ? ".ok" : ""), activityLabel(c.activity_status)) },
      { key: "arguments", label: "Arguments", sortable: false, render: (c) => Object.keys(c.arguments || {}).length ? h("span.mono", JSON.stringify(c.arguments)) : "" },
    ], { sortKey: "consumer_tag", empty: "No consumers.", rowKey: (c) => c.consumer_tag });
    return {
      el: h("div",
        pageHead(h("span", h("span.muted", "Channel "), name), h("span.spacer"), h("a", { href: "#/channels" }, "← All channels")),
        h("div.grid-2",
          h("section.panel", h("div.panel-head", h("h2", "Details")), h("div.panel-body", info)),
          h("section.panel", h("div.panel-head", h("h2", "Message rates")), h("div.panel-body", rates))),
        h("section.panel", { id: "channel-consumers" }, h("div.panel-head", h("h2", "Consumers")), h("div.panel-body.flush", consumers.el))),
      async refresh() {
        const c = await api("GET", `channels/${enc(name)}`);
        replace(info, W.kvTable([
          ["Connection", connectionLink(c.connection_details.name)], ["Virtual host", c.vhost], ["User", c.user],
          ["Node", h("span.mono", c.node || "")],
          ["State", h("span.tag" + (c.state === "running" ? ".ok" : ".warn"), c.state)],
          ["Mode", [c.confirm ? h("span.tag", "confirm") : null, c.transactional ? h("span.tag", "transactional") : null,
            c.confirm || c.transactional ? null : h("span.muted", "none")]],
          ...[["Prefetch count", "prefetch_count"], ["Global prefetch count", "global_prefetch_count"],
            ["Messages unacknowledged", "messages_unacknowledged"], ["Messages unconfirmed", "messages_unconfirmed"],
            ["Messages uncommitted", "messages_uncommitted"], ["Acks uncommitted", "acks_uncommitted"],
            ["Pending Raft commands", "pending_raft_commands"]].map(([label, key]) => [label, h("span", { "data-field": key }, fmtNum(c[key]))]),
        ]));
        replace(rates, W.kvTable([["Publish", "publish"], ["Confirm", "confirm"], ["Deliver / get", "deliver_get"],
          ["Redelivered", "redeliver"], ["Ack", "ack"]].map(([label, stat]) => [label, fmtRate(rate(c, stat)) || "0.0/s"])));
        consumers.update(c.consumer_details || []);
      },
    };
  };

  /* ====================== Exchanges ====================== */
  pages.exchanges = function () {
    const count = countLabel();
    const vf = vhostFilter(() => page.refresh());
    const table = W.dataTable("exchanges", [
      { key: "vhost", label: "Virtual host" },
      { key: "name", label: "Name", render: (x) => exchangeLink(x.vhost, x.name) },
      { key: "type", label: "Type" },
      { key: "features", label: "Features", sortable: false, render: (x) => [W.featureTags(x), policyTags(x)] },
      { key: "rate_in", label: "Message rate in", num: true, value: (x) => rate(x, "publish_in"), render: (x) => fmtRate(rate(x, "publish_in")) },
      { key: "rate_out", label: "Message rate out", num: true, value: (x) => rate(x, "publish_out"), render: (x) => fmtRate(rate(x, "publish_out")) },
    ], { sortKey: "name", empty: "No exchanges.", onRender: (s, t) => count.set(s, t) });
    const form = {
      vhost: vhostSelect({ id: "ex-vhost", name: "vhost" }),
      name: h("input", { id: "ex-name", name: "name", required: true, placeholder: "e.g. orders" }),
      type: h("select", { id: "ex-type", name: "type" }),
      durable: W.select({ id: "ex-durable", name: "durable" }, [["true", "Durable"], ["false", "Transient"]], "true"),
      autoDelete: W.select({ id: "ex-auto-delete", name: "auto_delete" }, [["false", "No"], ["true", "Yes"]], "false"),
      internal: W.select({ id: "ex-internal", name: "internal" }, [["false", "No"], ["true", "Yes"]], "false"),
      args: W.kvEditor("Arguments", [["Alternate exchange", "alternate-exchange", "string"],
        ["Delayed type", "x-delayed-type", "string", ["direct", "fanout", "topic", "headers"]]]),
    };
    // The types the node has (the overview's exchange_types, refreshed every tick), so plugins' types show up too.
    function fillTypes() {
      const types = ((W.state.overview || {}).exchange_types || []).map((t) => t.name);
      const cur = form.type.value || "direct";
      replace(form.type, types.map((t) => h("option", { value: t }, t)));
      form.type.value = types.includes(cur) ? cur : types[0] || "";
    }
    const submit = h("button.btn.btn-primary", { type: "submit", id: "ex-add" }, "Add exchange");
    const addForm = h("form.form", { id: "exchange-form", on: { submit: async (e) => {
      e.preventDefault();
      const name = form.name.value.trim();
      const vhost = form.vhost.value;
      const ok = await act(submit, async () => {
        if (!name) throw new W.InputError("Exchange name is required");
        await api("PUT", `exchanges/${exchangePath(vhost, name)}`, {
          type: form.type.value, durable: form.durable.value === "true", auto_delete: form.autoDelete.value === "true",
          internal: form.internal.value === "true", arguments: form.args.value() });
        return true;
      }, `Exchange ${name} declared in ${vhost}.`, "Declare exchange");
      if (ok) { form.name.value = ""; form.args.reset(); await page.refresh(); }
    } } },
      W.field("Virtual host", form.vhost), W.field("Name", form.name), W.field("Type", form.type),
      W.field("Durability", form.durable), W.field("Auto delete", form.autoDelete, "Deleted when its last binding goes"),
      W.field("Internal", form.internal, "Clients cannot publish to an internal exchange"),
      W.field("Arguments", form.args.el), h("div.actions", submit));
    const page = {
      el: h("div", pageHead("Exchanges"),
        h("section.panel", h("div.panel-head", h("h2", "All exchanges"), count.el, h("span.spacer"), h("div.filter-bar", vf.el, searchBox(table))),
          h("div.panel-body.flush", table.el)),
        h("details.panel", { id: "add-exchange", open: true }, h("summary", "Add a new exchange"), h("div.panel-body", addForm))),
      async refresh() {
        fillTypes();
        const vhosts = await vhostNames();
        vf.fill(vhosts);
        table.update(await api("GET", vf.value ? `exchanges/${enc(vf.value)}` : "exchanges"));
      },
    };
    return page;
  };

  /* ---------- shared: bindings table, publish form, message cards ---------- */
  function bindingsTable(id, vhost, side, onChange) {
    const columns = [
      side === "queue"
        ? { key: "source", label: "From exchange", render: (b) => exchangeLink(vhost, b.source) }
        : { key: "destination", label: "To", render: (b) => [h("span.tag", b.destination_type === "queue" ? "queue" : "exchange"), " ",
          b.destination_type === "queue" ? queueLink(vhost, b.destination) : exchangeLink(vhost, b.destination)] },
      { key: "routing_key", label: "Routing key", render: (b) => h("span.mono", b.routing_key) },
      { key: "arguments", label: "Arguments", sortable: false, render: (b) => Object.keys(b.arguments || {}).length ? h("span.mono", JSON.stringify(b.arguments)) : "" },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (b) => b.source === "" ? h("span.muted", "default binding") :
        h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "unbind", on: { click: (e) => unbind(e.target, b) } }, "Unbind") },
    ];
    async function unbind(button, b) {
      const kind = b.destination_type === "queue" ? "q" : "e";
      await act(button, async () => {  // the key is escaped already; escaped again as a segment, as RabbitMQ's UI sends it
        await api("DELETE", `bindings/${enc(vhost)}/e/${enc(b.source)}/${kind}/${enc(b.destination)}/${enc(b.properties_key)}`);
        await onChange();
      }, `Unbound ${b.destination} from ${b.source}.`, "Unbind");
    }
    return W.dataTable(id, columns, { sortKey: columns[0].key, empty: "No bindings." });
  }

  function bindForm(vhost, fixed, onDone) {
    // fixed: {exchange} (exchange page: choose destination) or {queue} (queue page: choose source)
    const listId = "bind-suggest-" + Math.random().toString(36).slice(2);
    const datalist = h("datalist", { id: listId });
    const destType = W.select({ id: "bind-dest-type", name: "destination_type" }, [["q", "Queue"], ["e", "Exchange"]], "q");
    const other = h("input", { id: "bind-target", name: "target", list: listId, required: true, placeholder: fixed.exchange !== undefined ? "queue or exchange name" : "exchange name" });
    const rk = h("input", { id: "bind-routing-key", name: "routing_key", placeholder: "routing key (may be empty)" });
    const args = W.kvEditor("Binding arguments", [["x-match", "x-match", "string"]]);
    const submit = h("button.btn.btn-primary", { type: "submit", id: "bind-submit" }, "Bind");
    const form = h("form.form", { id: "bind-form", on: { submit: async (e) => {
      e.preventDefault();
      const target = other.value.trim();
      let source, kind, dest;
      if (fixed.exchange !== undefined) { source = fixed.exchange; kind = destType.value; dest = target; }
      else { source = target; kind = "q"; dest = fixed.queue; }
      const ok = await act(submit, async () => {
        if (!target) throw new W.InputError("Name is required");
        await api("POST", `bindings/${enc(vhost)}/e/${enc(source === "" ? DEFAULT_EX : source)}/${kind}/${enc(dest)}`,
          { routing_key: rk.value, arguments: args.value() });
        return true;
      }, `Bound ${dest} to ${source || "(AMQP default)"}${rk.value ? ` with routing key "${rk.value}"` : ""}.`, "Bind");
      if (ok) { other.value = ""; rk.value = ""; args.reset(); await onDone(); }
    } } },
      fixed.exchange !== undefined ? W.field("Destination type", destType) : null,
      W.field(fixed.exchange !== undefined ? "Destination" : "From exchange", other),
      W.field("Routing key", rk), W.field("Arguments", args.el), h("div.actions", submit), datalist);
    async function suggest() {
      const wantQueues = fixed.exchange !== undefined && destType.value === "q";
      const items = await api("GET", `${wantQueues ? "queues" : "exchanges"}/${enc(vhost)}?columns=name`);
      replace(datalist, items.filter((x) => x.name !== "").map((x) => h("option", { value: x.name })));
    }
    destType.addEventListener("change", () => suggest().catch(() => {}));
    return { el: form, suggest };
  }

  function publishForm(vhost, exchange, fixedRoutingKey) {
    const rk = h("input", { id: "pub-routing-key", name: "routing_key", value: fixedRoutingKey || "", placeholder: "routing key", readonly: fixedRoutingKey !== undefined });
    const mode = W.select({ id: "pub-delivery-mode", name: "delivery_mode" }, [["1", "1 - Non-persistent"], ["2", "2 - Persistent"]], "1");
    const headers = W.kvEditor("Headers");
    const props = W.kvEditor("Properties", [["content_type", "content_type", "string"], ["correlation_id", "correlation_id", "string"],
      ["message_id", "message_id", "string"], ["reply_to", "reply_to", "string"], ["expiration", "expiration", "string"], ["priority", "priority", "number"]]);
    const payload = h("textarea", { id: "pub-payload", name: "payload", rows: 5, placeholder: "message body" });
    const encoding = W.select({ id: "pub-encoding", name: "payload_encoding" }, [["string", "String"], ["base64", "Base64"]], "string");
    const submit = h("button.btn.btn-primary", { type: "submit", id: "pub-submit" }, "Publish message");
    const form = h("form.form", { id: "publish-form", on: { submit: async (e) => {
      e.preventDefault();
      await act(submit, async () => {
        const properties = Object.assign({ delivery_mode: Number(mode.value) }, props.value());
        const hdrs = headers.value();
        if (Object.keys(hdrs).length) properties.headers = hdrs;
        const res = await api("POST", `exchanges/${exchangePath(vhost, exchange)}/publish`,
          { routing_key: rk.value, payload: payload.value, payload_encoding: encoding.value, properties });
        if (res && res.routed === false) W.banner("warn", "Message published, but not routed.", "No queue is bound with a matching routing key.", 8000);
        else W.showSuccess("Message published.");
        if (W.app && W.app.current && W.app.current.refresh) await W.app.current.refresh();
      }, null, "Publish");
    } } },
      W.field("Routing key", rk), W.field("Delivery mode", mode), W.field("Headers", headers.el),
      W.field("Properties", props.el), W.field("Payload", payload), W.field("Payload encoding", encoding),
      h("div.actions", submit));
    return form;
  }

  function messageCard(m, label) {
    const props = Object.assign({}, m.properties || {});
    const headers = props.headers;
    delete props.headers;
    return h("article.message", { "data-message": "" },
      h("div.message-head",
        h("span.pos", label),
        h("span", "Exchange: ", m.exchange === "" ? h("i", "(AMQP default)") : h("b", m.exchange)),
        h("span", "Routing key: ", h("b.mono", m.routing_key)),
        m.redelivered ? h("span.tag.warn", "redelivered") : h("span.tag", "first delivery"),
        m.message_count !== undefined ? h("span.muted", `${fmtNum(m.message_count)} left in queue`) : null,
        h("span.muted", `${fmtBytes(m.payload_bytes)}, ${m.payload_encoding}`)),
      h("div.message-body",
        Object.keys(props).length || headers ? W.kvTable([
          ...Object.entries(props).map(([k, v]) => [k, h("span.mono", typeof v === "object" ? JSON.stringify(v) : String(v))]),
          headers ? ["headers", h("span.mono", JSON.stringify(headers))] : null,
        ]) : null,
        h("pre.payload", m.payload)));
  }

  /* ====================== Exchange detail ====================== */
  pages.exchange = function (vhost, rawName) {
    const name = rawName === DEFAULT_EX ? "" : rawName;
    const display = name === "" ? "(AMQP default)" : name;
    const info = h("div");
    const bindings = bindingsTable("exchange-bindings", vhost, "exchange", () => page.refresh());
    const incoming = bindingsTable("exchange-incoming", vhost, "queue", () => page.refresh());
    const bind = bindForm(vhost, { exchange: name }, () => page.refresh());
    const del = h("button.btn.btn-danger", { type: "button", id: "exchange-delete", on: { click: async () => {
      if (!await W.confirmDialog("Delete exchange", ["Delete exchange ", h("b", display), ` in ${vhost}? Its bindings go with it.`], "Delete")) return;
      const ok = await act(del, async () => { await api("DELETE", `exchanges/${exchangePath(vhost, name)}`); return true; }, null, "Delete exchange");
      if (ok) W.navigate("#/exchanges", `Exchange ${display} deleted.`);
    } } }, "Delete this exchange");
    const isDefault = name === "";
    const builtin = name.startsWith("amq.");
    const page = {
      el: h("div",
        pageHead(h("span", h("span.muted", "Exchange "), display), h("span.crumbs", "in virtual host ", h("b", vhost)), h("span.spacer"), h("a", { href: "#/exchanges" }, "← All exchanges")),
        h("section.panel", h("div.panel-head", h("h2", "Details")), h("div.panel-body", info)),
        isDefault ? h("div.banner.banner-info", "The default exchange is implicitly bound to every queue, with the queue name as the routing key. It cannot be bound or deleted.") : h("div.grid-2",
          h("section.panel", h("div.panel-head", h("h2", "Bindings from this exchange")), h("div.panel-body.flush", bindings.el)),
          h("section.panel", h("div.panel-head", h("h2", "Add binding from this exchange")), h("div.panel-body", bind.el))),
        isDefault ? null : h("section.panel", h("div.panel-head", h("h2", "Bindings to this exchange")), h("div.panel-body.flush", incoming.el)),
        h("section.panel", { id: "publish" }, h("div.panel-head", h("h2", "Publish message")), h("div.panel-body", publishForm(vhost, name))),
        isDefault || builtin ? null : h("section.panel", h("div.panel-head", h("h2", "Delete")), h("div.panel-body.danger-zone", del,
          h("span.muted", "Queues bound to it stay; only the bindings go.")))),
      async refresh() {
        const x = await api("GET", `exchanges/${exchangePath(vhost, name)}`);
        replace(info, W.kvTable([
          ["Type", x.type], ["Features", W.featureTags(x).length ? W.featureTags(x) : h("span.muted", "none")],
          ["Arguments", Object.keys(x.arguments || {}).length ? h("span.mono", JSON.stringify(x.arguments)) : h("span.muted", "none")],
          ...policyRows(x),
          ["Message rate in", fmtRate(rate(x, "publish_in")) || "0.0/s"], ["Message rate out", fmtRate(rate(x, "publish_out")) || "0.0/s"],
        ]));
        if (!isDefault) {
          bindings.update(await api("GET", `exchanges/${exchangePath(vhost, name)}/bindings/source`));
          incoming.update(await api("GET", `exchanges/${exchangePath(vhost, name)}/bindings/destination`));
          await bind.suggest();
        }
      },
    };
    return page;
  };

  /* ====================== Queues ====================== */
  pages.queues = function () {
    const count = countLabel();
    const vf = vhostFilter(() => page.refresh());
    const table = W.dataTable("queues", [
      { key: "vhost", label: "Virtual host" },
      { key: "name", label: "Name", render: (q) => queueLink(q.vhost, q.name) },
      { key: "type", label: "Type" },
      { key: "features", label: "Features", sortable: false, render: (q) => [W.featureTags(q), policyTags(q)] },
      { key: "state", label: "State", render: (q) => h("span.tag" + (q.state === "running" ? ".ok" : ".warn"), q.state) },
      { key: "consumers", label: "Consumers", num: true },
      { key: "messages_ready", label: "Ready", num: true },
      { key: "messages_unacknowledged", label: "Unacked", num: true },
      { key: "messages", label: "Total", num: true },
      { key: "rate_in", label: "Incoming", num: true, value: (q) => rate(q, "publish"), render: (q) => fmtRate(rate(q, "publish")) },
      { key: "rate_out", label: "Deliver / get", num: true, value: (q) => rate(q, "deliver_get"), render: (q) => fmtRate(rate(q, "deliver_get")) },
      { key: "rate_ack", label: "Ack", num: true, value: (q) => rate(q, "ack"), render: (q) => fmtRate(rate(q, "ack")) },
    ], { sortKey: "name", empty: "No queues yet. Declare one below.", onRender: (s, t) => count.set(s, t) });
    const form = {
      vhost: vhostSelect({ id: "q-vhost", name: "vhost" }),
      name: h("input", { id: "q-name", name: "name", required: true, placeholder: "e.g. orders.pending" }),
      durable: W.select({ id: "q-durable", name: "durable" }, [["true", "Durable"], ["false", "Transient"]], "true"),
      autoDelete: W.select({ id: "q-auto-delete", name: "auto_delete" }, [["false", "No"], ["true", "Yes"]], "false"),
      // RabbitMQ's hints for a classic queue, with the types its queue argument validation wants
      args: W.kvEditor("Arguments", [["Auto expire", "x-expires", "number"], ["Message TTL", "x-message-ttl", "number"],
        ["Overflow behaviour", "x-overflow", "string", W.OVERFLOW_MODES], ["Single active consumer", "x-single-active-consumer", "boolean", ["true", "false"]],
        ["Dead letter exchange", "x-dead-letter-exchange", "string"], ["Dead letter routing key", "x-dead-letter-routing-key", "string"],
        ["Max length", "x-max-length", "number"], ["Max length bytes", "x-max-length-bytes", "number"],
        ["Maximum priority", "x-max-priority", "number"], ["Leader locator", "x-queue-leader-locator", "string", ["client-local", "balanced"]],
        ["Queue type", "x-queue-type", "string", ["classic", "quorum", "stream"]], ["Delivery limit (quorum)", "x-delivery-limit", "number"],
        ["Max age (stream)", "x-max-age", "string"], ["Max segment size bytes (stream)", "x-stream-max-segment-size-bytes", "number"]]),
    };
    const submit = h("button.btn.btn-primary", { type: "submit", id: "q-add" }, "Add queue");
    const addForm = h("form.form", { id: "queue-form", on: { submit: async (e) => {
      e.preventDefault();
      const name = form.name.value.trim();
      const vhost = form.vhost.value;
      const ok = await act(submit, async () => {
        if (!name) throw new W.InputError("Queue name is required");
        await api("PUT", `queues/${enc(vhost)}/${enc(name)}`, {
          durable: form.durable.value === "true", auto_delete: form.autoDelete.value === "true", arguments: form.args.value() });
        return true;
      }, `Queue ${name} declared in ${vhost}.`, "Declare queue");
      if (ok) { form.name.value = ""; form.args.reset(); await page.refresh(); }
    } } },
      W.field("Virtual host", form.vhost), W.field("Name", form.name), W.field("Durability", form.durable),
      W.field("Auto delete", form.autoDelete, "Deleted when its last consumer goes"),
      W.field("Arguments", form.args.el), h("div.actions", submit));
    const page = {
      el: h("div", pageHead("Queues"),
        h("section.panel", h("div.panel-head", h("h2", "All queues"), count.el, h("span.spacer"), h("div.filter-bar", vf.el, searchBox(table))),
          h("div.panel-body.flush", table.el)),
        h("details.panel", { id: "add-queue", open: true }, h("summary", "Add a new queue"), h("div.panel-body", addForm))),
      async refresh() {
        const vhosts = await vhostNames();
        vf.fill(vhosts);
        table.update(await api("GET", vf.value ? `queues/${enc(vf.value)}` : "queues"));
      },
    };
    return page;
  };

  /* ====================== Queue detail ====================== */
  pages.queue = function (vhost, name) {
    const qpath = `queues/${enc(vhost)}/${enc(name)}`;
    const cards = h("div.stats");
    const info = h("div");
    const bindings = bindingsTable("queue-bindings", vhost, "queue", () => page.refresh());
    const bind = bindForm(vhost, { queue: name }, () => page.refresh());
    const consumers = W.dataTable("queue-consumers", [
      { key: "channel", label: "Channel", value: (c) => c.channel_details.name,
        render: (c) => channelLink(c.channel_details.name) },
      { key: "consumer_tag", label: "Consumer tag", render: (c) => h("span.mono", c.consumer_tag) },
      { key: "ack_required", label: "Ack required" },
      { key: "exclusive", label: "Exclusive" },
      { key: "prefetch_count", label: "Prefetch count", num: true },
      { key: "priority", label: "Priority", num: true, value: (c) => (c.arguments || {})["x-priority"] },
      { key: "activity_status", label: "Activity status", render: (c) => h("span.tag" + (c.active ? ".ok" : ""), { "data-activity": c.activity_status }, activityLabel(c.activity_status)) },
      { key: "arguments", label: "Arguments", sortable: false, render: (c) => Object.keys(c.arguments || {}).length ? h("span.mono", JSON.stringify(c.arguments)) : "" },
    ], { sortKey: "consumer_tag", empty: "No consumers.", rowKey: (c) => c.consumer_tag });

    // get messages
    const ackmode = W.select({ id: "get-ackmode", name: "ackmode" }, [
      ["ack_requeue_true", "Nack message requeue true"], ["reject_requeue_true", "Reject requeue true"],
      ["ack_requeue_false", "Automatic ack"], ["reject_requeue_false", "Reject requeue false"]], "ack_requeue_true");
    const getEncoding = W.select({ id: "get-encoding", name: "encoding" }, [["auto", "Auto string / base64"], ["base64", "base64"]], "auto");
    const getCount = h("input", { id: "get-count", name: "count", type: "number", min: 1, value: 1, style: "width:90px" });
    const getSubmit = h("button.btn.btn-primary", { type: "submit", id: "get-submit" }, "Get message(s)");
    const getOut = h("div.messages", { id: "get-result" });
    const getForm = h("form.inline-form", { id: "get-form", on: { submit: async (e) => {
      e.preventDefault();
      const msgs = await act(getSubmit, () => api("POST", `${qpath}/get`, { count: Number(getCount.value || 1), ackmode: ackmode.value, encoding: getEncoding.value, truncate: 50000 }), null, "Get messages");
      if (msgs === undefined) return;
      replace(getOut, msgs.length ? msgs.map((m, i) => messageCard(m, `Message ${i + 1}`)) : h("div.banner.banner-info", "Queue is empty."));
      await page.refresh();
    } } },
      h("label", "Ack mode", ackmode), h("label", "Encoding", getEncoding), h("label", "Messages", getCount), getSubmit);

    // peek
    const peekOffset = h("input", { id: "peek-offset", name: "offset", type: "number", min: 0, value: 0, style: "width:90px" });
    const peekCount = h("input", { id: "peek-count", name: "count", type: "number", min: 1, value: 10, style: "width:90px" });
    const peekSubmit = h("button.btn.btn-primary", { type: "submit", id: "peek-submit" }, "Peek");
    const peekOut = h("div.messages", { id: "peek-result" });
    const peekForm = h("form.inline-form", { id: "peek-form", on: { submit: async (e) => {
      e.preventDefault();
      const msgs = await act(peekSubmit, () => api("GET", `${qpath}/peek?offset=${Number(peekOffset.value || 0)}&count=${Number(peekCount.value || 10)}`), null, "Peek");
      if (msgs === undefined) return;
      replace(peekOut, msgs.length ? msgs.map((m) => messageCard(m, `#${m.position}`)) : h("div.banner.banner-info", "No ready messages at that offset."));
    } } },
      h("label", "Offset", peekOffset), h("label", "Count", peekCount), peekSubmit,
      h("span.muted", { style: "font-size:12px;align-self:center" }, "Shows ready messages without taking them; nothing is redelivered."));

    // move
    const listId = "move-suggest";
    const moveDatalist = h("datalist", { id: listId });
    const moveDest = h("input", { id: "move-destination", name: "destination", list: listId, placeholder: "queue in " + vhost, required: true });
    const moveCount = h("input", { id: "move-count", name: "count", type: "number", min: 1, placeholder: "all", style: "width:90px" });
    const moveSubmit = h("button.btn.btn-primary", { type: "submit", id: "move-submit" }, "Move messages");
    const moveForm = h("form.inline-form", { id: "move-form", on: { submit: async (e) => {
      e.preventDefault();
      const body = { destination: moveDest.value.trim() };
      if (moveCount.value) body.count = Number(moveCount.value);
      const res = await act(moveSubmit, async () => {
        if (!body.destination) throw new W.InputError("Destination queue is required");
        return api("POST", `${qpath}/move`, body);
      }, (r) => `Moved ${fmtNum(r.moved)} message${r.moved === 1 ? "" : "s"} to ${r.destination}.`, "Move");
      if (res) await page.refresh();
    } } },
      h("label", "Destination queue", moveDest), h("label", "Count", moveCount), moveSubmit, moveDatalist);

    const purge = h("button.btn.btn-danger", { type: "button", id: "queue-purge", on: { click: async () => {
      if (!await W.confirmDialog("Purge queue", ["Remove every ready message from ", h("b", name), "? This cannot be undone."], "Purge")) return;
      await act(purge, async () => { await api("DELETE", `${qpath}/contents`); await page.refresh(); }, `Queue ${name} purged.`, "Purge");
    } } }, "Purge messages");
    const ifUnused = h("input", { type: "checkbox", id: "delete-if-unused" });
    const ifEmpty = h("input", { type: "checkbox", id: "delete-if-empty" });
    const del = h("button.btn.btn-danger", { type: "button", id: "queue-delete", on: { click: async () => {
      if (!await W.confirmDialog("Delete queue", ["Delete queue ", h("b", name), ` in ${vhost} and every message in it?`], "Delete")) return;
      const q = [ifUnused.checked ? "if-unused=true" : "", ifEmpty.checked ? "if-empty=true" : ""].filter(Boolean).join("&");
      const ok = await act(del, async () => { await api("DELETE", qpath + (q ? "?" + q : "")); return true; }, null, "Delete queue");
      if (ok) W.navigate("#/queues", `Queue ${name} deleted.`);
    } } }, "Delete queue");

    const page = {
      el: h("div",
        pageHead(h("span", h("span.muted", "Queue "), name), h("span.crumbs", "in virtual host ", h("b", vhost)), h("span.spacer"), h("a", { href: "#/queues" }, "← All queues")),
        cards,
        h("div.grid-2",
          h("section.panel", h("div.panel-head", h("h2", "Details")), h("div.panel-body", info)),
          h("section.panel", h("div.panel-head", h("h2", "Bindings")), h("div.panel-body.flush", bindings.el),
            h("div.panel-body", { style: "border-top:1px solid var(--border)" }, h("h3", { style: "margin-bottom:10px" }, "Add binding to this queue"), bind.el))),
        h("section.panel", { id: "consumers" }, h("div.panel-head", h("h2", "Consumers")), h("div.panel-body.flush", consumers.el)),
        h("section.panel", { id: "get-messages" }, h("div.panel-head", h("h2", "Get messages")), h("div.panel-body", getForm, getOut)),
        h("section.panel", { id: "peek-messages" }, h("div.panel-head", h("h2", "Peek"), h("span.tag.accent", "Warren")), h("div.panel-body", peekForm, peekOut)),
        h("section.panel", { id: "move-messages" }, h("div.panel-head", h("h2", "Move messages"), h("span.tag.accent", "Warren")), h("div.panel-body", moveForm)),
        h("section.panel", { id: "publish" }, h("div.panel-head", h("h2", "Publish message"), h("span.spacer"), h("span.muted", "through the default exchange")),
          h("div.panel-body", publishForm(vhost, "", name))),
        h("section.panel", h("div.panel-head", h("h2", "Purge and delete")), h("div.panel-body.danger-zone", purge, del,
          h("label.muted", ifUnused, " only if unused"), h("label.muted", ifEmpty, " only if empty")))),
      async refresh() {
        const q = await api("GET", qpath);
        const stat = (label, value, key) => h("div.stat", { "data-stat": key }, h("div.label", label), h("div.value", value));
        replace(cards,
          stat("Ready", fmtNum(q.messages_ready), "messages_ready"), stat("Unacked", fmtNum(q.messages_unacknowledged), "messages_unacknowledged"),
          stat("Total", fmtNum(q.messages), "messages"), stat("Consumers", fmtNum(q.consumers), "consumers"),
          stat("Ready bytes", fmtBytes(q.message_bytes_ready || 0), "message_bytes_ready"),
          stat("Incoming", fmtRate(rate(q, "publish")) || "0.0/s", "publish_rate"), stat("Deliver / get", fmtRate(rate(q, "deliver_get")) || "0.0/s", "deliver_rate"));
        replace(info, W.kvTable([
          ["Type", q.type], ["State", h("span.tag" + (q.state === "running" ? ".ok" : ".warn"), q.state)],
          ["Features", W.featureTags(q).length ? W.featureTags(q) : h("span.muted", "none")],
          ["Arguments", Object.keys(q.arguments || {}).length ? h("span.mono", JSON.stringify(q.arguments)) : h("span.muted", "none")],
          ["Node", h("span.mono", q.node || "")],
          q.type === "quorum" ? ["Leader", h("span.mono", { id: "queue-leader" }, q.leader || "")] : null,
          q.members ? ["Members", h("span", { id: "queue-members" }, q.members.map((m) =>
            h("span.tag" + ((q.online || []).includes(m) ? ".ok" : ".warn"), { "data-member": m }, m)))] : null,
          q.owner_pid_details ? ["Exclusive owner", h("span.mono", q.owner_pid_details.name)] : null,
          q.exclusive_consumer_tag ? ["Exclusive consumer", h("span.mono", q.exclusive_consumer_tag)] : null,
          q.single_active_consumer_tag ? ["Single active consumer", h("span.mono", q.single_active_consumer_tag)] : null,
          ...policyRows(q),
        ]));
        consumers.update(q.consumer_details || []);
        bindings.update(await api("GET", `${qpath}/bindings`));
        await bind.suggest();
        const queues = await api("GET", `queues/${enc(vhost)}?columns=name`);
        replace(moveDatalist, queues.filter((x) => x.name !== name).map((x) => h("option", { value: x.name })));
      },
    };
    return page;
  };

  function activityLabel(status) {
    return { up: "up", single_active: "single active", waiting: "waiting" }[status] || status || "";
  }

  W.messageCard = messageCard;
  W.vhostFilter = vhostFilter;
  W.vhostSelect = vhostSelect;
  W.pageHead = pageHead;
  W.countLabel = countLabel;
  W.searchBox = searchBox;
  W.vhostNames = vhostNames;
})(window.W);

/* Admin: users, virtual hosts, permissions, policies, limits, definitions export/import, shovel and federation status. */
"use strict";
(function (W) {
  const { h, api, act, replace, fmtNum, enc } = W;
  const TAGS = ["administrator", "monitoring", "policymaker", "management", "impersonator"];
  // [key, label, who may open it]: as in RabbitMQ, policymakers see the Admin tab with Policies only.
  const admin = () => W.isAdmin();
  const SECTIONS = [["users", "Users", admin], ["vhosts", "Virtual hosts", admin], ["permissions", "Permissions", admin],
    ["policies", "Policies", () => W.isPolicymaker()], ["limits", "Limits", admin], ["definitions", "Definitions", admin],
    ["shovels", "Shovel Status", () => W.isMonitor()], ["federation", "Federation Status", () => W.isMonitor()]];

  W.pages.admin = function (section = "users") {
    const allowed = SECTIONS.filter(([, , may]) => may());
    if (!allowed.length) {
      return { el: h("div", W.pageHead("Admin"), h("div.panel", h("div.empty",
        "Users, virtual hosts, permissions and definitions are for users tagged administrator; policies for policymakers too."))) };
    }
    if (!allowed.some(([k]) => k === section)) section = allowed[0][0];
    const sub = h("nav.subtabs", allowed.map(([key, label]) => h("a", { href: `#/admin/${key}`, class: key === section ? "active" : null, "data-subtab": key }, label)));
    const inner = sections[section]();
    return {
      el: h("div", W.pageHead("Admin"), sub, inner.el),
      refresh: inner.refresh,
    };
  };

  const sections = {};

  /* ---------- users ---------- */
  sections.users = function () {
    const count = W.countLabel();
    const table = W.dataTable("users", [
      { key: "name", label: "Name", render: (u) => h("b", u.name) },
      { key: "tags", label: "Tags", value: (u) => (u.tags || []).join(","), render: (u) => (u.tags || []).length ? u.tags.map((t) => h("span.tag" + (t === "administrator" ? ".accent" : ""), t)) : h("span.muted", "no access to the management UI") },
      { key: "password", label: "Password", value: (u) => (u.password_hash ? 1 : 0), render: (u) => (u.password_hash ? "●●●●●●" : h("span.muted", "none")) },
      { key: "vhosts", label: "Can access", value: (u) => (perms[u.name] || []).join(","), render: (u) => (perms[u.name] || []).length ? perms[u.name].map((v) => h("span.tag", v)) : h("span.muted", "no virtual hosts") },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (u) => [
        h("button.btn.btn-sm", { type: "button", "data-action": "edit-user", on: { click: () => edit(u) } }, "Edit"),
        h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "delete-user", disabled: u.name === W.auth.user(), title: u.name === W.auth.user() ? "You are logged in as this user" : null, on: { click: (e) => remove(e.target, u) } }, "Delete")] },
    ], { empty: "No users.", rowKey: (u) => u.name, onRender: (s, t) => count.set(s, t) });
    let perms = {};
    async function remove(button, u) {
      if (!await W.confirmDialog("Delete user", ["Delete user ", h("b", u.name), "? Their connections stay open until they close."], "Delete")) return;
      await act(button, async () => { await api("DELETE", `users/${enc(u.name)}`); await refresh(); }, `User ${u.name} deleted.`, "Delete user");
    }
    const name = h("input", { id: "user-name", name: "username", required: true, autocomplete: "off" });
    const password = h("input", { id: "user-password", name: "password", type: "password", autocomplete: "new-password" });
    // As RabbitMQ's user forms: a password, or none (the user cannot log in with one); an update sets it afresh.
    const passwordMode = W.select({ id: "user-password-mode", name: "has-password", on: { change: () => { password.hidden = passwordMode.value !== "password"; } } },
      [["password", "Password"], ["none", "No password"]], "password");
    const tags = h("input", { id: "user-tags", name: "tags", placeholder: "comma-separated, e.g. management" });
    const quick = h("div.quick-add", h("span.muted.hint-group", "Set"), TAGS.map((t) => h("button", { type: "button", on: { click: () => {
      const cur = tags.value.split(",").map((s) => s.trim()).filter(Boolean);
      if (!cur.includes(t)) cur.push(t);
      tags.value = cur.join(", ");
    } } }, t)));
    const grant = h("input", { type: "checkbox", id: "user-grant", checked: true });
    const submit = h("button.btn.btn-primary", { type: "submit", id: "user-add" }, "Add / update user");
    const form = h("form.form", { id: "user-form", on: { submit: async (e) => {
      e.preventDefault();
      const user = name.value.trim();
      const existed = table.rows.some((u) => u.name === user);
      const ok = await act(submit, async () => {
        if (!user) throw new W.InputError("User name is required");
        if (passwordMode.value === "password" && !password.value) throw new W.InputError("Please specify a password.");
        const body = { tags: tags.value.split(",").map((s) => s.trim()).filter(Boolean).join(",") };
        if (passwordMode.value === "password") body.password = password.value; else body.password_hash = "";
        await api("PUT", `users/${enc(user)}`, body);
        if (grant.checked) await api("PUT", `permissions/%2F/${enc(user)}`, { configure: ".*", write: ".*", read: ".*" });
        return true;
      }, `User ${user} ${existed ? "updated" : "added"}.`, existed ? "Update user" : "Add user");
      if (ok) { name.value = ""; password.value = ""; tags.value = ""; grant.checked = true; await refresh(); }
    } } },
      W.field("Username", name), W.field("Password", h("div", passwordMode, " ", password), "With no password, the user cannot log in with one"),
      W.field("Tags", h("div", tags, quick)), W.field("Permissions", h("label", grant, " Grant full permissions on the default virtual host \"/\"")),
      h("div.actions", submit));
    const details = h("details.panel", { id: "add-user", open: true }, h("summary", "Add / update a user"), h("div.panel-body", form));
    // Into the form: its name and tags; a password to type again, or none as now; its permissions left as they are.
    function edit(u) {
      name.value = u.name;
      tags.value = (u.tags || []).join(", ");
      passwordMode.value = u.password_hash ? "password" : "none";
      password.value = "";
      password.hidden = !u.password_hash;
      grant.checked = false;
      details.open = true;
      details.scrollIntoView({ block: "start" });
      (u.password_hash ? password : tags).focus();
    }
    async function refresh() {
      const [users, permissions] = await Promise.all([api("GET", "users"), api("GET", "permissions")]);
      perms = {};
      for (const p of permissions) (perms[p.user] = perms[p.user] || []).push(p.vhost);
      table.update(users);
    }
    return {
      el: h("div",
        h("section.panel", h("div.panel-head", h("h2", "Users"), count.el, h("span.spacer"), h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
        details),
      refresh,
    };
  };

  /* ---------- vhosts ---------- */
  sections.vhosts = function () {
    const count = W.countLabel();
    const table = W.dataTable("vhosts", [
      { key: "name", label: "Name", render: (v) => h("b", v.name) },
      { key: "messages_ready", label: "Ready", num: true },
      { key: "messages_unacknowledged", label: "Unacked", num: true },
      { key: "messages", label: "Total", num: true },
      { key: "publish", label: "Publish", num: true, value: (v) => W.rate(v, "publish"), render: (v) => W.fmtRate(W.rate(v, "publish")) },
      { key: "deliver", label: "Deliver / get", num: true, value: (v) => W.rate(v, "deliver_get"), render: (v) => W.fmtRate(W.rate(v, "deliver_get")) },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (v) => h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "delete-vhost", on: { click: (e) => remove(e.target, v) } }, "Delete") },
    ], { empty: "No virtual hosts.", onRender: (s, t) => count.set(s, t) });
    async function remove(button, v) {
      if (!await W.confirmDialog("Delete virtual host", ["Delete virtual host ", h("b", v.name), " with all its exchanges, queues and messages? Its connections are closed."], "Delete")) return;
      await act(button, async () => { await api("DELETE", `vhosts/${enc(v.name)}`); await refresh(); }, `Virtual host ${v.name} deleted.`, "Delete virtual host");
    }
    const name = h("input", { id: "vhost-name", name: "name", required: true, autocomplete: "off" });
    const submit = h("button.btn.btn-primary", { type: "submit", id: "vhost-add" }, "Add virtual host");
    const form = h("form.form", { id: "vhost-form", on: { submit: async (e) => {
      e.preventDefault();
      const v = name.value.trim();
      const ok = await act(submit, async () => {
        if (!v) throw new W.InputError("Name is required");
        await api("PUT", `vhosts/${enc(v)}`, {});
        return true;
      }, `Virtual host ${v} added.`, "Add virtual host");
      if (ok) { name.value = ""; await refresh(); }
    } } }, W.field("Name", name), h("div.actions", submit));
    async function refresh() { table.update(await W.vhostNames().then(() => api("GET", "vhosts"))); }
    return {
      el: h("div",
        h("section.panel", h("div.panel-head", h("h2", "Virtual hosts"), count.el), h("div.panel-body.flush", table.el)),
        h("details.panel", { id: "add-vhost", open: true }, h("summary", "Add a virtual host"), h("div.panel-body", form))),
      refresh,
    };
  };

  /* ---------- permissions ---------- */
  sections.permissions = function () {
    const count = W.countLabel();
    const table = W.dataTable("permissions", [
      { key: "user", label: "User", render: (p) => h("b", p.user) },
      { key: "vhost", label: "Virtual host" },
      { key: "configure", label: "Configure", render: (p) => h("span.mono", p.configure) },
      { key: "write", label: "Write", render: (p) => h("span.mono", p.write) },
      { key: "read", label: "Read", render: (p) => h("span.mono", p.read) },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (p) => h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "clear-permissions", on: { click: (e) => clearPerm(e.target, p) } }, "Clear") },
    ], { empty: "No permissions set.", filterFields: ["user", "vhost"], onRender: (s, t) => count.set(s, t) });
    async function clearPerm(button, p) {
      await act(button, async () => { await api("DELETE", `permissions/${enc(p.vhost)}/${enc(p.user)}`); await refresh(); },
        `Permissions of ${p.user} on ${p.vhost} cleared.`, "Clear permissions");
    }
    const user = h("select", { id: "perm-user", name: "user" });
    const vhost = h("select", { id: "perm-vhost", name: "vhost" });
    const configure = h("input", { id: "perm-configure", value: ".*" });
    const write = h("input", { id: "perm-write", value: ".*" });
    const read = h("input", { id: "perm-read", value: ".*" });
    const submit = h("button.btn.btn-primary", { type: "submit", id: "perm-set" }, "Set permission");
    const form = h("form.form", { id: "perm-form", on: { submit: async (e) => {
      e.preventDefault();
      const ok = await act(submit, async () => {
        await api("PUT", `permissions/${enc(vhost.value)}/${enc(user.value)}`, { configure: configure.value, write: write.value, read: read.value });
        return true;
      }, `Permissions of ${user.value} on ${vhost.value} set.`, "Set permission");
      if (ok) await refresh();
    } } },
      W.field("User", user), W.field("Virtual host", vhost),
      W.field("Configure regexp", configure), W.field("Write regexp", write), W.field("Read regexp", read),
      h("div.actions", submit));

    // Topic permissions (RabbitMQ's user page): routing key patterns per topic exchange.
    const topicCount = W.countLabel();
    const topicTable = W.dataTable("topic-permissions", [
      { key: "user", label: "User", render: (p) => h("b", p.user) },
      { key: "vhost", label: "Virtual host" },
      { key: "exchange", label: "Exchange" },
      { key: "write", label: "Write", render: (p) => h("span.mono", p.write) },
      { key: "read", label: "Read", render: (p) => h("span.mono", p.read) },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (p) => h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "clear-topic-permission", on: { click: (e) => clearTopic(e.target, p) } }, "Clear") },
    ], { empty: "No topic permissions set.", filterFields: ["user", "vhost", "exchange"], onRender: (s, t) => topicCount.set(s, t) });
    async function clearTopic(button, p) {
      await act(button, async () => { await api("DELETE", `topic-permissions/${enc(p.vhost)}/${enc(p.user)}/${enc(p.exchange)}`); await refresh(); },
        `Topic permission of ${p.user} on ${p.exchange} in ${p.vhost} cleared.`, "Clear topic permission");
    }
    const topicUser = h("select", { id: "topic-user", name: "user" });
    const topicVhost = h("select", { id: "topic-vhost", name: "vhost" });
    const topicExchange = h("input", { id: "topic-exchange", name: "exchange", value: "amq.topic", required: true });
    const topicWrite = h("input", { id: "topic-write", value: ".*" });
    const topicRead = h("input", { id: "topic-read", value: ".*" });
    const topicSubmit = h("button.btn.btn-primary", { type: "submit", id: "topic-set" }, "Set topic permission");
    const topicForm = h("form.form", { id: "topic-form", on: { submit: async (e) => {
      e.preventDefault();
      const ok = await act(topicSubmit, async () => {
        await api("PUT", `topic-permissions/${enc(topicVhost.value)}/${enc(topicUser.value)}`,
          { exchange: topicExchange.value, write: topicWrite.value, read: topicRead.value });
        return true;
      }, `Topic permission of ${topicUser.value} on ${topicExchange.value} in ${topicVhost.value} set.`, "Set topic permission");
      if (ok) await refresh();
    } } },
      W.field("User", topicUser), W.field("Virtual host", topicVhost), W.field("Exchange", topicExchange, "A topic exchange"),
      W.field("Write regexp", topicWrite, "Routing keys the user may publish with"),
      W.field("Read regexp", topicRead, "Routing keys the user may bind with"), h("div.actions", topicSubmit));
    function fill(sel, names) {
      const cur = sel.value;
      replace(sel, names.map((n) => h("option", { value: n }, n)));
      if (names.includes(cur)) sel.value = cur;
    }
    async function refresh() {
      const [permissions, topic, users, vhosts] = await Promise.all([api("GET", "permissions"), api("GET", "topic-permissions"),
        api("GET", "users"), W.vhostNames()]);
      for (const sel of [user, topicUser]) fill(sel, users.map((u) => u.name));
      for (const sel of [vhost, topicVhost]) fill(sel, vhosts.map((v) => v.name));
      table.update(permissions);
      topicTable.update(topic);
    }
    return {
      el: h("div",
        h("section.panel", h("div.panel-head", h("h2", "Permissions"), count.el, h("span.spacer"), h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
        h("details.panel", { id: "set-permission", open: true }, h("summary", "Set permission"), h("div.panel-body", form)),
        h("section.panel", { id: "topic-permissions" }, h("div.panel-head", h("h2", "Topic permissions"), topicCount.el, h("span.spacer"),
          h("div.filter-bar", W.searchBox(topicTable))), h("div.panel-body.flush", topicTable.el)),
        h("details.panel", { id: "set-topic-permission", open: true }, h("summary", "Set topic permission"), h("div.panel-body", topicForm))),
      refresh,
    };
  };

  /* ---------- policies ---------- */
  const APPLY_TO = [["all", "Exchanges and queues"], ["exchanges", "Exchanges"], ["queues", "Queues [All types]"],
    ["classic_queues", "Classic queues"], ["quorum_queues", "Quorum queues"], ["streams", "Streams"]];
  const { OVERFLOW_MODES, LEADER_LOCATORS } = W;
  // The definition keys RabbitMQ's policy form offers, typed as its validators want them.
  const POLICY_HINTS = ["Queues",
    ["Max length", "max-length", "number"], ["Max length bytes", "max-length-bytes", "number"],
    ["Overflow behaviour", "overflow", "string", OVERFLOW_MODES], ["Auto expire", "expires", "number"],
    ["Message TTL", "message-ttl", "number"], ["Dead letter exchange", "dead-letter-exchange", "string"],
    ["Dead letter routing key", "dead-letter-routing-key", "string"],
    ["Leader locator", "queue-leader-locator", "string", LEADER_LOCATORS],
    "Exchanges", ["Alternate exchange", "alternate-exchange", "string"]];
  const OPERATOR_HINTS = [
    ["Max length", "max-length", "number"], ["Max length bytes", "max-length-bytes", "number"],
    ["Message TTL", "message-ttl", "number"], ["Auto expire", "expires", "number"],
    ["Delivery limit", "delivery-limit", "number"], ["Max in memory length", "max-in-memory-length", "number"],
    ["Max in memory bytes", "max-in-memory-bytes", "number"]];
  const POLICY_KINDS = [
    { path: "policies", id: "policy", what: "Policy", title: "User policies", applyTo: APPLY_TO, hints: POLICY_HINTS },
    { path: "operator-policies", id: "operator-policy", what: "Operator policy", title: "Operator policies",
      applyTo: APPLY_TO.slice(2), hints: OPERATOR_HINTS, admin: true },
  ];

  function definitionTags(def) {
    return h("span.policy-def", Object.entries(def || {}).map(([k, v]) => h("span.tag", `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`)));
  }

  // The definition as key/value rows or as raw JSON; switching carries what was typed across.
  function definitionEditor(id, hints) {
    const rows = W.kvEditor("Definition", hints);
    const json = h("textarea", { id: `${id}-definition-json`, rows: 5, placeholder: '{"max-length": 1000}', hidden: true });
    const mode = (value) => h("input", { type: "radio", name: `${id}-definition-mode`, value, id: `${id}-mode-${value}`,
      checked: value === "rows", on: { change: () => switchTo(value) } });
    const modes = h("div.def-mode", h("label", mode("rows"), "Key / value"), h("label", mode("json"), "JSON"));
    const isJson = () => !json.hidden;
    function parsed() {
      let def;
      try { def = JSON.parse(json.value || "{}"); } catch (e) { throw new W.InputError(`Definition is not valid JSON: ${e.message}`); }
      if (!def || typeof def !== "object" || Array.isArray(def)) throw new W.InputError("Definition must be a JSON object");
      return def;
    }
    function switchTo(value) {
      try {
        if (value === "json" && !isJson()) json.value = JSON.stringify(rows.value(), null, 2);
        if (value === "rows" && isJson()) rows.set(parsed());
      } catch (err) {
        W.showError(err, "Definition");
        modes.querySelector(`input[value=${isJson() ? "json" : "rows"}]`).checked = true;
        return;
      }
      json.hidden = value !== "json";
      rows.el.hidden = value === "json";
    }
    return {
      el: h("div", modes, rows.el, json),
      value: () => (isJson() ? parsed() : rows.value()),
      set(def) { switchTo("rows"); rows.set(def); json.value = ""; },
    };
  }

  function policyKind(kind) {
    const { path, id, what } = kind;
    const count = W.countLabel();
    const vf = W.vhostFilter(() => refresh());
    const table = W.dataTable(path, [
      { key: "vhost", label: "Virtual host" },
      { key: "name", label: "Name", render: (p) => h("b", p.name) },
      { key: "pattern", label: "Pattern", render: (p) => h("span.mono", p.pattern) },
      { key: "apply-to", label: "Apply to" },
      { key: "definition", label: "Definition", sortable: false, render: (p) => definitionTags(p.definition) },
      { key: "priority", label: "Priority", num: true },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (p) => [
        h("button.btn.btn-sm", { type: "button", "data-action": `edit-${id}`, on: { click: () => edit(p) } }, "Edit"),
        h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": `delete-${id}`, on: { click: (e) => remove(e.target, p) } }, "Delete")] },
    ], { sortKey: "priority", sortDir: -1, empty: `No ${kind.title.toLowerCase()}.`, filterFields: ["name", "pattern"],
      rowKey: (p) => `${p.vhost}/${p.name}`, onRender: (s, t) => count.set(s, t) });
    async function remove(button, p) {
      if (!await W.confirmDialog(`Delete ${what.toLowerCase()}`, [`Delete ${what.toLowerCase()} `, h("b", p.name), ` in ${p.vhost}? What it set falls back to the next matching policy or the arguments.`], "Delete")) return;
      await act(button, async () => { await api("DELETE", `${path}/${enc(p.vhost)}/${enc(p.name)}`); await refresh(); },
        `${what} ${p.name} deleted.`, `Delete ${what.toLowerCase()}`);
    }
    const vhost = W.vhostSelect({ id: `${id}-vhost`, name: "vhost" });
    const name = h("input", { id: `${id}-name`, name: "name", required: true, autocomplete: "off" });
    const pattern = h("input", { id: `${id}-pattern`, name: "pattern", required: true, placeholder: "regular expression, e.g. ^orders\\." });
    const applyTo = W.select({ id: `${id}-apply-to`, name: "apply-to" }, kind.applyTo, kind.applyTo[0][0]);
    const priority = h("input", { id: `${id}-priority`, name: "priority", type: "number", value: 0, style: "max-width:120px" });
    const definition = definitionEditor(id, kind.hints);
    const submit = h("button.btn.btn-primary", { type: "submit", id: `${id}-add` }, `Add / update ${what.toLowerCase()}`);
    const form = h("form.form", { id: `${id}-form`, on: { submit: async (e) => {
      e.preventDefault();
      const n = name.value.trim();
      const v = vhost.value;
      const ok = await act(submit, async () => {
        if (!n) throw new W.InputError("Name is required");
        await api("PUT", `${path}/${enc(v)}/${enc(n)}`, {
          pattern: pattern.value, "apply-to": applyTo.value, priority: Number(priority.value || 0), definition: definition.value() });
        return true;
      }, `${what} ${n} set in ${v}.`, `Set ${what.toLowerCase()}`);
      if (ok) { name.value = ""; pattern.value = ""; priority.value = 0; definition.set({}); await refresh(); }
    } } },
      W.field("Virtual host", vhost), W.field("Name", name), W.field("Pattern", pattern, "Matched anywhere in queue and exchange names"),
      W.field("Apply to", applyTo), W.field("Priority", priority, "Of the policies matching an object, the highest priority applies"),
      W.field("Definition", definition.el), h("div.actions", submit));
    const details = h("details.panel", { id: `add-${id}`, open: true }, h("summary", `Add / update ${what.toLowerCase()}`), h("div.panel-body", form));
    function edit(p) {
      vhost.value = p.vhost;
      name.value = p.name;
      pattern.value = p.pattern;
      applyTo.value = p["apply-to"];
      priority.value = p.priority;
      definition.set(p.definition);
      details.open = true;
      details.scrollIntoView({ block: "start" });
      pattern.focus();
    }
    async function refresh(vhosts) {
      vf.fill(vhosts || await W.vhostNames());
      table.update(await api("GET", vf.value ? `${path}/${enc(vf.value)}` : path));
    }
    return {
      el: h("div",
        h("section.panel", { id: path }, h("div.panel-head", h("h2", kind.title), count.el, h("span.spacer"),
          h("div.filter-bar", vf.el, W.searchBox(table))), h("div.panel-body.flush", table.el)),
        details),
      refresh,
    };
  }

  sections.policies = function () {
    const kinds = POLICY_KINDS.filter((k) => !k.admin || W.isAdmin()).map(policyKind);
    return {
      el: h("div", kinds.map((k) => k.el)),
      async refresh() {
        const vhosts = await W.vhostNames();
        await Promise.all(kinds.map((k) => k.refresh(vhosts)));
      },
    };
  };

  /* ---------- limits (RabbitMQ's Admin > Limits: per virtual host and per user) ---------- */
  const LIMIT_KINDS = [
    { path: "vhost-limits", id: "vhost-limit", owner: "vhost", ownerLabel: "Virtual host", title: "Virtual host limits",
      names: ["max-connections", "max-queues"], owners: async () => (await W.vhostNames()).map((v) => v.name) },
    { path: "user-limits", id: "user-limit", owner: "user", ownerLabel: "User", title: "User limits",
      names: ["max-connections", "max-channels"], owners: async () => (await api("GET", "users")).map((u) => u.name) },
  ];

  function limitKind(kind) {
    const { path, id, owner, ownerLabel } = kind;
    const count = W.countLabel();
    const table = W.dataTable(path, [
      { key: owner, label: ownerLabel, render: (l) => h("b", l[owner]) },
      { key: "name", label: "Limit" },
      { key: "value", label: "Value", num: true },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (l) => h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": `clear-${id}`, on: { click: (e) => clearLimit(e.target, l) } }, "Clear") },
    ], { empty: `No ${kind.title.toLowerCase()}.`, filterFields: [owner], rowKey: (l) => `${l[owner]}/${l.name}`, onRender: (s, t) => count.set(s, t) });
    async function clearLimit(button, l) {
      if (!await W.confirmDialog("Clear limit", [`Clear ${l.name} of `, h("b", l[owner]), "?"], "Clear")) return;
      await act(button, async () => { await api("DELETE", `${path}/${enc(l[owner])}/${enc(l.name)}`); await refresh(); },
        `Limit ${l.name} of ${l[owner]} cleared.`, "Clear limit");
    }
    const who = h("select", { id: `${id}-${owner}`, name: owner });
    const name = W.select({ id: `${id}-name`, name: "name" }, kind.names, kind.names[0]);
    const value = h("input", { id: `${id}-value`, name: "value", required: true, style: "max-width:160px" });
    const submit = h("button.btn.btn-primary", { type: "submit", id: `${id}-set` }, "Set / update limit");
    const form = h("form.form", { id: `${id}-form`, on: { submit: async (e) => {
      e.preventDefault();
      const target = who.value;
      const ok = await act(submit, async () => {
        const n = parseInt(value.value, 10);  // as RabbitMQ's form reads it
        if (isNaN(n)) throw new W.InputError(`${name.value} should be a number, actually was "${value.value}"`);
        await api("PUT", `${path}/${enc(target)}/${enc(name.value)}`, { value: n });
        return true;
      }, `Limit ${name.value} of ${target} set.`, "Set limit");
      if (ok) { value.value = ""; await refresh(); }
    } } }, W.field(ownerLabel, who), W.field("Limit", name), W.field("Value", value, "A negative value means no limit"),
      h("div.actions", submit));
    async function refresh() {
      const [limits, owners] = await Promise.all([api("GET", path), kind.owners()]);
      const cur = who.value;
      replace(who, owners.map((o) => h("option", { value: o }, o)));
      if (owners.includes(cur)) who.value = cur;
      table.update(limits.flatMap((l) => Object.entries(l.value).map(([k, v]) => ({ [owner]: l[owner], name: k, value: v }))));
    }
    return {
      el: h("div",
        h("section.panel", { id: path }, h("div.panel-head", h("h2", kind.title), count.el, h("span.spacer"),
          h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
        h("details.panel", { id: `set-${id}`, open: true }, h("summary", `Set / update a ${kind.title.toLowerCase().replace(/s$/, "")}`),
          h("div.panel-body", form))),
      refresh,
    };
  }

  sections.limits = function () {
    const kinds = LIMIT_KINDS.map(limitKind);
    return { el: h("div", kinds.map((k) => k.el)), refresh: () => Promise.all(kinds.map((k) => k.refresh())) };
  };

  /* ---------- shovel status (RabbitMQ's rabbitmq_shovel_management page) ---------- */
  sections.shovels = function () {
    const count = W.countLabel();
    const endpoint = (s, side) => [s[`${side}_uri`] || "", h("br"), h("span.muted",
      s[`${side}_queue`] !== undefined ? `queue ${s[`${side}_queue`]}` : s[`${side}_exchange`] !== undefined
        ? `exchange ${s[`${side}_exchange`]}${s[`${side}_exchange_key`] ? ` (${s[`${side}_exchange_key`]})` : ""}` : "")];
    const table = W.dataTable("shovels", [
      { key: "name", label: "Name", render: (s) => h("b", s.name) },
      { key: "vhost", label: "Virtual host" },
      { key: "state", label: "State", render: (s) => h("span.tag" + (s.state === "running" ? ".ok" : ".warn"), { "data-shovel-state": s.state }, s.state) },
      { key: "src_uri", label: "Source", render: (s) => endpoint(s, "src") },
      { key: "dest_uri", label: "Destination", render: (s) => endpoint(s, "dest") },
      { key: "node", label: "Node" },
      { key: "timestamp", label: "Last changed" },
      { key: "reason", label: "Reason", render: (s) => s.reason ? h("code", s.reason) : "" },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (s) => h("button.btn.btn-sm", { type: "button", "data-action": "restart-shovel",
        on: { click: (e) => act(e.target, async () => { await api("DELETE", `shovels/vhost/${enc(s.vhost)}/${enc(s.name)}/restart`); await refresh(); }, `Shovel ${s.name} restarted.`, "Restart shovel") } }, "Restart") },
    ], { empty: "No shovels. Define one with a shovel runtime parameter (PUT /api/parameters/shovel/{vhost}/{name}).", onRender: (s, t) => count.set(s, t) });
    async function refresh() { table.update(await api("GET", "shovels")); }
    return {
      el: h("section.panel", h("div.panel-head", h("h2", "Shovel status"), count.el, h("span.spacer"), h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
      refresh,
    };
  };

  /* ---------- federation status (RabbitMQ's rabbitmq_federation_management page) ---------- */
  sections.federation = function () {
    const count = W.countLabel();
    const table = W.dataTable("federation-links", [
      { key: "upstream", label: "Upstream", render: (l) => h("b", l.upstream) },
      { key: "uri", label: "URI" },
      { key: "vhost", label: "Virtual host" },
      { key: "exchange", label: "Exchange / Queue", render: (l) => l.type === "queue" ? `queue ${l.queue}` : `exchange ${l.exchange}` },
      { key: "upstream_exchange", label: "Upstream", render: (l) => l.type === "queue" ? l.upstream_queue : l.upstream_exchange },
      { key: "status", label: "State", render: (l) => h("span.tag" + (l.status === "running" ? ".ok" : ".warn"), { "data-federation-state": l.status }, l.status) },
      { key: "node", label: "Node" },
      { key: "timestamp", label: "Last changed" },
      { key: "error", label: "Error", render: (l) => l.error ? h("code", l.error) : "" },
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (l) => h("button.btn.btn-sm", { type: "button", "data-action": "restart-federation-link",
        on: { click: (e) => act(e.target, async () => { await api("DELETE", `federation-links/vhost/${enc(l.vhost)}/${enc(l.id)}/${enc(l.node)}/restart`); await refresh(); }, `Federation link ${l.upstream} restarted.`, "Restart link") } }, "Restart") },
    ], { empty: "No federation links. Define an upstream (PUT /api/parameters/federation-upstream/{vhost}/{name}) and a policy with federation-upstream or federation-upstream-set.", onRender: (s, t) => count.set(s, t) });
    async function refresh() { table.update(await api("GET", "federation-links")); }
    return {
      el: h("section.panel", h("div.panel-head", h("h2", "Federation status"), count.el, h("span.spacer"), h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
      refresh,
    };
  };

  /* ---------- definitions ---------- */
  sections.definitions = function () {
    const summary = h("div");
    const exportBtn = h("button.btn.btn-primary", { type: "button", id: "definitions-export", on: { click: async () => {
      const defs = await act(exportBtn, () => api("GET", "definitions"), null, "Export definitions");
      if (!defs) return;
      const blob = new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" });
      const url = URL.createObjectURL(blob);
      const d = new Date();
      const stamp = d.toISOString().slice(0, 10);
      const a = h("a", { href: url, download: `warren_definitions_${stamp}.json` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      W.showSuccess("Definitions exported.");
    } } }, "Download broker definitions");
    const file = h("input", { type: "file", id: "definitions-file", accept: ".json,application/json" });
    const importBtn = h("button.btn.btn-primary", { type: "submit", id: "definitions-import" }, "Upload broker definitions");
    const importForm = h("form.inline-form", { id: "definitions-form", on: { submit: async (e) => {
      e.preventDefault();
      const f = file.files[0];
      await act(importBtn, async () => {
        if (!f) throw new W.InputError("Choose a definitions file first");
        const text = await f.text();
        let body;
        try { body = JSON.parse(text); } catch (err) { throw new W.InputError(`${f.name} is not valid JSON: ${err.message}`); }
        const answer = await api("POST", "definitions", body);
        file.value = "";
        await refresh();
        return answer;
      }, (answer) => `Definitions imported from ${f ? f.name : "file"}.` + (answer && answer.skipped ? " Skipped, as Warren does not serve them: "
        + answer.skipped.map((s) => `${s.policy ? `policy ${s.policy}` : `${s.component} ${s.parameter}`} in ${s.vhost} (${s.reason})`).join("; ") : ""),
      "Import definitions");
    } } }, h("label", "Definitions file (JSON)", file), importBtn);
    async function refresh() {
      const d = await api("GET", "definitions");
      const n = (k) => fmtNum((d[k] || []).length);
      replace(summary, W.kvTable([["Users", n("users")], ["Virtual hosts", n("vhosts")], ["Permissions", n("permissions")],
        ["Exchanges", n("exchanges")], ["Queues", n("queues")], ["Bindings", n("bindings")], ["Policies", n("policies")]]));
    }
    return {
      el: h("div.grid-2",
        h("section.panel", h("div.panel-head", h("h2", "Export definitions")), h("div.panel-body",
          h("p.muted", { style: "margin-top:0" }, "Users, virtual hosts, permissions, exchanges, queues and bindings as a JSON file RabbitMQ can import too."),
          summary, h("div", { style: "margin-top:14px" }, exportBtn))),
        h("section.panel", h("div.panel-head", h("h2", "Import definitions")), h("div.panel-body",
          h("p.muted", { style: "margin-top:0" }, "Objects in the file are created or updated; nothing is deleted."), importForm))),
      refresh,
    };
  };
})(window.W);

/* Admin: users, virtual hosts, permissions, definitions export/import. */
"use strict";
(function (W) {
  const { h, api, act, replace, fmtNum, enc } = W;
  const TAGS = ["administrator", "monitoring", "policymaker", "management", "impersonator"];
  const SECTIONS = [["users", "Users"], ["vhosts", "Virtual hosts"], ["permissions", "Permissions"], ["definitions", "Definitions"]];

  W.pages.admin = function (section = "users") {
    if (!W.isAdmin()) {
      return { el: h("div", W.pageHead("Admin"), h("div.panel", h("div.empty",
        "Users, virtual hosts, permissions and definitions are for users tagged administrator."))) };
    }
    if (!SECTIONS.some(([k]) => k === section)) section = "users";
    const sub = h("nav.subtabs", SECTIONS.map(([key, label]) => h("a", { href: `#/admin/${key}`, class: key === section ? "active" : null, "data-subtab": key }, label)));
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
      { key: "_actions", label: "", sortable: false, cls: "actions", render: (u) => h("button.btn.btn-sm.btn-danger", { type: "button", "data-action": "delete-user", disabled: u.name === W.auth.user(), title: u.name === W.auth.user() ? "You are logged in as this user" : null, on: { click: (e) => remove(e.target, u) } }, "Delete") },
    ], { empty: "No users.", onRender: (s, t) => count.set(s, t) });
    let perms = {};
    async function remove(button, u) {
      if (!await W.confirmDialog("Delete user", ["Delete user ", h("b", u.name), "? Their connections stay open until they close."], "Delete")) return;
      await act(button, async () => { await api("DELETE", `users/${enc(u.name)}`); await refresh(); }, `User ${u.name} deleted.`, "Delete user");
    }
    const name = h("input", { id: "user-name", name: "username", required: true, autocomplete: "off" });
    const password = h("input", { id: "user-password", name: "password", type: "password", autocomplete: "new-password" });
    const tags = h("input", { id: "user-tags", name: "tags", placeholder: "comma-separated, e.g. management" });
    const quick = h("div.quick-add", h("span.muted", { style: "font-size:12px;margin-right:4px" }, "Set"), TAGS.map((t) => h("button", { type: "button", on: { click: () => {
      const cur = tags.value.split(",").map((s) => s.trim()).filter(Boolean);
      if (!cur.includes(t)) cur.push(t);
      tags.value = cur.join(", ");
    } } }, t)));
    const grant = h("input", { type: "checkbox", id: "user-grant", checked: true });
    const submit = h("button.btn.btn-primary", { type: "submit", id: "user-add" }, "Add user");
    const form = h("form.form", { id: "user-form", on: { submit: async (e) => {
      e.preventDefault();
      const user = name.value.trim();
      const ok = await act(submit, async () => {
        if (!user) throw new W.InputError("User name is required");
        const body = { tags: tags.value.split(",").map((s) => s.trim()).filter(Boolean).join(",") };
        if (password.value) body.password = password.value; else body.password_hash = "";
        await api("PUT", `users/${enc(user)}`, body);
        if (grant.checked) await api("PUT", `permissions/%2F/${enc(user)}`, { configure: ".*", write: ".*", read: ".*" });
        return true;
      }, `User ${user} added.`, "Add user");
      if (ok) { name.value = ""; password.value = ""; tags.value = ""; await refresh(); }
    } } },
      W.field("Username", name), W.field("Password", password, "Leave empty for a user who cannot log in with a password"),
      W.field("Tags", h("div", tags, quick)), W.field("Permissions", h("label", grant, " Grant full permissions on the default virtual host \"/\"")),
      h("div.actions", submit));
    async function refresh() {
      const [users, permissions] = await Promise.all([api("GET", "users"), api("GET", "permissions")]);
      perms = {};
      for (const p of permissions) (perms[p.user] = perms[p.user] || []).push(p.vhost);
      table.update(users);
    }
    return {
      el: h("div",
        h("section.panel", h("div.panel-head", h("h2", "Users"), count.el, h("span.spacer"), h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
        h("details.panel", { id: "add-user", open: true }, h("summary", "Add a user"), h("div.panel-body", form))),
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
    function fill(sel, names) {
      const cur = sel.value;
      replace(sel, names.map((n) => h("option", { value: n }, n)));
      if (names.includes(cur)) sel.value = cur;
    }
    async function refresh() {
      const [permissions, users, vhosts] = await Promise.all([api("GET", "permissions"), api("GET", "users"), W.vhostNames()]);
      fill(user, users.map((u) => u.name));
      fill(vhost, vhosts.map((v) => v.name));
      table.update(permissions);
    }
    return {
      el: h("div",
        h("section.panel", h("div.panel-head", h("h2", "Permissions"), count.el, h("span.spacer"), h("div.filter-bar", W.searchBox(table))), h("div.panel-body.flush", table.el)),
        h("details.panel", { id: "set-permission", open: true }, h("summary", "Set permission"), h("div.panel-body", form))),
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
        await api("POST", "definitions", body);
        file.value = "";
        await refresh();
      }, `Definitions imported from ${f ? f.name : "file"}.`, "Import definitions");
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

/* Warren management UI: DOM helpers, the API client, banners, dialogs, sortable tables, small widgets. */
"use strict";
window.W = window.W || {};

(function (W) {
  const AUTH_KEY = "warren.auth";
  const USER_KEY = "warren.user";

  /* ---------- DOM ---------- */
  // h("div.panel#id", {attrs, on: {click}}, children...) -- text is always set as text, never as HTML.
  function h(spec, attrs, ...children) {
    const m = /^([a-z0-9]+)?((?:[.#][\w-]+)*)$/i.exec(spec) || [null, spec, ""];
    const el = document.createElement(m[1] || "div");
    (m[2] || "").replace(/([.#])([\w-]+)/g, (_, kind, name) => {
      if (kind === ".") el.classList.add(name); else el.id = name;
    });
    if (attrs && (typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs))) {
      children.unshift(attrs);
      attrs = null;
    }
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "on") for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
      else if (key === "class") el.className += (el.className ? " " : "") + value;
      else if (key === "dataset") Object.assign(el.dataset, value);
      else if (key === "value") el.value = value;
      else if (key === "checked" || key === "selected" || key === "disabled") el[key] = !!value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    append(el, children);
    return el;
  }
  function append(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }
  function replace(el, ...children) { return append(clear(el), children); }

  /* ---------- formatting ---------- */
  function fmtNum(n) {
    if (n === undefined || n === null || n === "") return "";
    if (typeof n !== "number") return String(n);
    return n.toLocaleString("en-US");
  }
  function fmtRate(r) {
    if (r === undefined || r === null) return "";
    if (r === 0) return "0.0/s";
    if (r < 10) return r.toFixed(1) + "/s";
    return Math.round(r).toLocaleString("en-US") + "/s";
  }
  function fmtBytes(b) {
    if (b === undefined || b === null) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : String(b)) + " " + units[i];
  }
  function fmtTime(ms) {
    if (!ms) return "";
    const d = new Date(ms);
    const p = (x) => String(x).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  }
  function get(obj, path, dflt) {
    let v = obj;
    for (const part of path.split(".")) {
      if (v === null || v === undefined || typeof v !== "object") return dflt;
      v = v[part];
    }
    return v === undefined ? dflt : v;
  }
  function rate(obj, stat) { return get(obj, `message_stats.${stat}_details.rate`, undefined); }
  function enc(s) { return encodeURIComponent(s); }
  function vhostLabel(v) { return v; }

  /* ---------- auth + API ---------- */
  function b64(str) {
    const bytes = new TextEncoder().encode(str);
    let bin = "";
    bytes.forEach((b) => { bin += String.fromCharCode(b); });
    return btoa(bin);
  }
  const auth = {
    set(user, password) {
      sessionStorage.setItem(AUTH_KEY, b64(`${user}:${password}`));
      sessionStorage.setItem(USER_KEY, user);
    },
    header() { const t = sessionStorage.getItem(AUTH_KEY); return t ? "Basic " + t : null; },
    headerFor(user, password) { return "Basic " + b64(`${user}:${password}`); },
    user() { return sessionStorage.getItem(USER_KEY) || ""; },
    clear() { sessionStorage.removeItem(AUTH_KEY); sessionStorage.removeItem(USER_KEY); },
  };

  class ApiError extends Error {
    constructor(status, error, reason) {
      super(reason || error || `HTTP ${status}`);
      this.status = status;
      this.error = error;
      this.reason = reason;
      this.sessionEnded = false;  // set by api(): the credentials no longer work
    }
  }

  // Every call goes through here.  credentials: "omit" keeps the browser from popping up its own
  // basic-auth dialog on a 401 (the API answers with WWW-Authenticate); we send the header ourselves.
  async function api(method, path, body, options = {}) {
    const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
    const authHeader = options.authHeader || auth.header();
    if (authHeader) headers.Authorization = authHeader;
    const init = { method, headers, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = typeof body === "string" ? body : JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch("api/" + path.replace(/^\/+/, ""), init);
    } catch (e) {
      throw new ApiError(0, "network_error", "The management API cannot be reached: " + e.message);
    }
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = text; }
    }
    if (!res.ok) {
      const error = data && typeof data === "object" ? data.error : undefined;
      const reason = data && typeof data === "object" ? data.reason : (typeof data === "string" ? data : "");
      // shown as text: a reason escaped for HTML (a policy's, as RabbitMQ sends it) is unescaped first
      // (RabbitMQ sends some reasons as a list: ["not_boolean", "yes"])
      const text = typeof reason === "string"
        ? reason.replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&")
        : Array.isArray(reason) ? reason.map(String).join(": ") : reason;
      const err = new ApiError(res.status, error || res.statusText, text || res.statusText);
      // 401 asking for credentials (WWW-Authenticate): these ones no longer work.  A 401 without it
      // (RabbitMQ's "not allowed", as a 403 is) is an answer to this request only.
      err.sessionEnded = res.status === 401 && res.headers.has("WWW-Authenticate") && !options.authHeader;
      if (err.sessionEnded && W.onUnauthorized) W.onUnauthorized(err);
      throw err;
    }
    return data;
  }

  // What the user typed cannot be sent: shown like an API refusal, not logged as a fault of the page.
  class InputError extends Error {}

  /* ---------- banners ---------- */
  function banner(kind, title, message, timeout) {
    const box = document.getElementById("banners");
    const el = h("div.banner.banner-" + kind, { role: kind === "error" ? "alert" : "status" },
      h("div.body", title ? h("span.title", title + " ") : null, h("span.msg", message || "")),
      h("button.close", { type: "button", title: "Dismiss", "aria-label": "Dismiss", on: { click: () => el.remove() } }, "×"));
    // one error banner at a time, newest first
    if (kind === "error") box.querySelectorAll(".banner-error").forEach((b) => b.remove());
    box.querySelectorAll(".banner-success,.banner-info,.banner-warn").forEach((b) => b.remove());
    box.prepend(el);
    if (timeout) setTimeout(() => el.remove(), timeout);
    return el;
  }
  function showError(err, context) {
    if (err instanceof ApiError) {
      const title = (context ? context + ": " : "") + (err.status ? `${err.status} ${err.error || ""}`.trim() : "Error");
      return banner("error", title + " —", err.reason || err.message);
    }
    if (!(err instanceof InputError)) console.error(err);
    return banner("error", (context ? context + ": " : "") + "Error —", String(err && err.message || err));
  }
  function showSuccess(message) { return banner("success", "", message, 6000); }
  function clearBanners() { clear(document.getElementById("banners")); }

  // Runs an action with its button disabled; errors become a banner.  Resolves to the result or undefined.
  async function act(button, fn, successMessage, context) {
    if (button) button.disabled = true;
    try {
      const result = await fn();
      // done: an earlier action's refusal no longer stands (a page's failing refresh says so again itself)
      document.querySelectorAll("#banners .banner-error:not([data-refresh])").forEach((b) => b.remove());
      if (successMessage) showSuccess(typeof successMessage === "function" ? successMessage(result) : successMessage);
      return result;
    } catch (err) {
      showError(err, context);
      return undefined;
    } finally {
      if (button) button.disabled = false;
    }
  }

  /* ---------- modal ---------- */
  function confirmDialog(title, message, okLabel = "Confirm", danger = true) {
    return new Promise((resolve) => {
      const root = document.getElementById("modal-root");
      const done = (value) => { clear(root); document.removeEventListener("keydown", onKey); resolve(value); };
      const onKey = (e) => { if (e.key === "Escape") done(false); };
      const ok = h("button.btn" + (danger ? ".btn-danger-solid" : ".btn-primary"), { type: "button", on: { click: () => done(true) } }, okLabel);
      const dialog = h("div.modal-backdrop", { on: { click: (e) => { if (e.target === dialog) done(false); } } },
        h("div.modal", { role: "dialog", "aria-modal": "true", "aria-label": title },
          h("h2", title),
          h("div.modal-body", message),
          h("div.modal-actions",
            h("button.btn", { type: "button", on: { click: () => done(false) } }, "Cancel"), ok)));
      replace(root, dialog);
      document.addEventListener("keydown", onKey);
      ok.focus();
    });
  }

  /* ---------- sortable table ---------- */
  const sortState = {};
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
  // Rows shown a page at a time, as RabbitMQ's lists (100 by default): a thousand queues' rows, each
  // refresh, kept the page from answering for a second or more.
  const PAGE_SIZES = [100, 500, 1000];
  // columns: [{key, label, value(row) -> sortable, render(row) -> node|string, num, sortable=true, cls}]
  function dataTable(id, columns, options = {}) {
    const state = sortState[id] || (sortState[id] = { key: options.sortKey || columns[0].key, dir: options.sortDir || 1,
      page: 1, size: PAGE_SIZES[0] });
    const wrap = h("div.table-wrap");
    const table = h("table.data", { "data-table": id });
    const thead = h("thead");
    const tbody = h("tbody");
    const pager = h("div.pager", { "data-pager": id, hidden: true });
    table.append(thead, tbody);
    wrap.append(table, pager);
    let rows = [];
    let filter = "";
    const colValue = (col, row) => (col.value ? col.value(row) : get(row, col.key));
    function renderHead() {
      replace(thead, h("tr", columns.map((col) => {
        const sortable = col.sortable !== false;
        const arrow = state.key === col.key ? (state.dir > 0 ? "▲" : "▼") : "";
        return h("th" + (col.num ? ".num" : "") + (sortable ? ".sortable" : ""), {
          "data-col": col.key,
          "aria-sort": state.key === col.key ? (state.dir > 0 ? "ascending" : "descending") : null,
          on: sortable ? { click: () => { if (state.key === col.key) state.dir = -state.dir; else { state.key = col.key; state.dir = col.num ? -1 : 1; } render(); } } : {},
        }, col.label, h("span.arrow", arrow));
      })));
    }
    function compare(a, b) {
      if (a === b) return 0;
      if (a === undefined || a === null || a === "") return -1;
      if (b === undefined || b === null || b === "") return 1;
      if (typeof a === "number" && typeof b === "number") return a - b;
      return collator.compare(String(a), String(b));
    }
    function renderPager(count) {
      const pages = Math.max(1, Math.ceil(count / state.size));
      pager.hidden = count <= PAGE_SIZES[0];
      if (pager.hidden) return;
      const go = (n) => ({ click: () => { state.page = n; render(); } });
      const first = (state.page - 1) * state.size;
      replace(pager,
        h("span.muted", { "data-page-range": "" }, `${fmtNum(first + 1)}–${fmtNum(Math.min(first + state.size, count))} of ${fmtNum(count)}`),
        h("label.muted", "Rows per page ", select({ "data-page-size": "", on: { change: (e) => { state.size = Number(e.target.value); state.page = 1; render(); } } },
          PAGE_SIZES.map((n) => [String(n), String(n)]), String(state.size))),
        h("button.btn.btn-sm", { type: "button", "data-page": "previous", disabled: state.page <= 1, on: go(state.page - 1) }, "‹ Previous"),
        h("span", { "data-page-of": "" }, `Page ${fmtNum(state.page)} of ${fmtNum(pages)}`),
        h("button.btn.btn-sm", { type: "button", "data-page": "next", disabled: state.page >= pages, on: go(state.page + 1) }, "Next ›"));
    }
    function render() {
      renderHead();
      const col = columns.find((c) => c.key === state.key) || columns[0];
      let shown = rows;
      if (filter) {
        const f = filter.toLowerCase();
        const fields = options.filterFields || ["name"];
        shown = rows.filter((r) => fields.some((k) => String(get(r, k, "")).toLowerCase().includes(f)));
      }
      shown = shown.slice().sort((a, b) => state.dir * compare(colValue(col, a), colValue(col, b)));
      state.page = Math.min(state.page, Math.max(1, Math.ceil(shown.length / state.size)));
      renderPager(shown.length);
      const total = shown.length;
      shown = shown.slice((state.page - 1) * state.size, state.page * state.size);
      if (!shown.length) {
        replace(tbody, h("tr", h("td.empty", { colspan: columns.length }, rows.length ? "No rows match the filter." : (options.empty || "Nothing here yet."))));
      } else {
        replace(tbody, shown.map((row) => h("tr", { "data-key": options.rowKey ? options.rowKey(row) : null },
          columns.map((c) => {
            const content = c.render ? c.render(row) : fmtCell(colValue(c, row));
            return h("td" + (c.num ? ".num" : "") + (c.cls ? "." + c.cls : ""), { "data-col": c.key }, content);
          }))));
      }
      if (options.onRender) options.onRender(total, rows.length);
    }
    function fmtCell(v) {
      if (typeof v === "number") return fmtNum(v);
      if (typeof v === "boolean") return v ? "yes" : "no";
      if (v === undefined || v === null) return "";
      if (typeof v === "object") return JSON.stringify(v);
      return String(v);
    }
    return {
      el: wrap,
      update(newRows) { rows = newRows || []; render(); },
      setFilter(f) { filter = f; state.page = 1; render(); },
      get rows() { return rows; },
    };
  }

  /* ---------- widgets ---------- */
  function field(label, input, hint) {
    return [h("label", { for: input.id || null }, label), hint ? h("div", input, h("div.hint", hint)) : input];
  }
  function select(attrs, options, selected) {
    return h("select", attrs, options.map((o) => {
      const [value, label] = Array.isArray(o) ? o : [o, o];
      return h("option", { value, selected: value === selected }, label);
    }));
  }
  // Key = value rows with a type per row, as RabbitMQ's arguments editor; .value() -> object.
  // quick: hints that fill a row's key and type: [label, key, type, suggested values?], or a string heading a group.
  let datalists = 0;
  function kvEditor(name, quick = []) {
    const list = h("div.kv-editor", { "data-kv": name });
    function addRow(key = "", value = "", type = "string") {
      const suggestions = h("datalist", { id: `kv-values-${++datalists}` });
      const row = h("div.kv-row",
        h("input", { placeholder: "key", value: key, "data-kv-key": "" }),
        h("span.eq", "="),
        h("input", { placeholder: "value", value: String(value), "data-kv-value": "", list: suggestions.id }),
        select({ "data-kv-type": "" }, [["string", "String"], ["number", "Number"], ["boolean", "Boolean"], ["json", "JSON"]], type),
        h("button.btn.btn-sm", { type: "button", title: "Remove", on: { click: () => { row.remove(); ensureBlank(); } } }, "×"),
        suggestions);
      row.querySelectorAll("input").forEach((i) => i.addEventListener("input", ensureBlank));
      list.insertBefore(row, quickBox);
      return row;
    }
    function ensureBlank() {
      const rows = [...list.querySelectorAll(".kv-row")];
      if (!rows.length || rows[rows.length - 1].querySelector("[data-kv-key]").value) addRow();
    }
    function hint([label, key, type, values]) {
      return h("button", { type: "button", "data-hint": key, title: `${key} (${type})`, on: {
        click: () => {
          const rows = [...list.querySelectorAll(".kv-row")];
          const row = rows.find((r) => r.querySelector("[data-kv-key]").value === key)
            || rows.find((r) => !r.querySelector("[data-kv-key]").value) || addRow();
          row.querySelector("[data-kv-key]").value = key;
          row.querySelector("[data-kv-type]").value = type;
          replace(row.querySelector("datalist"), (values || []).map((v) => h("option", { value: v })));
          row.querySelector("[data-kv-value]").focus();
          ensureBlank();
        },
      } }, label);
    }
    const quickBox = h("div.quick-add", quick.length && typeof quick[0] !== "string" ? h("span.muted.hint-group", "Add") : null,
      quick.map((q) => (typeof q === "string" ? h("span.muted.hint-group", q) : hint(q))));
    list.append(quickBox);
    addRow();
    return {
      el: list,
      value() {
        const out = {};
        for (const row of list.querySelectorAll(".kv-row")) {
          const key = row.querySelector("[data-kv-key]").value.trim();
          if (!key) continue;
          const raw = row.querySelector("[data-kv-value]").value;
          const type = row.querySelector("[data-kv-type]").value;
          if (type === "number") {
            if (raw.trim() === "" || isNaN(Number(raw))) throw new InputError(`${name}: "${key}" must be a number`);
            out[key] = Number(raw);
          } else if (type === "boolean") {
            out[key] = /^(true|1|yes)$/i.test(raw.trim());
          } else if (type === "json") {
            try { out[key] = JSON.parse(raw); } catch (e) { throw new InputError(`${name}: "${key}" is not valid JSON`); }
          } else out[key] = raw;
        }
        return out;
      },
      // Rows for an object's entries, each typed by its value.
      set(obj) {
        list.querySelectorAll(".kv-row").forEach((r) => r.remove());
        for (const [key, v] of Object.entries(obj || {})) {
          const type = ["number", "boolean", "string"].includes(typeof v) ? typeof v : "json";
          addRow(key, type === "json" ? JSON.stringify(v) : v, type);
        }
        addRow();
      },
      reset() { this.set({}); },
    };
  }
  function featureTags(obj) {
    const tags = [];
    if (obj.durable) tags.push(h("span.tag.accent", { title: "durable" }, "D"));
    if (obj.auto_delete) tags.push(h("span.tag", { title: "auto-delete" }, "AD"));
    if (obj.exclusive) tags.push(h("span.tag", { title: "exclusive" }, "Excl"));
    if (obj.internal) tags.push(h("span.tag", { title: "internal" }, "I"));
    for (const [k, v] of Object.entries(obj.arguments || {})) {
      tags.push(h("span.tag.warn", { title: `${k}: ${JSON.stringify(v)}` }, shortArg(k)));
    }
    return tags;
  }
  function shortArg(k) {
    const names = { "x-message-ttl": "TTL", "x-expires": "Exp", "x-max-length": "Lim", "x-max-length-bytes": "Lim B",
      "x-dead-letter-exchange": "DLX", "x-dead-letter-routing-key": "DLK", "x-max-priority": "Pri",
      "x-overflow": "Ovfl", "x-queue-mode": "Mode", "x-queue-type": "Type", "x-single-active-consumer": "SAC",
      "x-queue-leader-locator": "Ldr", "x-delayed-type": "Delayed", "alternate-exchange": "AE" };
    return names[k] || k;
  }
  function kvTable(pairs) {
    return h("table.kv", h("tbody", pairs.filter(Boolean).map(([k, v]) => h("tr", h("th", k), h("td", v)))));
  }
  function panel(title, body, extra) {
    return h("section.panel", h("div.panel-head", h("h2", title), h("span.spacer"), extra || null),
      h("div.panel-body", body));
  }

  Object.assign(W, {
    h, append, clear, replace, fmtNum, fmtRate, fmtBytes, fmtTime, get, rate, enc, vhostLabel,
    auth, api, ApiError, InputError, banner, showError, showSuccess, clearBanners, act, confirmDialog,
    dataTable, field, select, kvEditor, featureTags, kvTable, panel,
  });
})(window.W);

/* App shell: login, hash routing, the refresh tick and the overview history the charts draw. */
"use strict";
(function (W) {
  const { h, api, replace } = W;
  const HISTORY_MS = 10 * 60 * 1000;
  const INTERVAL_KEY = "warren.refresh";
  W.state = { me: null, overview: null, vhosts: null };
  const tagged = (tag) => ((W.state.me || {}).tags || []).includes(tag);
  W.isAdmin = () => tagged("administrator");
  W.isPolicymaker = () => W.isAdmin() || tagged("policymaker");
  W.isMonitor = () => W.isAdmin() || tagged("monitoring");
  W.history = [];

  const $ = (id) => document.getElementById(id);
  const app = (W.app = { current: null, timer: null, ticking: false, flash: null });

  /* ---------- login ---------- */
  function showLogin(message) {
    stopTimer();
    W.auth.clear();
    $("app-view").hidden = true;
    $("login-view").hidden = false;
    W.clearBanners();
    const err = $("login-error");
    err.hidden = !message;
    err.textContent = message || "";
    $("login-username").focus();
  }
  W.onUnauthorized = (err) => showLogin(`Your session ended: ${err.reason || "not authorised"}. Please log in again.`);

  $("login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const user = $("login-username").value;
    const password = $("login-password").value;
    const submit = $("login-submit");
    submit.disabled = true;
    try {
      const me = await api("GET", "whoami", undefined, { authHeader: W.auth.headerFor(user, password) });
      W.auth.set(user, password);
      $("login-password").value = "";
      await enter(me);
    } catch (err) {
      const e2 = $("login-error");
      e2.hidden = false;
      e2.textContent = err.reason === "Login failed" ? "Wrong username or password."
        : err.status === 401 || err.status === 403 ? `${user} may not log in here: ${err.reason}` : (err.reason || err.message);
    } finally {
      submit.disabled = false;
    }
  });
  $("logout").addEventListener("click", () => { W.history = []; showLogin(""); location.hash = "#/"; });

  async function enter(me) {
    me = me || await api("GET", "whoami");
    W.state.me = me;
    document.querySelector('#nav a[data-tab="admin"]').hidden = !(W.isPolicymaker() || W.isMonitor());
    $("current-user").textContent = me.name;
    $("current-user").title = (me.tags || []).join(", ");
    $("login-view").hidden = true;
    $("app-view").hidden = false;
    try {
      await loadOverview();
      await W.vhostNames();
    } catch (err) {
      W.showError(err, "Overview");
    }
    renderChrome();
    await route();
    startTimer();
  }

  // The overview feeds the header, the footer and the charts' history on every tick, whatever the page.
  async function loadOverview() {
    W.state.overview = await api("GET", "overview");
    pushHistory(W.state.overview);
    renderChrome();
  }
  W.loadOverview = loadOverview;

  function renderChrome() {
    const ov = W.state.overview || {};
    $("node-name").textContent = ov.node || "";
    replace($("footer"), `${ov.product_name || "Warren"} ${ov.product_version || ""}`,
      ov.rabbitmq_version ? ` · RabbitMQ ${ov.rabbitmq_version} compatible management API` : "");
  }

  /* ---------- history for the charts ---------- */
  function pushHistory(ov) {
    const ms = ov.message_stats || {};
    const qt = ov.queue_totals || {};
    const r = (k) => (ms[`${k}_details`] || {}).rate || 0;
    const now = Date.now();
    W.history.push({ t: now, v: {
      publish: r("publish"), deliver: r("deliver_get"), ack: r("ack"), redeliver: r("redeliver"),
      ready: qt.messages_ready || 0, unacked: qt.messages_unacknowledged || 0, total: qt.messages || 0 } });
    while (W.history.length && W.history[0].t < now - HISTORY_MS) W.history.shift();
  }

  /* ---------- routing ---------- */
  // A "%" that starts no valid escape (an address typed by hand: #/queues/%2F/50% off) is taken as it stands.
  function decodePart(part) {
    return part.replace(/(?:%[0-9a-f]{2})+/gi, (escapes) => {
      try { return decodeURIComponent(escapes); } catch (e) { return escapes; }
    });
  }
  function parseHash() {
    return (location.hash.replace(/^#\/?/, "") || "").split("/").filter((p, i) => p !== "" || i > 0).map(decodePart);
  }
  async function route() {
    const parts = parseHash();
    const [tab] = parts;
    let page, active;
    try {
      if (!tab) { page = W.pages.overview(); active = "overview"; }
      else if (tab === "connections" && parts.length >= 2) { page = W.pages.connection(parts.slice(1).join("/")); active = tab; }
      else if (tab === "connections") { page = W.pages.connections(); active = tab; }
      else if (tab === "channels" && parts.length >= 2) { page = W.pages.channel(parts.slice(1).join("/")); active = tab; }
      else if (tab === "channels") { page = W.pages.channels(); active = tab; }
      else if (tab === "exchanges" && parts.length >= 3) { page = W.pages.exchange(parts[1], parts.slice(2).join("/")); active = tab; }
      else if (tab === "exchanges") { page = W.pages.exchanges(); active = tab; }
      else if (tab === "queues" && parts.length >= 3) { page = W.pages.queue(parts[1], parts.slice(2).join("/")); active = tab; }
      else if (tab === "queues") { page = W.pages.queues(); active = tab; }
      else if (tab === "admin") { page = W.pages.admin(parts[1]); active = tab; }
      else { page = { el: h("div.panel", h("div.empty", "No such page. ", h("a", { href: "#/" }, "Go to the overview"))) }; }
    } catch (err) {
      W.showError(err);
      return;
    }
    document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.tab === active));
    document.title = `${active ? active[0].toUpperCase() + active.slice(1) : "Not found"} · Warren`;
    app.current = page;
    W.clearBanners();
    if (app.flash) { W.showSuccess(app.flash); app.flash = null; }
    const main = $("main");
    main.dataset.route = location.hash;
    main.setAttribute("aria-busy", "true");  // until the page's data is in
    replace(main, page.el);
    window.scrollTo(0, 0);
    await refreshPage(page, true);
    if (app.current === page) main.removeAttribute("aria-busy");
  }
  async function refreshPage(page, first) {
    if (!page.refresh) return;
    try {
      await page.refresh(first);
      if (page.failed) { document.querySelectorAll(".banner-error[data-refresh]").forEach((b) => b.remove()); page.failed = false; }
    } catch (err) {
      if (err.sessionEnded || page !== app.current) return;  // a page left meanwhile (e.g. just deleted) stays quiet
      if (first || !page.failed) {
        const b = W.showError(err, err.status === 404 ? "Not found" : "Refresh");
        b.dataset.refresh = "1";
      }
      page.failed = true;
    }
  }
  window.addEventListener("hashchange", () => { if (W.auth.header()) route(); });
  // Go to another page and say what was done there: route() clears the old page's banners.
  W.navigate = (hash, message) => { app.flash = message; location.hash = hash; };

  /* ---------- refresh tick ---------- */
  function interval() { return Number(sessionStorage.getItem(INTERVAL_KEY) || 5000); }
  function stopTimer() { if (app.timer) clearInterval(app.timer); app.timer = null; }
  function startTimer() {
    stopTimer();
    const ms = interval();
    if (ms > 0) app.timer = setInterval(tick, ms);
  }
  async function tick() {
    if (app.ticking || document.hidden || !W.auth.header()) return;
    app.ticking = true;
    try {
      try {
        await loadOverview();
      } catch (err) {
        if (!err.sessionEnded && !document.querySelector(".banner-error")) W.showError(err, "Overview");
      }
      if (app.current && W.auth.header()) await refreshPage(app.current, false);
    } finally {
      app.ticking = false;
    }
  }
  W.tick = tick;
  const sel = $("refresh-interval");
  sel.value = String(interval());
  sel.addEventListener("change", () => { sessionStorage.setItem(INTERVAL_KEY, sel.value); startTimer(); });

  /* ---------- start ---------- */
  if (W.auth.header()) enter().catch((err) => { if (!err.sessionEnded) showLogin(err.reason || err.message); });
  else showLogin("");
})(window.W);

/* Charts drawn on <canvas>: a time-series line chart and a horizontal stacked bar chart. No libraries. */
"use strict";
(function (W) {
  const { h } = W;
  const FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif';
  const GRID = "#e8ebef";
  const AXIS = "#7b8794";

  const TICKS = 4;
  // The top of the scale: TICKS steps of a round size (1, 2, 2.5 or 5 × 10^n) reaching v; whole steps for counts.
  function scaleMax(v, integer) {
    let step = v > 0 ? v / TICKS : 0.25;
    const exp = Math.pow(10, Math.floor(Math.log10(step)));
    step = [1, 2, 2.5, 5, 10].map((m) => m * exp).find((s) => s >= step);
    return (integer ? Math.max(1, Math.ceil(step)) : step) * TICKS;
  }
  function compact(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(v % 1e6 ? 1 : 0) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(v % 1e3 ? 1 : 0) + "k";
    if (v > 0 && v < 1) return v.toFixed(2).replace(/0+$/, "");
    return String(Math.round(v * 10) / 10);
  }
  function setupCanvas(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 600;
    const hgt = canvas.clientHeight || 220;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(hgt * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(hgt * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    ctx.font = FONT;
    return [ctx, w, hgt];
  }
  // What the chart shows now, as text: for screen readers (role="img") and for tests.
  function describe(canvas, label, parts) {
    canvas.setAttribute("aria-label", `${label}: ${parts.join(", ")}`);
  }
  function observe(el, fn) {
    if (window.ResizeObserver) new ResizeObserver(() => fn()).observe(el);
  }

  // series: [{key, label, color}]; points: [{t: ms, v: {key: number}}]
  class LineChart {
    constructor(id, series, options = {}) {
      this.series = series;
      this.options = options;
      this.points = [];
      this.canvas = h("canvas", { "data-chart": id, role: "img", "aria-label": options.label || id });
      this.legend = h("div.legend");
      this.el = h("div.chart", this.canvas, this.legend);
      observe(this.canvas, () => this.draw());
    }
    setPoints(points) {
      this.points = points;
      const last = points[points.length - 1];
      const format = this.options.format || W.fmtNum;
      describe(this.canvas, this.options.label, this.series.map((s) => `${s.label} ${last ? format(last.v[s.key] || 0) : "–"}`));
      this.draw();
    }
    draw() {
      if (!this.canvas.isConnected) return;
      const [ctx, w, hgt] = setupCanvas(this.canvas);
      const pad = { l: 46, r: 14, t: 12, b: 24 };
      const pw = w - pad.l - pad.r;
      const ph = hgt - pad.t - pad.b;
      const pts = this.points;
      const windowMs = this.options.windowMs || 5 * 60 * 1000;
      const now = pts.length ? pts[pts.length - 1].t : Date.now();
      const t0 = now - windowMs;
      let max = 0;
      for (const p of pts) for (const s of this.series) max = Math.max(max, p.v[s.key] || 0);
      max = scaleMax(max * 1.1, this.options.integer);
      const x = (t) => pad.l + ((t - t0) / windowMs) * pw;
      const y = (v) => pad.t + ph - (v / max) * ph;
      // grid + y labels
      ctx.strokeStyle = GRID; ctx.fillStyle = AXIS; ctx.lineWidth = 1;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (let i = 0; i <= TICKS; i++) {
        const v = (max * i) / TICKS;
        const yy = Math.round(y(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(pad.l, yy); ctx.lineTo(pad.l + pw, yy); ctx.stroke();
        ctx.fillText(compact(v) + (this.options.unit || ""), pad.l - 6, yy);
      }
      // x labels: minutes ago
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      const steps = 5;
      for (let i = 0; i <= steps; i++) {
        const t = t0 + (windowMs * i) / steps;
        const ago = Math.round((now - t) / 1000);
        const label = ago === 0 ? "now" : ago >= 60 ? `-${(ago / 60).toFixed(ago % 60 ? 1 : 0)}m` : `-${ago}s`;
        ctx.fillText(label, x(t), pad.t + ph + 6);
      }
      if (pts.length === 0) {
        ctx.textAlign = "center"; ctx.textBaseline = "middle"; ctx.fillStyle = AXIS;
        ctx.fillText("Collecting samples…", pad.l + pw / 2, pad.t + ph / 2);
      }
      // series
      ctx.save();
      ctx.beginPath(); ctx.rect(pad.l, pad.t - 2, pw, ph + 4); ctx.clip();
      for (const s of this.series) {
        const visible = pts.filter((p) => p.t >= t0 - 10000);
        if (!visible.length) continue;
        if (this.options.fill) {
          ctx.beginPath();
          visible.forEach((p, i) => { const xx = x(p.t), yy = y(p.v[s.key] || 0); if (i) ctx.lineTo(xx, yy); else ctx.moveTo(xx, yy); });
          ctx.lineTo(x(visible[visible.length - 1].t), y(0));
          ctx.lineTo(x(visible[0].t), y(0));
          ctx.closePath();
          ctx.globalAlpha = 0.08; ctx.fillStyle = s.color; ctx.fill(); ctx.globalAlpha = 1;
        }
        ctx.beginPath();
        visible.forEach((p, i) => { const xx = x(p.t), yy = y(p.v[s.key] || 0); if (i) ctx.lineTo(xx, yy); else ctx.moveTo(xx, yy); });
        ctx.strokeStyle = s.color; ctx.lineWidth = 2; ctx.lineJoin = "round"; ctx.stroke();
        const last = visible[visible.length - 1];
        ctx.beginPath(); ctx.arc(x(last.t), y(last.v[s.key] || 0), 3, 0, Math.PI * 2); ctx.fillStyle = s.color; ctx.fill();
      }
      ctx.restore();
      // axis line
      ctx.strokeStyle = "#c7cdd4"; ctx.beginPath(); ctx.moveTo(pad.l, pad.t + ph + 0.5); ctx.lineTo(pad.l + pw, pad.t + ph + 0.5); ctx.stroke();
      // legend with current values
      const last = pts[pts.length - 1];
      W.replace(this.legend, this.series.map((s) => h("span.item", { "data-series": s.key },
        h("span.swatch", { style: `background:${s.color}` }), s.label,
        h("span.val", last ? (this.options.format || W.fmtNum)(last.v[s.key] || 0) : "–"))));
    }
  }

  // items: [{label, parts: {key: number}}]; series: [{key, label, color}] stacked left to right.
  class BarChart {
    constructor(id, series, options = {}) {
      this.series = series;
      this.options = options;
      this.items = [];
      this.canvas = h("canvas", { "data-chart": id, role: "img", "aria-label": options.label || id });
      this.legend = h("div.legend", series.map((s) => h("span.item", h("span.swatch", { style: `background:${s.color}` }), s.label)));
      this.el = h("div.chart", this.canvas, this.legend);
      observe(this.canvas, () => this.draw());
    }
    setItems(items) {
      this.items = items;
      const shown = items.slice(0, this.options.limit || 8);
      describe(this.canvas, this.options.label, shown.length
        ? shown.map((it) => `${it.label} ${W.fmtNum(this.series.reduce((n, s) => n + (it.parts[s.key] || 0), 0))}`)
        : [this.options.empty || "No data"]);
      this.draw();
    }
    draw() {
      if (!this.canvas.isConnected) return;
      const [ctx, w, hgt] = setupCanvas(this.canvas);
      const items = this.items.slice(0, this.options.limit || 8);
      ctx.textBaseline = "middle";
      if (!items.length) {
        ctx.fillStyle = AXIS; ctx.textAlign = "center";
        ctx.fillText(this.options.empty || "No data", w / 2, hgt / 2);
        return;
      }
      let labelW = 0;
      for (const it of items) labelW = Math.max(labelW, ctx.measureText(it.label).width);
      labelW = Math.min(Math.max(labelW + 12, 70), w * 0.35);
      const pad = { l: labelW, r: 56, t: 8, b: 20 };
      const pw = w - pad.l - pad.r;
      const rowH = Math.min(26, (hgt - pad.t - pad.b) / items.length);
      let max = 0;
      for (const it of items) max = Math.max(max, this.series.reduce((a, s) => a + (it.parts[s.key] || 0), 0));
      max = scaleMax(max, true);
      // grid
      ctx.strokeStyle = GRID; ctx.fillStyle = AXIS; ctx.textAlign = "center"; ctx.textBaseline = "top";
      const gridBottom = pad.t + rowH * items.length;
      for (let i = 0; i <= TICKS; i++) {
        const xx = Math.round(pad.l + (pw * i) / TICKS) + 0.5;
        ctx.beginPath(); ctx.moveTo(xx, pad.t); ctx.lineTo(xx, gridBottom); ctx.stroke();
        ctx.fillText(compact((max * i) / TICKS), xx, gridBottom + 4);
      }
      ctx.textBaseline = "middle";
      items.forEach((it, i) => {
        const cy = pad.t + rowH * i + rowH / 2;
        ctx.fillStyle = "#3e4c5b"; ctx.textAlign = "right";
        let label = it.label;
        while (label.length > 3 && ctx.measureText(label).width > labelW - 10) label = label.slice(0, -2);
        if (label !== it.label) label = label.slice(0, -1) + "…";
        ctx.fillText(label, pad.l - 8, cy);
        let xx = pad.l;
        let total = 0;
        for (const s of this.series) {
          const v = it.parts[s.key] || 0;
          total += v;
          const bw = (v / max) * pw;
          if (bw > 0) { ctx.fillStyle = s.color; ctx.fillRect(xx, cy - rowH * 0.32, Math.max(bw, 1), rowH * 0.64); }
          xx += bw;
        }
        ctx.fillStyle = "#1f2a37"; ctx.textAlign = "left";
        ctx.fillText(W.fmtNum(total), xx + 6, cy);
      });
    }
  }

  W.LineChart = LineChart;
  W.BarChart = BarChart;
})(window.W);

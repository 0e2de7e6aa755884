"use strict";
// The report's page: reads the JSON that `model-trace report` embedded and draws every section
// with SVG and canvas, no library and no network.
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const SPECIALIZATIONS = {
    first_token_sink: ["first-token sink", "#d62728"],
    previous_token: ["previous-token", "#1f77b4"],
    positional: ["positional", "#9467bd"],
    local_window: ["local window", "#2ca02c"],
    broad: ["broad", "#ff7f0e"],
    mixed: ["mixed", "#b0b7c3"],
    unjudged: ["unjudged", "#eceff4"],
  };

  // ---- small helpers ---------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "onclick" || k === "onchange") node.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null) node.setAttribute(k, v);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function s(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function bytesOf(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }

  function f32(b64) {
    const bytes = bytesOf(b64);
    return new Float32Array(bytes.buffer, 0, bytes.length / 4);
  }

  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (!Number.isFinite(v)) return v > 0 ? "∞" : "−∞";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2).replace(/\.?0+e/, "e").replace("e+", "e");
    return String(Number(v.toPrecision(4)));
  }

  function mib(bytes) {
    return bytes / (1024 * 1024);
  }

  const tooltip = document.getElementById("tooltip");
  function tip(node, text) {
    node.addEventListener("mousemove", (e) => {
      tooltip.textContent = typeof text === "function" ? text(e) : text;
      tooltip.hidden = !tooltip.textContent;
      tooltip.style.left = Math.min(e.clientX + 14, window.innerWidth - 300) + "px";
      tooltip.style.top = e.clientY + 14 + "px";
    });
    node.addEventListener("mouseleave", () => (tooltip.hidden = true));
  }

  // items: [name, color] or [name, color, dashed]
  function legend(items) {
    return h("div", { class: "legend-row" },
      items.map(([name, color, dashed]) => h("span", {}, h("span", { class: "swatch", style: dashed ? `background:repeating-linear-gradient(90deg, ${color} 0 3px, transparent 3px 5px)` : `background:${color}` }), name)));
  }

  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const span = hi - lo;
    const step0 = Math.pow(10, Math.floor(Math.log10(span / count)));
    const err = (span / count) / step0;
    const step = step0 * (err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
    return ticks;
  }

  // ---- plots -------------------------------------------------------------------------------

  // A line plot. series: [{name, color, points: [[x, y]], dashed}]; options: xLabel, yLabel,
  // logY, invertY, markers [{x, text, color}], hlines [{y, text, color}], integerX.
  function linePlot(series, o) {
    const W = o.width || 900, H = o.height || 300, M = { l: 64, r: 16, t: 14, b: 40 };
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
    const usable = (y) => Number.isFinite(y) && (!o.logY || y > 0);
    const pts = series.flatMap((se) => se.points.filter((p) => Number.isFinite(p[0]) && usable(p[1])));
    if (pts.length === 0) {
      svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, o.empty || "nothing recorded"));
      return svg;
    }
    let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
    if (o.xDomain) [x0, x1] = o.xDomain;
    if (x1 === x0) { x0 -= 0.5; x1 += 0.5; }
    const ys = pts.map((p) => p[1]).concat((o.hlines || []).map((l) => l.y).filter(usable));
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    const T = o.logY ? Math.log10 : (v) => v;
    let t0 = T(y0), t1 = T(y1);
    if (t1 === t0) { t0 -= o.logY ? 0.5 : Math.max(Math.abs(t0) * 0.1, 0.5); t1 += o.logY ? 0.5 : Math.max(Math.abs(t1) * 0.1, 0.5); }
    const pad = (t1 - t0) * 0.05;
    t0 -= pad; t1 += pad;
    const X = (x) => M.l + ((x - x0) / (x1 - x0)) * (W - M.l - M.r);
    const Y = (y) => {
      const f = (T(y) - t0) / (t1 - t0);
      return o.invertY ? M.t + f * (H - M.t - M.b) : H - M.b - f * (H - M.t - M.b);
    };
    const grid = s("g", { class: "grid" }), axis = s("g", { class: "axis" });
    // y ticks
    let yTicks;
    if (o.logY) {
      yTicks = [];
      for (let e = Math.floor(t0); e <= Math.ceil(t1); e++) if (e >= t0 && e <= t1) yTicks.push(Math.pow(10, e));
      if (yTicks.length < 2) yTicks = niceTicks(Math.pow(10, t0), Math.pow(10, t1), 4).filter((v) => v > 0);
    } else {
      yTicks = niceTicks(t0, t1, 5);
    }
    for (const v of yTicks) {
      const y = Y(v);
      if (y < M.t - 1 || y > H - M.b + 1) continue;
      grid.append(s("line", { x1: M.l, x2: W - M.r, y1: y, y2: y }));
      axis.append(s("text", { x: M.l - 6, y: y + 4, "text-anchor": "end" }, fmt(v)));
    }
    let xTicks = niceTicks(x0, x1, Math.min(12, Math.max(2, Math.round(x1 - x0))));
    if (o.integerX) xTicks = xTicks.filter((v) => Number.isInteger(v));
    for (const v of xTicks) {
      const x = X(v);
      grid.append(s("line", { x1: x, x2: x, y1: M.t, y2: H - M.b }));
      axis.append(s("text", { x, y: H - M.b + 15, "text-anchor": "middle" }, fmt(v)));
    }
    axis.append(s("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b }));
    axis.append(s("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b }));
    if (o.xLabel) axis.append(s("text", { x: (M.l + W - M.r) / 2, y: H - 6, "text-anchor": "middle" }, o.xLabel));
    if (o.yLabel) axis.append(s("text", { x: 12, y: (M.t + H - M.b) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(M.t + H - M.b) / 2})` }, o.yLabel));
    svg.append(grid, axis);
    for (const l of o.hlines || []) {
      if (!usable(l.y)) continue;
      svg.append(s("line", { x1: M.l, x2: W - M.r, y1: Y(l.y), y2: Y(l.y), stroke: l.color || "#888", "stroke-dasharray": "5 4" }));
      svg.append(s("text", { x: W - M.r - 4, y: Y(l.y) - 4, "text-anchor": "end" }, l.text || ""));
    }
    for (const m of o.markers || []) {
      const x = X(m.x);
      const line = s("line", { x1: x, x2: x, y1: M.t, y2: H - M.b, stroke: m.color || "#c62828", "stroke-width": 2, "stroke-dasharray": "3 3" });
      const flag = s("circle", { cx: x, cy: M.t + 4, r: 5, fill: m.color || "#c62828" });
      svg.append(line, flag);
      tip(line, m.text);
      tip(flag, m.text);
    }
    for (const se of series) {
      let d = "", pen = false;
      for (const [x, y] of se.points) {
        if (!usable(y) || !Number.isFinite(x)) { pen = false; continue; }
        d += (pen ? "L" : "M") + X(x).toFixed(1) + " " + Y(y).toFixed(1);
        pen = true;
      }
      const path = s("path", { d, fill: "none", stroke: se.color, "stroke-width": 1.8 });
      if (se.dashed) path.setAttribute("stroke-dasharray", "6 3");
      svg.append(path);
      for (const [x, y] of se.points) {
        if (!usable(y) || !Number.isFinite(x)) continue;
        const dot = s("circle", { cx: X(x).toFixed(1), cy: Y(y).toFixed(1), r: se.points.length > 200 ? 1.2 : 2.6, fill: se.color });
        tip(dot, `${se.name}\n${o.xLabel || "x"} ${fmt(x)}: ${fmt(y)}`);
        svg.append(dot);
      }
    }
    return svg;
  }

  // Grouped bars. categories: labels; groups: [{name, color, values}].
  function barPlot(categories, groups, o) {
    const W = o.width || 900, H = o.height || 280, M = { l: 64, r: 16, t: 14, b: 40 };
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
    const values = groups.flatMap((g) => g.values).filter(Number.isFinite);
    if (values.length === 0) {
      svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "nothing recorded"));
      return svg;
    }
    const top = Math.max(...values) * 1.08 || 1;
    const Y = (v) => H - M.b - (v / top) * (H - M.t - M.b);
    const band = (W - M.l - M.r) / categories.length;
    const bar = Math.max(1, (band * 0.8) / groups.length);
    const grid = s("g", { class: "grid" }), axis = s("g", { class: "axis" });
    for (const v of niceTicks(0, top, 5)) {
      grid.append(s("line", { x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v) }));
      axis.append(s("text", { x: M.l - 6, y: Y(v) + 4, "text-anchor": "end" }, fmt(v)));
    }
    const every = Math.ceil(categories.length / 30);
    categories.forEach((c, i) => {
      if (i % every === 0) axis.append(s("text", { x: M.l + band * (i + 0.5), y: H - M.b + 15, "text-anchor": "middle" }, c));
    });
    axis.append(s("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b }));
    if (o.xLabel) axis.append(s("text", { x: (M.l + W - M.r) / 2, y: H - 6, "text-anchor": "middle" }, o.xLabel));
    if (o.yLabel) axis.append(s("text", { x: 12, y: (M.t + H - M.b) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(M.t + H - M.b) / 2})` }, o.yLabel));
    svg.append(grid, axis);
    groups.forEach((g, gi) => {
      g.values.forEach((v, i) => {
        if (!Number.isFinite(v)) return;
        const x = M.l + band * i + band * 0.1 + bar * gi;
        const rect = s("rect", { x: x.toFixed(1), y: Y(v).toFixed(1), width: bar.toFixed(1), height: Math.max(0.5, H - M.b - Y(v)).toFixed(1), fill: g.color });
        tip(rect, `${g.name}\n${o.xLabel || ""} ${categories[i]}: ${fmt(v)}`);
        svg.append(rect);
      });
    });
    return svg;
  }

  // A sequential colour scale (viridis-like) for t in [0, 1].
  const STOPS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  function viridis(t) {
    if (!Number.isFinite(t)) return [236, 239, 244];
    const x = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
    const i = Math.min(STOPS.length - 2, Math.floor(x)), f = x - i;
    return STOPS[i].map((c, k) => Math.round(c + (STOPS[i + 1][k] - c) * f));
  }
  const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;

  // A heatmap on a canvas: value(r, c) in [0, 1] or NaN; labels on the axes.
  function heatmap(rows, cols, value, o) {
    const M = { l: 52, r: 10, t: 10, b: 36 };
    const cw = o.cellWidth, ch = o.cellHeight;
    const W = M.l + cols * cw + M.r, H = M.t + rows * ch + M.b;
    const canvas = h("canvas", { width: Math.ceil(W), height: Math.ceil(H) });
    canvas.style.width = Math.ceil(W) + "px";
    canvas.style.maxWidth = "100%";
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, W, H);
    // paint at one pixel per cell, then scale up without smoothing
    const cells = document.createElement("canvas");
    cells.width = cols;
    cells.height = rows;
    const cctx = cells.getContext("2d");
    const image = cctx.createImageData(cols, rows);
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const color = (o.color || viridis)(value(r, c));
        const k = (r * cols + c) * 4;
        image.data[k] = color[0]; image.data[k + 1] = color[1]; image.data[k + 2] = color[2]; image.data[k + 3] = 255;
      }
    }
    cctx.putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(cells, M.l, M.t, cols * cw, rows * ch);
    ctx.fillStyle = "#5d6678";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "right";
    const rowEvery = Math.max(1, Math.ceil(12 / ch));
    for (let r = 0; r < rows; r += rowEvery) ctx.fillText(o.rowLabel ? o.rowLabel(r) : String(r), M.l - 4, M.t + r * ch + ch / 2 + 4);
    ctx.textAlign = "center";
    const colEvery = Math.max(1, Math.ceil(24 / cw));
    for (let c = 0; c < cols; c += colEvery) ctx.fillText(String(c), M.l + c * cw + cw / 2, M.t + rows * ch + 13);
    if (o.xLabel) ctx.fillText(o.xLabel, M.l + (cols * cw) / 2, H - 6);
    if (o.yLabel) {
      ctx.save();
      ctx.translate(11, M.t + (rows * ch) / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(o.yLabel, 0, 0);
      ctx.restore();
    }
    const at = (e) => {
      const box = canvas.getBoundingClientRect();
      const scale = canvas.width / box.width;
      const x = (e.clientX - box.left) * scale - M.l, y = (e.clientY - box.top) * scale - M.t;
      const c = Math.floor(x / cw), r = Math.floor(y / ch);
      return r >= 0 && r < rows && c >= 0 && c < cols ? [r, c] : null;
    };
    if (o.hover) tip(canvas, (e) => { const p = at(e); return p ? o.hover(p[0], p[1]) : ""; });
    if (o.click) canvas.addEventListener("click", (e) => { const p = at(e); if (p) o.click(p[0], p[1]); });
    return canvas;
  }

  function select(options, selected, onchange) {
    const node = h("select", { onchange: (e) => onchange(e.target.value) },
      options.map(([value, label]) => {
        const option = h("option", { value }, label);
        if (String(value) === String(selected)) option.selected = true;
        return option;
      }));
    return node;
  }

  function table(head, rows) {
    return h("table", {}, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
  }

  const sections = document.getElementById("sections");
  const toc = document.getElementById("toc");
  function section(id, title, note) {
    const node = h("section", { id }, h("h2", {}, title), note ? h("p", { class: "note" }, note) : null);
    sections.append(node);
    toc.append(h("a", { href: "#" + id }, title));
    return node;
  }

  function plotBox(id) {
    return h("div", { class: "plot", id });
  }

  function replace(box, ...children) {
    box.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
  }

  // ---- the facts at the top ------------------------------------------------------------------

  const passes = DATA.passes;
  const anomalous = passes.filter((p) => p.anomalies.length > 0);
  (function facts() {
    const m = DATA.metadata || {};
    const extra = m.extra || {};
    const lines = [
      [["file", `${DATA.file} (${(DATA.bytes / 1e6).toFixed(1)} MB, ${DATA.writer})`]],
      [["recorded", new Date(DATA.started_unix_ms).toISOString().replace("T", " ").replace(/\..*/, " UTC")],
        ["passes", passes.length], ["layers", DATA.layers]],
      [["prompt", m.prompt], ["weights", m.weights], ["dtype", m.dtype], ["device", m.device]],
      Object.entries(extra).map(([k, v]) => [k, v]),
    ];
    const box = document.getElementById("facts");
    for (const line of lines) {
      const parts = line.filter(([, v]) => v !== undefined && v !== null && v !== "");
      if (parts.length === 0) continue;
      box.append(h("div", {}, parts.map(([k, v], i) => [i ? " · " : "", k + " ", h("b", {}, String(v))])));
    }
    if (anomalous.length) {
      const first = anomalous[0];
      box.append(h("div", { class: "warn" }, `${anomalous.length} pass${anomalous.length > 1 ? "es" : ""} with an anomaly; first: pass ${first.pass}, ${first.anomalies[0].description}`));
    } else if (DATA.stages.length) {
      box.append(h("div", { class: "ok" }, "no activation anomaly"));
    }
    if (DATA.cut_short) box.append(h("div", { class: "warn" }, `file cut short: ${DATA.cut_short}`));
    box.append(h("details", {}, h("summary", {}, "the tracer's summary"), h("pre", {}, DATA.summary_text)));
  })();

  const passLabel = (i) => {
    const p = passes[i];
    return `pass ${p.pass} (position ${p.position})${p.anomalies.length ? " ⚠ anomaly" : ""}`;
  };
  const shown = DATA.shown_passes;
  const shownNote = shown.length < passes.length
    ? ` ${shown.length} of the ${passes.length} passes can be chosen (the first, the anomalous, the last and evenly spaced others).`
    : "";
  let selectShownPass = null;

  // ---- through the layers ----------------------------------------------------------------------

  if (DATA.stages.length) {
    const sec = section("layers", "Through the layers",
      "Each recorded stage's statistics, layer by layer, for one pass; a red flag marks a layer that broke an anomaly rule (hover it)." + shownNote);
    const stats = f32(DATA.stats);
    const L = DATA.layers, S = DATA.stages.length;
    let stat = 3, at = anomalous.length ? Math.max(0, shown.indexOf(passes.indexOf(anomalous[0]))) : 0, log = true;
    const box = plotBox("layers-plot");
    const draw = () => {
      const series = DATA.stages.map((name, st) => ({
        name,
        color: PALETTE[st % PALETTE.length],
        points: Array.from({ length: L }, (_, layer) => [layer, stats[((at * L + layer) * S + st) * 4 + stat]]),
      }));
      const pass = passes[shown[at]];
      const markers = pass.anomalies.map((a) => ({ x: a.layer, text: a.description }));
      replace(box, linePlot(series, { xLabel: "layer", yLabel: DATA.stat_names[stat], logY: log && stat !== 0, integerX: true, markers }),
        legend(series.map((se) => [se.name, se.color])));
    };
    const passSelect = select(shown.map((i, k) => [k, passLabel(i)]), at, (v) => { at = Number(v); draw(); });
    selectShownPass = (passIndex) => {
      const k = shown.indexOf(passIndex);
      if (k < 0) return false;
      at = k; passSelect.value = String(k); draw();
      sec.scrollIntoView({ behavior: "smooth" });
      return true;
    };
    const logBox = h("input", { type: "checkbox", id: "layers-log", onchange: (e) => { log = e.target.checked; draw(); } });
    logBox.checked = true;
    sec.append(h("div", { class: "controls" },
      h("label", {}, "statistic ", select(DATA.stat_names.map((n, i) => [i, n]), stat, (v) => { stat = Number(v); draw(); })),
      h("label", {}, "pass ", passSelect),
      h("label", {}, logBox, " log scale (not for the mean)")), box);
    draw();
  }

  // ---- through the passes ------------------------------------------------------------------------

  if (DATA.stages.length && passes.length > 1) {
    const sec = section("passes", "Through the passes",
      "Every pass's layer outputs, one row per pass (log colour scale). Click a row to see that pass layer by layer, when it is one of those that can be chosen.");
    const norm = f32(DATA.output_norm), max = f32(DATA.output_max);
    const L = DATA.layers, P = passes.length;
    let which = "norm";
    const box = plotBox("passes-plot");
    const draw = () => {
      const values = which === "norm" ? norm : max;
      const positive = Array.from(values).filter((v) => v > 0 && Number.isFinite(v));
      const lo = Math.log10(Math.min(...positive)), hi = Math.log10(Math.max(...positive));
      const t = (v) => (v > 0 && Number.isFinite(v) ? (hi > lo ? (Math.log10(v) - lo) / (hi - lo) : 0.5) : NaN);
      const cellHeight = Math.max(1, Math.min(14, Math.floor(420 / P)));
      const cellWidth = Math.max(6, Math.floor(860 / L));
      const nonFinite = new Set();
      passes.forEach((p, i) => p.anomalies.forEach((a) => nonFinite.add(i * L + a.layer)));
      replace(box, heatmap(P, L, (r, c) => (nonFinite.has(r * L + c) && !(values[r * L + c] > 0) ? NaN : t(values[r * L + c])), {
        cellWidth, cellHeight,
        color: (v) => (Number.isNaN(v) ? [198, 40, 40] : viridis(v)),
        rowLabel: (r) => String(passes[r].pass),
        xLabel: "layer", yLabel: "pass",
        hover: (r, c) => `pass ${passes[r].pass} (position ${passes[r].position}), layer ${c}\noutput ${which === "norm" ? "l2 norm" : "max |x|"} ${fmt(values[r * L + c])}${passes[r].anomalies.length ? "\n⚠ " + passes[r].anomalies[0].description : ""}`,
        click: (r) => selectShownPass && selectShownPass(r),
      }), h("div", { class: "note" }, `colour: log10 of the output ${which === "norm" ? "l2 norm" : "max |x|"} from ${fmt(Math.pow(10, lo))} (dark) to ${fmt(Math.pow(10, hi))} (yellow); red: not finite or not recorded in an anomalous pass`));
    };
    sec.append(h("div", { class: "controls" }, h("label", {}, "output ", select([["norm", "l2 norm"], ["max", "max |x|"]], which, (v) => { which = v; draw(); }))), box);
    draw();
  }

  // ---- attention -----------------------------------------------------------------------------------

  if (DATA.attention) {
    const A = DATA.attention.analysis;
    const sec = section("attention", "Attention heads",
      `${A.rows} attention rows, ${A.heads.length} heads (${A.causal ? "causal" : "bidirectional"}). Left: what each head does; right: its mean normalized entropy (0: one key, 1: uniform). Click a head for its pattern.`);
    const layers = [...new Set(A.heads.map((x) => x.layer))].sort((a, b) => a - b);
    const H = Math.max(...A.heads.map((x) => x.head)) + 1;
    const byKey = new Map(A.heads.map((x) => [x.layer + "." + x.head, x]));
    const patterns = new Map(DATA.attention.patterns.map((p) => [p.layer + "." + p.head, p]));
    const describe = (x) => `layer ${x.layer} head ${x.head}: ${SPECIALIZATIONS[x.specialization][0]}${x.offset !== null && x.offset !== undefined ? ` (offset ${x.offset})` : ""}\nentropy ${fmt(x.entropy)} nats (normalized ${fmt(x.normalized_entropy)}), sparsity ${fmt(x.sparsity)}\nweight on key 0 ${fmt(x.sink_weight)}, on the previous key ${fmt(x.previous_token_weight)}, local ${fmt(x.local_mass)}\n${x.judged} of ${x.rows} rows judged`;
    const patternBox = plotBox("attention-pattern");
    const grid = (colour, id) => {
      const cell = 18, M = { l: 48, t: 22 };
      const W = M.l + H * cell + 8, Hh = M.t + layers.length * cell + 8;
      const svg = s("svg", { viewBox: `0 0 ${W} ${Hh}`, id, width: W, height: Hh, style: `width:${W}px` });
      for (let hd = 0; hd < H; hd += Math.ceil(H / 16)) svg.append(s("text", { x: M.l + hd * cell + cell / 2, y: M.t - 6, "text-anchor": "middle" }, "H" + hd));
      layers.forEach((layer, r) => {
        svg.append(s("text", { x: M.l - 6, y: M.t + r * cell + cell / 2 + 4, "text-anchor": "end" }, "L" + layer));
        for (let hd = 0; hd < H; hd++) {
          const x = byKey.get(layer + "." + hd);
          if (!x) continue;
          const rect = s("rect", { class: "grid-cell", x: M.l + hd * cell, y: M.t + r * cell, width: cell - 1, height: cell - 1, fill: colour(x) });
          tip(rect, describe(x));
          rect.addEventListener("click", () => showPattern(x));
          svg.append(rect);
        }
      });
      return svg;
    };
    const showPattern = (x) => {
      const p = patterns.get(x.layer + "." + x.head);
      const N = DATA.attention.pattern_size;
      const rows = Array.from({ length: N }, () => new Float32Array(N).fill(NaN));
      let seen = 0;
      if (p) {
        const bytes = bytesOf(p.rows);
        let k = 0;
        for (let q = 0; q < N && k < bytes.length; q++) {
          const n = bytes[k++];
          if (n > 0) { seen = q + 1; rows[q].fill(0); }
          for (let i = 0; i < n; i++) { rows[q][bytes[k]] = bytes[k + 1] / 255; k += 2; }
        }
      }
      const size = Math.max(1, seen);
      const cell = Math.min(24, Math.max(4, Math.floor(340 / size)));
      replace(patternBox, h("h3", {}, `layer ${x.layer} head ${x.head}: ${SPECIALIZATIONS[x.specialization][0]}`),
        heatmap(size, size, (r, c) => rows[r][c], {
          cellWidth: cell, cellHeight: cell, xLabel: "key", yLabel: "query",
          color: (v) => (Number.isNaN(v) ? [255, 255, 255] : [Math.round(255 - 224 * Math.sqrt(v)), Math.round(255 - 160 * Math.sqrt(v)), Math.round(255 - 64 * Math.sqrt(v))]),
          hover: (r, c) => `query ${r}, key ${c}: ${Number.isNaN(rows[r][c]) ? "not kept" : fmt(rows[r][c])}`,
        }),
        h("div", { class: "note" }, `the first ${size} queries and keys, from the first pass that recorded each query; white: not kept (below the record's top-k or threshold); colour ∝ √weight`));
    };
    const specGrid = grid((x) => SPECIALIZATIONS[x.specialization][1], "attention-grid");
    const entropyGrid = grid((x) => rgb(viridis(x.normalized_entropy)), "attention-entropy");
    const pick = A.heads.find((x) => x.specialization === "previous_token") || A.heads.find((x) => x.specialization !== "first_token_sink") || A.heads[0];
    sec.append(legend(Object.values(SPECIALIZATIONS).filter(([name]) => A.heads.some((x) => SPECIALIZATIONS[x.specialization][0] === name))),
      h("div", { class: "row", id: "attention-grids" }, specGrid, entropyGrid, patternBox));
    showPattern(pick);
    const counts = {};
    A.heads.forEach((x) => { counts[x.specialization] = (counts[x.specialization] || 0) + 1; });
    sec.append(h("h3", {}, "Layer patterns"),
      table(["layer", "heads", "diagonal offset", "vertical columns", "block", "repetitive", "norm. entropy", "weight on key 0", "max weight"],
        A.layers.map((l) => [l.layer, l.heads, l.diagonal_offset === null ? "–" : (l.diagonal_offset > 0 ? "+" : "") + l.diagonal_offset,
          l.vertical_columns.length ? l.vertical_columns.slice(0, 6).join(", ") + (l.vertical_columns.length > 6 ? ", …" : "") : "–",
          fmt(l.block_share), fmt(l.repetitive_share), fmt(l.normalized_entropy), fmt(l.sink_weight), fmt(l.max_weight)])));
    // Two first-token sinks attend alike by definition: the other pairs come first.
    const sinkPair = (p) => [0, 1].every((i) => byKey.get(p.layer + "." + p.heads[i]).specialization === "first_token_sink");
    const others = A.redundant.filter((p) => !sinkPair(p)), sinkPairs = A.redundant.length - others.length;
    const pairs = others.concat(A.redundant.filter(sinkPair)).slice(0, 16);
    sec.append(h("h3", {}, `Redundant pairs (${A.redundant.length}${sinkPairs ? `, ${sinkPairs} of them between first-token sinks` : ""})`),
      pairs.length ? table(["layer", "heads", "similarity", "what they do"], pairs.map((p) => {
        const a = byKey.get(p.layer + "." + p.heads[0]), b = byKey.get(p.layer + "." + p.heads[1]);
        return [p.layer, `H${p.heads[0]} ~ H${p.heads[1]}`, fmt(p.similarity), `${SPECIALIZATIONS[a.specialization][0]} / ${SPECIALIZATIONS[b.specialization][0]}`];
      })) : h("p", { class: "note" }, "none: no two heads of a layer put ≥ 90% of their mass in the same places"),
      A.redundant.length > pairs.length ? h("p", { class: "note" }, `and ${A.redundant.length - pairs.length} more (model-trace summary --json lists them all)`) : "");
    sec.append(h("details", {}, h("summary", {}, "how heads are judged"), h("p", { class: "note" },
      "A row is judged against the keys it could see (keys 0..q for causal attention) and only if it saw at least 4. Per head, over its judged rows, the first rule met: first-token sink (mean weight on key 0 ≥ 0.5 and ≥ 3× the uniform share), previous-token (mean weight on key q−1 ≥ 0.5), positional (one argmax offset, other than −1, in ≥ 70% of rows), local window (mean mass within 2 keys of the query ≥ 0.7), broad (mean normalized entropy ≥ 0.8), else mixed. Redundant: mean overlap Σ min(w₁, w₂) ≥ 0.9 over rows of the same query.")));
  }

  // ---- logit evolution ---------------------------------------------------------------------------

  const withLogits = shown.map((i, k) => [i, k]).filter(([, k]) => DATA.logits[k]);
  if (withLogits.length) {
    const sec = section("logits", "Logit evolution",
      "The rank of the tracked tokens (by default the final top 5) at each layer that recorded logits: with a logit lens, where the model makes up its mind.");
    let k = withLogits[0][1];
    const box = plotBox("logits-plot");
    const draw = () => {
      const ev = DATA.logits[k];
      const series = ev.tracked_tokens.map((t, i) => ({
        name: `token ${t.token_id}${t.token_text ? ` “${t.token_text}”` : ""}`,
        color: PALETTE[i % PALETTE.length],
        points: t.layers.map((layer, j) => [layer, t.ranks_by_layer[j] + 1]),
      }));
      const layersRecorded = new Set(ev.tracked_tokens.flatMap((t) => t.layers)).size;
      const markers = ev.decisive_layer !== null && ev.decisive_layer !== undefined ? [{ x: ev.decisive_layer, text: `decisive layer ${ev.decisive_layer}: from here on the predicted token stays first`, color: "#2e7d32" }] : [];
      replace(box, linePlot(series, { xLabel: "layer", yLabel: "rank (1 = top)", logY: true, invertY: true, integerX: true, markers, xDomain: layersRecorded === 1 ? [0, DATA.layers] : undefined }),
        legend(series.map((se) => [se.name, se.color])),
        layersRecorded === 1 ? h("p", { class: "note" }, "Only the final logits were recorded. Record the logit lens (trace_logits_value!(&lens, layer = i); `--logit-lens` in examples/smollm) to see the ranks through the layers.") : null,
        table(["token", "final rank", "final logit"], ev.tracked_tokens.map((t) => [`${t.token_id}${t.token_text ? ` “${t.token_text}”` : ""}`, t.ranks_by_layer[t.ranks_by_layer.length - 1] + 1, fmt(t.logits_by_layer[t.logits_by_layer.length - 1])])));
    };
    sec.append(h("div", { class: "controls" }, h("label", {}, "pass ", select(withLogits.map(([i, kk]) => [kk, passLabel(i)]), k, (v) => { k = Number(v); draw(); }))), box);
    draw();
  }

  // ---- quantization ------------------------------------------------------------------------------

  if (DATA.quant.length) {
    const sec = section("quantization", "Quantization error",
      "Each quantized site against its full-precision reference, layer by layer over every pass: SNR (higher is better) and the worst cosine similarity.");
    const sites = [...new Set(DATA.quant.map((q) => q.site))];
    const series = (field, dashed) => sites.map((site, i) => ({
      name: `${site} ${field.startsWith("snr_min") || field === "cosine_min" ? "(worst)" : "(mean)"}`,
      color: PALETTE[i % PALETTE.length], dashed,
      points: DATA.quant.filter((q) => q.site === site).map((q) => [q.layer, q[field]]),
    }));
    const snr = series("snr_mean_db", false).concat(series("snr_min_db", true));
    const cosine = sites.map((site, i) => ({
      name: site, color: PALETTE[i % PALETTE.length],
      points: DATA.quant.filter((q) => q.site === site).map((q) => [q.layer, 1 - q.cosine_min]),
    }));
    sec.append(h("div", { class: "row" },
      h("div", { class: "plot", id: "quant-snr" }, linePlot(snr, { xLabel: "layer", yLabel: "SNR (dB)", integerX: true, width: 560 }), legend(snr.map((x) => [x.name, x.color, x.dashed]))),
      h("div", { class: "plot", id: "quant-cosine" }, linePlot(cosine, { xLabel: "layer", yLabel: "1 − worst cosine", logY: true, integerX: true, width: 560 }), legend(cosine.map((x) => [x.name, x.color])))));
    const bySite = sites.map((site) => {
      const rows = DATA.quant.filter((q) => q.site === site);
      const n = rows.reduce((a, q) => a + q.count, 0);
      return [site, rows[0].quant_type, n, fmt(rows.reduce((a, q) => a + q.cosine_mean * q.count, 0) / n), fmt(Math.min(...rows.map((q) => q.cosine_min))),
        fmt(Math.min(...rows.map((q) => q.snr_min_db))), rows.reduce((a, q) => a + q.non_finite, 0)];
    });
    sec.append(table(["site", "type", "records", "cosine (mean)", "cosine (worst)", "SNR worst (dB)", "non-finite"], bySite));
  }

  // ---- KV cache --------------------------------------------------------------------------------

  if (DATA.kv.length) {
    const sec = section("kv", "KV cache", "What the cache holds after each pass: positions (the most of any layer) against capacity, and every layer's cache together.");
    const positions = [{ name: "positions held", color: PALETTE[0], points: DATA.kv.map((k) => [k.pass, k.positions]) },
      { name: "capacity", color: PALETTE[7], dashed: true, points: DATA.kv.map((k) => [k.pass, k.capacity]) }];
    const memory = [{ name: "all layers (MiB)", color: PALETTE[1], points: DATA.kv.map((k) => [k.pass, mib(k.bytes)]) }];
    const evictions = DATA.kv.reduce((a, k) => a + k.evictions, 0);
    sec.append(h("div", { class: "row" },
      h("div", { class: "plot", id: "kv-positions" }, linePlot(positions, { xLabel: "pass", yLabel: "positions", integerX: true, width: 560 }), legend(positions.map((x) => [x.name, x.color, x.dashed]))),
      h("div", { class: "plot", id: "kv-memory" }, linePlot(memory, { xLabel: "pass", yLabel: "MiB", integerX: true, width: 560 }), legend(memory.map((x) => [x.name, x.color])))),
    h("p", { class: "note" }, `${evictions} evictions over ${DATA.kv.length} passes.`));
  }

  // ---- time ----------------------------------------------------------------------------------------

  if (DATA.layer_ms.length || passes.length) {
    const sec = section("time", "Time", "Wall time per layer call and per pass, tracing's own work included (small with summaries only; capture and quantization records cost more).");
    const cats = DATA.layer_ms.map((t) => String(t.layer));
    const groups = [{ name: "first pass", color: PALETTE[0], values: DATA.layer_ms.map((t) => t.first_ms) }];
    if (passes.length > 1) groups.push({ name: "other passes (mean)", color: PALETTE[1], values: DATA.layer_ms.map((t) => t.rest_mean_ms) });
    const perPass = [{ name: "pass", color: PALETTE[2], points: passes.map((p) => [p.pass, p.ms]) }];
    sec.append(h("div", { class: "row" },
      h("div", { class: "plot", id: "time-layers" }, barPlot(cats, groups, { xLabel: "layer", yLabel: "ms per call", width: 560 }), legend(groups.map((g) => [g.name, g.color]))),
      h("div", { class: "plot", id: "time-passes" }, linePlot(perPass, { xLabel: "pass", yLabel: "ms", integerX: true, logY: true, width: 560 }), legend(perPass.map((x) => [x.name, x.color])))));
  }

  // ---- routers ---------------------------------------------------------------------------------------

  if (DATA.routers.length) {
    const R = DATA.routers;
    const experts = Math.max(...R.map((l) => l.load.length));
    // Each cell: the expert's tokens over the layer's mean per expert (1: an even share).
    const ratio = (l, e) => {
      const total = l.load.reduce((a, n) => a + n, 0);
      return e < l.load.length && total > 0 ? l.load[e] / (total / l.load.length) : NaN;
    };
    const ratios = R.flatMap((l) => Array.from({ length: experts }, (_, e) => ratio(l, e))).filter(Number.isFinite);
    const hi = Math.max(1, ...ratios);
    const calls = R.reduce((a, l) => a + l.calls, 0);
    const sec = section("routers", "Expert load",
      `Tokens each router sent to each expert, over its ${calls} calls: each cell is the expert's tokens over the layer's mean per expert (1: an even share; 0: idle). Imbalance: the busiest expert's share over the mean.`);
    sec.append(h("div", { class: "plot", id: "routers-load" },
      heatmap(R.length, experts, (r, c) => ratio(R[r], c) / hi, {
        cellWidth: Math.max(4, Math.min(28, Math.floor(860 / experts))), cellHeight: Math.max(6, Math.min(22, Math.floor(420 / R.length))),
        color: (v) => (Number.isNaN(v) ? [235, 235, 235] : viridis(v)),
        rowLabel: (r) => String(R[r].layer),
        xLabel: "expert", yLabel: "layer",
        hover: (r, c) => `layer ${R[r].layer}, expert ${c}: ${R[r].load[c] ?? 0} tokens, ${fmt(ratio(R[r], c))}× the mean (imbalance ${fmt(R[r].imbalance)})`,
      }),
      h("div", { class: "note" }, `colour: tokens over the layer's mean from 0 (dark) to ${fmt(hi)} (yellow); grey: no such expert in that layer`)));
    const wrong = R.filter((l) => l.not_top_k > 0);
    if (wrong.length) {
      sec.append(h("p", { class: "warn", id: "routers-not-top-k" },
        wrong.map((l) => `layer ${l.layer}: ${l.not_top_k} of ${l.tokens} tokens chose experts that are not the top-${l.top_k} of their own scores (margin < 0)`).join("; ") +
        ": the router's chosen indices do not follow its logits."));
    }
    sec.append(table(["layer", "calls", "tokens", "experts", "top-k", "imbalance", "idle experts", "margin < 0", "narrowest margin"],
      R.map((l) => [l.layer, l.calls, l.tokens, l.num_experts, l.top_k, fmt(l.imbalance), l.idle_experts, l.not_top_k,
        l.narrowest.length ? `${fmt(l.narrowest[0].margin)} (${l.narrowest[0].pass !== null ? `pass ${l.narrowest[0].pass}, ` : ""}row ${l.narrowest[0].row})` : "–"])));
  }

  // ---- patching ------------------------------------------------------------------------------------

  if (DATA.patching) {
    const P = DATA.patching;
    const probs = f32(P.probs);
    const finite = Array.from(probs).filter(Number.isFinite);
    const lo = Math.min(...finite, P.unpatched ?? Infinity), hi = Math.max(...finite);
    const t = (v) => (Number.isFinite(v) ? (hi > lo ? (v - lo) / (hi - lo) : 0.5) : NaN);
    const token = (r) => (P.tokens[r] !== undefined ? `${JSON.stringify(P.tokens[r])} (${r})` : String(r));
    const answer = P.answer !== null ? `${JSON.stringify(P.answer)} (${P.token})` : String(P.token);
    const sec = section("patching", "Activation patching",
      `Each cell is a run that changed one layer's tensor at one token position (the first: ${P.intervention}), and the probability of token ${answer} it ended with` +
      (P.unpatched !== null ? `; unpatched: ${fmt(P.unpatched)}.` : ".") +
      " Where patching restores the probability, that layer at that position carries what decides the answer.");
    const cellWidth = Math.max(8, Math.floor(860 / P.layers));
    sec.append(h("div", { class: "plot", id: "patching-plot" },
      heatmap(P.positions, P.layers, (r, c) => t(probs[r * P.layers + c]), {
        cellWidth, cellHeight: 22,
        color: (v) => (Number.isNaN(v) ? [235, 235, 235] : viridis(v)),
        rowLabel: (r) => (P.tokens[r] !== undefined ? P.tokens[r].slice(0, 8) : String(r)),
        xLabel: "layer", yLabel: "position",
        hover: (r, c) => `layer ${c}, position ${token(r)}\nprobability of ${answer}: ${fmt(probs[r * P.layers + c])}`,
      }),
      h("div", { class: "note" }, `colour: probability from ${fmt(lo)} (dark) to ${fmt(hi)} (yellow); grey: not patched`)));
  }

  // ---- diff ----------------------------------------------------------------------------------------

  if (DATA.diff) {
    const D = DATA.diff;
    const sec = section("diff", "Against the reference",
      `This trace compared with ${D.reference}: each tensor's error over what the tolerance allows (above 1: out of tolerance), layer by layer in pass ${D.curve_pass}, and the worst of each pass.`);
    const series = D.stages.map((name, i) => ({ name, color: PALETTE[i % PALETTE.length], points: D.ratios[i].map((r, layer) => [layer, r]) }));
    const markers = D.first && D.first.pass === D.curve_pass ? [{ x: D.first.layer, text: `first divergence: pass ${D.first.pass}, layer ${D.first.layer}, ${D.first.stage}` }] : [];
    const perPass = [{ name: "worst ratio", color: PALETTE[3], points: D.passes.map((p) => [p.pass, p.worst_ratio]) }];
    // With a floor: each tensor's error (the least rtol at which it is close to the reference),
    // this trace's solid and the floor's dashed in its stage's colour, and their ratio.
    const floor = [];
    if (D.floor) {
      const F = D.floor, color = (i) => PALETTE[i % PALETTE.length];
      const errors = D.stages.flatMap((name, i) => [
        { name, color: color(i), points: F.rtols[i].map((r, layer) => [layer, r]) },
        { name: `${name} (floor)`, color: color(i), dashed: true, points: F.floor_rtols[i].map((r, layer) => [layer, r]) }]);
      const overFloor = D.stages.map((name, i) => ({ name, color: color(i), points: F.rtols[i].map((r, layer) => {
        const f = F.floor_rtols[i][layer];
        return [layer, r !== null && f !== null && f !== undefined && f > 0 ? r / f : null];
      }) }));
      floor.push(h("p", {}, `Against the floor ${F.path}: each tensor's error is the smallest rtol at which it is close to the reference (≈ where summaries bound it), this trace's solid and the floor's dashed; each tensor is allowed the larger of the given rtol and ${F.factor} times the floor's.`),
        h("div", { class: "row" },
          h("div", { class: "plot", id: "diff-floor" }, linePlot(errors, { xLabel: "layer", yLabel: "error (least rtol)", logY: true, integerX: true, markers, width: 560, empty: "no error above 0" }), legend(D.stages.map((name, i) => [name, color(i)]).concat([["the floor", "#555", true]]))),
          h("div", { class: "plot", id: "diff-floor-ratio" }, linePlot(overFloor, { xLabel: "layer", yLabel: "error / the floor's", logY: true, integerX: true, markers, hlines: [{ y: F.factor, text: `${F.factor}× the floor's`, color: "#c62828" }], width: 560, empty: "no floor error above 0" }), legend(overFloor.map((x) => [x.name, x.color])))));
    }
    // With a quantized run: per layer, its largest total error, its largest quantization part
    // and its largest logic part (each of its own stage: a logic bug in one stage is not hidden
    // by the quantization of another).
    const split = [];
    if (D.split) {
      const S = D.split, perLayer = (values) => values.map((v, layer) => [layer, v]);
      // The total last and dashed: where one part dominates it lies on that part's curve.
      const parts = [
        { name: "largest quantization (quantized − this)", color: PALETTE[1], points: perLayer(S.quantization) },
        { name: "largest logic (this − reference)", color: PALETTE[2], points: perLayer(S.logic) }];
      if (S.quant_records.some((v) => v !== null)) {
        parts.push({ name: "quantization records (worst)", color: PALETTE[4], dashed: true, points: perLayer(S.quant_records) });
      }
      parts.push({ name: "largest total (quantized − reference)", color: PALETTE[0], dashed: true, points: perLayer(S.total) });
      split.push(h("p", {}, `The error split against the quantized run ${S.quantized}, pass ${D.curve_pass}: per layer, the largest total error, the largest quantization part and the largest logic part of its stages (each stage's own), ‖·‖ / ‖reference‖${S.exact ? "" : " (some estimated from the sketches)"}; a stage's total is the sum of its two parts as vectors, and a logic part above float rounding is the port's own.`),
        h("div", { class: "plot", id: "diff-split" }, linePlot(parts, { xLabel: "layer", yLabel: "‖·‖ / ‖reference‖", logY: true, integerX: true, markers, width: 900, empty: "no error above 0" }), legend(parts.map((x) => [x.name, x.color, x.dashed]))));
    }
    sec.append(h("p", { class: D.first ? "warn" : "ok", id: "diff-verdict" }, D.first ? `first divergence: pass ${D.first.pass}, layer ${D.first.layer}, ${D.first.stage}` : "no divergence: every matched tensor is within tolerance"),
      h("div", { class: "row" },
        h("div", { class: "plot", id: "diff-layers" }, linePlot(series, { xLabel: "layer", yLabel: "error / allowed", logY: true, integerX: true, markers, hlines: [{ y: 1, text: "tolerance", color: "#c62828" }], width: 560, empty: "every tensor bit-identical" }), legend(series.map((x) => [x.name, x.color]))),
        h("div", { class: "plot", id: "diff-passes" }, linePlot(perPass, { xLabel: "pass", yLabel: "worst error / allowed", logY: true, integerX: true, hlines: [{ y: 1, text: "tolerance", color: "#c62828" }], width: 560, empty: "every tensor bit-identical" }))),
      ...floor,
      ...split,
      h("details", { open: "" }, h("summary", {}, "the diff"), h("pre", {}, D.text)));
    if (D.first_token) {
      const T = D.first_token;
      const verdict = { near_tie: "a near-tie (the flip is within the other's logit error)", divergence: "a divergence", unknown: "not judged (the final logits were not compared)" }[T.verdict];
      const lens = T.decisive_layer !== null && T.decisive_layer !== undefined ? `; this trace's logit lens prefers its token from layer ${T.decisive_layer} on` : "";
      sec.querySelector("#diff-verdict").after(h("p", { class: T.verdict === "near_tie" ? "ok" : "warn", id: "diff-first-token" }, `first token divergence: ${T.headline}: ${verdict}${lens}`));
    }
  }
})();

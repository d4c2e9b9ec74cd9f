/* FecomCharts: the small SVG charts of fecomlite's report (and its live view). No dependencies,
 * nothing loaded from the network. Every string from the measured program is set with
 * textContent, never parsed as HTML.
 *
 *   FecomCharts.bars(host, {series, items, unit})            stacked horizontal bars
 *   FecomCharts.timeline(host, {series, memory, lanes, marks, range})
 *                                                             power, memory and call spans over time
 *   FecomCharts.scatter(host, {series, points, xUnit, yUnit}) log-log points
 *   FecomCharts.lines(host, {series, xUnit, yUnit, xLog, yLog, vlines})
 *                                                             x-y lines and markers; optional log
 *                                                             axes and labelled vertical lines {x, label}
 *   FecomCharts.fmt(value, unit)                              the report's number format
 *
 * Each returns {draw()}; charts redraw themselves when their host is resized.
 */
(function (global) {
  "use strict";

  // The SVG namespace, taken from an element the HTML parser made, so no URL appears in the page.
  const NS = (function () {
    const probe = document.createElement("div");
    probe.innerHTML = "<svg></svg>";
    return probe.firstChild.namespaceURI;
  })();

  // -- numbers (the same rules as fecomlite/analysis/units.py) ---------------------------------

  const SCALES = {
    J: [["µJ", 1e-6], ["mJ", 1e-3], ["J", 1], ["kJ", 1e3], ["MJ", 1e6]],
    W: [["mW", 1e-3], ["W", 1], ["kW", 1e3]],
    s: [["ns", 1e-9], ["µs", 1e-6], ["ms", 1e-3], ["s", 1]],
    B: [["B", 1], ["kB", 1e3], ["MB", 1e6], ["GB", 1e9], ["TB", 1e12]],
  };

  function sig3(v) {
    const r = Number(Number(v).toPrecision(3));
    if (r === 0) return "0";
    const digits = Math.max(0, 2 - Math.floor(Math.log10(Math.abs(r))));
    return r.toFixed(digits);
  }

  function fmt(v, unit, signed) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const sign = signed && v > 0 ? "+" : "";
    if (unit === "%") {
      const pct = v * 100;
      if (pct !== 0 && Math.abs(pct) < 0.01) return "≈ 0 %";  // as units.percent
      return sign + (Math.abs(pct) < 100 ? sig3(pct) : pct.toFixed(0)) + " %";
    }
    if (unit === "s" && Math.abs(v) >= 120) {
      return sign + (Math.abs(v) >= 7200 ? sig3(v / 3600) + " h" : sig3(v / 60) + " min");
    }
    const scale = SCALES[unit];
    if (!scale) return sign + sig3(v) + (unit ? " " + unit : "");
    if (v === 0) return "0 " + unit;
    if (Math.abs(v) < scale[0][1] * 1e-3) return "0 " + unit;  // rounding residue, as units.scaled
    let name = scale[0][0], factor = scale[0][1];
    for (const [n, f] of scale) {
      if (Math.abs(v) >= f * 0.9995) { name = n; factor = f; }
    }
    return sign + sig3(v / factor) + " " + name;
  }

  // -- SVG and DOM helpers -------------------------------------------------------------------

  function svgEl(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function svgText(parent, x, y, str, attrs) {
    const t = svgEl("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = str;
    return t;
  }

  function htmlEl(tag, cls, parent, str) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (str !== undefined) e.textContent = str;
    if (parent) parent.appendChild(e);
    return e;
  }

  // Keeps the end of a dotted name, whole components ("…Tensor.backward"): the end says which API
  // it is, where a kept start would read as another ("torch.nn.functional.nll_loss…"). A
  // component that does not fit loses its middle ("Sparse…entropy"), never an end.
  function clip(str, max) {
    if (str.length <= max) return str;
    const parts = str.split(".");
    let out = parts.pop();
    while (parts.length && out.length + parts[parts.length - 1].length + 2 <= max) {
      out = parts.pop() + "." + out;
    }
    if (!parts.length) return clipMiddle(out, max);
    if (out.length >= max) return "…" + clipMiddle(out, max - 1);
    const room = max - out.length - 3;  // "…" + owner + "." + out
    if (!out.includes(".") && room >= 5) out = clipMiddle(parts.pop(), room) + "." + out;
    return "…" + out;
  }

  function clipMiddle(str, max) {
    if (str.length <= max) return str;
    const keep = Math.max(2, max - 1), head = Math.ceil(keep / 2);
    return str.slice(0, head) + "…" + str.slice(str.length - (keep - head));
  }

  function legend(host, series) {
    const box = htmlEl("div", "fc-legend", host);
    for (const s of series) {
      const item = htmlEl("span", "fc-legend-item", box);
      const sw = htmlEl("span", "fc-swatch" + (s.dash ? " fc-dash" : ""), item);
      sw.style.background = s.color;
      htmlEl("span", "", item, s.label);
    }
    return box;
  }

  function tooltip(host) {
    const tip = htmlEl("div", "fc-tip", host);
    tip.hidden = true;
    return {
      show(px, py, lines) {
        tip.replaceChildren();
        for (const line of lines) {
          const row = htmlEl("div", line.head ? "fc-tip-head" : "fc-tip-row", tip);
          if (line.color) htmlEl("span", "fc-swatch", row).style.background = line.color;
          htmlEl("span", "", row, line.text);
        }
        tip.hidden = false;
        const w = tip.offsetWidth, h = tip.offsetHeight, W = host.clientWidth;
        let x = px + 14;
        if (x + w > W) x = Math.max(0, px - w - 14);
        tip.style.left = x + "px";
        tip.style.top = Math.max(0, py - h - 8) + "px";
      },
      hide() { tip.hidden = true; },
    };
  }

  function frame(host, cls) {
    host.replaceChildren();
    host.classList.add("fc-host", cls);
    return host;
  }

  function onResize(host, draw) {
    if (typeof ResizeObserver === "undefined") return;
    let width = host.clientWidth, pending = false;
    new ResizeObserver(() => {
      if (pending || host.clientWidth === width) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; width = host.clientWidth; draw(); });
    }).observe(host);
  }

  function empty(host, message) {
    htmlEl("div", "fc-empty", host, message);
    return { draw() {} };
  }

  // -- scales and ticks ----------------------------------------------------------------------

  function linear(d0, d1, r0, r1) {
    const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
    const f = (v) => r0 + (v - d0) * k;
    f.invert = (p) => (k === 0 ? d0 : d0 + (p - r0) / k);
    return f;
  }

  function logScale(d0, d1, r0, r1) {
    const l0 = Math.log10(d0), l1 = Math.log10(d1);
    const k = l1 === l0 ? 0 : (r1 - r0) / (l1 - l0);
    const f = (v) => r0 + (Math.log10(v) - l0) * k;
    f.invert = (p) => Math.pow(10, k === 0 ? l0 : l0 + (p - r0) / k);
    return f;
  }

  function ticks(lo, hi, n) {
    if (!(hi > lo)) hi = lo + 1;
    const raw = (hi - lo) / Math.max(1, n);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const e = raw / mag;
    const step = (e >= 7.5 ? 10 : e >= 3.5 ? 5 : e >= 1.5 ? 2 : 1) * mag;
    const out = [];
    for (let i = Math.ceil(lo / step); i * step <= hi + step * 1e-9; i++) out.push(i * step);
    return out;
  }

  function logTicks(lo, hi) {
    // Decades when the range spans several; 1-2-5 steps on a narrow one; plain ticks if less.
    for (const steps of [[1], [1, 2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]) {
      const out = [];
      for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
        for (const m of steps) {
          const v = m * Math.pow(10, e);
          if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
        }
      }
      if (out.length >= 3) return out;
    }
    return ticks(lo, hi, 3).filter((v) => v > 0);
  }

  function upperBound(arr, v) {  // first index with arr[i] > v
    let lo = 0, hi = arr.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (arr[mid] <= v) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  function tick(v, unit) {
    return fmt(v, unit).replace(/\.0+(?= )/, "").replace(/(\.\d*?)0+(?= )/, "$1");
  }

  // Labels of a linear axis share one unit prefix, chosen by the largest tick (0, 0.5, 1 GB),
  // and long time spans count minutes or hours on round steps.
  function axisLabels(values, unit) {
    const scale = SCALES[unit];
    if (!scale || !values.length) return values.map((v) => tick(v, unit));
    const big = Math.max.apply(null, values.map(Math.abs));
    let name = scale[0][0], factor = scale[0][1];
    if (unit === "s" && big >= 120) { name = big >= 7200 ? "h" : "min"; factor = big >= 7200 ? 3600 : 60; }
    else for (const [n, f] of scale) if (big >= f * 0.9995) { name = n; factor = f; }
    return values.map((v) => (v === 0 ? "0" : String(Number((v / factor).toPrecision(6)))) + " " + name);
  }

  function linearTicks(lo, hi, n, unit) {
    const span = Math.max(Math.abs(lo), Math.abs(hi));
    if (unit === "s" && span >= 120) {  // round minutes (or hours), not 50 s steps shown as 0.833 min
      const f = span >= 7200 ? 3600 : 60;
      return ticks(lo / f, hi / f, n).map((v) => v * f);
    }
    return ticks(lo, hi, n);
  }

  function xAxis(g, scale, values, y, unit, x0, x1, log) {
    svgEl("line", { x1: x0, x2: x1, y1: y, y2: y, class: "fc-axis" }, g);
    let last = -Infinity;
    const labels = log ? values.map((v) => tick(v, unit)) : axisLabels(values, unit);
    for (let i = 0; i < values.length; i++) {
      const v = values[i], x = scale(v), label = labels[i];
      svgEl("line", { x1: x, x2: x, y1: y, y2: y + 4, class: "fc-axis" }, g);
      if (x - last < label.length * 7 + 8) continue;  // would overlap the previous label
      svgText(g, x, y + 16, label, { class: "fc-tick", "text-anchor": "middle" });
      last = x;
    }
  }

  function yAxis(g, scale, values, x, unit, width, log) {
    const labels = log ? values.map((v) => tick(v, unit)) : axisLabels(values, unit);
    values.forEach((v, i) => {
      const y = scale(v);
      svgEl("line", { x1: x, x2: x + width, y1: y, y2: y, class: "fc-grid" }, g);
      svgText(g, x - 6, y + 4, labels[i], { class: "fc-tick", "text-anchor": "end" });
    });
  }

  // -- bars: stacked horizontal bars, one row per item ---------------------------------------

  function bars(host, data) {
    frame(host, "fc-bars");
    const series = data.series || [], items = data.items || [];
    if (!items.length) return empty(host, data.empty || "nothing to show");
    legend(host, series);
    const wrap = htmlEl("div", "fc-plot", host);
    const tip = tooltip(host);
    const grouped = data.mode === "grouped";  // one bar per series side by side, not stacked
    const barH = grouped ? 9 : 16;
    const rowH = grouped ? 8 + barH * series.length : 24, top = 26, bottom = 8;

    function draw() {
      wrap.replaceChildren();
      const W = Math.max(320, wrap.clientWidth || host.clientWidth || 640);
      const left = Math.min(Math.round(W * 0.34), 260), right = 140;
      const H = top + rowH * items.length + bottom;
      const svg = svgEl("svg", { width: W, height: H, class: "fc-svg" }, wrap);
      let max = 0;
      for (const it of items) {
        let sum = 0;
        for (const s of series) {
          const v = Math.max(0, it.values[s.key] || 0);
          sum = grouped ? Math.max(sum, v) : sum + v;
        }
        it._sum = sum;
        max = Math.max(max, sum);
      }
      const x = linear(0, max > 0 ? max * 1.04 : 1, left, W - right);
      const g = svgEl("g", {}, svg);
      const tv = ticks(0, max > 0 ? max * 1.04 : 1, Math.max(2, Math.floor((W - left - right) / 90)));
      const tl = axisLabels(tv, data.unit);
      tv.forEach((v, i) => {
        svgEl("line", { x1: x(v), x2: x(v), y1: top - 4, y2: H - bottom, class: "fc-grid" }, g);
        svgText(g, x(v), top - 10, tl[i], { class: "fc-tick", "text-anchor": "middle" });
      });
      const maxChars = Math.floor((left - 12) / 6.6);
      items.forEach((it, i) => {
        const y = top + i * rowH;
        const label = svgText(g, left - 8, y + rowH / 2 + 4, clip(it.label, maxChars),
          { class: "fc-label", "text-anchor": "end" });
        label.appendChild(svgEl("title", {})).textContent = it.label;
        let acc = 0;
        series.forEach((s, k) => {
          const v = Math.max(0, it.values[s.key] || 0);
          if (v <= 0) return;
          const x0 = x(grouped ? 0 : acc), x1 = x(grouped ? v : acc + v);
          const rect = svgEl("rect", {
            x: x0, y: grouped ? y + 4 + k * barH : y + 4, width: Math.max(1, x1 - x0),
            height: grouped ? barH - 1 : rowH - 8, fill: s.color, class: "fc-bar",
          }, g);
          rect.addEventListener("mousemove", (ev) => {
            const r = host.getBoundingClientRect();
            const lines = [{ text: it.label, head: true }];
            for (const z of series) {
              if (it.values[z.key] !== undefined) {
                lines.push({ text: z.label + ": " + fmt(it.values[z.key], data.unit), color: z.color });
              }
            }
            if (it.note) lines.push({ text: it.note });
            tip.show(ev.clientX - r.left, ev.clientY - r.top, lines);
          });
          rect.addEventListener("mouseleave", () => tip.hide());
          acc += v;
        });
        if (data.totals !== false && !grouped) {
          // A sum over domains is `estimated` as soon as one part is (never mixed silently).
          const est = series.some((z) => (it.values[z.key] || 0) > 0 && z.provenance !== "measured");
          svgText(g, x(acc) + 6, y + rowH / 2 + 4,
            fmt(it._sum, data.unit) + (est && series.length > 1 ? " (estimated)" : ""), { class: "fc-value" });
        }
      });
    }
    draw();
    onResize(wrap, draw);
    return { draw: draw };
  }

  // -- timeline: power per domain, memory, call spans; hover, drag/wheel zoom, reset ---------

  function timeline(host, data) {
    frame(host, "fc-timeline");
    const power = data.series || [], memory = data.memory || [], lanes = data.lanes || [];
    const marks = data.marks || [];
    if (!power.length && !memory.length && !lanes.length) {
      return empty(host, data.empty || "no samples in this run");
    }
    const bar = htmlEl("div", "fc-toolbar", host);
    legend(bar, power.concat(memory));
    const reset = htmlEl("button", "fc-reset", bar, "Reset zoom");
    reset.type = "button";
    htmlEl("span", "fc-hint", bar, "drag or scroll to zoom");
    const wrap = htmlEl("div", "fc-plot", host);
    const tip = tooltip(host);
    const full = data.range || extent(power, memory, lanes);
    let view = [full[0], full[1]];
    const left = 118, right = 16, gap = 14, laneH = 16;
    const powerH = power.length ? 190 : 0, memH = memory.length ? 90 : 0;
    const lanesH = lanes.length * laneH;
    const top = 18;
    const bottom = 28;

    function layout() {
      const panels = [];
      let y = top;
      if (powerH) { panels.push({ kind: "power", y: y, h: powerH }); y += powerH + gap; }
      if (memH) { panels.push({ kind: "memory", y: y, h: memH }); y += memH + gap; }
      if (lanesH) { panels.push({ kind: "lanes", y: y, h: lanesH }); y += lanesH; }
      return { panels: panels, height: y + bottom };
    }

    let svg, xs, W, panels, cursor, brush;

    function draw() {
      wrap.replaceChildren();
      W = Math.max(360, wrap.clientWidth || host.clientWidth || 800);
      const lay = layout();
      panels = lay.panels;
      svg = svgEl("svg", { width: W, height: lay.height, class: "fc-svg" }, wrap);
      xs = linear(view[0], view[1], left, W - right);
      const clipId = "fc-clip-" + Math.random().toString(36).slice(2);
      const defs = svgEl("defs", {}, svg);
      const cp = svgEl("clipPath", { id: clipId }, defs);
      svgEl("rect", { x: left, y: 0, width: W - left - right, height: lay.height }, cp);
      const body = svgEl("g", { "clip-path": "url(#" + clipId + ")" }, svg);
      const axes = svgEl("g", {}, svg);
      for (const m of marks) drawMark(body, m, lay.height);
      for (const p of panels) {
        if (p.kind === "power") drawSeries(body, axes, p, power, "W", true);
        if (p.kind === "memory") drawSeries(body, axes, p, memory, "B", false);
        if (p.kind === "lanes") drawLanes(body, axes, p);
      }
      xAxis(axes, xs, linearTicks(view[0], view[1], Math.max(2, Math.floor((W - left) / 100)), "s"),
        lay.height - bottom + 2, "s", left, W - right);
      cursor = svgEl("line", { y1: top, y2: lay.height - bottom, class: "fc-cursor",
                                visibility: "hidden" }, svg);
      brush = svgEl("rect", { y: top, height: lay.height - bottom - top, class: "fc-brush",
                               visibility: "hidden" }, svg);
      attachMouse(lay.height);
    }

    function drawMark(g, m, height) {
      const x0 = xs(m.t0), x1 = xs(m.t1);
      svgEl("rect", { x: x0, y: top, width: Math.max(0, x1 - x0), height: height - bottom - top,
                      class: "fc-mark fc-mark-" + (m.kind || "span") }, g);
      if (x1 - x0 > 30) svgText(g, x0 + 4, top - 5, m.label, { class: "fc-mark-label" });
    }

    function visibleMax(s) {
      let max = 0;
      const lo = Math.max(0, upperBound(s.t, view[0]) - 1), hi = upperBound(s.t, view[1]);
      for (let i = lo; i < Math.min(hi + 1, s.v.length); i++) if (s.v[i] > max) max = s.v[i];
      if (s.idle && s.idle > max) max = s.idle;
      return max;
    }

    function drawSeries(g, axes, p, list, unit, step) {
      let max = 0;
      for (const s of list) max = Math.max(max, visibleMax(s));
      const ymax = max > 0 ? max * 1.08 : 1;
      const ys = linear(0, ymax, p.y + p.h, p.y);
      yAxis(axes, ys, ticks(0, ymax, Math.max(2, Math.floor(p.h / 40))), left, unit, W - left - right);
      svgText(axes, 6, p.y + 10, p.kind === "power" ? "power" : "memory", { class: "fc-panel-label" });
      for (const s of list) {
        if (s.idle) {
          svgEl("line", { x1: left, x2: W - right, y1: ys(s.idle), y2: ys(s.idle), stroke: s.color,
                          class: "fc-idle" }, g);
        }
        const lo = Math.max(0, upperBound(s.t, view[0]) - 2);
        const hi = Math.min(s.v.length, upperBound(s.t, view[1]) + 1);
        let d = "", move = true;  // a null value is a gap: the line starts again after it
        for (let i = lo; i < hi; i++) {
          if (s.v[i] === null || s.v[i] === undefined) { move = true; continue; }
          const x0 = xs(s.t[i]), y = ys(s.v[i]);
          if (step) {
            const x1 = xs(s.t[i + 1]);
            d += (move ? "M" : "L") + x0.toFixed(1) + "," + y.toFixed(1) +
                 "L" + x1.toFixed(1) + "," + y.toFixed(1);
          } else {
            d += (move ? "M" : "L") + x0.toFixed(1) + "," + y.toFixed(1);
          }
          move = false;
        }
        if (d) svgEl("path", { d: d, stroke: s.color, class: "fc-line" }, g);
      }
      p.ys = ys;
    }

    function drawLanes(g, axes, p) {
      const span = view[1] - view[0], px = span / Math.max(1, W - left - right);
      lanes.forEach((lane, i) => {
        const y = p.y + i * laneH;
        svgEl("rect", { x: left, y: y + 1, width: W - left - right, height: laneH - 2,
                        class: "fc-lane-bg" }, g);
        const lbl = svgText(axes, left - 6, y + laneH / 2 + 4, clip(lane.label, 19),
          { class: "fc-lane-label", "text-anchor": "end" });
        lbl.appendChild(svgEl("title", {})).textContent = lane.label;
        if (lane.spans) {
          const t0 = lane.spans.t0, t1 = lane.spans.t1;
          const lo = Math.max(0, upperBound(t0, view[0] - (lane.spans.maxDur || 0)) - 1);
          const hi = upperBound(t0, view[1]);
          let lastX = -Infinity;
          for (let k = lo; k < hi; k++) {
            if (t1[k] < view[0]) continue;
            const x0 = xs(t0[k]), w = Math.max(1, xs(t1[k]) - x0);
            if (w <= 1 && x0 - lastX < 1) continue;  // one pixel already drawn there
            lastX = x0;
            svgEl("rect", { x: x0, y: y + 2, width: w, height: laneH - 4, fill: lane.color,
                            class: "fc-span" }, g);
          }
        } else if (lane.bins) {
          const b = lane.bins, step = Math.max(1, Math.floor(px / b.dt));
          const peak = Math.max.apply(null, b.busy) || 1;  // shade relative to the busiest bin
          for (let k = 0; k < b.busy.length; k += step) {
            let busy = 0;
            for (let j = k; j < Math.min(k + step, b.busy.length); j++) busy = Math.max(busy, b.busy[j]);
            if (busy <= 0) continue;
            const ta = b.t0 + k * b.dt, tb = ta + step * b.dt;
            if (tb < view[0] || ta > view[1]) continue;
            svgEl("rect", { x: xs(ta), y: y + 2, width: Math.max(1, xs(tb) - xs(ta)),
                            height: laneH - 4, fill: lane.color,
                            "fill-opacity": (0.15 + 0.85 * Math.min(1, busy / peak)).toFixed(2),
                            class: "fc-span" }, g);
          }
        }
      });
    }

    function laneAt(t, y) {
      const p = panels.find((q) => q.kind === "lanes");
      if (!p || y < p.y || y >= p.y + p.h) return null;
      const lane = lanes[Math.floor((y - p.y) / laneH)];
      if (!lane) return null;
      const tol = 3 * (view[1] - view[0]) / Math.max(1, W - left - right);
      if (lane.spans) {
        const s = lane.spans;
        let k = upperBound(s.t0, t + tol) - 1;
        for (; k >= 0 && s.t0[k] >= t - (s.maxDur || 0) - tol; k--) {
          if (s.t1[k] >= t - tol) {
            const lines = [{ text: lane.label, head: true, color: lane.color },
                           { text: "call " + fmt(s.t1[k] - s.t0[k], "s") + " at " + fmt(s.t0[k], "s") }];
            if (s.site) lines.push({ text: s.site[k] });
            return lines;
          }
        }
        return [{ text: lane.label, head: true, color: lane.color }];
      }
      const b = lane.bins, k = Math.floor((t - b.t0) / b.dt);
      const busy = k >= 0 && k < b.busy.length ? b.busy[k] : 0;
      return [{ text: lane.label, head: true, color: lane.color },
              { text: "busy " + fmt(busy, "%") + " of " + fmt(b.dt, "s") +
                      (b.calls ? ", " + b.calls[k] + " calls" : "") }];
    }

    function valueAt(s, t, step) {
      const i = upperBound(s.t, t) - 1;
      if (step) return i >= 0 && i < s.v.length ? s.v[i] : null;
      if (i < 0) return null;
      return s.v[Math.min(i, s.v.length - 1)];
    }

    function attachMouse(height) {
      let dragFrom = null;
      const pos = (ev) => {
        const r = svg.getBoundingClientRect();
        return [ev.clientX - r.left, ev.clientY - r.top];
      };
      const inPlot = (x) => x >= left && x <= W - right;
      svg.addEventListener("mousedown", (ev) => {
        const [x] = pos(ev);
        if (!inPlot(x)) return;
        dragFrom = x;
        ev.preventDefault();
      });
      svg.addEventListener("mousemove", (ev) => {
        const [x, y] = pos(ev);
        if (dragFrom !== null) {
          const a = Math.max(left, Math.min(dragFrom, x)), b = Math.min(W - right, Math.max(dragFrom, x));
          brush.setAttribute("x", a);
          brush.setAttribute("width", b - a);
          brush.setAttribute("visibility", "visible");
          tip.hide();
          return;
        }
        if (!inPlot(x)) { cursor.setAttribute("visibility", "hidden"); tip.hide(); return; }
        cursor.setAttribute("x1", x);
        cursor.setAttribute("x2", x);
        cursor.setAttribute("visibility", "visible");
        const t = xs.invert(x);
        const lines = [{ text: "t = " + fmt(t, "s"), head: true }];
        for (const s of power) lines.push({ text: s.label + ": " + fmt(valueAt(s, t, true), "W"), color: s.color });
        for (const s of memory) lines.push({ text: s.label + ": " + fmt(valueAt(s, t, false), "B"), color: s.color });
        const lane = laneAt(t, y);
        if (lane) lines.push.apply(lines, lane);
        const hr = host.getBoundingClientRect(), sr = svg.getBoundingClientRect();
        tip.show(x + sr.left - hr.left, y + sr.top - hr.top, lines);
      });
      const endDrag = (ev) => {
        if (dragFrom === null) return;
        const [x] = pos(ev);
        const a = Math.max(left, Math.min(dragFrom, x)), b = Math.min(W - right, Math.max(dragFrom, x));
        dragFrom = null;
        brush.setAttribute("visibility", "hidden");
        if (b - a >= 4) zoomTo(xs.invert(a), xs.invert(b));
      };
      svg.addEventListener("mouseup", endDrag);
      svg.addEventListener("mouseleave", (ev) => {
        endDrag(ev);
        cursor.setAttribute("visibility", "hidden");
        tip.hide();
      });
      svg.addEventListener("wheel", (ev) => {
        const [x] = pos(ev);
        if (!inPlot(x)) return;
        ev.preventDefault();
        const t = xs.invert(x), k = ev.deltaY > 0 ? 1.25 : 0.8;
        zoomTo(t - (t - view[0]) * k, t + (view[1] - t) * k);
      }, { passive: false });
      svg.addEventListener("dblclick", () => zoomTo(full[0], full[1]));
    }

    function zoomTo(a, b) {
      const minSpan = 1e-6;
      a = Math.max(full[0], a);
      b = Math.min(full[1], b);
      if (b - a < minSpan) { const c = (a + b) / 2; a = c - minSpan / 2; b = c + minSpan / 2; }
      view = [a, b];
      host.dataset.view = a + "," + b;
      draw();
    }

    reset.addEventListener("click", () => zoomTo(full[0], full[1]));
    draw();
    onResize(wrap, draw);
    return { draw: draw, zoom: zoomTo };
  }

  function extent(power, memory, lanes) {
    let lo = Infinity, hi = -Infinity;
    for (const s of power.concat(memory)) {
      if (s.t.length) { lo = Math.min(lo, s.t[0]); hi = Math.max(hi, s.t[s.t.length - 1]); }
    }
    for (const l of lanes) {
      if (l.spans && l.spans.t0.length) {
        lo = Math.min(lo, l.spans.t0[0]);
        hi = Math.max(hi, Math.max.apply(null, l.spans.t1));
      }
      if (l.bins) { lo = Math.min(lo, l.bins.t0); hi = Math.max(hi, l.bins.t0 + l.bins.dt * l.bins.busy.length); }
    }
    return isFinite(lo) && hi > lo ? [lo, hi] : [0, 1];
  }

  // -- scatter: one point per (item, series), log-log ----------------------------------------

  function scatter(host, data) {
    frame(host, "fc-scatter");
    const series = data.series || [];
    const pts = (data.points || []).filter((p) => p.x > 0 && p.y > 0);
    const dropped = (data.points || []).length - pts.length;
    if (!pts.length) return empty(host, data.empty || "no calls with energy above idle");
    legend(host, series);
    const wrap = htmlEl("div", "fc-plot", host);
    const tip = tooltip(host);
    if (dropped) htmlEl("div", "fc-note", host, dropped + " point(s) at zero not shown on log axes");
    const color = {};
    for (const s of series) color[s.key] = s.color;

    function draw() {
      wrap.replaceChildren();
      const W = Math.max(320, wrap.clientWidth || host.clientWidth || 640), H = 300;
      const left = 72, right = 16, top = 26, bottom = 40;
      const svg = svgEl("svg", { width: W, height: H, class: "fc-svg" }, wrap);
      const xr = range(pts.map((p) => p.x)), yr = range(pts.map((p) => p.y));
      const xs = logScale(xr[0], xr[1], left, W - right), ys = logScale(yr[0], yr[1], H - bottom, top);
      const g = svgEl("g", {}, svg);
      yAxis(g, ys, logTicks(yr[0], yr[1]), left, data.yUnit, W - left - right, true);
      xAxis(g, xs, logTicks(xr[0], xr[1]), H - bottom, data.xUnit, left, W - right, true);
      svgText(g, (left + W - right) / 2, H - 4, data.xLabel || "", { class: "fc-axis-label", "text-anchor": "middle" });
      svgText(g, 4, 11, data.yLabel || "", { class: "fc-axis-label" });
      const placed = [];
      for (const p of pts) {
        const cx = xs(p.x), cy = ys(p.y);
        svgEl("circle", { cx: cx, cy: cy, r: 4.5, fill: color[p.key] || "#555", class: "fc-dot" }, g);
        placed.push([cx, cy, p]);
      }
      svg.addEventListener("mousemove", (ev) => {
        const r = svg.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
        let best = null, bestD = 14 * 14;
        for (const q of placed) {
          const d = (q[0] - mx) ** 2 + (q[1] - my) ** 2;
          if (d < bestD) { bestD = d; best = q; }
        }
        if (!best) { tip.hide(); return; }
        const p = best[2], s = series.find((z) => z.key === p.key);
        const hr = host.getBoundingClientRect();
        tip.show(best[0] + r.left - hr.left, best[1] + r.top - hr.top, [
          { text: p.label, head: true },
          { text: (s ? s.label : p.key), color: color[p.key] },
          { text: (data.xName || "x") + ": " + fmt(p.x, data.xUnit) },
          { text: (data.yName || "y") + ": " + fmt(p.y, data.yUnit) },
        ].concat(p.note ? [{ text: p.note }] : []));
      });
      svg.addEventListener("mouseleave", () => tip.hide());
    }
    draw();
    onResize(wrap, draw);
    return { draw: draw };
  }

  function range(values) {
    let lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    if (hi <= lo) { lo /= 2; hi *= 2; }
    return [lo / 1.3, hi * 1.3];
  }

  // -- lines: x-y series (tails, data-size curves) -------------------------------------------

  function lines(host, data) {
    frame(host, "fc-lines");
    const xLog = !!data.xLog, yLog = !!data.yLog;
    // A log axis cannot place zero or less: such points are left out. A point [x, null] is a
    // break: the line stops there and starts again at the next point.
    const series = (data.series || []).map((s) => Object.assign({}, s, {
      points: (s.points || []).filter((p) => p[1] === null
        || ((!xLog || p[0] > 0) && (!yLog || p[1] > 0))),
    })).filter((s) => s.points.some((p) => p[1] !== null));
    const vlines = (data.vlines || []).filter((v) => isFinite(v.x) && (!xLog || v.x > 0));
    if (!series.length) return empty(host, data.empty || "nothing to show");
    legend(host, series);
    const wrap = htmlEl("div", "fc-plot", host);
    const tip = tooltip(host);

    function draw() {
      wrap.replaceChildren();
      const W = Math.max(280, wrap.clientWidth || host.clientWidth || 480), H = data.height || 220;
      const left = 72, right = 16, top = 26, bottom = 40;
      const svg = svgEl("svg", { width: W, height: H, class: "fc-svg" }, wrap);
      let x0 = Infinity, x1 = -Infinity, y0 = data.yZero === false || yLog ? Infinity : 0, y1 = -Infinity;
      for (const s of series) for (const [x, y] of s.points) {
        if (y === null) continue;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
      for (const v of vlines) { x0 = Math.min(x0, v.x); x1 = Math.max(x1, v.x); }
      let xs, ys, xt, yt;
      if (xLog) {
        [x0, x1] = range([x0, x1]);
        xs = logScale(x0, x1, left, W - right);
        xt = logTicks(x0, x1);
      } else {
        if (!(x1 > x0)) { x1 = x0 + 1; }
        xs = linear(x0, x1, left, W - right);
        xt = ticks(x0, x1, Math.max(2, Math.floor((W - left) / 100)));
      }
      if (yLog) {
        [y0, y1] = range([y0, y1]);
        ys = logScale(y0, y1, H - bottom, top);
        yt = logTicks(y0, y1);
      } else {
        if (!(y1 > y0)) { y1 = y0 + 1; }
        y1 += (y1 - y0) * 0.08;
        ys = linear(y0, y1, H - bottom, top);
        yt = ticks(y0, y1, 4);
      }
      const g = svgEl("g", {}, svg);
      yAxis(g, ys, yt, left, data.yUnit, W - left - right, yLog);
      xAxis(g, xs, xt, H - bottom, data.xUnit, left, W - right, xLog);
      for (const v of vlines) {
        const x = xs(v.x);
        svgEl("line", { x1: x, x2: x, y1: top, y2: H - bottom, stroke: "#57606a",
                        "stroke-dasharray": "4 3", class: "fc-vline" }, g);
        svgText(g, x + 3, top + 10, v.label, { class: "fc-tick fc-vline-label" });
      }
      svgText(g, (left + W - right) / 2, H - 4, data.xLabel || "", { class: "fc-axis-label", "text-anchor": "middle" });
      svgText(g, 4, 11, data.yLabel || "", { class: "fc-axis-label" });
      for (const s of series) {
        if (s.line !== false) {
          let d = "", move = true;
          for (const p of s.points) {
            if (p[1] === null) { move = true; continue; }
            d += (move ? "M" : "L") + xs(p[0]).toFixed(1) + "," + ys(p[1]).toFixed(1);
            move = false;
          }
          svgEl("path", { d: d, stroke: s.color, class: "fc-line" + (s.dash ? " fc-dashed" : "") }, g);
        }
        if (s.markers) {
          for (const p of s.points) if (p[1] !== null) svgEl("circle", { cx: xs(p[0]), cy: ys(p[1]), r: 3.5, fill: s.color, class: "fc-dot" }, g);
        }
      }
      const cursor = svgEl("line", { y1: top, y2: H - bottom, class: "fc-cursor", visibility: "hidden" }, svg);
      svg.addEventListener("mousemove", (ev) => {
        const r = svg.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
        if (mx < left || mx > W - right) { tip.hide(); cursor.setAttribute("visibility", "hidden"); return; }
        const x = xs.invert(mx);
        const out = [{ text: (data.xName || "x") + " = " + fmt(x, data.xUnit), head: true }];
        for (const s of series) {
          let best = null;  // the nearest point, or the break nearer than any: no value there
          for (const p of s.points) if (!best || Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
          out.push({ text: s.label + ": " + fmt(best[1], data.yUnit), color: s.color });
        }
        cursor.setAttribute("x1", mx); cursor.setAttribute("x2", mx);
        cursor.setAttribute("visibility", "visible");
        const hr = host.getBoundingClientRect();
        tip.show(mx + r.left - hr.left, my + r.top - hr.top, out);
      });
      svg.addEventListener("mouseleave", () => { tip.hide(); cursor.setAttribute("visibility", "hidden"); });
    }
    draw();
    onResize(wrap, draw);
    return { draw: draw };
  }

  global.FecomCharts = { bars: bars, timeline: timeline, scatter: scatter, lines: lines, fmt: fmt };
})(window);

/* The live view: listens to the measurement server's Server-Sent Events (live/stream) and keeps
 * the page current. Charts are the report's (FecomCharts); every string from the measured
 * program is set with textContent, never parsed as HTML.
 */
(function () {
  "use strict";

  const fmt = FecomCharts.fmt;
  const WINDOW_S = 120;
  const buffers = {};  // sensor -> {t: [...], v: [...]}: the chart points of the last WINDOW_S
  const overview = {};  // sensor -> {t, v, filling, width}: the whole run, in bounded buckets
  let range = "run";  // what the chart shows: the whole run, or the last WINDOW_S ("recent")
  let updates = 0;

  function el(id) { return document.getElementById(id); }

  function make(tag, cls, parent, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function badge(parent, cls, text, title) {
    const b = make("span", "badge " + cls, parent, text);
    if (title) b.title = title;
    return b;
  }

  function provenanceBadge(parent, s) {
    return badge(parent, s.provenance === "measured" ? "measured" : "estimated",
      s.provenance + (s.model ? " (" + s.model + ")" : ""), s.model || "");
  }

  // -- chart buffers ---------------------------------------------------------------------------

  function keep(m) {
    if (m.reset) for (const k in buffers) delete buffers[k];
    for (const k in m.points) {
      const b = buffers[k] || (buffers[k] = { t: [], v: [] });
      for (const p of m.points[k]) { b.t.push(p[0]); b.v.push(p[1]); }
      let cut = 0;
      while (cut < b.t.length && b.t[cut] < m.t - WINDOW_S) cut++;
      if (cut) { b.t.splice(0, cut); b.v.splice(0, cut); }
    }
  }

  function keepOverview(m) {
    if (m.reset) for (const k in overview) delete overview[k];
    for (const k in m.overview) {
      const o = m.overview[k];
      if (o.reset || !overview[k]) overview[k] = { t: [], v: [], top: [] };
      const b = overview[k];
      for (const p of o.points) { b.t.push(p[0]); b.v.push(p[1]); b.top.push(p[2]); }
      b.filling = o.filling;
      b.width = o.width_s;
    }
  }

  // the whole run's buckets, the one filling last: at most a few hundred points a series
  function wholeRun(key) {
    const b = overview[key];
    if (!b) return null;
    const t = b.t.slice(), v = b.v.slice(), top = b.top.slice();
    if (b.filling) { t.push(b.filling[0]); v.push(b.filling[1]); top.push(b.filling[2]); }
    return t.length ? { t: t, v: v, top: top, width: b.width } : null;
  }

  function recent(key) {
    const b = buffers[key];
    return b && b.t.length ? { t: b.t, v: b.v, width: null } : null;
  }

  function drawChart(m) {
    const pick = range === "run" ? wholeRun : recent;
    const power = m.power.filter((p) => pick(p.key)).map((p) => {
      const b = pick(p.key);
      // a step per bin: the edges are the bin starts and the last bin's end
      return { key: p.key, label: p.label, color: p.color, idle: p.idle,
               t: b.t.concat([b.t[b.t.length - 1] + (b.width || m.bin_s)]), v: b.v.slice() };
    });
    // a power point of the whole run is a mean: its highest 0.5 s step is drawn faint above it
    const tops = m.power.filter((p) => range === "run" && pick(p.key) &&
                                       pick(p.key).top[0] !== undefined).map((p) => {
      const b = pick(p.key);
      return { key: p.key + ":top", label: "highest 0.5 s step of each point", color: p.color + "55",
               t: b.t.concat([b.t[b.t.length - 1] + b.width]), v: b.top };
    });
    const memory = m.memory.filter((s) => !s.peak && pick(s.key))
      .map((s) => ({ key: s.key, label: s.label, color: s.color,
                     t: pick(s.key).t.slice(), v: pick(s.key).v.slice() }));
    const hi = Math.max(m.t, 1);
    const widths = Object.values(overview).map((o) => o.width).filter((w) => w);
    el("chart-resolution").textContent = range === "run"
      ? "whole run, one point per " + fmt(widths.length ? Math.max(...widths) : m.bin_s, "s") +
        " (mean power, its highest 0.5 s step faint above it; peak memory)"
      : "last " + WINDOW_S + " s, one point per " + fmt(m.bin_s, "s");
    FecomCharts.timeline(el("timeline"), {
      series: power.concat(tops), memory: memory,
      range: range === "run" ? [0, hi] : [Math.max(0, hi - WINDOW_S), hi],
      empty: m.run ? "no samples yet" : "no run is recording",
    });
  }

  // -- header ----------------------------------------------------------------------------------

  const STAGES = {
    idle: (s) => "idle baseline (" + fmt(s.seconds, "s") + "), " + fmt(s.for_s, "s") + " in",
    gate: (s) => "stability gate: waiting " + fmt(s.for_s, "s") + " (at most " +
                 fmt(s.max_wait_s, "s") + ")",
    tail: (s) => "tail after repetition " + s.rep + " (" + fmt(s.seconds, "s") + ")",
    run: (s) => "repetition " + s.rep + " running for " + fmt(s.for_s, "s"),
    between: () => "between repetitions",
    waiting: () => "no run yet: start one with fecomlite run or fecomlite watch",
    finished: () => "run finished",
    failed: () => "run failed",
    interrupted: () => "run interrupted",
  };

  function header(m) {
    const run = m.run;
    el("program").textContent = run ? (run.program || "(unnamed program)") : "fecomlite live view";
    const sub = el("subtitle");
    sub.replaceChildren();
    if (run) {
      make("span", "", sub, "run " + run.id + " · " + run.kind + " · " + run.level + " level · ");
      badge(sub, run.status === "running" ? "ok" : run.status === "finished" ? "neutral" : "bad",
        run.status);
      make("span", "", sub, " · " + fmt(run.elapsed_s, "s") + " · host " + m.host);
    } else {
      make("span", "", sub, "host " + m.host + " · no run has recorded since the server started");
    }
    const stage = STAGES[m.stage.stage];
    el("stage").textContent = stage ? stage(m.stage) : m.stage.stage;
    el("stage").dataset.stage = m.stage.stage;
    const p = m.progress || {};
    const bar = el("progress");
    bar.max = p.total || Math.max(p.started || 0, 1);
    bar.value = p.done || 0;
    el("progress-text").textContent = run ? (p.done || 0) + " of " +
      (p.total || "?") + " done" + (p.started > p.done ? ", " + p.started + " started" : "") : "–";
    gate(m);
  }

  function gate(m) {
    const box = el("gate");
    box.replaceChildren();
    const g = m.gate;
    if (m.stage.stage === "gate") {
      badge(box, "neutral", "waiting");
    } else if (!g) {
      make("span", "muted", box, "not run yet");
      box.dataset.state = "none";
      return;
    } else {
      badge(box, g.passed ? "ok" : "bad", g.passed ? (g.gated ? "stable" : "not gated")
        : "not stable");
      make("span", "muted", box, " after " + fmt(g.waited_s, "s"));
    }
    box.dataset.state = m.stage.stage === "gate" ? "waiting" : g.passed ? "passed" : "failed";
    if (g && g.reasons && g.reasons.length) {
      const ul = make("ul", "reasons", box);
      for (const r of g.reasons) make("li", "", ul, r);
    }
  }

  // -- cards -----------------------------------------------------------------------------------

  function card(parent, s, title, value, unit, extra) {
    const c = make("div", "domain", parent);
    c.style.setProperty("--c", s.color || "#888");
    const name = make("div", "name", c, title + " ");
    if (s.provenance) provenanceBadge(name, s);
    const big = make("div", "big", c, fmt(value, unit));
    big.dataset.key = s.key;
    big.dataset.v = value === null || value === undefined ? "" : String(value);
    if (extra) make("div", "what", c, extra);
    return c;
  }

  function power(m) {
    const box = el("power-cards");
    box.replaceChildren();
    if (!m.power.length) {
      make("p", "muted", box, m.run ? "no energy sensor gave readings" : "");
      return;
    }
    for (const p of m.power) {
      card(box, p, p.label.replace(/ \(.*$/, ""), p.now, "W",
        "idle baseline " + (p.idle === null || p.idle === undefined ? "not measured" : fmt(p.idle, "W")) +
        " · " + p.key);
    }
  }

  function memory(m) {
    const box = el("memory-cards");
    box.replaceChildren();
    for (const s of m.memory) {
      card(box, Object.assign({ provenance: null }, s), s.label, s.now, "B");
    }
  }

  function listValues(id, items, unit, none, scale) {
    const box = el(id);
    box.replaceChildren();
    if (!items.length) { make("span", "muted", box, none); return; }
    items.forEach((s, i) => {
      if (i) make("span", "", box, " · ");
      const shown = s.now === null ? "–" : fmt(s.now * (scale || 1), unit);
      const v = make("span", "", box, s.label + " " + shown);
      v.dataset.key = s.key;
      v.dataset.v = s.now === null ? "" : String(s.now);
    });
  }

  // -- figures: the analysis' model, computed by the server (live.py) -------------------------

  function roleText(d) {
    if (d.role === "disjoint") return "disjoint: adds to the other disjoint domains";
    if (d.role === "share") return "share of " + d.of_label + ": never added to it";
    return d.meaning;
  }

  function fact(dl, term, value, key) {
    make("dt", "", dl, term);
    const dd = make("dd", "", dl, value);
    if (key) dd.dataset.key = key;
    return dd;
  }

  function joules(dd, v) {
    dd.dataset.v = v === null || v === undefined ? "" : String(v);
    return dd;
  }

  function figures(m) {
    const box = el("figure-cards");
    box.replaceChildren();
    const f = m.figures;
    for (const d of f.domains) {
      const c = make("div", "domain", box);
      c.dataset.domain = d.domain;
      c.style.setProperty("--c", d.color || "#888");
      const name = make("div", "name", c, d.label + " ");
      provenanceBadge(name, d);
      if (!d.reliable) badge(name, "bad", "unreliable: busy machine", f.load.text);
      make("div", "role", c, roleText(d)).dataset.role = d.role;
      if (d.program_J === undefined) {
        make("div", "what", c, "no estimate yet (settles " + m.calls.settle_s + " s behind)");
        continue;
      }
      const big = make("div", "big", c, fmt(d.program_J, "J"));
      joules(big, d.program_J).dataset.key = d.domain + ":program_J";
      make("div", "what", c, "above idle while the program ran");
      const dl = make("dl", "facts", c);
      joules(fact(dl, "in wrapped calls", fmt(d.in_calls_J, "J"), d.domain + ":in_calls_J"),
        d.in_calls_J);
      make("dd", "share", dl, d.in_calls_text).dataset.key = d.domain + ":in_calls_text";
      joules(fact(dl, "outside calls", fmt(d.outside_calls_J, "J"), d.domain + ":outside_calls_J"),
        d.outside_calls_J);
      joules(fact(dl, "tail after the program", fmt(d.tail_J, "J"), d.domain + ":tail_J"),
        d.tail_J);
      joules(fact(dl, "baseline, gate, pauses", fmt(d.other_J, "J"), d.domain + ":other_J"),
        d.other_J);
      fact(dl, "idle baseline", fmt(d.idle_W, "W"));
    }
    const load = el("figures-load");
    load.textContent = f.load.text;
    load.className = f.load.busy ? "warn" : "note";
    const all = f.all_domains;
    if (all.domains.length > 1) {
      const c = make("div", "domain", box);
      c.dataset.domain = "all";
      const name = make("div", "name", c, all.label + " ");
      badge(name, all.provenance === "measured" ? "measured" : "estimated", all.provenance);
      if (!all.reliable) badge(name, "bad", "unreliable: busy machine", f.load.text);
      make("div", "role", c, "the sum of the disjoint domains only; a share is never added");
      joules(make("div", "big", c, fmt(all.program_J, "J")), all.program_J).dataset.key =
        "all:program_J";
      make("div", "what", c, "above idle while the program ran");
      const dl = make("dl", "facts", c);
      joules(fact(dl, "in wrapped calls", fmt(all.in_calls_J, "J"), "all:in_calls_J"),
        all.in_calls_J);
    }
  }

  // -- calls -----------------------------------------------------------------------------------

  function inProgress(m) {
    const box = el("in-progress");
    box.replaceChildren();
    const open = m.calls.in_progress;
    if (!open.length) {
      make("span", "muted", box, m.run && m.run.status === "running" ? "no wrapped call" : "—");
      return;
    }
    const list = make("ol", "", box);
    for (const c of open) {
      const li = make("li", "", list);
      li.style.paddingLeft = (c.level * 1.2) + "em";
      li.dataset.site = c.site;
      make("span", "api", li, c.api);
      if (c.written && c.written !== c.api) make("span", "written", li, " (" + c.written + ")");
      if (c.file) make("span", "where", li, " at " + c.file + ":" + c.line);
      make("span", "", li, " — ");
      const t = make("span", "elapsed", li, fmt(c.elapsed_s, "s"));
      t.dataset.v = String(c.elapsed_s);
      if (c.depth > c.level + 1 && c.level === 0 && open.filter((o) => o.tid === c.tid).length < c.depth) {
        make("span", "muted", li, " (" + c.depth + " calls deep)");
      }
    }
  }

  function calls(m) {
    const c = m.calls;
    const last = c.last;
    inProgress(m);
    el("call").textContent = last ? last.api + (last.raised ? " (raised)" : "") + " — " +
      fmt(last.ago_s, "s") + " ago, took " + fmt(last.took_s, "s") : "—";
    el("calls-total").textContent = c.total.toLocaleString("en") + " calls of " + c.apis + " APIs";
    const head = el("apis-head");
    head.replaceChildren();
    make("th", "", head, "API");
    make("th", "num", head, "calls");
    make("th", "num", head, "self time").title = "time its calls were the innermost call " +
      "(a nested call's time is its own, not its caller's), over the steps attributed so far";
    make("th", "num", head, "inclusive time").title = "each call's whole span, the calls " +
      "nested in it included: these overlap and do not add up";
    const shown = c.domains.filter((d) => m.figures.domains.some((f) => f.domain === d.domain));
    for (const d of shown) {
      const th = make("th", "num", head, d.label + " self ");
      th.dataset.domain = d.domain;
      th.title = "self energy above idle; the share is of the program's " + d.label +
        " above idle so far, and self shares add up (nested calls are not counted twice)" +
        (d.role === "share" ? " (a share of " + d.of + ": never added)" : "");
      provenanceBadge(th, d);
    }
    const all = m.figures.all_domains;
    if (all.domains.length > 1) {
      const th = make("th", "num", head, all.label + " ");
      th.dataset.domain = "all";
      badge(th, all.provenance === "measured" ? "measured" : "estimated", all.provenance);
    }
    const body = el("apis-table").tBodies[0];
    body.replaceChildren();
    for (const a of c.top) {
      const tr = make("tr", "", body);
      tr.dataset.api = a.api;
      make("td", "api", tr, a.api);
      make("td", "num", tr, a.calls.toLocaleString("en")).dataset.v = a.calls;
      const own = make("td", "num self", tr, fmt(a.self_s, "s"));
      own.dataset.v = a.self_s;
      if (a.running_s !== null) make("span", "share running", own, "+ " + fmt(a.running_s, "s") + " running");
      make("td", "num inclusive", tr, fmt(a.seconds, "s")).dataset.v = a.seconds;
      for (const d of shown) {
        const v = a.energy[d.domain];
        const td = make("td", "num", tr, v === undefined ? "–" : "≈ " + fmt(v, "J"));
        td.dataset.domain = d.domain;
        td.dataset.v = v === undefined ? "" : String(v);
        const share = a.share[d.domain];
        if (share !== undefined) make("span", "share", td, fmt(share, "%"));
      }
      if (all.domains.length > 1) {
        const v = a.all_domains.above_idle_J;
        const td = make("td", "num", tr, v === null ? "–" : "≈ " + fmt(v, "J"));
        td.dataset.domain = "all";
        td.dataset.v = v === null ? "" : String(v);
      }
    }
    el("apis-note").textContent = "Calls and inclusive time come from the probe's events as " +
      "they arrive (a call is counted when it ends; the calls in progress are above); " +
      "inclusive time counts a nested call in its caller's time too. Self time and energy are " +
      "each API's own (the time its calls were the innermost), over the steps attributed so " +
      "far, so self shares add up, as the report's self columns. Energy is a running " +
      "estimate (" + c.method + "): each 0.5 s step's " +
      "energy above the idle baseline while the program ran is shared by time among the calls " +
      "active in it (those in progress included) and the program outside them, once " +
      c.settle_s + " s have passed; the " +
      "percentage under it is of the program's energy above idle so far in that domain. " +
      (all.domains.length > 1 ? "The last column adds " + all.domains.join(" + ") +
        " only: a share domain is never added. " : "") +
      "fecomlite report attributes the whole run afterwards.";
  }

  function notes(m) {
    const list = el("notes");
    list.replaceChildren();
    for (const n of m.notes) make("li", "", list, n);
    el("notes-card").hidden = !m.notes.length;
  }

  // -- the stream ------------------------------------------------------------------------------

  let latest = null;  // the last message, to redraw the chart when its range is changed

  for (const button of document.querySelectorAll("#chart-range button")) {
    button.addEventListener("click", () => {
      range = button.dataset.range;
      for (const b of document.querySelectorAll("#chart-range button")) {
        b.setAttribute("aria-pressed", String(b === button));
      }
      if (latest) drawChart(latest);
    });
  }

  function update(ev) {
    const m = JSON.parse(ev.data);
    latest = m;
    updates += 1;
    keep(m);
    keepOverview(m);
    header(m);
    power(m);
    memory(m);
    listValues("temperatures", m.temperatures, "°C", "no temperature sensor");
    listValues("utilisation", m.utilisation, "%", "–", 0.01);  // sensors give percent
    figures(m);
    calls(m);
    notes(m);
    drawChart(m);
    el("window-s").textContent = WINDOW_S;
    document.body.dataset.updates = String(updates);
    document.body.dataset.ready = "1";
  }

  const conn = el("conn");
  const source = new EventSource("live/stream");
  source.addEventListener("update", update);
  source.addEventListener("open", () => { conn.className = "badge ok"; conn.textContent = "live"; });
  source.addEventListener("error", () => {
    conn.className = "badge bad";
    conn.textContent = "reconnecting";
  });
})();

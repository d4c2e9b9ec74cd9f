/* The report page: sortable and filterable tables, and the charts drawn from the embedded data.
 * Tables are rendered by the server side (Jinja); here they only gain behaviour. */
(function () {
  "use strict";

  function cellValue(row, index, numeric) {
    const cell = row.cells[index];
    if (!cell) return numeric ? NaN : "";
    const raw = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent;
    return numeric ? (raw === "" ? NaN : Number(raw)) : raw.toLowerCase();
  }

  function sortable(table) {
    const heads = table.querySelectorAll("thead th[data-type]");
    heads.forEach((th) => {
      th.tabIndex = 0;
      const sort = () => {
        const numeric = th.dataset.type === "num";
        // Numbers sort largest first on the first click, text A to Z; a second click reverses.
        const first = numeric ? "descending" : "ascending";
        const again = th.getAttribute("aria-sort") === first;
        const desc = again ? !numeric : numeric;
        heads.forEach((h) => h.removeAttribute("aria-sort"));
        th.setAttribute("aria-sort", desc ? "descending" : "ascending");
        const index = Number(th.dataset.index);
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort((a, b) => {
          const x = cellValue(a, index, numeric), y = cellValue(b, index, numeric);
          if (numeric) {
            if (isNaN(x)) return isNaN(y) ? 0 : 1;  // missing values last either way
            if (isNaN(y)) return -1;
            return desc ? y - x : x - y;
          }
          return desc ? y.localeCompare(x) : x.localeCompare(y);
        });
        body.append.apply(body, rows);
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", (ev) => { if (ev.key === "Enter") sort(); });
    });
  }

  function filterable(input) {
    const table = document.getElementById(input.dataset.filterFor);
    const count = document.getElementById(input.dataset.filterFor + "-count");
    if (!table) return;
    const apply = () => {
      const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      let shown = 0;
      for (const row of table.tBodies[0].rows) {
        const text = row.dataset.search || row.textContent.toLowerCase();
        const hit = words.every((w) => text.includes(w));
        row.hidden = !hit;
        if (hit) shown++;
      }
      if (count) count.textContent = shown + " of " + table.tBodies[0].rows.length;
    };
    input.addEventListener("input", apply);
    apply();
  }

  // The column chooser: a checkbox per column shows or hides it; a group header spans the
  // columns of its group still shown.
  function columnChooser(box) {
    const table = document.getElementById(box.dataset.colsFor);
    const update = () => {
      box.querySelectorAll("input[type=checkbox]").forEach((cb) => {
        table.querySelectorAll('[data-c="' + cb.value + '"]').forEach((el) => { el.hidden = !cb.checked; });
      });
      table.querySelectorAll("tr.group th[data-first]").forEach((th) => {
        const first = Number(th.dataset.first), span = Number(th.dataset.span);
        let shown = 0;
        for (let k = first; k < first + span; k++) {
          if (!table.querySelector('thead th[data-c="' + k + '"]').hidden) shown++;
        }
        th.colSpan = Math.max(shown, 1);
        th.hidden = shown === 0;
      });
    };
    box.addEventListener("change", update);
  }

  function charts(data) {
    document.querySelectorAll("[data-chart]").forEach((host) => {
      const spec = data.charts && data.charts[host.dataset.chart];
      if (!spec) return;
      try {
        window.FecomCharts[spec.type](host, spec);
        host.dataset.drawn = "1";
      } catch (err) {
        host.textContent = "this chart could not be drawn: " + err.message;
        throw err;
      }
    });
  }

  function boot() {
    document.querySelectorAll("table.sortable").forEach(sortable);
    document.querySelectorAll("input[data-filter-for]").forEach(filterable);
    document.querySelectorAll("[data-cols-for]").forEach(columnChooser);
    const node = document.getElementById("fecom-data");
    if (node) charts(JSON.parse(node.textContent));
    document.body.dataset.ready = "1";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();

"""Issue 30 item 7: first-use imports detected, not inferred. The probe's sized path counts
`sys.modules` around a site's first call; a call that imported modules is marked "first use" in
the report with the count, from what happened rather than from the memory its call kept."""

from __future__ import annotations

from report_helpers import html_tables
from test_memory_resolution import SITES, recorded
from test_probe import run_script, spooled

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.first_use import imports_by_api, shape_variants
from fecomlite.report.render import render_page
from fecomlite.runtime.capture import IMPORTED


def test_the_probe_counts_the_modules_a_first_call_imports(tmp_path):
    result = run_script(tmp_path, """
        import sys
        import numpy as np
        import fecomlite.runtime.probe as __fecomlite__

        def build(a):
            import colorsys, wave  # imported on first use, as an optimizer's modules are
            return a * 2

        a = np.ones((4, 8), np.float32)
        for _ in range(3):
            y = __fecomlite__.call("prog.py:9:8", build, a)
            z = __fecomlite__.call("prog.py:10:8", np.matmul, a, a.T)
        print("wave" in sys.modules, y.sum(), z.shape)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "64.0", "(4,", "4)"]
    headers, _ = spooled(tmp_path)
    sent = [h["shapes"] for h in headers if "shapes" in h]
    records = {site: record for batch in sent for site, record in batch.items()}
    assert records["prog.py:9:8"][IMPORTED] >= 2  # colorsys, wave (and what they import)
    assert IMPORTED not in records["prog.py:10:8"]  # matmul imports nothing
    assert records["prog.py:10:8"]["args"][0]["shape"] == [4, 8]


def test_the_report_marks_the_call_that_imported_modules_with_the_count(tmp_path):
    store, run = recorded(tmp_path)  # AdamW built in one 200 ms call that kept 77 MB
    shapes = {SITES[2]: [{"args": [], "result": [], IMPORTED: 835}],
              SITES[3]: [{"args": [], "result": []}]}
    store.put_result(run, "shapes", shapes)
    a = analyse_run(store, run)
    assert imports_by_api(shapes, a.sites) == {"torch.optim.AdamW": 835}
    html = render_page("report.html.j2", build_report(store, run, analysis=a).context, {})
    assert 'first-use" title="its first call imported 835 modules, and kept 77' in html
    table = html_tables(html)["apis-table"]
    marked = [row[0]["text"] for row in table["rows"] if "imported" in row[0]["text"]
              or "first use" in row[0]["text"]]
    assert any("torch.optim.AdamW" in text for text in marked)
    store.close()


def test_a_first_call_s_record_and_a_later_one_of_the_same_shapes_are_one_variant():
    record = {"args": [{"shape": [4, 8], "dtype": "float32", "itemsize": 4}], "result": []}
    assert shape_variants([{**record, IMPORTED: 12}, record]) == [record]
    other = {**record, "result": [{"shape": [1], "dtype": "float32", "itemsize": 4}]}
    assert shape_variants([record, other]) == [record, other]

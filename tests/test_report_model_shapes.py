"""The report's energy-model section for a method-level run whose probe recorded shapes: each
API with shapes and a FLOP model is measured against predicted per call; the rest say why not."""

from __future__ import annotations

import numpy as np
import pytest
from report_helpers import SITES, build_run
from test_model_fit import PLANTED
from test_report_model import html_of, sweep_run

from fecomlite.model.command import MODEL_RESULT
from fecomlite.model.features import dense, matmul
from fecomlite.model.fit import EnergyModels
from fecomlite.model.predict import predict_call
from fecomlite.report.build import build_report
from fecomlite.report.model_section import NO_SHAPES
from fecomlite.runtime.capture import call_shapes
from fecomlite.store import Store

LINEAR = "torch.nn.Linear.__call__"
SHAPED_SITES = {
    **SITES,
    "matmul_bf16_2048": ("bench.py:14:8", "numpy.matmul", "np.matmul", "h = np.matmul(x, w)"),
    "matmul_bf16_4096": ("bench.py:18:8", LINEAR, "self.fc", "h = self.fc(h)"),
}  # and bench.py:22:12, torch.Tensor.matmul, whose shapes are not recorded at first
F32 = {"dtype": "float32", "itemsize": 4}
LINEAR_RECORD = {"args": [{"shape": [64, 256], **F32}], "result": [{"shape": [64, 128], **F32}],
                 "weights": {"weight": {"shape": [128, 256], **F32},
                             "bias": {"shape": [128], **F32}}}


def test_apis_with_recorded_shapes_are_measured_against_predicted(tmp_path):
    x, w = np.ones((64, 512), np.float32), np.ones((512, 512), np.float32)
    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = sweep_run(store)
        models = EnergyModels.from_json(store.result(sweep_id, MODEL_RESULT))
        run = build_run(store, reps=1, sites=SHAPED_SITES)
        store.put_result(run, "shapes", {
            "bench.py:14:8": [call_shapes(np.matmul, (x, w), {}, np.matmul(x, w))],
            "bench.py:18:8": [LINEAR_RECORD],
        })
        report = build_report(store, run)
        store.put_result(run, "shapes", {**store.result(run, "shapes"), "bench.py:22:12": [
            {"self": {"shape": [None, 8192]}, "args": [{"shape": [8192, 8]}]}]})
        unknown = build_report(store, run, analysis=report.analysis).context["model"]
    m = report.context["model"]
    rows = {r["what"]: r for r in m["api_rows"]}
    assert set(rows) == {"numpy.matmul", LINEAR}
    sites = {s["key"]: s for s in report.analysis.sites}
    apis = {a["api"]: a for a in report.analysis.apis}
    expected = {"numpy.matmul": (matmul([64, 512], [512, 512]), "bench.py:14:8"),
                LINEAR: (dense(64, 256, 128), "bench.py:18:8")}
    for api, (features, key) in expected.items():
        mean, low, high = predict_call(models, features, PLANTED, sites[key]["mean_time_s"], 0.9)
        row = rows[api]
        assert row["predicted_J"] == pytest.approx(mean)
        assert (row["low_J"], row["high_J"]) == pytest.approx((low, high))
        energy = apis[api]["energy"]["cpu-package"]
        assert row["measured_J"] == pytest.approx(energy["above_idle_J"] / apis[api]["calls"])
        assert row["measured_provenance"] == "estimated"  # the run's CPU power is a model
        assert row["inside"] == (low <= row["measured_J"] <= high)
    assert rows["numpy.matmul"]["predicted_J"] != rows[LINEAR]["predicted_J"]
    assert [(u["api"], u["why"]) for u in m["unpredictable"]] == [
        ("torch.Tensor.matmul", NO_SHAPES)]
    (why,) = [u["why"] for u in unknown["unpredictable"]]
    assert why.startswith("bench.py:22:12") and "unknown dimensions" in why
    assert len(unknown["api_rows"]) == 2
    assert m["run_provenance"] == "estimated (model cpu-util-linear)"
    html = html_of(report)
    assert 'id="model-api-predicted"' in html and f'data-api="{LINEAR}"' in html
    assert 'data-api="numpy.matmul"' in html


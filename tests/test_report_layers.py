"""The report's layer tree: the domains it sums are the ones the report leads with (the
program's own share where machine-level figures are unreliable), and on every row inclusive
energy is self plus the children's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report import layers

FIT, LAYER, BACK = ("keras.Model.fit", "layer:m/dense (Dense) in fit",
                    "layer-backward:m/dense (Dense) in fit")


def _energy(above: float, own: float) -> dict[str, float]:
    return {"above_idle_J": above, "self_J": own}


def _analysis(package_reliable: bool) -> RunAnalysis:
    """Two calls of fit → its layer's forward (both) and backward (the first), with cpu-package
    figures that noise took below zero (not shown, NaN) where the package is unreliable, and
    cpu-process figures; per call half the API's figure (the backward's whole)."""
    package = {FIT: _energy(5.0, 2.0), LAYER: _energy(2.0, 2.0), BACK: _energy(1.0, 1.0)}
    if not package_reliable:
        package = {k: _energy(math.nan, math.nan) for k in package}
    process = {FIT: _energy(3.0, 1.5), LAYER: _energy(1.0, 1.0), BACK: _energy(0.5, 0.5)}
    apis = [{"api": name, "calls": 1, "total_time_s": 1.0,
             "energy": {"cpu-package": package[name], "cpu-process": process[name]}}
            for name in (FIT, LAYER, BACK)]
    domains = [
        {"domain": "cpu-package", "addable": True, "role": "disjoint", "provenance": "estimated",
         "reliable": package_reliable},
        {"domain": "cpu-process", "addable": False, "role": "share", "provenance": "estimated",
         "reliable": True},
    ]
    order = (FIT, LAYER, BACK)
    calls = {"api": np.array([0, 1, 2, 0, 1]), "parent": np.array([-1, 0, 0, -1, 3]),
             "depth": np.array([0, 1, 1, 0, 1]), "call": np.arange(5),
             "duration_s": np.ones(5),
             "energy_J": {d: np.array([v[k]["above_idle_J"] / (2 if k != BACK else 1)
                                       for k in (*order, FIT, LAYER)])
                          for d, v in (("cpu-package", package), ("cpu-process", process))},
             "self_energy_J": {d: np.array([v[k]["self_J"] / (2 if k != BACK else 1)
                                            for k in (*order, FIT, LAYER)])
                               for d, v in (("cpu-package", package), ("cpu-process", process))}}
    a = RunAnalysis(run={}, repetitions=[], sensors=[], domains=domains, calls=calls, sites=[],
                    apis=apis, per_rep=[], share_in_calls={}, intensities={}, method="overlap",
                    api_names=[FIT, LAYER, BACK])
    layers.annotate(a, {})
    return a


def _adds_up(nodes: list[dict]) -> None:
    for n in nodes:
        if n["children"]:
            children = sum(c["inclusive_J"] for c in n["children"])
            assert n["inclusive_J"] == pytest.approx(n["self_J"] + children)
            _adds_up(n["children"])


@pytest.mark.parametrize(("reliable", "domain", "fit"), [
    (True, "CPU package", (5.0, 2.0)), (False, "cpu-process", (3.0, 1.5))])
def test_the_tree_sums_the_domains_the_report_leads_with(reliable, domain, fit):
    a = _analysis(reliable)
    (top,) = layers.tree(a)
    assert (top["label"], top["calls"]) == (FIT, 2)
    assert (top["inclusive_J"], top["self_J"]) == pytest.approx(fit)
    assert [c["label"] for c in top["children"]] == ["dense (Dense)", "dense (Dense)"]
    assert [c["phase"] for c in top["children"]] == ["forward", "backward"]
    _adds_up([top])
    assert domain.lower() in layers.tree_domains(a).lower()
    row = next(r for r in a.apis if r["api"] == LAYER)
    assert (row["driver"], row["parent_api"]) == ("fit", FIT)

"""Every name reported for the sample projects exists in the framework: the projects run
instrumented with the probe (tf.function and torch.compile units among them), and each site's API
in the store is importable and reachable attribute by attribute, with no `()` in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_probe_hyperparams import assert_names_exist, run_project

PROJECTS = sorted(p.parent for p in (Path(__file__).parents[1] / "projects").glob("*/train.py"))


@pytest.mark.slow
@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_every_name_reported_for_a_sample_project_exists(project: Path, tmp_path: Path) -> None:
    sites, _, manifest = run_project(tmp_path, project)
    assert sites
    assert_names_exist(sites, manifest)
    compiled = {s["written"]: s["api"] for s in sites.values() if "(tf.function)" in s["written"]}
    compiled |= {s["written"]: s["api"] for s in sites.values() if "torch.compile)" in s["written"]}
    if project.name == "tf_data_loop":
        polymorphic = "tensorflow.types.experimental.PolymorphicFunction.__call__"
        assert compiled == {
            "train_step (tf.function)": polymorphic,
            "test_step (tf.function)": polymorphic,
        }
    if project.name == "torch_compile":
        assert compiled == {
            "compiled (ResidualMLP, torch.compile)": "torch.nn.Module.__call__",
            "smoothed_loss (torch.compile)": "torch.compile",
        }

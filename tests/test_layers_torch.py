"""The PyTorch layer hooks leave the program's behaviour alone (in a child process: the hooks are
global to the process that installs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = """
    import json, sys
    from fecomlite.runtime import layers

    events = []
    if sys.argv[1] == "on":
        layers.start(lambda site, t0, t1, raised=False: events.append([site, raised]), None)
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    out = {}
    net = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    try:  # autograd's check of a saved tensor modified in place must still fire
        h = net(torch.randn(2, 4))
        h.mul_(2)
        h.sum().backward()
        out["inplace"] = "no error"
    except RuntimeError as exc:
        out["inplace"] = str(exc).split(":")[0]
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    x = torch.randn(3, 4, requires_grad=True)
    net(x).sum().backward()
    out["grad"] = [round(v, 6) for v in x.grad.flatten().tolist()]
    bad = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 1))
    try:
        bad(torch.randn(2, 4))
    except RuntimeError as exc:
        out["raised"] = type(exc).__name__
    out["events"] = events
    print(json.dumps(out))
"""


def run(tmp_path, flag: str) -> dict:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    done = subprocess.run(
        [sys.executable, str(script), flag],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert done.stderr == ""
    return json.loads(done.stdout)


@pytest.mark.slow
def test_hooks_change_no_result_no_error_and_record_the_failing_layer(tmp_path):
    off, on = run(tmp_path, "off"), run(tmp_path, "on")
    assert on["inplace"] == off["inplace"] != "no error"
    assert on["grad"] == off["grad"] and on["raised"] == off["raised"] == "RuntimeError"
    assert off["events"] == []
    sites = [site for site, _ in on["events"]]
    assert "layer:Sequential/1 (ReLU)" in sites and "layer-backward:Sequential/1 (ReLU)" in sites
    assert ["layer:Sequential/1 (Linear)", True] in on["events"]  # the forward that raised

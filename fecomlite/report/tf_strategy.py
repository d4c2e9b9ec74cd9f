"""What the report can say of a TensorFlow `tf.distribute` program, and what it cannot.

A strategy's replicas are threads of one process (MirroredStrategy) or workers that no launcher
numbers for us (MultiWorkerMirroredStrategy: TF_CONFIG, not torchrun's RANK). So the calls the
program makes (`strategy.run`, `model.fit` under `strategy.scope()`) are measured whole, across
replicas; nothing is split per replica. Each visible GPU is still an energy domain of its own
(`gpu:0`, `gpu:1`): the report is per device, not per replica.
"""

from __future__ import annotations

from typing import Any

from fecomlite.analysis.run_analysis import RunAnalysis

PREFIXES = ("tensorflow.distribute.", "tf.distribute.")
STRATEGIES = frozenset(
    {
        "MirroredStrategy",
        "MultiWorkerMirroredStrategy",
        "CentralStorageStrategy",
        "ParameterServerStrategy",
        "TPUStrategy",
    }
)
NOTE = (
    "{strategy}: its replicas run inside this process (MultiWorkerMirroredStrategy: one run per "
    "worker, not merged), so each call your code makes, such as strategy.run or model.fit under "
    "strategy.scope(), is measured whole across the replicas; nothing is split per replica. "
    "{devices}"
)


def strategy_section(a: RunAnalysis) -> dict[str, Any] | None:
    """{strategy, per_replica: False, devices, note} for a run that made a tf.distribute
    strategy; None otherwise."""
    made = [n for n in a.api_names if n.startswith(PREFIXES) and n.rpartition(".")[2] in STRATEGIES]
    if not made:
        return None
    gpus = sorted(d["domain"] for d in a.domains if d["domain"].startswith("gpu:"))
    devices = (
        f"Each GPU's energy is its own domain ({', '.join(gpus)}): per device, not per replica."
        if gpus
        else "No GPU was measured: the replicas' CPU work shares the CPU package and DRAM."
    )
    strategy = made[0]
    return {
        "strategy": strategy,
        "per_replica": False,
        "devices": gpus,
        "note": NOTE.format(strategy=strategy, devices=devices),
    }

"""TensorFlow's MirroredStrategy on CPU (two logical devices, two replicas): the program runs as
it does without fecomlite, and the report says what it measured and what it cannot split."""

from __future__ import annotations

import textwrap

from run_helpers import fecomlite_run, report_json

MIRRORED_PROGRAM = """
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.random.default_rng(0).normal(size=(128, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((8,)), tf.keras.layers.Dense(8, activation="relu"),
             tf.keras.layers.Dense(1, activation="sigmoid")]
        )
        model.compile(optimizer="sgd", loss="binary_crossentropy")
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    print(f"replicas {strategy.num_replicas_in_sync}, trained: {len(history.history['loss'])}")
"""


def test_a_mirrored_strategy_program_runs_and_the_report_says_what_is_per_replica(home, tmp_path):
    script = tmp_path / "tfdist" / "mirrored.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(MIRRORED_PROGRAM))
    result = fecomlite_run(tmp_path, home, script)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "replicas 2, trained: 1" in result.stdout

    data = report_json(tmp_path, home)
    apis = {a["api"]: a for a in data["apis"]}
    assert apis["keras.Sequential.fit"]["calls"] == 1  # measured whole, across the replicas
    assert apis["tensorflow.distribute.MirroredStrategy"]["calls"] == 1
    assert data["ranks"] == []  # replicas are not ranks
    section = data["tf_distribute"]
    assert section["strategy"] == "tensorflow.distribute.MirroredStrategy"
    assert section["per_replica"] is False and section["devices"] == []  # no GPU here
    assert section["note"] in data["notes"]
    assert "nothing is split per replica" in (tmp_path / "report" / "index.html").read_text()

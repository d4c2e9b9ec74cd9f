"""A tf.data input pipeline feeding a hand-written training loop with GradientTape."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

SEED = 3
NUM_SAMPLES = 3000
NUM_FEATURES = 10
NUM_CLASSES = 3
EPOCHS = 4
BATCH_SIZE = 128
LEARNING_RATE = 5e-3


def make_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Labels from a fixed nonlinear rule, so the model has something real to learn."""
    x = rng.uniform(-1.0, 1.0, size=(NUM_SAMPLES, NUM_FEATURES)).astype("float32")
    score = np.sin(3.0 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3]
    y = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3])).astype("int32")
    return x, y


def make_pipeline(x: np.ndarray, y: np.ndarray, training: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if training:
        ds = ds.shuffle(buffer_size=len(x), seed=SEED, reshuffle_each_iteration=True)
    return ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def main() -> None:
    tf.keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(SEED)

    x, y = make_data(rng)
    split = int(0.8 * NUM_SAMPLES)
    train_ds = make_pipeline(x[:split], y[:split], training=True)
    test_ds = make_pipeline(x[split:], y[split:], training=False)
    n_train, n_test = train_ds.cardinality().numpy(), test_ds.cardinality().numpy()
    print(f"train batches {n_train} test batches {n_test}")

    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(NUM_FEATURES,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(NUM_CLASSES),
        ]
    )
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.Adam(learning_rate=LEARNING_RATE)
    train_loss = tf.keras.metrics.Mean(name="train_loss")
    train_acc = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_acc = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

    @tf.function
    def train_step(features: tf.Tensor, labels: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = loss_fn(labels, logits)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_loss.update_state(loss)
        train_acc.update_state(labels, logits)

    @tf.function
    def test_step(features: tf.Tensor, labels: tf.Tensor) -> None:
        test_acc.update_state(labels, model(features, training=False))

    for epoch in range(EPOCHS):
        train_loss.reset_state()
        train_acc.reset_state()
        for features, labels in train_ds:
            train_step(features, labels)
        print(
            f"epoch {epoch + 1} loss {train_loss.result().numpy():.3f} "
            f"train accuracy {train_acc.result().numpy():.3f}"
        )

    for features, labels in test_ds:
        test_step(features, labels)
    print(f"accuracy {test_acc.result().numpy():.3f}")


if __name__ == "__main__":
    main()

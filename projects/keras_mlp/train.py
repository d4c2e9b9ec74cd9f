"""Keras MLP classifier on synthetic Gaussian blobs: compile, fit, evaluate, predict."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers

SEED = 42
NUM_CLASSES = 4
NUM_FEATURES = 16
SAMPLES_PER_CLASS = 500
EPOCHS = 5
BATCH_SIZE = 64
LEARNING_RATE = 1e-3


def make_blobs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping Gaussian clusters, one per class, so accuracy is high but not perfect."""
    centres = rng.normal(0.0, 1.5, size=(NUM_CLASSES, NUM_FEATURES))
    x = np.concatenate(
        [c + rng.normal(0.0, 1.5, size=(SAMPLES_PER_CLASS, NUM_FEATURES)) for c in centres]
    )
    y = np.repeat(np.arange(NUM_CLASSES), SAMPLES_PER_CLASS)
    order = rng.permutation(len(y))
    return x[order].astype("float32"), y[order].astype("int64")


def build_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input(shape=(NUM_FEATURES,)),
            layers.Dense(64, activation="relu"),
            layers.Dropout(0.2),
            layers.Dense(32, activation="relu"),
            layers.Dense(NUM_CLASSES, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=LEARNING_RATE),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(SEED)

    x, y = make_blobs(rng)
    split = int(0.8 * len(y))
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    x_train = (x_train - mean) / std
    x_test = (x_test - mean) / std
    print(f"train {x_train.shape} test {x_test.shape}")

    model = build_model()
    print(f"parameters {model.count_params()}")
    history = model.fit(
        x_train, y_train, epochs=EPOCHS, batch_size=BATCH_SIZE, validation_split=0.1, verbose=0
    )
    print(f"final train loss {history.history['loss'][-1]:.3f}")

    test_loss, test_acc = model.evaluate(x_test, y_test, batch_size=BATCH_SIZE, verbose=0)
    print(f"test loss {test_loss:.3f}")

    probs = model.predict(x_test[:8], verbose=0)
    print(f"predicted classes {np.argmax(probs, axis=1).tolist()}")
    print(f"accuracy {test_acc:.3f}")


if __name__ == "__main__":
    main()

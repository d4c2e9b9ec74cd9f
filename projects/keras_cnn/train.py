"""Keras CNN that tells drawn squares, discs and crosses apart, with augmentation layers."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow.keras import layers, models

SEED = 7
IMAGE_SIZE = 32
CLASS_NAMES = ("square", "disc", "cross")
IMAGES_PER_CLASS = 200
EPOCHS = 4
BATCH_SIZE = 32
LEARNING_RATE = 2e-3


def draw_shape(kind: int, rng: np.random.Generator) -> np.ndarray:
    """One grey-scale image with a single shape of random size and position, plus noise."""
    image = rng.normal(0.0, 0.1, size=(IMAGE_SIZE, IMAGE_SIZE)).astype("float32")
    radius = int(rng.integers(5, 10))
    cy, cx = rng.integers(radius + 1, IMAGE_SIZE - radius - 1, size=2)
    yy, xx = np.mgrid[:IMAGE_SIZE, :IMAGE_SIZE]
    if kind == 0:
        mask = (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius)
    elif kind == 1:
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
    else:
        arm = (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius)
        mask = arm & ((np.abs(yy - cy) <= 1) | (np.abs(xx - cx) <= 1))
    image[mask] += 1.0
    return image


def make_dataset(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = np.repeat(np.arange(len(CLASS_NAMES)), IMAGES_PER_CLASS)
    rng.shuffle(labels)
    images = np.stack([draw_shape(int(k), rng) for k in labels])[..., np.newaxis]
    return images, labels


def build_model() -> tf.keras.Model:
    augment = tf.keras.Sequential(
        [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1, seed=SEED)],
        name="augment",
    )
    model = models.Sequential(
        [
            layers.Input(shape=(IMAGE_SIZE, IMAGE_SIZE, 1)),
            augment,
            layers.Conv2D(16, 3, activation="relu", padding="same"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, activation="relu", padding="same"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(32, activation="relu"),
            layers.Dense(len(CLASS_NAMES)),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(LEARNING_RATE),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    tf.keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(SEED)

    images, labels = make_dataset(rng)
    split = int(0.8 * len(labels))
    print(f"images {images.shape} classes {len(CLASS_NAMES)}")

    model = build_model()
    model.fit(images[:split], labels[:split], epochs=EPOCHS, batch_size=BATCH_SIZE, verbose=0)
    loss, acc = model.evaluate(images[split:], labels[split:], verbose=0)
    print(f"test loss {loss:.3f}")

    logits = model.predict(images[split : split + 6], verbose=0)
    predicted = [CLASS_NAMES[i] for i in tf.argmax(logits, axis=1).numpy()]
    print(f"predicted {predicted}")
    print(f"accuracy {acc:.3f}")


if __name__ == "__main__":
    main()

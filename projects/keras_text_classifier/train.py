"""Keras text classifier (TextVectorization + Embedding) trained, saved, loaded and checked."""

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
from keras import layers

SEED = 11
NUM_SENTENCES = 1200
MAX_TOKENS = 200
SEQUENCE_LENGTH = 12
EMBEDDING_DIM = 16
EPOCHS = 6
BATCH_SIZE = 32
OUT_DIR = Path("out")

SUBJECTS = ["the film", "this book", "the meal", "our trip", "the concert", "that game"]
VERBS = ["was", "felt", "seemed", "turned out"]
POSITIVE = ["great", "wonderful", "delightful", "superb", "fun", "brilliant"]
NEGATIVE = ["awful", "boring", "dreadful", "bland", "tedious", "terrible"]
FILLERS = ["really", "quite", "very", "somewhat", "truly", ""]
ENDINGS = ["overall", "in the end", "to me", "for everyone", "honestly", ""]


def make_sentences(rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    """Template sentences; the label is the sentiment word, flipped by "not" half the time."""
    texts, labels = [], []
    for _ in range(NUM_SENTENCES):
        positive = bool(rng.integers(2))
        negated = rng.random() < 0.3
        word = rng.choice(POSITIVE if positive != negated else NEGATIVE)
        parts = [rng.choice(SUBJECTS), rng.choice(VERBS)]
        parts += ["not"] if negated else []
        parts += [rng.choice(FILLERS), word, rng.choice(ENDINGS)]
        texts.append(" ".join(p for p in parts if p))
        labels.append(int(positive))
    return texts, np.array(labels, dtype="float32")


def build_model(vectorizer: layers.TextVectorization) -> keras.Model:
    inputs = keras.Input(shape=(), dtype="string")
    x = vectorizer(inputs)
    x = layers.Embedding(MAX_TOKENS, EMBEDDING_DIM)(x)
    x = layers.Conv1D(16, 3, activation="relu")(x)
    x = layers.GlobalMaxPooling1D()(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, outputs, name="sentiment")
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def main() -> None:
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(SEED)

    texts, labels = make_sentences(rng)
    split = int(0.8 * NUM_SENTENCES)
    train_texts = tf.constant(texts[:split])
    test_texts = tf.constant(texts[split:])
    print(f"sentences {len(texts)} example '{texts[0]}'")

    vectorizer = layers.TextVectorization(
        max_tokens=MAX_TOKENS, output_mode="int", output_sequence_length=SEQUENCE_LENGTH
    )
    vectorizer.adapt(texts[:split])
    print(f"vocabulary {vectorizer.vocabulary_size()}")

    model = build_model(vectorizer)
    model.fit(train_texts, labels[:split], epochs=EPOCHS, batch_size=BATCH_SIZE, verbose=0)
    loss, acc = model.evaluate(test_texts, labels[split:], verbose=0)
    print(f"test loss {loss:.3f}")

    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / "sentiment.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    before = model.predict(test_texts, verbose=0)
    after = restored.predict(test_texts, verbose=0)
    print(f"reloaded predictions match {bool(np.allclose(before, after, atol=1e-6))}")
    print(f"accuracy {acc:.3f}")


if __name__ == "__main__":
    main()

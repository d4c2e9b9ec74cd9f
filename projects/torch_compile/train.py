"""A residual MLP classifier compiled with torch.compile, defined in another module (model.py).

The compiled model sees two batch sizes (the last batch of each epoch is smaller), so dynamo
compiles a second, dynamic-shape graph; the loss is a compiled function of its own.
"""

import torch
import torch._dynamo
import torch.nn.functional as F
from model import ResidualMLP
from torch._dynamo.utils import counters

SEED = 11
NUM_SAMPLES = 2300
NUM_FEATURES = 16
NUM_CLASSES = 4
WIDTH = 64
DEPTH = 2
EPOCHS = 6
BATCH_SIZE = 256
LEARNING_RATE = 2e-3
# Dynamo captures the same graphs whatever the backend; "aot_eager" runs them through AOTAutograd
# without generating C++ kernels (inductor's compile takes minutes on a 2-core machine).
BACKEND = "aot_eager"


def make_splits(generator: torch.Generator) -> list[torch.Tensor]:
    """Four Gaussian clusters in 16 dimensions, one per class: train x, y, then test x, y."""
    centres = 0.7 * torch.randn(NUM_CLASSES, NUM_FEATURES, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,), generator=generator)
    x = centres[labels] + torch.randn(NUM_SAMPLES, NUM_FEATURES, generator=generator)
    cut = int(0.8 * NUM_SAMPLES)
    return [x[:cut], labels[:cut], x[cut:], labels[cut:]]


@torch.compile(backend=BACKEND)
def smoothed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, label_smoothing=0.1)


def main() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(SEED)
    x_train, y_train, x_test, y_test = make_splits(generator)
    split = len(x_train)
    print(f"train {tuple(x_train.shape)} test {tuple(x_test.shape)}")

    model = ResidualMLP(NUM_FEATURES, WIDTH, NUM_CLASSES, DEPTH)
    compiled = torch.compile(model, backend=BACKEND)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    for epoch in range(EPOCHS):
        order = torch.randperm(split, generator=generator)
        for start in range(0, split, BATCH_SIZE):
            idx = order[start : start + BATCH_SIZE]
            loss = smoothed_loss(compiled(x_train[idx]), y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if (epoch + 1) % 2 == 0:
            print(f"epoch {epoch + 1} loss {loss.item():.3f}")

    compiled.eval()
    with torch.no_grad():
        predicted = torch.argmax(compiled(x_test), dim=1)
    graphs = counters["stats"]["unique_graphs"]
    print(f"compiled graphs {graphs}")
    print(f"accuracy {(predicted == y_test).float().mean().item():.3f}")


if __name__ == "__main__":
    main()

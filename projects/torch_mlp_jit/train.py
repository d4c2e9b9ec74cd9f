"""Small PyTorch MLP regressor whose loss is a TorchScript function (torch.jit.script)."""

import warnings

import torch
from torch import nn, optim

warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*deprecated")

SEED = 5
NUM_SAMPLES = 4000
NUM_FEATURES = 8
HIDDEN = 64
EPOCHS = 30
BATCH_SIZE = 256
LEARNING_RATE = 3e-3
HUBER_DELTA = 0.5


@torch.jit.script
def huber_loss(pred: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    """Robust to the outliers planted in the targets; scripted so it runs as one graph."""
    error = torch.abs(pred - target)
    quadratic = torch.clamp(error, max=delta)
    return torch.mean(0.5 * quadratic**2 + delta * (error - quadratic))


def make_data(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(NUM_SAMPLES, NUM_FEATURES, generator=generator)
    weights = torch.linspace(-1.0, 1.0, NUM_FEATURES)
    y = torch.tanh(x @ weights) + 0.3 * x[:, 0] * x[:, 1]
    y = y + 0.05 * torch.randn(NUM_SAMPLES, generator=generator)
    outliers = torch.rand(NUM_SAMPLES, generator=generator) < 0.02
    y[outliers] += 5.0
    return x, y.unsqueeze(1)


def main() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(SEED)

    x, y = make_data(generator)
    split = int(0.8 * NUM_SAMPLES)
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]
    print(f"train {tuple(x_train.shape)} test {tuple(x_test.shape)}")

    model = nn.Sequential(
        nn.Linear(NUM_FEATURES, HIDDEN),
        nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.GELU(),
        nn.Linear(HIDDEN, 1),
    )
    optimizer = optim.Adam(model.parameters(), lr=LEARNING_RATE)

    for epoch in range(EPOCHS):
        order = torch.randperm(split, generator=generator)
        for start in range(0, split, BATCH_SIZE):
            idx = order[start : start + BATCH_SIZE]
            loss = huber_loss(model(x_train[idx]), y_train[idx], HUBER_DELTA)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1} loss {loss.item():.3f}")

    model.eval()
    with torch.no_grad():
        pred = model(x_test)
        test_loss = huber_loss(pred, y_test, HUBER_DELTA).item()
        inliers = (y_test - pred).abs() < 1.0
        print(f"test huber loss {test_loss:.3f}")
        print(f"accuracy {inliers.float().mean().item():.3f} (share within 1.0 of target)")


if __name__ == "__main__":
    main()

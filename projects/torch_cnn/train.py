"""PyTorch CNN that classifies the orientation of stripe patterns, trained with a DataLoader."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

SEED = 0
IMAGE_SIZE = 28
ANGLES = (0.0, 30.0, 60.0, 90.0, 120.0, 150.0)
IMAGES_PER_CLASS = 150
EPOCHS = 5
BATCH_SIZE = 32
LEARNING_RATE = 0.02
MOMENTUM = 0.9


def make_stripes(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sinusoidal gratings; the class is the stripe angle, the period and phase vary."""
    labels = torch.arange(len(ANGLES)).repeat_interleave(IMAGES_PER_CLASS)
    labels = labels[torch.randperm(len(labels), generator=generator)]
    coords = torch.arange(IMAGE_SIZE, dtype=torch.float32)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    angles = torch.tensor(ANGLES)[labels] * math.pi / 180.0
    period = 4.0 + 4.0 * torch.rand(len(labels), generator=generator)
    phase = 2 * math.pi * torch.rand(len(labels), generator=generator)
    along = xx * torch.cos(angles)[:, None, None] + yy * torch.sin(angles)[:, None, None]
    images = torch.sin(2 * math.pi * along / period[:, None, None] + phase[:, None, None])
    images = images + 1.5 * torch.randn(images.shape, generator=generator)
    return images.unsqueeze(1), labels


class StripeNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = self.dropout(torch.flatten(x, 1))
        return self.fc2(F.relu(self.fc1(x)))


def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            logits = model(images)
            total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            seen += labels.numel()
    return total_loss / seen, correct / seen


def main() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    generator = torch.Generator().manual_seed(SEED)

    images, labels = make_stripes(generator)
    split = int(0.8 * len(labels))
    train_set = TensorDataset(images[:split], labels[:split])
    test_set = TensorDataset(images[split:], labels[split:])
    shuffle_generator = torch.Generator().manual_seed(SEED)
    train_loader = DataLoader(
        train_set, batch_size=BATCH_SIZE, shuffle=True, generator=shuffle_generator
    )
    test_loader = DataLoader(test_set, batch_size=BATCH_SIZE)
    print(f"train {tuple(images[:split].shape)} test {tuple(images[split:].shape)}")

    model = StripeNet(num_classes=len(ANGLES))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    criterion = nn.CrossEntropyLoss()
    print(f"parameters {sum(p.numel() for p in model.parameters())}")

    for epoch in range(EPOCHS):
        model.train()
        running_loss = 0.0
        for batch_images, batch_labels in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(batch_images), batch_labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item() * batch_labels.numel()
        print(f"epoch {epoch + 1} loss {running_loss / len(train_set):.3f}")

    test_loss, test_acc = evaluate(model, test_loader)
    print(f"test loss {test_loss:.3f}")
    print(f"accuracy {test_acc:.3f}")


if __name__ == "__main__":
    main()

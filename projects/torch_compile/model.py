"""The classifier: a residual MLP whose forward pass torch.compile turns into graphs (train.py)."""

import torch
import torch.nn.functional as F
from torch import nn


def standardise(x: torch.Tensor) -> torch.Tensor:
    """Per-sample standardisation, traced into the same graph as the model that calls it."""
    mean = torch.mean(x, dim=1, keepdim=True)
    std = torch.std(x, dim=1, keepdim=True)
    return (x - mean) / (std + 1e-5)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(self.norm(x)))


class ResidualMLP(nn.Module):
    def __init__(self, features: int, width: int, classes: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(standardise(x)))
        for block in self.blocks:
            h = block(h)
        return self.head(h)

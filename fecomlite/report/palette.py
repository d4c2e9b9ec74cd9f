"""Colours and display names: one colour per energy domain, the same in every chart and table."""

from __future__ import annotations

DOMAIN_COLORS = {
    "cpu-package": "#2f6fde",
    "cpu-core": "#6aa3f5",
    "cpu-uncore": "#93b7ea",
    "dram": "#139a8c",
    "psys": "#6b7280",
}
GPU_COLORS = ("#e3742f", "#b8457d", "#c99a06", "#8b5cf6")
MEMORY_COLORS = {"rss": "#7c4dcc", "gpu_memory": "#d04a8e"}
# Call lanes and scatter groups: a qualitative palette that avoids the domain colours' hues.
SERIES_COLORS = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
)
DOMAIN_NAMES = {
    "cpu-package": "CPU package",
    "cpu-core": "CPU cores",
    "cpu-uncore": "CPU uncore",
    "dram": "DRAM",
    "psys": "platform",
}


def domain_color(domain: str) -> str:
    if domain.startswith("gpu:"):
        index = int(domain[4:]) if domain[4:].isdigit() else 0
        return GPU_COLORS[index % len(GPU_COLORS)]
    return DOMAIN_COLORS.get(domain, "#6b7280")


def domain_name(domain: str) -> str:
    """'gpu:0' → 'GPU 0', 'cpu-package' → 'CPU package'; unknown domains as they are."""
    if domain.startswith("gpu:"):
        return f"GPU {domain[4:]}"
    return DOMAIN_NAMES.get(domain, domain)


def shade(color: str, k: int, n: int) -> str:
    """The k-th of n shades of `color`, from the colour itself toward white (for repetitions)."""
    if n <= 1:
        return color
    mix = 0.6 * k / (n - 1)
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)

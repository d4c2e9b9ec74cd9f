"""Cache hierarchies from sysfs trees, GPU L2 from the table, and where a working set lands."""

from __future__ import annotations

from pathlib import Path

import pytest

from fecomlite.model.cache import (
    HierarchyError,
    MemoryHierarchy,
    cpu_hierarchy,
    gpu_hierarchy,
    hierarchy_for,
    parse_size,
)


def make_cache(root: Path, cpu: int, index: int, level: int, kind: str, size: str) -> None:
    folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
    folder.mkdir(parents=True)
    (folder / "level").write_text(f"{level}\n")
    (folder / "type").write_text(f"{kind}\n")
    (folder / "size").write_text(f"{size}\n")


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "cpu"
    make_cache(root, 0, 0, 1, "Data", "32K")
    make_cache(root, 0, 1, 1, "Instruction", "64K")
    make_cache(root, 0, 2, 2, "Unified", "1024K")
    make_cache(root, 0, 3, 3, "Unified", "8M")
    return root


@pytest.mark.parametrize(("text", "size"), [
    ("48K", 48 * 1024), ("2048K\n", 2 << 20), ("32M", 32 << 20), ("1G", 1 << 30), ("512", 512),
])
def test_sysfs_sizes_are_binary_units(text, size):
    assert parse_size(text) == size


def test_unreadable_size_is_an_error():
    with pytest.raises(HierarchyError, match="cannot read cache size"):
        parse_size("lots")


def test_data_and_unified_caches_then_dram(sysfs):
    h = cpu_hierarchy(sysfs)
    assert h.level_names == ["L1d", "L2", "L3", "DRAM"]
    assert [lv.size_bytes for lv in h.levels] == [32 << 10, 1 << 20, 8 << 20, None]
    assert h.breakpoints() == [("L1d", 32 << 10), ("L2", 1 << 20), ("L3", 8 << 20)]
    assert str(sysfs) in h.source


def test_a_working_set_goes_to_the_smallest_level_it_fits(sysfs):
    h = cpu_hierarchy(sysfs)
    assert h.level_of(0) == "L1d"
    assert h.level_of(32 << 10) == "L1d"
    assert h.level_of((32 << 10) + 1) == "L2"
    assert h.level_of(8 << 20) == "L3"
    assert h.level_of(1e12) == "DRAM"
    with pytest.raises(HierarchyError):
        h.level_of(-1)


def test_no_caches_in_sysfs_means_dram_only_and_says_so(tmp_path):
    h = cpu_hierarchy(tmp_path)
    assert h.level_names == ["DRAM"]
    assert "no caches" in h.source


def test_this_machines_levels_grow(tmp_path):
    h = cpu_hierarchy()
    sizes = [lv.size_bytes for lv in h.levels[:-1]]
    assert h.levels[-1].name == "DRAM"
    assert sizes == sorted(sizes)


def test_gpu_l2_comes_from_the_table_or_is_unknown():
    h200 = gpu_hierarchy("NVIDIA H200", 1)
    assert h200.device == "gpu:1"
    assert h200.level_names == ["L2", "VRAM"] and h200.levels[0].size_bytes == 50 << 20
    odd = gpu_hierarchy("Some Future GPU")
    assert odd.level_names == ["VRAM"] and "unknown" in odd.source


def test_hierarchy_for_a_device(sysfs):
    machine = {"gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB"}]}
    assert hierarchy_for("gpu:0", machine).levels[0].size_bytes == 40 << 20
    assert hierarchy_for("cpu").device == "cpu"
    with pytest.raises(HierarchyError, match="device must be"):
        hierarchy_for("tpu")


def test_json_round_trip(sysfs):
    h = cpu_hierarchy(sysfs)
    assert MemoryHierarchy.from_json(h.to_json()) == h
    with pytest.raises(HierarchyError):
        MemoryHierarchy.from_json({"device": "cpu"})

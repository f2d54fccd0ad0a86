"""Launch helpers shared by the kernel families: geometry read off a layout, input views,
launch sizes. Nothing here synchronises with the host, so every launcher stays CUDA-graph
capturable."""

from __future__ import annotations

import struct

import torch

# Rows per program and warps per program of each kernel, by (family, op). Benchmarks may
# override entries; tests run whatever is here.
CONFIG: dict[tuple[str, str], dict[str, int]] = {  # fastest at 131,072 rows on an H200 (benchmarks/)
    ("fp8_ds_mla", "encode"): {"block_m": 16, "num_warps": 4},
    ("fp8_ds_mla", "decode"): {"block_m": 16, "num_warps": 4},
    ("gather", "bytes"): {"tile_bytes": 16384, "num_warps": 4},
    ("indexer", "encode"): {"block_m": 32, "num_warps": 4},
    ("indexer", "decode"): {"block_m": 16, "num_warps": 4},
    ("state", "copy"): {"block_m": 1, "block_w": 2048, "num_warps": 4},
}


def config(family: str, op: str) -> dict[str, int]:
    return CONFIG[(family, op)]


def f32(value: float) -> float:
    """The float32 value nearest to ``value`` (round to nearest even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def rows_per_tile(tile: int, row: int) -> int:
    """Rows per program so that a program's tile spans about ``tile`` elements (a power of two)."""
    return max(1, tile // row)


def grid_rows(n: int, block_m: int) -> int:
    return (n + block_m - 1) // block_m


def region(layout, name: str):
    """(in-page byte offset of row 0, byte stride between rows, bytes per row) of a region."""
    r = layout.region(name)
    return r.offset, r.row_stride, r.nbytes


def capacity(layout, cache: torch.Tensor) -> int:
    """Slots the cache holds; kernels skip slot >= capacity (no write outside the cache)."""
    return cache.shape[0] * layout.page_size


def byte_cache(layout, cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(uint8 alias of the cache, page stride in bytes)."""
    return layout.byte_pages(cache)


def rows_input(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(``x [N, D]`` with unit column stride, whether it is bf16). The row stride is passed to
    the kernel; bf16 goes as its int16 bit patterns, which kernels widen exactly (load_f32)."""
    if x.stride(1) != 1 and x.shape[1] > 1:
        x = x.contiguous()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16), True
    return x, False


def row_stride(x: torch.Tensor) -> int:
    return x.stride(0) if x.shape[0] > 1 else x.shape[1]


def rule_constants(rule) -> dict:
    """A ScaleRule as kernel constexprs (floor and element max rounded to float32 as torch does)."""
    return dict(FLOOR=f32(rule.floor), ELEM_MAX=f32(rule.element_max), FLOOR_ON_SCALE=rule.floor_on == "scale",
                E_MIN=rule.exponent_min, E_MAX=rule.exponent_max)

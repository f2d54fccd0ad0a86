"""PNG images of small grids of colours, written with zlib alone (no imaging package): a page's
heatmap is one pixel per cell, drawn scaled up by the browser, so a page of 64 rows x 32 blocks
costs a few KB instead of two thousand SVG elements."""

from __future__ import annotations

import base64
import struct
import zlib

import torch

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(rgb: torch.Tensor) -> bytes:
    """uint8 ``[height, width, 3]`` -> the bytes of an 8-bit RGB PNG."""
    height, width, _ = rgb.shape
    rows = torch.cat([torch.zeros((height, 1), dtype=torch.uint8), rgb.reshape(height, width * 3)], dim=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, truecolour, no interlace
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(bytes(rows.flatten().tolist()), 9)) \
        + _chunk(b"IEND", b"")


def data_uri(rgb: torch.Tensor) -> str:
    return "data:image/png;base64," + base64.b64encode(png(rgb)).decode("ascii")


def hex_rgb(colour: str) -> tuple[int, int, int]:
    """``"#d62828"`` -> ``(214, 40, 40)``."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)

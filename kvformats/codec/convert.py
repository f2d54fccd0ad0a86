"""Converters between format variants: re-layout (byte permutations, always exact) and
re-quantization (decode, map dims, encode; exact only where the target grid holds every value).

* ``convert_rows(src, rows, dst, exact=...)``: gathered rows of layout ``src`` -> rows of ``dst``.
  Supported pairs, read from the layouts' data regions: the same format with another profile (or
  any parameters of equal data regions), and two formats whose data regions have the same names
  and element types, each region's elements mapped by index (a longer target region takes
  zeros, a shorter one drops the source's last elements). So V4 ``fp8_ds_mla`` (head 512 = 448
  NoPE + 64 RoPE) <-> V3.2 ``fp8_ds_mla_v32`` (head 576 = 512 NoPE + 64 RoPE):

  * 584 -> 656: V3.2 NoPE dims 0..447 = V4 NoPE dims 0..447 (V4 blocks 2t, 2t+1 form V3.2 tile
    t), V3.2 NoPE dims 448..511 = 0, V3.2 RoPE = V4 RoPE (bf16 bytes copied). Values are the V4
    decoded values re-quantized per 128-tile: exact when both 64-blocks of a tile share one
    exponent (or the smaller block's values lie on the coarser grid); otherwise each element moves
    by at most the V3.2 bound, ``max(|x|/16, 2^(e_t-10))`` with ``x`` the V4 decoded value.
  * 656 -> 584: V4 NoPE dims 0..447 = V3.2 NoPE dims 0..447, V3.2 NoPE dims 448..511 are dropped
    (exact only if they are zero), RoPE copied. From power-of-two scales (flashmla-ref) the kept
    values are always exact (a 64-block's scale is at most its tile's, so every e4m3 value of the
    tile stays on the finer grid); from arbitrary float32 scales (vllm) the decoded bf16 values
    are re-quantized with error at most ``max(|x|/16, 2^(e_b-10))``.
  * same format, other profile: decode then encode with the target's rules; error at most the
    target format's bound on the decoded values (0 where the target grid holds them).

  ``exact=True`` raises ConversionError (nothing is returned or written) unless decoding the
  result gives back, bit for bit, the mapped source values; the message names the alternatives
  (``exact=False``, or a target profile/format that holds the values).
  * two layouts of one record (``fp8_ds_mla_v41`` <-> ``fp8_ds_mla_v41_interleaved``, the fp4
    pair, with the same profile): the row bytes are the same, copied exactly.
* ``convert_slots``: the same between two caches, by slot lists; every check runs before any
  byte of the destination is written.
* ``pack_ue8m0`` / ``unpack_ue8m0``: ue8m0 scale bytes ``[N, k]`` <-> DeepGEMM's packed int32
  ``[N, ceil(k/4)]`` (byte j of word w = scale 4w + j, little-endian; padding bytes 127 = 1.0).
  Exact both ways; ``unpack(strict=True)`` refuses padding that is not 127.
* ``to_token_interleaved`` / ``to_page_planar``: a page's segments (e.g. the indexer's
  ``[P x values | P x scales]``) <-> one record per row (``[P x (values | scales)]``, the layout
  vLLM's Ampere port read, spec/engines.md §3). Pure byte permutations: exact, any byte format.
"""

from __future__ import annotations

import torch

from kvformats.codec.rows import read_rows, write_rows
from kvformats.errors import ConversionError, InputError, InputTypeError, describe  # noqa: F401 - ConversionError re-exported
from kvformats.validation import check_cache


def _data(layout) -> list[tuple[str, str]]:
    return [(r.name, r.dtype) for r in layout.data_regions]


def region_pairs(src, dst) -> list[tuple]:
    """(source, target) data regions, in row order: a conversion maps each region's elements by
    index. The same format converts between parameters of equal data regions (another profile);
    two formats convert when their data regions have the same names and element types, a target
    region longer than its source taking zeros, a shorter one dropping the source's last elements
    (the V4 and V3.2 rows: NoPE 448 <-> 512, RoPE 64 <-> 64)."""
    same = type(src) is type(dst)
    if not same and _data(src) != _data(dst):
        raise ConversionError(f"no converter from {src.name} to {dst.name}; supported: the same format (another "
                              f"profile), and formats whose data regions have the same names and element types "
                              f"({src.name}: {_data(src)}, {dst.name}: {_data(dst)})")
    pairs = list(zip(src.data_regions, dst.data_regions))
    if same and any(s.count != d.count for s, d in pairs):
        width = lambda lay: sum(r.count for r in lay.data_regions)  # noqa: E731
        raise ConversionError(f"{src.name} -> {dst.name}: head sizes differ ({width(src)} vs {width(dst)})")
    return pairs


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _map(pairs, x: torch.Tensor) -> tuple[torch.Tensor, list[tuple[str, int, torch.Tensor]]]:
    """Decoded source rows ``x`` -> the target's decoded order, and what was dropped: (region,
    first dropped element, the dropped values) per region the target holds fewer of."""
    parts, dropped, at = [], [], 0
    for s, d in pairs:
        part = x[:, at:at + s.count]
        at += s.count
        if d.count < s.count:
            dropped.append((s.name, d.count, part[:, d.count:]))
            part = part[:, :d.count]
        elif d.count > s.count:
            part = torch.cat([part, part.new_zeros((x.shape[0], d.count - s.count))], dim=1)
        parts.append(part)
    return torch.cat(parts, dim=1), dropped


def row_record(layout) -> tuple:
    """What a gathered row holds, byte for byte: each region's name, type, place in the row, and
    the numerics profile that chose the bytes."""
    return (tuple((r.name, r.dtype, r.row_offset, r.nbytes, r.block) for r in layout.regions if not r.per_page),
            getattr(layout, "profile", None))


def convert_rows(src, rows: torch.Tensor, dst, *, exact: bool = False) -> torch.Tensor:
    """Gathered rows of ``src`` (uint8 ``[N, src.row_bytes]``) -> uint8 ``[N, dst.row_bytes]``.
    Two layouts of one record (the V4.1 page-planar and token-interleaved pairs, same profile)
    hold the same row bytes: the rows are copied, exactly."""
    pairs = region_pairs(src, dst)
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.uint8 or rows.dim() != 2 \
            or rows.shape[1] != src.row_bytes:
        raise InputError(f"rows must be a uint8 tensor [N, {src.row_bytes}] ({src.name} gathered rows), "
                         f"got {describe(rows)}")
    if row_record(src) == row_record(dst):
        return rows.clone()
    if src.decode_dtype is None:
        if not exact or src == dst:
            return rows.clone()
        raise ConversionError(f"{src.name} has no quantization to convert; copy the rows instead")
    x, dropped = _map(pairs, src.decode_rows(rows))
    out = dst.encode_rows(x.to(torch.float32) if src.decode_dtype == torch.float32 else x)
    if exact:
        for region, first, values in dropped:
            if bool((values != 0).any()):
                last = first + values.shape[1] - 1
                raise ConversionError(f"{src.name} -> {dst.name} drops {region} dims {first}..{last}, "
                                      f"which are not all zero here; pass exact=False to drop them")
        back = dst.decode_rows(out)
        want = x.to(back.dtype)
        if not torch.equal(_bits(back), _bits(want)):
            bad = int((_bits(back) != _bits(want)).any(-1).sum())
            raise ConversionError(f"{src.name}({src.profile}) -> {dst.name}({dst.profile}) is not exact for "
                                  f"{bad} of {rows.shape[0]} rows (the target grid cannot hold every value); "
                                  f"pass exact=False to accept the target format's error bound, or pick a "
                                  f"target profile with finer scales")
    return out


def convert_slots(src, src_cache, src_slots, dst, dst_cache, dst_slots, *, exact: bool = False) -> None:
    """Convert the rows at ``src_slots`` of ``src_cache`` into ``dst_cache`` at ``dst_slots``
    (negative slots skipped on either side). Validates and converts everything before writing."""
    from kvformats.validation import check_slots

    check_cache(src, src_cache)
    check_cache(dst, dst_cache)
    check_slots(src, src_slots, None, src_cache, check_range="strict", unique=False)
    check_slots(dst, dst_slots, src_slots.shape[0], dst_cache, check_range="strict", unique=True)
    rows = convert_rows(src, read_rows(src, src_cache, src_slots), dst, exact=exact)
    keep = src_slots.to(dst_slots.device) >= 0
    write_rows(dst, dst_cache, torch.where(keep, dst_slots, torch.full_like(dst_slots, -1)), rows)


# ----- scale words --------------------------------------------------------------------------------
def pack_ue8m0(scales: torch.Tensor) -> torch.Tensor:
    """ue8m0 bytes ``[N, k]`` (uint8) -> int32 ``[N, ceil(k/4)]``, padded with 127 (scale 1.0)."""
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.uint8 or scales.dim() != 2:
        raise InputError(f"scales must be a uint8 tensor [N, k] of ue8m0 bytes, got {describe(scales)}")
    n, k = scales.shape
    words = -(-k // 4)
    padded = torch.full((n, 4 * words), 127, dtype=torch.uint8, device=scales.device)
    padded[:, :k] = scales
    return padded.view(torch.int32)


def unpack_ue8m0(words: torch.Tensor, k: int, *, strict: bool = True) -> torch.Tensor:
    """int32 ``[N, w]`` -> ue8m0 bytes ``[N, k]`` (``k <= 4w``); ``strict``: padding bytes must be 127."""
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32 or words.dim() != 2:
        raise InputError(f"words must be an int32 tensor [N, w] of packed ue8m0 scales, got {describe(words)}")
    if not isinstance(k, int) or isinstance(k, bool):
        raise InputTypeError(f"k must be an int in [1, {4 * words.shape[1]}], got {describe(k)}")
    if not 0 < k <= 4 * words.shape[1]:
        raise InputError(f"k must be an int in [1, {4 * words.shape[1]}], got {k!r}")
    raw = words.contiguous().view(torch.uint8)
    if strict and bool((raw[:, k:] != 127).any()):
        raise ConversionError("padding bytes of the packed scales are not 127 (1.0): the words hold more "
                              "than k scales; pass a larger k, or strict=False to drop them")
    return raw[:, :k].clone()


# ----- page re-layout -------------------------------------------------------------------------------
def to_token_interleaved(layout, cache: torch.Tensor) -> torch.Tensor:
    """Byte cache of ``layout`` -> uint8 ``[pages, page_size * row_bytes]`` with each row's records
    contiguous (gather order). Exact; the page pad is not carried."""
    check_cache(layout, cache)
    parts = [layout.segment_view(cache, s.name) for s in layout.segments]
    return torch.cat(parts, dim=2).reshape(cache.shape[0], layout.page_size * layout.row_bytes)


def to_page_planar(layout, interleaved: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of ``to_token_interleaved``: -> a ``layout`` cache (``out``, or a fresh zeroed one)."""
    pages = interleaved.shape[0] if isinstance(interleaved, torch.Tensor) else -1
    want = (pages, layout.page_size * layout.row_bytes)
    if not isinstance(interleaved, torch.Tensor) or interleaved.dtype != torch.uint8 or \
            tuple(interleaved.shape) != want:
        raise InputError(f"interleaved must be uint8 {list(want)}, got "
                         f"{getattr(interleaved, 'dtype', type(interleaved))} "
                         f"{tuple(getattr(interleaved, 'shape', ()))}")
    cache = layout.allocate(pages, device=interleaved.device) if out is None else out
    check_cache(layout, cache)
    if cache.shape[0] != pages:
        raise InputError(f"out has {cache.shape[0]} pages, interleaved {pages}")
    rows = interleaved.reshape(pages, layout.page_size, layout.row_bytes)
    at = 0
    for seg in layout.segments:
        layout.segment_view(cache, seg.name).copy_(rows[:, :, at:at + seg.record_bytes])
        at += seg.record_bytes
    return cache

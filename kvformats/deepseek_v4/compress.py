"""Compressor state and the compressed caches it fills (spec/upstream.md §5, §2.4, §3.4, §4.5).

* ``save_compressor_state``: one state row per token, ``[kv | score + ape[p % ratio]]``, through
  the compressor_state codec (ape in checkpoint order).
* ``compress_kv_insert`` (``csa_compress_kv_insert``, ``hca_compress_kv_insert``): at every token
  that completes a group ((p + 1) % ratio == 0), pool the state window (``pooling``), rotate the
  RoPE tail of the un-rounded float32 result at ``(p // ratio) * ratio`` and write it as an
  fp8_ds_mla row through that codec.
* ``indexer_compress_insert``: the same on the indexer state (ratio 4, head 128), then the
  Hadamard rotation, then an fp8_indexer or mxfp4_indexer row.

A row is written only when the state slot, the group end, the target slot (in [0, capacity)) and
the rope position (a row of the cos/sin table) are all valid; nothing else in either cache
changes. Value checks follow ``check`` (``spec/checks.md``): a target slot beyond the cache or a
rope position beyond the table raises before any write on CPU tensors and in strict mode; on a
GPU it is not read on the host: the row is skipped and the violation recorded for
``kvformats.raise_pending``. Repeated target slots are refused only by the host checks.
"""

from __future__ import annotations

import torch

from kvformats.codec import registry
from kvformats.codec.blocktable import table_slots
from kvformats.codec.op import Op, replayed
from kvformats.codec.rows import write_rows
from kvformats.deepseek_v4 import _dispatch as D
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.pooling import pool_reference
from kvformats.deepseek_v4.transforms import hadamard_reference, rope_tail
from kvformats.errors import InputError
from kvformats.runtime import deferred
from kvformats.validation import check_slots

INDEX_FORMATS = ("fp8_indexer", "mxfp4_indexer")

SAVE_COMPRESSOR_STATE = Op(D.MODEL_FAMILY, "save_compressor_state", mutates=("state_cache",), sites=("slots",))
COMPRESS_KV_INSERT = Op(D.MODEL_FAMILY, "compress_kv_insert", mutates=("kv_cache",),
                        sites=("kv_slots", "rope positions"))
INDEXER_COMPRESS_INSERT = Op(D.MODEL_FAMILY, "indexer_compress_insert", mutates=("index_cache",),
                             sites=("index_slots", "rope positions"))


# ----- save -------------------------------------------------------------------------------------
@SAVE_COMPRESSOR_STATE.public
def save_compressor_state(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, state_cache: torch.Tensor, *,
                          ratio: int, positions: torch.Tensor, slots: torch.Tensor | None = None,
                          req_indices: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                          block_table_base_offsets: torch.Tensor | None = None, backend: str = "auto",
                          check: bool | str = True) -> None:
    """Store ``[kv | score + ape[p % ratio]]`` (float32) for each token at its state slot.

    ``kv``, ``score``: ``[N, W]`` float (``W = 2 * head_dim`` for ratio 4, ``head_dim`` for 128);
    ``ape``: ``[ratio, W]`` in checkpoint order; ``state_cache``: float32 ``[pages, rows, 2W]``.
    Slots come from ``slots [N]`` or, when it is None, from the state group's ``block_table``
    (``req_indices [N]``, optional base offsets): slot of position p = ``table[r, p // rows - base]
    * rows + p % rows``, −1 when missing. Negative slots are skipped.
    """
    device = state_cache.device if isinstance(state_cache, torch.Tensor) else None
    C.check_tensor("kv", kv, dtypes=C.FLOAT_DTYPES, shape=(None, None), device=device)
    C.check_int("ratio", ratio, allowed=C.RATIOS)
    coff = C.halves(ratio)
    if kv.shape[1] % coff:
        raise InputError(f"kv width must be a multiple of 2 for ratio 4 (W = 2 * head_dim), got {kv.shape[1]}")
    layout = C.state_layout(state_cache, ratio, kv.shape[1] // coff)
    n, kwargs = layout.check_encode_input((kv, score), device, positions=positions, ape=ape)
    if slots is None:
        if block_table is None or req_indices is None:
            raise InputError("pass slots=, or block_table= and req_indices= to derive the state slots")
        C.check_index("req_indices", req_indices, n, device)
        C.check_table(block_table, None, device, block_table_base_offsets)
        slots = table_slots(block_table, req_indices, positions, layout.page_size,
                            block_table_base_offsets, state_cache.shape[0])
    elif block_table is not None or req_indices is not None:
        raise InputError("pass either slots= or block_table= with req_indices=, not both")
    fn = SAVE_COMPRESSOR_STATE.resolve(backend, device)
    check_slots(layout, slots, n, state_cache, check_range=check, unique=True,
                site=SAVE_COMPRESSOR_STATE.site("slots"), kernel=registry.is_kernel(fn))
    fn(layout, kv, score, ape, state_cache, positions, slots)


@SAVE_COMPRESSOR_STATE.reference
def save_compressor_state_reference(layout, kv, score, ape, state_cache, positions, slots) -> None:
    write_rows(layout, state_cache, slots, layout.encode_rows((kv, score), positions=positions, ape=ape))


# ----- compressed KV (fp8_ds_mla) ---------------------------------------------------------------
def _check_window_args(state_cache, ratio, positions, req_indices, state_slots, block_table, base,
                       rms_weight, rms_eps, cos_sin, target_slots, target_name):
    """Shared validation of the compress inserts; returns (state layout, T, rope_dim, eps)."""
    device = state_cache.device if isinstance(state_cache, torch.Tensor) else None
    C.check_tensor("rms_weight", rms_weight, dtypes=C.FLOAT_DTYPES, shape=(None,), device=device)
    state = C.state_layout(state_cache, ratio, rms_weight.shape[0])
    n = C.check_index("positions", positions, None, device)
    C.check_index("req_indices", req_indices, n, device)
    C.check_index("state_slots", state_slots, n, device)
    C.check_index(target_name, target_slots, n, device)
    C.check_table(block_table, None, device, base)
    rope_dim = C.check_cos_sin(cos_sin, device)
    if rope_dim > rms_weight.shape[0]:
        raise InputError(f"rope_dim {rope_dim} (cos_sin_cache columns) exceeds head_dim {rms_weight.shape[0]}")
    return state, n, rope_dim, C.check_float("rms_eps", rms_eps)


def _group_end(ratio: int, positions, state_slots, target_slots) -> torch.Tensor:
    """Tokens that would write a row: valid state slot, last token of a group, a target slot."""
    p = positions.long()
    return (p >= 0) & ((p + 1) % ratio == 0) & (state_slots >= 0) & (target_slots >= 0)


def _writes(ratio: int, positions, state_slots, target_slots, capacity: int, cos_sin) -> torch.Tensor:
    """Tokens that write a row: ``_group_end``'s, with the target slot below ``capacity`` and
    the rope position a row of ``cos_sin``."""
    rope_pos = positions.long() // ratio * ratio
    return (_group_end(ratio, positions, state_slots, target_slots) & (target_slots < capacity)
            & (rope_pos < cos_sin.shape[0]))


def _value_checks(op: Op, target: str, layout, cache, ratio, positions, state_slots, target_slots, cos_sin,
                  check, fn) -> None:
    """The target-slot and rope-position checks of a compress insert, as ``check`` says: on the
    host before any write, or on the device (recorded here for the reference; a kernel records
    them itself)."""
    if deferred.on_host(check, positions):
        write = _group_end(ratio, positions, state_slots, target_slots)
        C.check_written_slots(layout, cache, target_slots, write, target)
        C.check_positions_in_table(positions.long() // ratio * ratio, cos_sin, write, "rope positions")
    elif not registry.is_kernel(fn) and positions.numel():
        ends = _group_end(ratio, positions, state_slots, target_slots)
        capacity = cache.shape[0] * layout.page_size
        over = ends & (target_slots >= capacity)
        deferred.record_where(over, target_slots, capacity, deferred.Check.SLOT_RANGE, op.site(target))
        rope_pos = positions.long() // ratio * ratio
        deferred.record_where(ends & ~over & (rope_pos >= cos_sin.shape[0]), rope_pos, cos_sin.shape[0],
                              deferred.Check.POSITION_RANGE, op.site("rope positions"))


@COMPRESS_KV_INSERT.public
def compress_kv_insert(state_cache: torch.Tensor, kv_cache: torch.Tensor, *, ratio: int, positions: torch.Tensor,
                       req_indices: torch.Tensor, state_slots: torch.Tensor, block_table: torch.Tensor,
                       rms_weight: torch.Tensor, rms_eps: float, cos_sin_cache: torch.Tensor,
                       kv_slots: torch.Tensor, kv_page_size: int,
                       block_table_base_offsets: torch.Tensor | None = None, backend: str = "auto",
                       check: bool | str = True) -> None:
    """Compress the state windows of group-ending tokens into fp8_ds_mla rows of ``kv_cache``.

    Args:
        state_cache: float32 ``[pages, rows, 2W]`` compressor state (``W = 2h`` for ratio 4).
        kv_cache: uint8 ``[pages, >= kv_page_size * row_bytes]`` fp8_ds_mla cache of head_dim
            ``h = rms_weight.numel()`` and rope_dim ``cos_sin_cache.shape[1]``.
        ratio: 4 (CSA) or 128 (HCA).
        positions: int ``[T]`` absolute positions p; a token writes iff ``(p + 1) % ratio == 0``
            and both its ``state_slots`` and ``kv_slots`` entries are >= 0.
        req_indices: int ``[T]`` request rows of ``block_table``.
        state_slots: int ``[T]`` state-cache slot of each token (−1: none).
        block_table: int ``[R, max_pages]`` of the state group, used to find the window positions'
            state rows.
        rms_weight: ``[h]`` weight of the compressor's norm.
        rms_eps: epsilon of the compressor's norm.
        cos_sin_cache: float32 ``[max_positions, rope_dim]`` (``kvformats.deepseek_v4.rope.cos_sin_cache``).
        kv_slots: int ``[T]`` slot of each token's row in ``kv_cache`` (−1: none).
        kv_page_size: rows per page of ``kv_cache``.
        block_table_base_offsets: optional int ``[R]``: logical page of column 0 of ``block_table``.
        backend: "auto", "reference" or "triton".
        check: True, False or "strict": where the target-slot and rope-position checks run (the
            module docstring; ``spec/checks.md``).

    Row written: ``Fp8DsMla.encode(rope_tail(pool(window), (p // ratio) * ratio))``.
    """
    state, n, rope_dim, eps = _check_window_args(state_cache, ratio, positions, req_indices, state_slots,
                                                 block_table, block_table_base_offsets, rms_weight, rms_eps,
                                                 cos_sin_cache, kv_slots, "kv_slots")
    kv_layout = C.ds_mla_layout(kv_cache, rms_weight.shape[0], rope_dim, kv_page_size)
    if kv_cache.device != state_cache.device:
        raise InputError(f"kv_cache must be on the state cache's device {state_cache.device}, got {kv_cache.device}")
    fn = COMPRESS_KV_INSERT.resolve(backend, kv_cache.device)
    _value_checks(COMPRESS_KV_INSERT, "kv_slots", kv_layout, kv_cache, ratio, positions, state_slots, kv_slots,
                  cos_sin_cache, check, fn)
    fn(state_cache, kv_cache, kv_layout, ratio, positions, req_indices, state_slots, block_table,
        block_table_base_offsets, rms_weight, eps, cos_sin_cache, kv_slots)


def _insert_at(kind: str, ratio: int, state_cache, kv_cache, kwargs: dict) -> None:
    """``compress_kv_insert`` at the one ratio of ``kind`` (a ``ratio`` keyword may repeat it)."""
    given = kwargs.pop("ratio", ratio)
    if given != ratio:
        raise InputError(f"{kind} compress insert requires ratio {ratio}, got {given!r}")
    compress_kv_insert(state_cache, kv_cache, ratio=ratio, **kwargs)


@replayed
def csa_compress_kv_insert(state_cache, kv_cache, **kwargs) -> None:
    """``compress_kv_insert`` with ratio 4 (overlapping windows of 8 positions)."""
    _insert_at("CSA", 4, state_cache, kv_cache, kwargs)


@replayed
def hca_compress_kv_insert(state_cache, kv_cache, **kwargs) -> None:
    """``compress_kv_insert`` with ratio 128 (windows of 128 positions, no overlap)."""
    _insert_at("HCA", 128, state_cache, kv_cache, kwargs)


def _pooled_rows(state_cache, ratio, positions, req_indices, state_slots, block_table, base, weight, eps,
                 cos_sin, target_slots, capacity):
    """(index of writing tokens, their rotated float32 pooled rows)."""
    idx = _writes(ratio, positions, state_slots, target_slots, capacity, cos_sin).nonzero().squeeze(1)
    p = positions.long()[idx]
    normed = pool_reference(state_cache, ratio, p, req_indices[idx], block_table, base, weight, eps)
    return idx, rope_tail(normed, p // ratio * ratio, cos_sin)


@COMPRESS_KV_INSERT.reference
def compress_kv_insert_reference(state_cache, kv_cache, kv_layout, ratio, positions, req_indices, state_slots,
                                 block_table, base, weight, eps, cos_sin, kv_slots) -> None:
    idx, x = _pooled_rows(state_cache, ratio, positions, req_indices, state_slots, block_table, base, weight,
                          eps, cos_sin, kv_slots, kv_cache.shape[0] * kv_layout.page_size)
    if idx.numel():
        write_rows(kv_layout, kv_cache, kv_slots[idx], kv_layout.encode_rows(x))


# ----- CSA indexer ------------------------------------------------------------------------------
@INDEXER_COMPRESS_INSERT.public
def indexer_compress_insert(state_cache: torch.Tensor, index_cache: torch.Tensor, *, index_format: str,
                            positions: torch.Tensor, req_indices: torch.Tensor, state_slots: torch.Tensor,
                            block_table: torch.Tensor, rms_weight: torch.Tensor, rms_eps: float,
                            cos_sin_cache: torch.Tensor, index_slots: torch.Tensor, index_page_size: int = 64,
                            ratio: int = 4, block_table_base_offsets: torch.Tensor | None = None,
                            backend: str = "auto", check: bool | str = True) -> None:
    """Compress the indexer state windows of group-ending tokens into indexer-cache rows.

    Same arguments as ``compress_kv_insert`` (the indexer compressor's state ``[pages, 4, 4h]``
    and norm), with ``index_format`` "mxfp4_indexer" or "fp8_indexer" and ``index_cache`` of
    that format (head_dim ``h``, ``index_page_size`` rows per page). Row written:
    ``encode(hadamard_transform(rope_tail(pool(window), (p // 4) * 4)))`` — the rotation takes
    bf16 in and gives bf16 out (spec/upstream.md §3.4, §4.5). ``h`` must be a power of two.
    """
    if ratio != 4:
        raise InputError(f"the CSA indexer compresses with ratio 4, got {ratio!r}")
    if index_format not in INDEX_FORMATS:
        raise InputError(f"index_format must be one of {', '.join(INDEX_FORMATS)}, got {index_format!r}")
    state, n, rope_dim, eps = _check_window_args(state_cache, ratio, positions, req_indices, state_slots,
                                                 block_table, block_table_base_offsets, rms_weight, rms_eps,
                                                 cos_sin_cache, index_slots, "index_slots")
    h = rms_weight.shape[0]
    if h & (h - 1):
        raise InputError(f"the indexer head dim (rms_weight size) must be a power of two for the Hadamard "
                         f"rotation, got {h}")
    C.check_int("index_page_size", index_page_size, minimum=1)
    layout = C.layout_of(index_format, head_dim=h, page_size=index_page_size)
    C.check_cache(layout, index_cache)
    if index_cache.device != state_cache.device:
        raise InputError(f"index_cache must be on the state cache's device {state_cache.device}, "
                         f"got {index_cache.device}")
    fn = INDEXER_COMPRESS_INSERT.resolve(backend, index_cache.device)
    _value_checks(INDEXER_COMPRESS_INSERT, "index_slots", layout, index_cache, ratio, positions, state_slots,
                  index_slots, cos_sin_cache, check, fn)
    fn(state_cache, index_cache, layout, positions, req_indices, state_slots, block_table,
        block_table_base_offsets, rms_weight, eps, cos_sin_cache, index_slots)


@INDEXER_COMPRESS_INSERT.reference
def indexer_compress_insert_reference(state_cache, index_cache, layout, positions, req_indices, state_slots,
                                      block_table, base, weight, eps, cos_sin, index_slots) -> None:
    idx, x = _pooled_rows(state_cache, 4, positions, req_indices, state_slots, block_table, base, weight,
                          eps, cos_sin, index_slots, index_cache.shape[0] * layout.page_size)
    if idx.numel():
        rotated = hadamard_reference(x, x.shape[-1] ** -0.5)
        write_rows(layout, index_cache, index_slots[idx], layout.encode_rows(rotated))

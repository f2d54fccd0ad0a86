"""The DeepSeek V4.1 row writers of the attention and indexer caches (docs/reference/deepseek_v41.md).

* ``swa_rope_scatter``: rotate the RoPE tail (dims 448..511) of already-normalized bf16 SWA rows
  at each token's position, round to bf16, and store them as ``fp8_ds_mla_v41`` rows (V4.1's
  528 B record) or ``fp8_ds_mla`` rows (V4's 584 B record, which FlashMLA on sm90 reads); on
  request the rows' quantize-dequantize round trip goes to ``out`` as bf16.
* ``index_q_quantize``: the indexer queries quantized as the keys they meet are stored
  (``mxfp4_indexer``, or the ``fp8_indexer`` row with one float32 scale per row that
  tokenspeed-kernel stores on Hopper) and dequantized back to bf16.

The behaviour is that of tokenspeed-kernel 0.1.4's ``tokenspeed_kernel.ops.attention.dsv41``
``swa_rope_scatter`` / ``index_q_quantize`` (PyPI; https://github.com/lightseekorg/tokenspeed),
on kvformats' caches and checks; ``kvformats.compat.tokenspeed_kernel`` has the drop-ins with
tokenspeed's own signatures. Value checks follow ``check`` (spec/checks.md).
"""

from __future__ import annotations

import torch

from kvformats.codec.op import Op
from kvformats.codec.rows import locate, write_rows
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.rope import rope_tail
from kvformats.deepseek_v41 import _dispatch as D
from kvformats.errors import InputError, InputTypeError, describe
from kvformats.numerics import codes as nx
from kvformats.runtime import deferred
from kvformats.validation import REPEATED_SLOTS, repeats

__all__ = ["INDEX_FORMATS", "SWA_FORMATS", "index_q_quantize", "swa_rope_scatter"]

HEAD_DIM = 512  # the SWA row: 448 NoPE dims, then the 64 RoPE dims
ROPE_DIM = 64
INDEX_HEAD_DIM = 128
PROFILE = "tokenspeed"  # the numerics of tokenspeed-kernel 0.1.4's writers, on both SWA rows
SWA_FORMATS = ("fp8_ds_mla_v41", "fp8_ds_mla")
NEGATIVE_POSITIONS = ("invalid", "clamp")  # swa_rope_scatter's rules for a negative position
INDEX_FORMATS = ("mxfp4_indexer", "fp8_indexer")
# the 'index' rows tokenspeed-kernel 0.1.4 writes are mxfp4_indexer's profile vllm (round-half-even
# e2m1, sign of zero kept, amax floored at 6 * 2^-126); one-row pages: the op stores no cache
_MXFP4 = C.layout_of("mxfp4_indexer", head_dim=INDEX_HEAD_DIM, page_size=1, profile="vllm")
FP8_SCALE_FLOOR = 1e-6  # the 'index_v4' row: scale = fl32(max(amax, 1e-6) * fl32(1 / 448))


# out stays optional (``Tensor(b!)?``): None means "no round trip", returned as given
SWA_ROPE_SCATTER = Op(D.MODEL_FAMILY, "swa_rope_scatter", mutates=("cache", "out"), sites=("positions",),
                      result=lambda a: a["out"])
INDEX_Q_QUANTIZE = Op(D.MODEL_FAMILY, "index_q_quantize", mutates=("out",), result=lambda a: a["out"],
                      workspaces={"out": lambda v: v["q"].new_empty(v["q"].shape, dtype=torch.bfloat16)})
POSITIONS_SITE = SWA_ROPE_SCATTER.site("positions")


def swa_layout(fmt: str, page_size: int):
    """The layout ``swa_rope_scatter`` writes for ``fmt`` (one of SWA_FORMATS) in pages of
    ``page_size`` rows: head_dim 512 (rope_dim 64 for fp8_ds_mla), profile tokenspeed."""
    if fmt == "fp8_ds_mla":
        return C.layout_of(fmt, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, page_size=page_size, profile=PROFILE)
    return C.layout_of(fmt, head_dim=HEAD_DIM, page_size=page_size, profile=PROFILE)


def _check_format(name: str, fmt, allowed: tuple[str, ...]) -> None:
    if not isinstance(fmt, str) or fmt not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {describe(fmt)}")


def _check_out(out, shape: tuple, device) -> None:
    C.check_tensor("out", out, dtypes=(torch.bfloat16,), shape=shape, device=device)
    if not out.is_contiguous():
        raise InputError(f"out must be a contiguous bf16 tensor {list(shape)}, got strides {out.stride()}")


# ----- swa_rope_scatter -------------------------------------------------------------------------
@SWA_ROPE_SCATTER.public
def swa_rope_scatter(values: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                     cache: torch.Tensor, slots: torch.Tensor, *, fmt: str = "fp8_ds_mla_v41", page_size: int = 64,
                     out: torch.Tensor | None = None, first_slot: int = 0, negative_positions: str = "invalid",
                     backend: str = "auto", check: bool | str = True):
    """Rotate the RoPE tail of normalized SWA rows and store them as ``fmt`` rows; returns ``out``.

    For each token t: ``r = bf16(rope_p(values[t]))``, the GPT-J rotation of dims 448..511 (pairs
    (448 + 2i, 449 + 2i)) at ``p = positions[t]`` in float32 with ``cos = cos_sin_cache[p, i]``,
    ``sin = cos_sin_cache[p, 32 + i]``, the NoPE dims unchanged; then ``r`` is encoded as one
    ``fmt`` row (profile tokenspeed) at ``slots[t]`` and, when ``out`` is given, ``out[t] =
    decode(encode(r))``, for every token, whatever its slot.

    Args:
        values: bf16 ``[T, 512]``, any strides (the rows after the KV RMSNorm).
        positions, slots: int32 / int64 ``[T]``.
        cos_sin_cache: float32 ``[max_positions, 64]`` of ``[cos | sin]`` rows.
        cache: uint8 kvformats cache ``[pages, >= page_bytes]`` of ``fmt`` with ``page_size`` rows
            a page: ``fp8_ds_mla_v41`` (528 B rows, page-planar; tokenspeed's 'swa' field) or
            ``fp8_ds_mla`` (584 B rows; tokenspeed's 'swa_v4').
        out: None, or a contiguous bf16 ``[T, 512]`` (it may be ``values`` itself).
        first_slot: int >= 0, the first slot written (default 0: page 0 is an ordinary page). Slots
            below it are skipped as negative ones are: tokenspeed's null page is ``first_slot=64``
            with 64-row pages.
        negative_positions: ``"invalid"`` (default: a negative position is outside the table, as
            below) or ``"clamp"`` (tokenspeed's rule: a negative position rotates as position 0;
            the position checks and records then see 0).

    Rows are written at slots in ``[first_slot, pages * page_size)``; negative slots, slots below
    ``first_slot`` and slots beyond the cache are skipped and never recorded (as
    ``deepseek_v4.swa_insert``: engines pad CUDA graphs with them).

    ``check`` (True, False or "strict"; ``spec/checks.md``): on CPU tensors and in strict mode,
    positions outside ``[0, max_positions)`` and a written slot named twice raise InputError
    before anything is written. On a GPU nothing is read on the host: a token at an invalid
    position gets no cache row, its ``out`` row is the round trip of its unrotated values, and
    the violation is recorded for ``kvformats.raise_pending``; repeated slots are not looked for
    (one of the rows naming a slot is stored).
    """
    _check_format("fmt", fmt, SWA_FORMATS)
    C.check_int("page_size", page_size, minimum=1)
    layout = swa_layout(fmt, page_size)
    C.check_cache(layout, cache)
    device = cache.device
    C.check_tensor("values", values, dtypes=(torch.bfloat16,), shape=(None, HEAD_DIM), device=device)
    t = values.shape[0]
    C.check_index("positions", positions, t, device)
    C.check_index("slots", slots, t, device)
    C.check_cos_sin(cos_sin_cache, device, ROPE_DIM)
    if out is not None:
        _check_out(out, (t, HEAD_DIM), device)
    C.check_int("first_slot", first_slot)
    clamp = _check_negative_positions(negative_positions)
    # nothing at or beyond the capacity is written either way: bounded, the kernel's argument fits int64
    first_slot = min(first_slot, cache.shape[0] * page_size)
    if deferred.on_host(check, positions):
        C.check_positions_in_table(positions.clamp_min(0) if clamp else positions, cos_sin_cache)
        if t:
            written = locate(layout, cache, slots)[0]
            if first_slot:
                written &= slots >= first_slot
            if repeats(slots[written]):
                raise InputError(REPEATED_SLOTS)
    SWA_ROPE_SCATTER.resolve(backend, device)(values, positions, cos_sin_cache, cache, layout, slots, out,
                                              first_slot, clamp)
    return out


def _check_negative_positions(rule) -> bool:
    """Whether ``negative_positions`` (one of NEGATIVE_POSITIONS) clamps."""
    if not isinstance(rule, str):
        raise InputTypeError(f"negative_positions must be a str, one of {', '.join(map(repr, NEGATIVE_POSITIONS))}, "
                             f"got {describe(rule)}")
    if rule not in NEGATIVE_POSITIONS:
        raise InputError(f"negative_positions must be one of {', '.join(map(repr, NEGATIVE_POSITIONS))}, "
                         f"got {rule!r}")
    return rule == "clamp"


@SWA_ROPE_SCATTER.reference
def swa_rope_scatter_reference(values, positions, cos_sin, cache, layout, slots, out, first_slot: int = 0,
                               clamp: bool = False) -> None:
    """``first_slot``: the validated argument, at most the capacity; ``clamp``: negative positions
    rotate as 0 (``negative_positions="clamp"``)."""
    if values.shape[0] == 0:
        return
    if clamp:
        positions = positions.clamp_min(0)
    # check=False: a token at an invalid position comes back unrotated and is recorded (the
    # public function raised on the host where its check mode asks)
    rotated = rope_tail(values, positions, cos_sin, check=False, site=POSITIONS_SITE).to(torch.bfloat16)
    rows = layout.encode_rows(rotated)
    valid = (positions >= 0) & (positions < cos_sin.shape[0])
    if first_slot:
        valid &= slots >= first_slot
    write_rows(layout, cache, torch.where(valid, slots, -1), rows)  # no row for an invalid position or slot
    if out is not None:
        out.copy_(layout.decode_rows(rows))


# ----- index_q_quantize -------------------------------------------------------------------------
@INDEX_Q_QUANTIZE.public
def index_q_quantize(q: torch.Tensor, *, fmt: str = "mxfp4_indexer", out: torch.Tensor | None = None,
                     backend: str = "auto", check: bool | str = True) -> torch.Tensor:
    """The indexer queries quantized as ``fmt``'s keys and dequantized: bf16, q's shape. Returns ``out``.

    ``q``: bf16 ``[T, H, 128]``, any strides. Each 128-dim row is quantized and read back:

    * ``"mxfp4_indexer"`` (tokenspeed's 'index' row): per 32 dims ``e = ceil(log2(max(amax,
      6 * 2^-126) / 6))``, e2m1 codes of ``x * 2^-e`` round-half-even (sign of zero kept,
      saturating at 6): the bytes of mxfp4_indexer's profile ``vllm``; values ``e2m1 * 2^e``.
    * ``"fp8_indexer"`` (tokenspeed's 'index_v4' row, the Hopper fallback): one float32 scale
      per row ``s = fl32(max(amax, 1e-6) * fl32(1/448))`` (not a power of two: the 132 B row of
      fp8_indexer with a scale rule none of its profiles has), codes ``e4m3(clamp(x / s, ±448))``
      round-half-even; values ``fl32(e4m3 * s)``.

    Each value is rounded once to bf16. ``out``: None (a new contiguous tensor) or a contiguous
    bf16 tensor of q's shape (it may be ``q`` itself). No RoPE, norm or Hadamard rotation is
    applied. Every value of ``q`` maps to a defined output: ``check`` (spec/checks.md) is
    validated and changes nothing.
    """
    C.check_mode(check)
    _check_format("fmt", fmt, INDEX_FORMATS)
    device = q.device if isinstance(q, torch.Tensor) else None
    C.check_tensor("q", q, dtypes=(torch.bfloat16,), shape=(None, None, INDEX_HEAD_DIM), device=device)
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=device)
    else:
        _check_out(out, tuple(q.shape), device)
    INDEX_Q_QUANTIZE.resolve(backend, device)(q, fmt, out)
    return out


def fp8_row_scales(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[N]``: the one scale of each row of ``x [N, 128]`` (float32) in tokenspeed's
    'index_v4' rule, ``fl32(max(amax, 1e-6) * fl32(1/448))`` (a NaN row: NaN)."""
    rcp = torch.full((), 1.0 / nx.FP8_E4M3_MAX, dtype=torch.float32, device=x.device)
    return torch.maximum(nx.absmax(x), torch.full((), FP8_SCALE_FLOOR, dtype=torch.float32, device=x.device)) * rcp


@INDEX_Q_QUANTIZE.reference
def index_q_quantize_reference(q, fmt, out) -> None:
    x = q.reshape(-1, INDEX_HEAD_DIM)
    if fmt == "mxfp4_indexer":
        values = _MXFP4.decode_rows(_MXFP4.encode_rows(x))
    else:
        xf = x.float()
        scale = fp8_row_scales(xf)
        values = nx.e4m3_decode(nx.e4m3_quantize_by_scale(xf, scale)) * scale.unsqueeze(1)
    out.copy_(values.view(q.shape))

"""Launchers of DeepSeek V4's compressor path (kvformats.deepseek_v4.compress / pooling): state
save, window pooling, and the CSA / HCA compressed-KV and CSA indexer compress-inserts.

Each function takes exactly the arguments of the reference it replaces (already validated) and
launches one kernel (plus, for decode-sized HCA calls, the zeroing of a per-token counter),
with no host synchronisation: which tokens write is decided on the device.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from kvformats.formats import Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from kvformats.runtime import deferred
from kvformats_kernels import _common as cm
from kvformats_kernels import settings
from kvformats_kernels import state
from kvformats_kernels.dsv4 import compress_jit as jit
from kvformats_kernels.geometry import row_geometry, target_constants
from kvformats_kernels.launch import fast

# Per (what, ratio): features per chunk (bd), tokens per program for large calls (block_t),
# warps, and for calls whose chunks are split over programs (split_bd, split_warps; a split_bd of
# the full padded width means no split), and a register cap for calls that are not split
# (maxnreg, 0 = the compiler's choice; _common.launch_opts) and one for split calls
# (split_maxnreg); fast_div 1 divides the softmax weights by the pooling's hoisted-reciprocal
# division (pool_jit.div_by: the same bits as div_rn), 0 by div_rn itself; hw_cvt 1 converts
# to bf16 / e4m3 with the GPU's instructions (the same bytes, tests/kernels/test_hw_cvt.py);
# early_inputs 1 loads the RMSNorm weight, cos / sin and the target slot of a decode program
# before its window loads rather than after (compress_jit.compress_kernel); split_fast_div is
# fast_div for decode-sized calls; calls of at most few_rows tokens take few_warps (fewer
# programs than SMs: more warps shorten each program's dependent chain, while large calls fit
# more programs per SM with fewer warps). The values are the fastest of sweeps: narrow chunks
# with few warps keep more programs in flight, the register caps fit more programs per SM
# without spilling, div_by speeds up HCA and the indexer but slows the one-warp CSA programs;
# the figures are in docs/explanation/measured-choices.md. Benchmarks may override entries
# (--sweep); tests run whatever is here.
CONFIG = settings.declare("compress", {
    ("kv", 4): {"bd": 64, "block_t": 4, "num_warps": 1, "split_bd": 512, "split_warps": 2, "maxnreg": 96,
                 "fast_div": 0, "split_fast_div": 1, "hw_cvt": 1, "early_inputs": 1, "few_rows": 128,
                 "few_warps": 8},
    ("kv", 128): {"bd": 32, "block_t": 128, "num_warps": 4, "split_bd": 32, "split_warps": 4, "maxnreg": 128,
                   "split_maxnreg": 0, "fast_div": 1, "hw_cvt": 1, "early_inputs": 0},
    ("index", 4): {"bd": 64, "block_t": 8, "num_warps": 1, "split_bd": 128, "split_warps": 2, "maxnreg": 80,
                    "fast_div": 1, "early_inputs": 0},
})
# one_token_max_t: calls with at most this many tokens run one token per program (decode);
# split_max_t: ... and spread a token's feature chunks over programs (workspace T x HP float32)
BOUNDS = settings.declare("compress_bounds", {"one_token_max_t": 2048, "split_max_t": 2048})
# The layout classes the compress-inserts write (the reference validates which each takes).
TARGETS = (Fp8DsMla, Fp8Indexer, Mxfp4Indexer)
# compress_kernel's MODE: the pooled float32 rows themselves, or a target row, read off its
# geometry: scaled values with an unscaled tail and a scale pad (store_ds_mla), or e4m3 / e2m1
# values and their scales alone (store_indexer).
POOL, TAILED, FP8_BLOCKS, FP4_BLOCKS = 0, 1, 2, 3
_SITES: dict[str, Any] = {"save": deferred.site("save_compressor_state", "slots"),
          "kv": (deferred.site("compress_kv_insert", "kv_slots"),
                 deferred.site("compress_kv_insert", "rope positions")),
          "index": (deferred.site("indexer_compress_insert", "index_slots"),
                    deferred.site("indexer_compress_insert", "rope positions"))}


def save_compressor_state(layout, kv, score, ape, state_cache, positions, slots) -> None:
    """``[kv | score + ape[p % ratio]]`` at ``slots``: the compressor_state encode kernel."""
    state.encode(layout, (kv, score), state_cache, slots, positions=positions, ape=ape, site=_SITES["save"])


def _plan(what: str, ratio: int, h: int, n: int) -> dict:
    """Launch constants for ``n`` tokens of head dim ``h`` (worked on padded to a power of two)."""
    cfg = CONFIG[(what, ratio)]
    hp = cm.next_pow2(h)
    bd, warps = min(cfg["bd"], hp), cfg["num_warps"]
    if n <= BOUNDS["split_max_t"] and hp > bd:
        bd, warps = min(cfg.get("split_bd", bd), hp), cfg.get("split_warps", warps)
        if n <= cfg.get("few_rows", 0):
            warps = cfg["few_warps"]
        return {"BD": bd, "NCHUNK": hp // bd, "NSPLIT": hp // bd, "BLOCK_T": 1, "num_warps": warps,
                "maxnreg": cfg.get("split_maxnreg", 0), "FAST_DIV": bool(cfg.get("split_fast_div", cfg["fast_div"])),
                "EARLY_INPUTS": bool(cfg.get("early_inputs", 0))}
    block_t = 1 if n <= BOUNDS["one_token_max_t"] else cfg["block_t"]
    return {"BD": bd, "NCHUNK": hp // bd, "NSPLIT": 1, "BLOCK_T": block_t, "num_warps": warps,
            "maxnreg": cfg.get("maxnreg", 0), "FAST_DIV": bool(cfg["fast_div"]), "EARLY_INPUTS": False}


def _mode(layout) -> int:
    """The MODE that writes rows of ``layout`` (geometry.row_geometry)."""
    g = row_geometry(layout)
    return TAILED if g.has_tail else FP4_BLOCKS if g.fp4 else FP8_BLOCKS


@cm.per_layout
def _target_constants(layout) -> dict:
    """Target-row constexprs: the row's geometry (geometry.target_constants) and the numerics
    profile (for e2m1 values, its rounding and sign of zero)."""
    rule = layout.scale_rule
    return {**target_constants(layout), **cm.rule_constants(rule), "POW2": rule.power_of_two, "E2M1_RNE": False,
            "E2M1_SIGNED_ZERO": False, **cm.profile_constants(layout, e2m1=row_geometry(layout).fp4)}


_NO_TARGET = {  # the pool mode writes float32 rows: target constexprs unused
    "PAGE_SIZE": 1, "NB": 1, "QB": 1, "OFF0": 0, "STRIDE0": 0, "OFF1": 0, "STRIDE1": 0, "SCALE_OFF": 0,
    "SCALE_STRIDE": 0, "PAD_OFF": 0, "PAD_STRIDE": 0, "PAD_BYTES": 0, "PAD_P2": 1, "FLOOR": 1.0, "ELEM_MAX": 1.0,
    "FLOOR_ON_SCALE": False, "E_MIN": 0, "E_MAX": 0, "FLOOR_MODE": False, "ELEM_EMAX": 0, "POW2": True,
    "E2M1_RNE": False, "E2M1_SIGNED_ZERO": False,
}


def _launch(mode: int, what: str, state_cache, ratio, positions, req, table, base, weight, eps, *,
            state_slots=None, target_slots=None, cos_sin=None, target=None, layout=None) -> torch.Tensor | None:
    """One compress_kernel launch; returns the float32 pooled rows for mode POOL. Arguments a
    mode does not use are passed as stand-ins the kernel never reads."""
    h, n, dev = weight.shape[0], positions.shape[0], state_cache.device
    out = torch.empty((n, h), dtype=torch.float32, device=dev) if mode == POOL else None
    if n == 0:
        return out
    plan, cfg = _plan(what, ratio, h, n), CONFIG[(what, ratio)]
    ws, cnt = positions, positions
    if plan["NSPLIT"] > 1:
        ws = torch.empty((n, plan["NCHUNK"] * plan["BD"]), dtype=torch.float32, device=dev)
        cnt = torch.zeros(n, dtype=torch.int32, device=dev)
    if mode == POOL:
        dst, dst_stride, capacity, geo = out, h, 0, dict(_NO_TARGET)
    else:
        dst, dst_stride = cm.byte_cache(layout, target)
        capacity, geo = cm.capacity(layout, target), _target_constants(layout)
    if cos_sin is None:
        cs, rope = state_cache, 0
    else:
        cs, rope = (cos_sin if cos_sin.stride(1) == 1 else cos_sin.contiguous()), cos_sin.shape[1]
    sslot = positions if state_slots is None else state_slots
    tslot = positions if target_slots is None else target_slots
    sites = (0, 0) if mode == POOL else _SITES[what]
    err = cnt if mode == POOL else deferred.error_record(dev)  # pool mode records nothing
    fast(jit.compress_kernel)[(cm.grid_rows(n, plan["BLOCK_T"]), plan["NSPLIT"])](
        state_cache, table, table if base is None else base, positions, req, sslot, tslot,
        weight.view(torch.int16) if weight.dtype == torch.bfloat16 else weight, cs, dst, ws, cnt, err,
        n, state_cache.stride(0), state_cache.shape[0], table.stride(0), table.stride(1), table.shape[0],
        table.shape[1], 0 if base is None else base.stride(0), positions.stride(0), req.stride(0), sslot.stride(0),
        tslot.stride(0), weight.stride(0), cs.stride(0), cs.shape[0] if rope else 0, dst_stride, capacity,
        float(eps), cm.f32(h ** -0.5),
        MODE=mode, RATIO=ratio, H=h, W=state_cache.shape[2] // 2, ROWS=state_cache.shape[1],
        BD=plan["BD"], NCHUNK=plan["NCHUNK"], NSPLIT=plan["NSPLIT"], BLOCK_T=plan["BLOCK_T"],
        HAS_BASE=base is not None, W_BF16=weight.dtype == torch.bfloat16, GPU=dev.type == "cuda",
        FAST_DIV=plan["FAST_DIV"], ROPE=rope, HW=dev.type == "cuda" and cm.hw_cvt(cfg),
        EARLY_INPUTS=plan["EARLY_INPUTS"], SLOT_SITE=sites[0], POS_SITE=sites[1],
        LOG2_H=h.bit_length() - 1, **geo, **cm.launch_opts(plan), enable_fp_fusion=False)
    return out


def pool_compressor_state(state_cache, ratio, positions, req_indices, block_table, base_offsets, weight,
                          eps) -> torch.Tensor:
    """float32 ``[T, h]``: pooled and RMS-normed windows ending at each position."""
    pooled = _launch(POOL, "kv" if ratio == 128 or weight.shape[0] > 128 else "index", state_cache, ratio,
                     positions, req_indices, block_table, base_offsets, weight, eps)
    return cast(torch.Tensor, pooled)  # mode POOL returns its rows


def compress_kv_insert(state_cache, kv_cache, kv_layout, ratio, positions, req_indices, state_slots,
                       block_table, base, weight, eps, cos_sin, kv_slots) -> None:
    """fp8_ds_mla rows of the group-ending tokens at ``kv_slots`` (see the reference)."""
    _launch(_mode(kv_layout), "kv", state_cache, ratio, positions, req_indices, block_table, base, weight, eps,
            state_slots=state_slots, target_slots=kv_slots, cos_sin=cos_sin, target=kv_cache, layout=kv_layout)


def indexer_compress_insert(state_cache, index_cache, layout, positions, req_indices, state_slots, block_table,
                            base, weight, eps, cos_sin, index_slots) -> None:
    """fp8_indexer / mxfp4_indexer rows of the group-ending tokens at ``index_slots``."""
    _launch(_mode(layout), "index", state_cache, 4, positions, req_indices, block_table, base, weight, eps,
            state_slots=state_slots, target_slots=index_slots, cos_sin=cos_sin, target=index_cache, layout=layout)


LAUNCHERS = {
    "save_compressor_state": save_compressor_state,
    "pool_compressor_state": pool_compressor_state,
    "compress_kv_insert": compress_kv_insert,
    "indexer_compress_insert": indexer_compress_insert,
}


# launch settings change through settings.change
settings.guard(__name__, 'CONFIG', 'BOUNDS')

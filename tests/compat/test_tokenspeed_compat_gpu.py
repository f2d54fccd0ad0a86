"""kvformats.compat.tokenspeed against tokenspeed's own functions, called by the same names on the
same inputs.

tokenspeed's code never enters this repository. These tests import it from ``$TOKENSPEED_SRC``
(default ``.tokenspeed/`` in the project root, git-ignored): the five files of
lightseekorg/tokenspeed at f3e4d1e24df512625f31312f4df9c74e7f6c15c5
(``python/tokenspeed/runtime/layers/attention/deepseek_v4_ops.py``,
``python/tokenspeed/runtime/configs/{deepseek_v4_cache_spec,paged_cache_spec}.py``,
``tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/triton/deepseek_v4.py``,
``tokenspeed-kernel/python/tokenspeed_kernel/ops/transform/triton/__init__.py``) extracted
unmodified under their package paths (without the ``python/`` and ``tokenspeed-kernel/python/``
prefixes), and from ``$TOKENSPEED_SHIMS`` a folder of import shims that gives those files stock
Triton under tokenspeed's import names, stubs its CUDA extension and dispatches
``hadamard_transform`` to its portable Triton kernel (the project's side-by-side tool has one).
Without both, every test here is skipped and says why.

* On any machine: the signatures of tokenspeed's functions themselves, and its pure-torch paths
  (readers, the FP8 indexer writer, the CPU paths of two index helpers, the cache-spec helpers)
  against the compat functions on CPU tensors; without CUDA, under the Triton interpreter, its
  Triton kernels that need no cast emulation (the compressor-state save with the reordered ape,
  the index helpers).
* ``gpu`` (a CUDA device): every compat function whose tokenspeed counterpart runs without its
  CUDA extension, on CUDA tensors, bytes equal; the softmax-pooled compress rows to tokenspeed's
  own bar (scale bytes equal, values at most one code apart, fewer than 1e-4 of them apart).
  Not compared here: ``fused_qnorm_rope_kv_insert`` and ``indexer_mxfp4_paged_gather`` (CUDA
  extension), ``deepseek_v4_prepare_indexer_q_fp8`` and ``gather_paged_indexer_fp8_cache``
  (absent at f3e4d1e2); their compat functions are checked against the native calls
  (test_tokenspeed_compat.py) and their signatures against the upstream table.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(os.environ.get("TOKENSPEED_SRC", str(ROOT / ".tokenspeed")))
SHIMS = os.environ.get("TOKENSPEED_SHIMS", "")
_OPS_FILE = SRC / "tokenspeed" / "runtime" / "layers" / "attention" / "deepseek_v4_ops.py"
if not _OPS_FILE.is_file():
    pytest.skip(f"tokenspeed's files are not at {SRC} (set TOKENSPEED_SRC; see this module's docstring)",
                allow_module_level=True)
if not SHIMS or not (Path(SHIMS) / "tokenspeed_kernel").is_dir():
    pytest.skip("TOKENSPEED_SHIMS does not name a folder of tokenspeed import shims (see this module's docstring)",
                allow_module_level=True)
sys.path[:0] = [SHIMS, str(SRC)]
TS = importlib.import_module("tokenspeed.runtime.layers.attention.deepseek_v4_ops")
TSK = importlib.import_module("tokenspeed_kernel.ops.attention.triton.deepseek_v4")
if not str(Path(TS.__file__).resolve()).startswith(str(SRC.resolve())):
    pytest.skip(f"another tokenspeed package shadows {SRC}: {TS.__file__}", allow_module_level=True)

from kvformats import deepseek_v4 as dsv4  # noqa: E402
from kvformats.compat import tokenspeed as ts  # noqa: E402
from kvformats.formats import CompressorState, Fp8DsMla, Fp8Indexer, Mxfp4Indexer  # noqa: E402
from kvformats.layout import storage_bytes  # noqa: E402
from kvformats.numerics.elements import ELEMENTS  # noqa: E402
from tests.compat.tokenspeed_forms import check_forms, params_of  # noqa: E402
from tests.harness.dsv4_scenarios import make_batch  # noqa: E402
from kvformats.testing.tolerance import code_distance, ordinal  # noqa: E402

CUDA = torch.cuda.is_available()
_NEEDS_CUDA = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def gpu(fn):
    """``@pytest.mark.gpu``, skipped without a CUDA device."""
    return pytest.mark.gpu(_NEEDS_CUDA(fn))
DEV = torch.device("cuda" if CUDA else "cpu")
NO_EXTENSION = {"fused_qnorm_rope_kv_insert", "indexer_mxfp4_paged_gather", "hadamard_transform"}


def upstream(name):
    for mod in (TS, TSK):
        fn = getattr(mod, name, None)
        if fn is not None:
            return fn
    return None


def bytes_equal(a, b, strides=True):
    """The same dtype, shape and bytes, and strides unless ``strides`` is False (a tensor copied
    across devices is made dense)."""
    if isinstance(a, (tuple, list)):
        for x, y in zip(a, b, strict=True):
            bytes_equal(x, y, strides)
        return
    assert (a.dtype, a.shape) == (b.dtype, b.shape) and (not strides or a.stride() == b.stride())
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    if a.dtype in (torch.bfloat16, torch.float16, torch.float32):  # NaN payloads may differ (a NaN read is undefined)
        both = a.isnan() & b.isnan()
        a, b = torch.where(both, 0, a), torch.where(both, 0, b)
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def clone_cache(c):
    st = storage_bytes(c).clone()
    return torch.empty(0, dtype=c.dtype, device=c.device).set_(st.untyped_storage(), c.storage_offset(), c.shape,
                                                               c.stride())


def randomized(lay, pages, g, device=DEV):
    cache = lay.allocate(pages, device=device)
    raw = storage_bytes(cache)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8, device=g.device))
    return cache


# ----- any machine ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in ts.__all__ if callable(getattr(ts, n)) and n not in NO_EXTENSION])
def test_signature_takes_tokenspeeds_call_forms(name):
    """Every call form of tokenspeed's own function binds on the drop-in, each argument landing in
    the parameter of its name (or the documented alias: tests/compat/tokenspeed_forms.py)."""
    fn = upstream(name)
    if fn is None:
        pytest.skip(f"{name} is not in the extracted files (f3e4d1e2)")
    check_forms(name, inspect.signature(getattr(ts, name)), params_of(fn))


def test_spec_names_equal_tokenspeeds():
    for name in ("DEEPSEEK_V4_FP8_MAX", "DEEPSEEK_V4_FP8_QUANT_BLOCK", "DEEPSEEK_V4_MXFP4_BLOCK_SIZE"):
        assert getattr(ts, name) == getattr(TS, name)
    for h, r in ((512, 64), (192, 64), (128, 64)):
        for name in ("deepseek_v4_nope_dim", "deepseek_v4_swa_token_stride", "deepseek_v4_swa_scale_dim",
                     "deepseek_v4_swa_row_bytes"):
            assert getattr(ts, name)(h, r) == getattr(TS, name)(h, r)
    for d in (128, 256):
        for name in ("deepseek_v4_indexer_fp8_row_bytes", "deepseek_v4_indexer_fp8_scale_bytes",
                     "deepseek_v4_indexer_mxfp4_row_bytes"):
            assert getattr(ts, name)(d) == getattr(TS, name)(d)
    for rb in (68, 136, 17):
        assert ts.deepseek_v4_indexer_mxfp4_layout_from_row_bytes(rb) == TS.deepseek_v4_indexer_mxfp4_layout_from_row_bytes(rb)
    for rb in (132, 264):
        assert ts.deepseek_v4_indexer_fp8_layout_from_row_bytes(rb) == TS.deepseek_v4_indexer_fp8_layout_from_row_bytes(rb)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, _NEEDS_CUDA])])
def test_torch_paths(device):
    """tokenspeed's pure-torch functions (they run on CPU too) against the compat functions."""
    g = torch.Generator(device=device).manual_seed(0)
    lay = Fp8Indexer(head_dim=128, page_size=16)
    x = (torch.randn(12, 128, generator=g, device=device) * 3).to(torch.bfloat16)
    x[0] = 0
    slots = torch.tensor([0, 17, -1, 40, 5, 63, 1, 2, 33, -1, 60, 61], device=device)
    c_ts, c_kvf = lay.allocate(4, device=device), lay.allocate(4, device=device)
    TS.write_deepseek_v4_indexer_fp8_cache(x, c_ts, slots, 16)
    ts.write_deepseek_v4_indexer_fp8_cache(x, c_kvf, slots, 16)
    bytes_equal(c_ts, c_kvf)
    read = torch.tensor([0, 17, -1, 40, 63, 7], device=device)
    bytes_equal(TS.read_deepseek_v4_indexer_fp8_cache(c_ts, read, 16), ts.read_deepseek_v4_indexer_fp8_cache(c_kvf, read, 16))
    mx = randomized(Mxfp4Indexer(head_dim=128, page_size=16), 4, g, device)
    bytes_equal(TS.read_deepseek_v4_indexer_mxfp4_cache(mx, read, 16), ts.read_deepseek_v4_indexer_mxfp4_cache(mx, read, 16))
    ds = randomized(Fp8DsMla(head_dim=512, rope_dim=64, page_size=8), 3, g, device)
    ds_slots = torch.tensor([0, 23, -1, 7, 8, 16], device=device)
    bytes_equal(TS.dequantize_deepseek_v4_fp8_ds_mla_cache(ds, ds_slots, 8, head_dim=512, rope_dim=64),
                ts.dequantize_deepseek_v4_fp8_ds_mla_cache(ds, ds_slots, 8, head_dim=512, rope_dim=64))
    pos = torch.tensor([0, 3, 4, 9, 130, 7], device=device)
    out_a, out_b = torch.full((8, 40), 9, dtype=torch.int32, device=device), torch.full((8, 40), 9, dtype=torch.int32,
                                                                                        device=device)
    bytes_equal(TSK.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=pos, compress_ratio=4, width=33,
                                                                             out=out_a),
                ts.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=pos, compress_ratio=4, width=33,
                                                                            out=out_b))
    bytes_equal(out_a, out_b)
    table = torch.tensor([[3, 1, 0], [2, 5, 4]], dtype=torch.int32, device=device)
    topk = torch.tensor([[0, 3, -1], [5, 1, 2], [7, -1, -1]], dtype=torch.int32, device=device)
    req = torch.tensor([0, 1, 1], device=device)
    valid = torch.tensor([True, True, False], device=device)
    got = ts.deepseek_v4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=req,
                                                              block_table=table, block_size=4, is_valid_token=valid)
    want = TSK.deepseek_v4_compute_global_topk_indices_and_lens(topk_indices=topk, token_to_req_indices=req,
                                                                block_table=table, block_size=4, is_valid_token=valid)
    bytes_equal(got[0][:2], want[0][:2])  # tokenspeed's GPU kernel leaves an invalid token's row unwritten
    bytes_equal(got[1], want[1])


# ----- CUDA -------------------------------------------------------------------------------------------
def _rows_apart(layout, a, b, slots):
    """Code distance of the written rows of two caches; no byte apart outside them."""
    written = torch.unique(slots[slots >= 0])  # tokens of one compressed row name it alike
    ra, rb = layout.gather(a, written, check=False), layout.gather(b, written, check=False)
    outside = int((storage_bytes(a) != storage_bytes(b)).sum()) - int((ra != rb).sum())
    assert outside == 0
    return code_distance(layout, ra, rb)


def _to(b, device):
    for name in ("state", "state_table", "base", "positions", "req", "state_slots", "target_table", "target_slots",
                 "weight", "cos_sin"):
        setattr(b, name, getattr(b, name).to(device))
    return b


@gpu
@pytest.mark.parametrize("case", ["csa", "hca", "indexer_mxfp4", "indexer_fp8"])
def test_compress_inserts(case):
    ratio, h, tps = {"csa": (4, 512, 64), "hca": (128, 512, 2), "indexer_mxfp4": (4, 128, 64),
                     "indexer_fp8": (4, 128, 64)}[case]
    over = {"seq_lens": (300, 130, 700), "new_tokens": (3, 130, 300), "base": (0, 0, 2), "missing": ((0, 20),)}
    b = _to(make_batch(ratio, h, tps, **(over if ratio == 128 else {})), DEV)
    cpu = make_batch(ratio, h, tps, **(over if ratio == 128 else {}))  # the same batch (a fixed seed), on CPU
    lay = (Fp8DsMla(head_dim=h, rope_dim=64, page_size=tps) if case in ("csa", "hca")
           else (Mxfp4Indexer if case == "indexer_mxfp4" else Fp8Indexer)(head_dim=h, page_size=tps))
    cache = lay.allocate(int(b.target_table.max()) + 1, device=DEV)
    c_ts, c_kvf = clone_cache(cache), clone_cache(cache)
    args = (b.state, b.req, b.positions, b.state_slots, b.state_table, b.state.shape[1], b.weight, b.eps, b.cos_sin)
    name = {"csa": "deepseek_v4_csa_compress_kv_cache_insert", "hca": "deepseek_v4_hca_compress_kv_cache_insert"}.get(
        case, "deepseek_v4_csa_indexer_cache_insert")
    extra = () if case in ("csa", "hca") else (case == "indexer_mxfp4",)
    kw = {"block_table_base_offsets": b.base}
    getattr(TS, name)(*args, c_ts, b.target_slots, tps, *extra, **kw)
    getattr(ts, name)(*args, c_kvf, b.target_slots, tps, *extra, **kw)
    c_ref = cache.cpu()  # the drop-in on CPU tensors: kvformats' reference
    getattr(ts, name)(*(cpu.state, cpu.req, cpu.positions, cpu.state_slots, cpu.state_table, cpu.state.shape[1],
                        cpu.weight, cpu.eps, cpu.cos_sin), c_ref, cpu.target_slots, tps, *extra,
                      block_table_base_offsets=cpu.base)
    torch.cuda.synchronize()
    # kvformats' kernel: within its bar of the reference (float32 sums in the compiler's order)
    ours = _rows_apart(lay, c_kvf, c_ref.to(DEV), b.target_slots)
    assert ours.exact_equal and ours.max_apart <= 1 and ours.apart < max(1, 1e-4 * ours.values)
    # tokenspeed's kernel: scales equal and values at most one code apart; its MXFP4 indexer insert
    # departs from the reference in more values than that (docs/porting-from-tokenspeed.md)
    theirs = _rows_apart(lay, c_kvf, c_ts, b.target_slots)
    assert theirs.exact_equal and theirs.max_apart <= 1


_INTERPRETED = not CUDA and os.environ.get("TRITON_INTERPRET") == "1"
ON_DEVICES = [pytest.param("cuda", marks=[pytest.mark.gpu, _NEEDS_CUDA]),
              pytest.param("cpu", marks=pytest.mark.skipif(not _INTERPRETED, reason="needs the Triton interpreter"))]


@pytest.mark.parametrize("device", ON_DEVICES)
@pytest.mark.parametrize("ratio", [4, 128])
def test_save_state(ratio, device):
    """On CPU: tokenspeed's Triton save kernel itself under the interpreter (its wrapper refuses
    CPU tensors); its float32 adds need no cast emulation."""
    DEV = torch.device(device)
    g = torch.Generator(device=DEV).manual_seed(1)
    lay = CompressorState(head_dim=512, ratio=ratio, page_size=4 if ratio == 4 else 8)
    w, n = lay.width, 64
    kv, score = torch.randn(n, w, generator=g, device=DEV), torch.randn(n, w, generator=g, device=DEV)
    ape = torch.randn(ratio, w, generator=g, device=DEV)
    if ratio == 4:  # as tokenspeed's model keeps it after loading (spec/upstream.md §5.2)
        ape = torch.cat([ape[:, :w // 2], ape[:, w // 2:]], dim=0).reshape(ratio, w)
    slots = torch.randperm(40 * lay.page_size, generator=g, device=DEV)[:n]
    slots[::7] = -1
    pos = torch.arange(1000, 1000 + n, device=DEV)
    s_ts, s_kvf = torch.zeros(40, lay.page_size, 2 * w, device=DEV), torch.zeros(40, lay.page_size, 2 * w, device=DEV)
    (TS.save_deepseek_v4_compressor_state if DEV.type == "cuda" else TSK.deepseek_v4_save_compressor_state)(
        kv, score, ape, s_ts, slots, pos, lay.page_size, ratio)
    ts.save_deepseek_v4_compressor_state(kv, score, ape, s_kvf, slots, pos, lay.page_size, ratio)
    bytes_equal(s_ts, s_kvf)


@gpu
def test_indexer_writers_and_gathers():
    g = torch.Generator(device=DEV).manual_seed(2)
    lay = Mxfp4Indexer(head_dim=128, page_size=64)
    x = (torch.randn(300, 128, generator=g, device=DEV) * torch.exp(torch.randn(300, 1, generator=g, device=DEV)))
    x = x.to(torch.bfloat16)
    slots = torch.randperm(8 * 64, device=DEV)[:300]
    slots[::5] = -1
    c_ts, c_kvf = lay.allocate(8, device=DEV), lay.allocate(8, device=DEV)
    TS.write_deepseek_v4_indexer_mxfp4_cache(x, c_ts, slots, 64)
    ts.write_deepseek_v4_indexer_mxfp4_cache(x, c_kvf, slots, 64)
    bytes_equal(c_ts, c_kvf)
    ws = [torch.full((310, 64), 0xCC, dtype=torch.uint8, device=DEV), torch.full((310, 4), 0xDD, dtype=torch.uint8,
                                                                                  device=DEV)]
    mine = [t.clone() for t in ws]
    TSK.deepseek_v4_gather_indexer_mxfp4_cache(cache_2d=c_ts, slot_mapping=slots, values_out=ws[0], scales_out=ws[1],
                                               block_size=64)
    ts.deepseek_v4_gather_indexer_mxfp4_cache(cache_2d=c_kvf, slot_mapping=slots, values_out=mine[0],
                                              scales_out=mine[1], block_size=64)
    bytes_equal(ws, mine)


@gpu
def test_dequantize_and_gather():
    g = torch.Generator(device=DEV).manual_seed(3)
    lay = Fp8DsMla(head_dim=512, rope_dim=64, page_size=64)
    cache = lay.allocate(12, device=DEV)
    x = (torch.randn(12 * 64, 512, generator=g, device=DEV) * 4).to(torch.bfloat16)
    lay.encode(x, cache, torch.arange(12 * 64, device=DEV))
    table = torch.tensor([[3, 1, -1, 0, 7], [2, 5, 6, 4, 8]], dtype=torch.int32, device=DEV)
    seq, glen = torch.tensor([200, 300], device=DEV), torch.tensor([150, 130], device=DEV)
    base = torch.tensor([0, 1], device=DEV)
    out = torch.full((2, 160, 512), 7.0, dtype=torch.bfloat16, device=DEV)
    o_ts, o_kvf = out.clone(), out.clone()
    kw = dict(cache_2d=cache, seq_lens=seq, gather_lens=glen, block_table=table, block_size=64, offset=3,
              block_table_base_offsets=base)
    TS.deepseek_v4_dequantize_and_gather_k_cache(out=o_ts, **kw)
    ts.deepseek_v4_dequantize_and_gather_k_cache(out=o_kvf, **kw)
    bytes_equal(o_ts, o_kvf)


def _codes_within_one(got, want, element: str):
    """Quantized outputs of two Triton kernels: the same shape, every code of ``element`` equal or
    one apart, few apart (tokenspeed's own kernels round a value near a code boundary either way)."""
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    elem = ELEMENTS[element]
    g, w = (elem.codes(t.contiguous().view(torch.uint8)) for t in (got, want))
    apart = ordinal(g, elem.bits) - ordinal(w, elem.bits)
    assert int(apart.abs().max()) <= 1 and int((apart != 0).sum()) <= max(1, 1e-3 * apart.numel())


@gpu
def test_query_and_output_transforms():
    """Bytes equal to kvformats' reference (the CPU drop-in); against tokenspeed's Triton kernels,
    scales and weights equal and quantized codes at most one apart (docs/porting-from-tokenspeed.md)."""
    g = torch.Generator(device=DEV).manual_seed(4)
    cs = dsv4.cos_sin_cache(64, 4096).to(DEV)
    q = torch.randn(37, 64, 128, generator=g, device=DEV).to(torch.bfloat16)
    pos = torch.randint(0, 4096, (37,), generator=g, device=DEV)
    w = torch.randn(37, 64, generator=g, device=DEV)
    cpu = [t.cpu() for t in (q, pos, cs, w)]
    (packed, scale), weights = ts.deepseek_v4_prepare_indexer_q_mxfp4(q, pos, cs, w, 128 ** -0.5, 64 ** -0.5)
    bytes_equal(((packed, scale), weights), ts.deepseek_v4_prepare_indexer_q_mxfp4(*cpu, 128 ** -0.5, 64 ** -0.5),
                strides=False)
    (ts_packed, ts_scale), ts_weights = TS.deepseek_v4_prepare_indexer_q_mxfp4(q, pos, cs, w, 128 ** -0.5, 64 ** -0.5)
    bytes_equal((scale, weights), (ts_scale, ts_weights))
    _codes_within_one(packed, ts_packed, "float4_e2m1fn_x2")
    o = torch.randn(37, 64, 512, generator=g, device=DEV).to(torch.bfloat16)
    for tma in (True, False):
        fp8, scales = ts.deepseek_v4_fused_inv_rope_fp8_quant(o, pos, cs, 8, 8, tma_aligned_scales=tma)
        bytes_equal((fp8, scales),
                    ts.deepseek_v4_fused_inv_rope_fp8_quant(o.cpu(), pos.cpu(), cs.cpu(), 8, 8, tma_aligned_scales=tma),
                    strides=False)
        ts_fp8, ts_scales = TS.deepseek_v4_fused_inv_rope_fp8_quant(o, pos, cs, 8, 8, tma_aligned_scales=tma)
        bytes_equal(scales, ts_scales)
        _codes_within_one(fp8, ts_fp8, "float8_e4m3fn")


@pytest.mark.parametrize("device", ON_DEVICES)
def test_index_helpers(device):
    """tokenspeed's Triton index kernels (on CPU under the interpreter: integer arithmetic only)."""
    DEV = torch.device(device)
    qsl = torch.tensor([0, 6, 7, 7], device=DEV)
    seq = torch.tensor([14, 30, 3], device=DEV)
    req = torch.tensor([0, 0, 0, 0, 0, 0, 1], device=DEV)
    pos = torch.tensor([8, 9, 10, 11, 12, 13, 29], device=DEV)
    table = torch.tensor([[3, 1, 2, 0], [2, 5, 6, 4], [7, 8, 9, 10]], dtype=torch.int32, device=DEV)
    base = torch.tensor([0, 0, 0], device=DEV)
    wide = torch.randperm(24, device=DEV).reshape(3, 8).to(torch.int32)  # every compressed page in the table
    kw = dict(num_tokens=7, query_start_loc=qsl, seq_lens=seq, block_table=wide, block_size=2, compress_ratio=2)
    bytes_equal(TSK.deepseek_v4_compressed_slot_mapping(**kw), ts.deepseek_v4_compressed_slot_mapping(**kw))
    topk = torch.tensor([[0, 3, -1], [5, 1, 2], [7, -1, -1], [0, 1, 2], [3, 4, 5], [1, -1, -1], [4, 2, 6]],
                        dtype=torch.int32, device=DEV)
    kw = dict(topk_indices=topk, token_to_req_indices=req, block_table=table, block_size=2)
    bytes_equal(TSK.deepseek_v4_compute_global_topk_indices_and_lens(**kw),
                ts.deepseek_v4_compute_global_topk_indices_and_lens(**kw))
    glen = torch.tensor([14, 4, 3], device=DEV)
    kw = dict(query_start_loc=qsl, seq_lens=seq, gather_lens=glen, window_size=4, compress_ratio=4, topk=3,
              workspace_width=40, compressed_base=20)
    topk_ok = torch.where(topk >= 0, topk, 0).clamp_max(2)  # no −1 inside the top-k range (tokenspeed offsets it)
    bytes_equal(TSK.deepseek_v4_combine_topk_swa_indices(topk_indices=topk_ok, **kw),
                ts.deepseek_v4_combine_topk_swa_indices(topk_indices=topk_ok, **kw))
    kw = dict(positions=pos, token_to_req_indices=req, seq_lens=seq, compressed_lens=torch.tensor([2, 7, 0], device=DEV),
              gather_lens=glen, window_size=4, compress_ratio=4, workspace_width=40, compressed_base=20)
    bytes_equal(TSK.deepseek_v4_combine_dense_swa_indices(**kw), ts.deepseek_v4_combine_dense_swa_indices(**kw))
    kw = dict(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req, block_table=table, window_size=5,
              block_size=4, block_table_base_offsets=base)
    bytes_equal(TSK.deepseek_v4_decode_swa_indices_and_lens(**kw), ts.deepseek_v4_decode_swa_indices_and_lens(**kw))
    out_a, out_b = (torch.full((9, 12), 3, dtype=torch.int32, device=DEV) for _ in range(2))
    bytes_equal(TSK.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=pos, compress_ratio=4, width=6,
                                                                             out=out_a),
                ts.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=pos, compress_ratio=4, width=6,
                                                                            out=out_b))

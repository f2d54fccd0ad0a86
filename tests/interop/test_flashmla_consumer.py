"""A real consumer reads our pages: FlashMLA's sparse fp8 decode (``flash_mla_with_kvcache(...,
is_fp8_kvcache=True, indices=...)``, its MODEL1 / V4 layout: d_qk = d_v = 512, 584 B per token)
attends over fp8_ds_mla caches that kvformats wrote, with page strides of 37440 B (kvformats'
natural page, FlashMLA tests/quant.py's padding to a multiple of 576 B) and 37376 B (64 rows of
584 B, no pad). Its output is compared with float32 attention over the rows ``layout.decode``
returns (relative error below 1e-2); where tokenspeed's V4 writer is importable (``.sbs/shims`` +
``.tokenspeed``, see .sbs/README.md), a cache it filled gets the same check, and both caches'
outputs must agree within the same bar.

The GPU tests skip unless ``flash_mla`` imports on an SM90 GPU (build it with the kit of
tools/flashmla_kit: ``.flashmla/build.sh``, then ``PYTHONPATH=<build>/lib``). The CPU test
checks, without FlashMLA, that the 4-D uint8 view handed to it addresses the bytes kvformats
wrote the way its kernel does (token record at page * stride(0) + row * 576, scale record at
page * stride(0) + page_size * 576 + row * 8; csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kvformats as kvf
from kvformats.deepseek_v4.rope import cos_sin_cache, rope_tail

PAGE = 64
HEAD, ROPE, NOPE = 512, 64, 448
TOKEN_B, SCALE_B = NOPE + 2 * ROPE, 8  # FlashMLA MODEL1: 576 B token record, 7 ue8m0 + 1 pad
ROW_B = TOKEN_B + SCALE_B  # 584
STRIDES = (37440, 37376)  # natural (padded to 576 B), and exactly 64 rows
NUM_PAGES = 24
TOPK = 128  # a multiple of FlashMLA's 64-token topk block
REL_TOL = 1e-2
ROOT = Path(__file__).resolve().parents[2]

try:
    import flash_mla  # noqa: F401

    _FLASH_MLA_ERR = None
except Exception as err:  # ImportError, or an undefined symbol / CUDA mismatch from the .so
    flash_mla, _FLASH_MLA_ERR = None, f"{type(err).__name__}: {err}"


def _flashmla_skip_reason() -> str | None:
    if flash_mla is None:
        return (f"flash_mla is not importable ({_FLASH_MLA_ERR}); build FlashMLA's SM90 sparse decode with "
                "tools/flashmla_kit (.flashmla/build.sh) and put <build>/lib on PYTHONPATH")
    if not torch.cuda.is_available():
        return "FlashMLA's sparse decode needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return (f"the kit builds FlashMLA's SM90 sparse decode only; this GPU is sm_"
                f"{''.join(map(str, torch.cuda.get_device_capability()))}")
    return None


needs_flashmla = pytest.mark.skipif(_flashmla_skip_reason() is not None, reason=_flashmla_skip_reason() or "")


def _layout() -> kvf.Fp8DsMla:
    return kvf.Fp8DsMla(head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)


def _cache(layout, stride: int, device) -> torch.Tensor:
    """uint8 [NUM_PAGES, stride]: kvformats' own page (37440 B) or pages of exactly 64 rows."""
    if stride == layout.page_bytes:
        cache = layout.allocate(NUM_PAGES, device=device)
    else:
        assert stride == layout.min_page_bytes  # the narrowest page kvformats' ops accept
        cache = torch.zeros((NUM_PAGES, stride), dtype=torch.uint8, device=device)
    assert cache.stride(0) == stride
    return cache


def flashmla_kv_view(cache: torch.Tensor) -> torch.Tensor:
    """The k_cache argument FlashMLA takes: [pages, page_size, 1, 584] over the same bytes, with
    stride(1) = 584 (its check) and stride(0) = the cache's page stride."""
    return cache.as_strided((cache.shape[0], PAGE, 1, ROW_B), (cache.stride(0), ROW_B, ROW_B, 1),
                            cache.storage_offset())


def _rows(n: int, g: torch.Generator, device) -> torch.Tensor:
    """bf16 rows with a per-row magnitude spread (so that the per-64-block scales differ)."""
    x = torch.randn(n, HEAD, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    return x.to(torch.bfloat16).to(device)


def _indices(b: int, s_q: int, n_slots: int, g: torch.Generator, device) -> torch.Tensor:
    """int32 [b, s_q, TOPK]: distinct slots per query (page * 64 + row, FlashMLA's convention),
    a few -1 (invalid, skipped) in the first query."""
    idx = torch.stack([torch.randperm(n_slots, generator=g)[:TOPK] for _ in range(b * s_q)]).view(b, s_q, TOPK)
    idx[0, 0, -7:] = -1
    return idx.to(torch.int32).to(device)


def ref_attention(layout, cache, q, indices, scale):
    """float32 attention over kvformats' decode of the indexed rows: (out [b, s_q, h, 512], lse [b, s_q, h])."""
    b, s_q, h, d = q.shape
    valid = indices >= 0
    kv = layout.decode(cache, indices.clamp_min(0).flatten().long()).float().view(b * s_q, TOPK, d)
    logits = torch.einsum("thd,tkd->thk", q.float().view(b * s_q, h, d), kv) * scale
    logits.masked_fill_(~valid.view(b * s_q, 1, TOPK), float("-inf"))
    lse = logits.logsumexp(-1)
    out = torch.einsum("thk,tkd->thd", torch.softmax(logits, -1), kv)
    return out.view(b, s_q, h, d), lse.view(b, s_q, h)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def run_flashmla(cache, q, indices, scale):
    sched, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, flashmla_kv_view(cache), None, None, HEAD, sched, None,
                                               softmax_scale=scale, is_fp8_kvcache=True, indices=indices)
    return out, lse.transpose(1, 2)  # lse comes back [b, h, s_q]


def _filled(stride, device, seed):
    g = torch.Generator().manual_seed(seed)
    layout = _layout()
    cache = _cache(layout, stride, device)
    n = NUM_PAGES * PAGE
    x = _rows(n, g, device)
    slots = torch.randperm(n, generator=g).to(device)
    layout.encode(x, cache, slots)
    return layout, cache, g


# ----- CPU: the view FlashMLA gets addresses what kvformats wrote -------------------------------
@pytest.mark.parametrize("stride", STRIDES)
def test_flashmla_view_addresses_kvformats_bytes(stride):
    layout, cache, g = _filled(stride, "cpu", 11)
    kv = flashmla_kv_view(cache)
    assert kv.shape == (NUM_PAGES, PAGE, 1, ROW_B) and kv.stride()[:2] == (stride, ROW_B)
    slots = torch.randint(0, NUM_PAGES * PAGE, (200,), generator=g)
    flat = cache.reshape(-1) if cache.is_contiguous() else cache.as_strided((cache.numel(),), (1,))
    page, row = slots // PAGE, slots % PAGE
    # FlashMLA's addressing (splitkv_mla.cuh, MODEL1): k_ptr + block*stride_kv_block + ...
    tok = page * kv.stride(0) + row * TOKEN_B
    sc = page * kv.stride(0) + PAGE * TOKEN_B + row * SCALE_B
    nope = flat[tok.unsqueeze(1) + torch.arange(NOPE)].view(torch.float8_e4m3fn).float()
    rope = flat[tok.unsqueeze(1) + NOPE + torch.arange(2 * ROPE)].contiguous().view(torch.bfloat16).float()
    e8 = flat[sc.unsqueeze(1) + torch.arange(SCALE_B)]
    assert torch.all(e8[:, 7] == 0)  # the pad byte FlashMLA loads with the 7 scales
    scales = torch.exp2(e8[:, :7].float() - 127)
    theirs = torch.cat([(nope.view(-1, 7, 64) * scales.unsqueeze(-1)).view(-1, NOPE), rope], 1)
    ours = layout.decode(cache, slots).float()
    assert torch.equal(theirs, ours)
    # and the last byte FlashMLA may read of the last page lies inside the cache
    assert (NUM_PAGES - 1) * stride + PAGE * ROW_B <= cache.untyped_storage().nbytes()


# ----- GPU: FlashMLA's sparse decode over kvformats' caches --------------------------------------
@needs_flashmla
@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("stride", STRIDES)
def test_flashmla_sparse_decode_reads_kvformats_pages(stride, h_q):
    layout, cache, g = _filled(stride, "cuda", 23 + h_q)
    b, s_q, scale = 3, 2, HEAD ** -0.5
    q = (torch.randn(b, s_q, h_q, HEAD, generator=g) * 2).to(torch.bfloat16).cuda()
    idx = _indices(b, s_q, NUM_PAGES * PAGE, g, "cuda")
    out, lse = run_flashmla(cache, q, idx, scale)
    torch.cuda.synchronize()
    ref, ref_lse = ref_attention(layout, cache, q, idx, scale)
    err = rel_err(out, ref)
    print(f"stride {stride} h_q {h_q}: relative error {err:.2e}, lse max abs diff "
          f"{(lse - ref_lse).abs().max().item():.2e}")
    assert out.shape == (b, s_q, h_q, HEAD) and out.dtype == torch.bfloat16
    assert err < REL_TOL
    assert torch.allclose(lse, ref_lse, rtol=REL_TOL, atol=REL_TOL)


# ----- GPU: and over caches tokenspeed's V4 writer filled ----------------------------------------
def _tokenspeed_writer():
    """tokenspeed's torch writer (_write_fp8_ds_mla_cache_rows_capturable), imported as .sbs does:
    the shims and the extracted files as namespace packages on sys.path; None if absent."""
    shims, src = ROOT / ".sbs" / "shims", ROOT / ".tokenspeed"
    if not (shims.is_dir() and src.is_dir()):
        return None, f"{shims} or {src} missing (see .sbs/README.md)"
    for p in (str(src), str(shims)):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        import tokenspeed.runtime.layers.attention.deepseek_v4_ops as ts

        return ts._write_fp8_ds_mla_cache_rows_capturable, None
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"


@needs_flashmla
@pytest.mark.parametrize("stride", STRIDES)
def test_flashmla_sparse_decode_reads_tokenspeed_pages(stride):
    write, why = _tokenspeed_writer()
    if write is None:
        pytest.skip(f"tokenspeed's writer is not importable: {why}")
    g = torch.Generator().manual_seed(5)
    layout, dev = _layout(), "cuda"
    n = NUM_PAGES * PAGE
    x = _rows(n, g, dev)
    pos = torch.randint(0, 1 << 15, (n,), generator=g).to(dev)
    cs = cos_sin_cache(ROPE, 1 << 15).to(dev)
    slots = torch.randperm(n, generator=g).to(dev)
    ours, theirs = _cache(layout, stride, dev), _cache(layout, stride, dev)
    layout.encode(rope_tail(x, pos, cs).to(torch.bfloat16), ours, slots)  # kvformats stores the tail as given
    write(x, pos, cs, theirs, slots, torch.ones(n, dtype=torch.bool, device=dev), PAGE, 1)  # rotates inside
    b, s_q, h_q, scale = 2, 1, 64, HEAD ** -0.5
    q = torch.randn(b, s_q, h_q, HEAD, generator=g).to(torch.bfloat16).to(dev)
    idx = _indices(b, s_q, n, g, dev)
    out_ours, _ = run_flashmla(ours, q, idx, scale)
    out_ts, _ = run_flashmla(theirs, q, idx, scale)
    torch.cuda.synchronize()
    err_ts = rel_err(out_ts, ref_attention(layout, theirs, q, idx, scale)[0])
    err_ours = rel_err(out_ours, ref_attention(layout, ours, q, idx, scale)[0])
    err_between = rel_err(out_ts, out_ours)
    print(f"stride {stride}: tokenspeed cache {err_ts:.2e}, kvformats cache {err_ours:.2e}, between {err_between:.2e}")
    assert err_ts < REL_TOL and err_ours < REL_TOL and err_between < REL_TOL

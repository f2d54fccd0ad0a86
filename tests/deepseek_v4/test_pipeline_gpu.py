"""Layer-step reference on a GPU: a whole decode step captured in one CUDA graph and replayed
with new inputs equals eager; no host synchronization inside a step after warm-up; the Triton
backend reproduces the reference backend's cache bytes (compressed rows within one fp8 code,
the bar of tests/kernels/test_dsv4_compress_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from kvformats.dsv4_layer.pipeline import LayerStep
from kvformats.dsv4_layer.pipeline_config import LayerConfig
from kvformats.testing.tolerance import code_distance

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]
OUTPUTS = ("swa", "csa", "hca", "layer", "topk", "index_scores")


def config(topk=512, index_format="mxfp4_indexer"):
    return LayerConfig(heads=16, head_dim=512, rope_dim=64, index_heads=16, topk=topk, requests=4,
                       max_context=8192 if topk > 512 else 4096, hidden=512, out_groups=4,
                       index_format=index_format)


def prefill_lens(cfg):
    return [cfg.max_context // 2 + 37 * r for r in range(cfg.requests)]


def prefill(step, lens, seed=0):
    cfg = step.cfg
    g = torch.Generator().manual_seed(seed)
    pos = torch.cat([torch.arange(n) for n in lens]).cuda()
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(lens)]).cuda()
    step.step(torch.randn(len(pos), cfg.hidden, generator=g).cuda(), pos, req)


def decode_inputs(cfg, lens, k, seed):
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(cfg.requests, cfg.hidden, generator=g).cuda()
    pos = torch.tensor([n + k for n in lens], dtype=torch.int64).cuda()
    return x, pos, torch.arange(cfg.requests, dtype=torch.int64).cuda()


def assert_same(a, b):
    for name in OUTPUTS:
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y) if x.dtype in (torch.int32, torch.int64) else torch.allclose(x, y, rtol=1e-5,
                                                                                                atol=1e-5), name
    assert torch.equal(a.out_fp8[0].view(torch.uint8), b.out_fp8[0].view(torch.uint8))


# The Triton backend only: the reference backend filters invalid rows with a host read
# (kvformats.codec.rows.write_rows), which no CUDA graph can capture; it defines bytes, engines run kernels.
@pytest.mark.parametrize("topk,fmt", [(512, "mxfp4_indexer"), (512, "fp8_indexer"), (2048, "mxfp4_indexer")])
@pytest.mark.parametrize("backend", ["auto"])
def test_decode_step_graph_replay_equals_eager(topk, fmt, backend):
    cfg = config(topk, fmt)
    lens = prefill_lens(cfg)
    graphed, eager = LayerStep(cfg, device="cuda", backend=backend), LayerStep(cfg, device="cuda", backend=backend)
    for s in (graphed, eager):
        prefill(s, lens)
    sx, spos, sreq = decode_inputs(cfg, lens, 0, 0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compiles kernels; rewriting one token's rows is idempotent
            graphed.step(sx, spos, sreq)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = graphed.step(sx, spos, sreq)
    graph.replay()
    assert_same(static_out, eager.step(sx, spos, sreq))
    for k in range(1, 4):  # new inputs into the static buffers: the next decode positions
        x, pos, req = decode_inputs(cfg, lens, k, k)
        sx.copy_(x), spos.copy_(pos), sreq.copy_(req)
        graph.replay()
        assert_same(static_out, eager.step(x, pos, req))
    for name, t in graphed.caches.tensors().items():
        assert torch.equal(t, eager.caches.tensors()[name]), name


def test_decode_step_does_not_synchronize():
    """Eager decode step after warm-up: no host synchronization with the ops' default checks
    (on a GPU they record on the device instead of reading back)."""
    cfg = config()
    lens = prefill_lens(cfg)
    step = LayerStep(cfg, device="cuda")
    prefill(step, lens)
    x, pos, req = decode_inputs(cfg, lens, 0, 0)
    step.step(x, pos, req)  # warm-up: kernel compilation and caching may synchronize
    inputs = decode_inputs(cfg, lens, 1, 1)  # built first: a copy from pageable host memory synchronizes
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step.step(*inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.layer.is_cuda


def _all_rows(layout, cache):
    slots = torch.arange(cache.shape[0] * layout.page_size, device=cache.device)
    return layout.gather(cache, slots, backend="reference")


@pytest.mark.parametrize("fmt", ["mxfp4_indexer", "fp8_indexer"])
def test_triton_reproduces_reference_cache_bytes(fmt):
    cfg = config(512, fmt)
    lens = prefill_lens(cfg)
    # "auto" takes the Triton kernel of every op that has one (backend="triton" would refuse the
    # ops that have none)
    ref, tri = LayerStep(cfg, device="cuda", backend="reference"), LayerStep(cfg, device="cuda", backend="auto")
    for s in (ref, tri):
        prefill(s, lens)
        for k in range(3):
            s.step(*decode_inputs(cfg, lens, k, k))
    c_ref, c_tri = ref.caches, tri.caches
    for name in ("csa_state", "idx_state", "hca_state"):
        torch.testing.assert_close(getattr(c_tri, name), getattr(c_ref, name), rtol=0, atol=0)
    for name, layout in (("swa", c_ref.kv_layout), ("csa", c_ref.kv_layout), ("hca", c_ref.kv_layout),
                         ("index", c_ref.index_layout)):
        d = code_distance(layout, _all_rows(layout, getattr(c_tri, name)), _all_rows(layout, getattr(c_ref, name)))
        assert d.exact_equal, f"{name}: scale / pad bytes differ"
        assert d.max_apart <= 1, f"{name}: a value more than one code apart"
        assert d.apart < 1e-4 * d.values or d.apart <= 1, f"{name}: {d.apart} of {d.values} values one code apart"

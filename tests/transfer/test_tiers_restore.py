"""The tiers' test that matters (issue 45): on the layer-step reference, prefill, offload the
prefix, drop it, restore it into a fresh pool at other pages and another page size, continue
decoding: the outputs equal the uninterrupted run bit for bit. Prefixes end mid-group of both
compressors (ratio 4 and 128), on a group boundary, and longer and shorter than the SWA window;
the restore goes through host memory and through a cache file. On the reference backend, and
with ``backend="auto"`` resolving to the Triton kernels (under the interpreter on a CPU-only
machine: one small case, well under a minute; compiled on a GPU). A last test shows that each
row rule is needed: restoring one row less of the SWA window or of a compressor state changes
the output."""

from __future__ import annotations

import copy

import pytest
import torch

from kvformats.codec import registry
from kvformats.dsv4_layer.pipeline import LayerStep
from kvformats.dsv4_layer.pipeline_config import tiny_config
from kvformats.transfer import load_tier, offload, restore, save_tier
from kvformats.transfer.tiers_layer import layer_step_pages, layer_step_rows

OUTPUTS = ("swa", "csa", "hca", "layer", "topk", "index_scores")


def prompt(cfg, lens, device="cpu"):
    g = torch.Generator().manual_seed(0)
    pos = torch.cat([torch.arange(n) for n in lens])
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(lens)])
    return (torch.randn(len(pos), cfg.hidden, generator=g).to(device), pos.to(device), req.to(device))


def decode(step, lens, steps, device="cpu"):
    outs = []
    for k in range(steps):
        x = torch.randn(len(lens), step.cfg.hidden, generator=torch.Generator().manual_seed(100 + k))
        pos = torch.tensor([n + k for n in lens])
        outs.append(step.step(x.to(device), pos.to(device), torch.arange(len(lens)).to(device)))
    return outs


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def assert_same_outputs(want, got) -> None:
    """Every output bit for bit; the slots read differ (other pages) but not where they are valid."""
    for k, (a, b) in enumerate(zip(want, got)):
        for name in OUTPUTS:
            assert torch.equal(bits(getattr(a, name)), bits(getattr(b, name))), (k, name)
        for x, y in zip(a.out_fp8, b.out_fp8):
            assert torch.equal(bits(x), bits(y)), (k, "out_fp8")
        for name in a.reads:
            assert torch.equal(a.reads[name] >= 0, b.reads[name] >= 0), (k, name)


def offload_and_restore(src, lens, dst, via, tmp_path, rows=None):
    """Offload each request's prefix from ``src``, restore it into ``dst`` (request r's own
    pages there) through host memory or a file."""
    for r, n in enumerate(lens):
        tier = offload(layer_step_pages(src, r), rows(n) if rows else layer_step_rows(src.cfg, n))
        if via == "file":
            path = tmp_path / f"request{r}.kvc"
            save_tier(path, tier)
            del tier  # dropped: the restore reads only the file
            restore(load_tier(path), layer_step_pages(dst, r), verify=False)  # load_tier verified it
        else:
            restore(tier, layer_step_pages(dst, r))


@pytest.mark.parametrize("lens,page_sizes", [((126, 37), (8, 32)), ((128, 12), (32, 8)), ((200, 64), (16, 32))],
                         ids=["mid-group", "group-boundary-and-short", "past-window"])
def test_restored_prefix_decodes_as_the_uninterrupted_run(lens, page_sizes, tmp_path):
    """126: mid CSA group (126 % 4 = 2) and mid HCA group, decode closes both at 127; 37 closes
    its CSA group at 39; 128 and 12 start on a boundary (no open group), 12 < window 16;
    200 and 64 are past the window by far. The source has pages of 16 rows; one pool is
    restored through host memory, the other through a file, each with its own page size."""
    cfg = tiny_config()
    src = LayerStep(cfg, seed=0, backend="reference")
    src.step(*prompt(cfg, lens))
    pools = {}
    for i, (via, page_size) in enumerate(zip(("host", "file"), page_sizes)):
        pools[via] = LayerStep(tiny_config(page_size=page_size), seed=11 + i, backend="reference",
                               weights=src.weights)
        offload_and_restore(src, lens, pools[via], via, tmp_path)
    want = decode(src, lens, 4)  # the uninterrupted run continues on the source pool
    for dst in pools.values():
        assert_same_outputs(want, decode(dst, lens, 4))


@pytest.fixture
def triton_auto(monkeypatch):
    """``backend="auto"`` on the Triton kernels: compiled on a GPU, else under the interpreter
    on CPU tensors (tests/harness/routing.py, the kernels' device-record checks)."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        yield "cuda"
        return
    from tests.harness.routing import auto_resolves_to_triton

    auto_resolves_to_triton(monkeypatch)
    assert registry.is_kernel(registry.resolve_model_op("deepseek_v4", "swa_insert", "auto", torch.device("cpu")))
    yield "cpu"
    registry._RESOLVED.clear()


def test_restored_prefix_decodes_as_the_uninterrupted_run_on_triton(triton_auto, tmp_path):
    """One request of 18 tokens (mid CSA group, mid HCA group, past the 16-row window), two
    decode steps closing the CSA group at 19; restored through a file into pages of 8 rows
    (host memory on the way: save_tier writes a HostTier). Under the interpreter: about 30 s."""
    device, lens = triton_auto, (18,)
    cfg = tiny_config(requests=1, max_context=128)
    src = LayerStep(cfg, device=device, seed=0, backend="auto")
    src.step(*prompt(cfg, lens, device))
    dst = LayerStep(tiny_config(requests=1, max_context=128, page_size=8), device=device, seed=3, backend="auto",
                    weights=src.weights)
    offload_and_restore(src, lens, dst, "file", tmp_path)
    assert_same_outputs(decode(src, lens, 2, device), decode(dst, lens, 2, device))


@pytest.fixture(scope="module")
def interrupted():
    """(the source pool right after its prefill of (126, 37), the uninterrupted run's outputs)."""
    cfg, lens = tiny_config(), (126, 37)
    src = LayerStep(cfg, seed=0, backend="reference")
    src.step(*prompt(cfg, lens))
    snapshot = copy.deepcopy(src)
    return snapshot, decode(src, lens, 4)


@pytest.mark.parametrize("cache,shift", [("swa", 2), ("csa_state", 4), ("idx_state", 4), ("hca_state", 126)])
def test_each_row_rule_is_needed(interrupted, cache, shift, tmp_path):
    """Restoring the rule's rows less its first ``shift`` changes the decode: the SWA window's
    oldest rows still read, the CSA and indexer states of the group before the open one (the
    overlapping window closing at 127 reads them), the HCA state of the open group. (The SWA
    rule keeps the whole ring of ``window`` positions, one more than the next token reads.)"""
    src, want = interrupted
    lens = (126, 37)

    def fewer(n):
        rows = layer_step_rows(src.cfg, n)
        start, stop = rows[cache]
        rows[cache] = (min(start + shift, stop), stop)
        return rows

    dst = LayerStep(tiny_config(page_size=8), seed=11, backend="reference", weights=src.weights)
    offload_and_restore(src, lens, dst, "host", tmp_path, rows=fewer)
    got = decode(dst, lens, 4)
    assert any(not torch.equal(bits(getattr(a, name)), bits(getattr(b, name)))
               for a, b in zip(want, got) for name in OUTPUTS)

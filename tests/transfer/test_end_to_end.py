"""Prefill on one process, decode on another, the request's pages moved by a real engine over
127.0.0.1 (tests.harness.transfer_pd): B's decode equals A's bit for bit; a byte changed
in flight is caught by the checksums, another layout by the handshake. Each engine runs when
installed (.ci/run installs both); the scenario moves two requests of a tiny layer. Across page
geometries (issue 45; tests/transfer/engine_children.py): A prefills with pages of 64 rows, B
decodes with pages of 32 or 128; whole requests, and layer by layer over two layers."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tests.harness import transfer_pd as pd
from kvformats.transfer.engines import available

WAIT_S = 240  # the whole scenario, both processes (spawn + torch import + two layer steps each)


def _results(procs, results) -> dict:
    """Start both sides, collect one result from each (keyed by its side) and end the processes."""
    for p in procs:
        p.start()
    try:
        out = {}
        for _ in procs:
            item = results.get(timeout=WAIT_S)
            out[item[0]] = item
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
    return out


def run(engine: str, direction: str, mode: str) -> dict:
    if not available(engine):
        pytest.skip(f"the {engine} engine is not installed here (pip install 'kvformats[{engine}]'; see "
                    f"docs/transfer.md)")
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    results = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(conn, results, engine, direction, mode))
             for fn, conn in ((pd.prefill_side, a), (pd.decode_side, b))]
    return _results(procs, results)


def same(x, y) -> bool:
    if isinstance(x, tuple):
        return len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y))
    return torch.equal(x, y)


CASES = [("nixl", "push", "ok"), ("nixl", "pull", "ok"), ("mooncake", "push", "ok"), ("mooncake", "pull", "ok"),
         ("nixl", "push", "rows")]


@pytest.mark.parametrize("engine, direction, mode", CASES)
def test_decode_after_transfer_is_bit_identical(engine, direction, mode):
    out = run(engine, direction, mode)
    assert out["A"][1] == "ok", out["A"][2]
    assert out["B"][1] == "ok", out["B"][2]
    assert out["B"][3] == [0, 1]  # both requests verified and marked valid
    want, got = pd.unpack(out["A"][2]), pd.unpack(out["B"][2])
    assert want["layer"].abs().sum() > 0 and (want["topk"] >= 0).any()  # a decode that read real rows
    assert {k for k in want if not same(want[k], got[k])} == set()


@pytest.mark.parametrize("engine, direction", [("nixl", "pull"), ("mooncake", "push")])
def test_a_byte_changed_in_flight_is_caught(engine, direction):
    out = run(engine, direction, "corrupt")
    assert out["A"][1] == "ok", out["A"][2]
    assert out["B"][1] == "rejected", out["B"][2:]
    assert out["B"][2].startswith("IntegrityError: cache 'index'")
    assert "region 'scale'" in out["B"][2]
    assert out["B"][3] == [0]  # request 0 arrived intact; request 1 was never marked valid


MXFP4 = "dsv4-mxfp4-indexer-68 (V4 / V4.1, 68 B/token, head_dim 128, page-planar)"
FP8 = "dsv4-fp8-indexer-132 (V4, 132 B/token, head_dim 128, page-planar)"


@pytest.mark.parametrize("engine", ["nixl", "mooncake"])
def test_another_layout_fails_the_handshake(engine):
    """Both sides refuse, each with the whole message from its own point of view (a prefix
    alone would pass with the fields after it ignored)."""
    out = run(engine, "push", "mismatch")
    want = {"A": ("mxfp4_indexer", "fp8_indexer", MXFP4, FP8), "B": ("fp8_indexer", "mxfp4_indexer", FP8, MXFP4)}
    for side, (here, there, rec_here, rec_there) in want.items():
        assert out[side][1] == "error", out[side][2:]
        assert out[side][2].splitlines()[0] == (
            f"HandshakeError: cache 'index': format differs: here {here!r}, at the peer {there!r} "
            f"(record here {rec_here}, at the peer {rec_there})")


def run_geometry(engine: str, direction: str, page: int, layerwise: bool) -> dict:
    from tests.transfer import engine_children as kids

    if not available(engine):
        pytest.skip(f"the {engine} engine is not installed here (pip install 'kvformats[{engine}]')")
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    results = ctx.Queue()
    layers = 2 if layerwise else 1
    procs = [ctx.Process(target=kids.geometry_prefill, args=(a, results, engine, direction, layers, layerwise)),
             ctx.Process(target=kids.geometry_decode, args=(b, results, engine, direction, layers, layerwise, page))]
    return _results(procs, results)


def differing(want, got, path="") -> list[str]:
    """The paths of every tensor that is not bit for bit the same in two nested results."""
    if isinstance(want, torch.Tensor):  # bit for bit: the bytes (NaN == NaN, -0.0 != 0.0)
        same = want.dtype == got.dtype and want.shape == got.shape and torch.equal(
            want.reshape(-1).contiguous().view(torch.uint8), got.reshape(-1).contiguous().view(torch.uint8))
        return [] if same else [path]
    if isinstance(want, dict):
        return [d for k in want for d in differing(want[k], got[k], f"{path}.{k}")]
    if isinstance(want, (list, tuple)):
        return [d for i, (x, y) in enumerate(zip(want, got, strict=True)) for d in differing(x, y, f"{path}[{i}]")]
    return [] if want == got else [path]


GEOMETRY_CASES = [("nixl", "push", 32, False), ("mooncake", "pull", 128, False), ("nixl", "push", 128, True),
                  ("mooncake", "push", 32, True)]


@pytest.mark.parametrize("engine, direction, page, layerwise", GEOMETRY_CASES,
                         ids=["nixl-push-64to32", "mooncake-pull-64to128", "nixl-layerwise-64to128",
                              "mooncake-layerwise-64to32"])
def test_decode_across_page_geometries_is_bit_identical(engine, direction, page, layerwise):
    """Every request's rows of every cache decode at B (pages of ``page`` rows) to exactly what
    A (pages of 64) holds, token by token, and B's decode step equals A's bit for bit; layer by
    layer, each layer verified as it landed, both requests valid only once every layer was."""
    out = run_geometry(engine, direction, page, layerwise)
    assert out["A"][1] == "ok", out["A"][2]
    assert out["B"][1] == "ok", out["B"][2]
    assert out["B"][3] == [0, 1]  # both requests verified and marked valid
    if layerwise:
        assert out["B"][4] == {"0": [0, 1], "1": [0, 1]}  # layer 0 verified first, on its own
    want, got = pd.unpack(out["A"][2]), pd.unpack(out["B"][2])
    assert len(want["rows"][1]) == 6 * (2 if layerwise else 1)  # every cache with rows at 70 tokens (no HCA row)
    assert want["out"][0]["layer"].abs().sum() > 0 and (want["out"][0]["topk"] >= 0).any()
    assert differing(want, got) == []

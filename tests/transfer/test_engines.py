"""Each installed engine behind the interface: batches land byte for byte, a segment beyond the
peer's registered memory is a typed TransferError, a plan for other caches is refused before
the engine sees it (tests.harness.transfer_pd.engine_checks, in a spawned process). The
batching, deadline and error paths of Endpoint are also checked with a scripted engine."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from kvformats.errors import InputError, TransferError
from kvformats.formats import Fp8DsMla
from tests.harness import transfer_pd as pd
from kvformats.transfer import plan_transfer
from kvformats.transfer.endpoint import Endpoint
from kvformats.transfer.engines import available, make_engine
from kvformats.transfer.engines.base import BUSY, DONE, FAILED, Engine


@pytest.mark.parametrize("engine", ["nixl", "mooncake"])
def test_engine_moves_batches_and_reports_errors(engine):
    if not available(engine):
        pytest.skip(f"the {engine} engine is not installed here (pip install 'kvformats[{engine}]')")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=pd.engine_checks, args=(results, engine))
    proc.start()
    try:
        kind, out = results.get(timeout=180)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert kind == "ok", out
    assert out["push"] is True
    assert out["arena"] == "ok"
    assert out["beyond"].startswith("TransferError: ")
    assert out["stale"].startswith("InputError: the plan was made for other caches")
    assert out["untouched"] is True


class Scripted(Engine):
    """An engine that answers polls from a script and records what it was handed."""

    name = "scripted"

    def __init__(self, answers=(DONE,), max_batch=2):
        self.answers, self.max_batch, self.posted = list(answers), max_batch, []

    def register(self, addr, nbytes, device=None):
        pass

    def metadata(self):
        return b"scripted"

    def connect(self, peer_metadata):
        return "peer"

    def post(self, op, peer, segments):
        self.posted.append((op, segments.clone()))
        return len(self.posted)

    def poll(self, handle):
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


LAYOUT = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)


def pair(engine):
    a = Endpoint(engine, {"kv": (LAYOUT, LAYOUT.allocate(8))})
    b = Endpoint(Scripted(), {"kv": (LAYOUT, LAYOUT.allocate(8))})
    peer = a.connect(b.hello())
    return a, b, peer


def test_batches_are_sized_to_the_engine_and_addressed_from_both_bases():
    engine = Scripted(max_batch=2)
    a, b, peer = pair(engine)
    plan = plan_transfer(a.descs, peer.descs, {"kv": [0, 2, 4, 6, 7]}, {"kv": [1, 3, 5, 7, 0]})
    a.push(peer, plan)
    assert [s.shape[0] for _, s in engine.posted] == [2, 2, 1]
    rows = torch.cat([s for _, s in engine.posted])
    assert torch.equal(rows[:, 0] - a.bases["kv"], plan.caches["kv"].src[:, 0])
    assert torch.equal(rows[:, 1] - b.bases["kv"], plan.caches["kv"].dst[:, 0])
    engine.posted.clear()
    a.pull(peer, plan_transfer(peer.descs, a.descs, {"kv": [1]}, {"kv": [2]}))
    assert engine.posted[0][0] == "read" and int(engine.posted[0][1][0, 0]) == a.bases["kv"] + 2 * LAYOUT.page_bytes


def test_a_failed_batch_and_a_late_batch_are_transfer_errors():
    a, _, peer = pair(Scripted(answers=(BUSY, FAILED)))
    plan = plan_transfer(a.descs, peer.descs, {"kv": [0]}, {"kv": [1]})
    with pytest.raises(TransferError, match="failed in batch 1 of 1"):
        a.push(peer, plan)
    a, _, peer = pair(Scripted(answers=(BUSY,)))
    with pytest.raises(TransferError, match="timed out after 0.05 s"):
        a.push(peer, plan, timeout=0.05)
    with pytest.raises(InputError, match="timeout"):
        a.push(peer, plan, timeout=0)


def test_hello_from_another_engine_or_layout_is_refused():
    from kvformats.errors import HandshakeError

    a = Endpoint(Scripted(), {"kv": (LAYOUT, LAYOUT.allocate(8))})
    other = Fp8DsMla(head_dim=128, rope_dim=64, page_size=32)
    b = Endpoint(Scripted(), {"kv": (other, other.allocate(8))})
    with pytest.raises(HandshakeError, match="'kv': params differs"):
        a.connect(b.hello())
    with pytest.raises(HandshakeError, match="not a kvformats hello"):
        a.connect(b"{}")


def test_unknown_engine_is_an_input_error():
    with pytest.raises(InputError, match="engine must be one of"):
        make_engine("tcp")


def test_importing_the_transfer_package_imports_no_engine():
    import subprocess
    import sys

    code = ("import sys, kvformats.transfer, kvformats.transfer.endpoint, kvformats.transfer.engines; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nixl', 'nixl_cu12', 'mooncake')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"

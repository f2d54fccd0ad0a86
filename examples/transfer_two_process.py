"""Move one request's KV pages from a prefill process to a decode process on CPU (127.0.0.1):
the call pattern of docs/transfer.md, complete (tests/transfer/test_example.py runs it).

    python3 examples/transfer_two_process.py [nixl | mooncake]
"""

import multiprocessing as mp
import sys

import torch

from kvformats.formats import Fp8DsMla, Mxfp4Indexer
from kvformats.transfer import expected_checksums, plan_transfer, verify
from kvformats.transfer.endpoint import Endpoint
from kvformats.transfer.engines import make_engine

KV = Fp8DsMla(head_dim=512, rope_dim=64, page_size=64)  # one layer's SWA cache
INDEX = Mxfp4Indexer(head_dim=128, page_size=64)  # and its indexer cache
TOKENS = 150  # one request: 3 pages of each cache


def make_caches(num_pages: int) -> dict:
    return {"L0.swa": (KV, KV.allocate(num_pages)), "L0.index": (INDEX, INDEX.allocate(num_pages))}


def make_endpoint(engine: str, caches: dict) -> Endpoint:
    if engine == "nixl":  # its progress thread (on by default) serves the peer's writes while we wait
        return Endpoint(make_engine("nixl", loopback=True), caches)
    return Endpoint(make_engine("mooncake", host="127.0.0.1"), caches)


def prefill(conn, engine: str) -> None:
    caches = make_caches(num_pages=8)
    my_pages = {"L0.swa": [5, 2, 7], "L0.index": [5, 2, 7]}  # the request's pages here, in request order
    slots = (torch.tensor(my_pages["L0.swa"])[:, None] * 64 + torch.arange(64)).flatten()[:TOKENS]
    g = torch.Generator().manual_seed(0)
    KV.encode(torch.randn(TOKENS, 512, generator=g).bfloat16(), caches["L0.swa"][1], slots)  # "the prefill"
    INDEX.encode(torch.randn(TOKENS, 128, generator=g).bfloat16(), caches["L0.index"][1], slots)

    here = make_endpoint(engine, caches)
    conn.send(here.hello())  # descriptions, arena addresses, engine metadata
    peer = here.connect(conn.recv())  # handshake first: HandshakeError on any difference
    their_pages = conn.recv()
    plan = plan_transfer(here.descs, peer.descs, my_pages, their_pages)
    sums = expected_checksums(plan, caches)  # right after the pages were written; no host read on a GPU
    here.push(peer, plan, timeout=30)  # TransferError on failure or timeout
    conn.send(("done", my_pages, {name: s.tolist() for name, s in sums.items()}))
    conn.recv()  # "bye": the decode side has verified
    here.close()


def decode(conn, engine: str) -> None:
    caches = make_caches(num_pages=6)
    my_pages = {"L0.swa": [0, 4, 1], "L0.index": [0, 4, 1]}  # the same request's pages here
    here = make_endpoint(engine, caches)
    conn.send(here.hello())
    peer = here.connect(conn.recv())
    conn.send(my_pages)
    kind, their_pages, sums = conn.recv()  # a plain blocking wait while the prefill side pushes
    plan = plan_transfer(peer.descs, here.descs, their_pages, my_pages)
    verify(plan, caches, {name: torch.tensor(s) for name, s in sums.items()})  # IntegrityError names the page
    print(f"decode: {plan.nbytes} bytes of {len(plan.caches)} caches verified; pages {my_pages['L0.swa']} valid")
    conn.send("bye")
    here.close()


if __name__ == "__main__":
    engine = sys.argv[1] if len(sys.argv) > 1 else "nixl"
    ctx = mp.get_context("spawn")  # engines start threads: fresh processes, not forks
    a, b = ctx.Pipe()  # the control channel (a serving engine has its own)
    sides = [ctx.Process(target=prefill, args=(a, engine)), ctx.Process(target=decode, args=(b, engine))]
    for p in sides:
        p.start()
    for p in sides:
        p.join(120)
        if p.is_alive():  # the other side failed: do not wait for it forever
            p.kill()
    codes = [p.exitcode for p in sides]
    print(f"exit codes {codes}")
    sys.exit(0 if codes == [0, 0] else 1)

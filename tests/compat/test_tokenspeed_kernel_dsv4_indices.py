"""The index half of kvformats.compat.tokenspeed_kernel.dsv4 against tokenspeed-kernel 0.1.4's released
``tokenspeed_kernel/ops/attention/dsv4/triton.py`` (the wheel fetched at test time,
tests/harness/released.py; skipped only when the package index cannot be reached):

* signatures: parameter names, kinds and defaults of the eleven helpers equal the released ones
  (read with ``ast``);
* results: every case runs the released function in one TRITON_INTERPRET=1 child process with the
  GPU's conversions (tests/harness/released_dsv4.py) on CPU tensors, which takes its torch path
  where it has one and its Triton kernel elsewhere, and, for the functions that branch on
  ``is_cuda`` or refuse CPU tensors, again on CPU tensors that say they are CUDA tensors
  (``CudaPath``): the released GPU branch, its Triton kernel interpreted. The drop-in's returned
  tensors (values, dtypes, shapes, strides, views of ``out``) and in-place writes (whole buffers,
  sentinel-filled beyond what is written) equal the released ones, except exactly where the
  module docstring says kvformats departs;
* bad input: the typed error, with the outputs untouched, where the released code refuses too and
  where only the drop-in does.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvformats.compat.tokenspeed_kernel import dsv4 as ts
from kvformats.errors import InputError, InputTypeError
from tests.harness import released as rel
from tests.harness import released_dsv4 as rd

NAMES = (
    "dsv4_build_dense_prefill_local_compressed_indices", "dsv4_combine_dense_swa_indices",
    "dsv4_combine_topk_swa_indices", "dsv4_compact_compressed_slot_mapping", "dsv4_compressed_slot_mapping",
    "dsv4_compute_global_topk_indices_and_lens", "dsv4_decode_dense_compressed_indices_and_lens",
    "dsv4_decode_swa_indices_and_lens", "dsv4_group_slot_mapping", "dsv4_indexer_decode_metadata_compute",
    "dsv4_validate_active_cache_pages",
)
SENTINEL = 77  # fills the outputs beyond what a call writes
I32, I64 = torch.int32, torch.int64

# ----- the released side: one child process, each call on CPU tensors or on CudaPath views ------
_CHILD = r'''
import sys
from pathlib import Path

import torch

from tests.harness import released as rel, released_dsv4 as rd


class CudaPath(torch.Tensor):
    """A CPU tensor that says it is a CUDA tensor: the released helpers take their GPU branch on it
    (launching their Triton kernel, which the interpreter runs on the CPU memory)."""

    @property
    def is_cuda(self):
        return True


def wrap(a):
    return a.as_subclass(CudaPath) if isinstance(a, torch.Tensor) else a


def plain(a):
    if isinstance(a, torch.Tensor):
        return a.as_subclass(torch.Tensor)
    if isinstance(a, (tuple, list)):
        return type(a)(plain(x) for x in a)
    if isinstance(a, dict):
        return {k: plain(v) for k, v in a.items()}
    return a


spec = torch.load(sys.argv[1], weights_only=False)
compiled = rel.released_device() == "cuda"  # a GPU: the GPU branch on CUDA tensors, its kernel compiled
module = rd.load_tokenspeed_dsv4(Path(spec["files"]), not compiled)
results = []
for name, kwargs, cuda in spec["calls"]:
    if cuda and not compiled:
        kwargs = {k: wrap(v) for k, v in kwargs.items()}
    device = "cuda" if cuda and compiled else "cpu"  # the torch path runs on CPU tensors either way
    results.append(plain(rd.call_tokenspeed_dsv4(module, name, (), kwargs, device)))
torch.save(results, sys.argv[2])
'''


def run_released(calls: list[tuple[str, dict, bool]], files_dir: Path, workdir: Path) -> list[dict]:
    """``rd.run_tokenspeed_dsv4`` with one more choice per call: ``(name, kwargs, cuda)``, where
    ``cuda`` runs the released GPU branch (the kernel, interpreted) on ``CudaPath`` views of the
    arguments. Arguments aliased before the call are separate copies in it (none of these cases
    alias)."""
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save({"calls": calls, "files": str(files_dir)}, workdir / "calls.pt")
    root = Path(__file__).resolve().parents[2]
    env = rel.child_env()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(workdir / "calls.pt"), str(workdir / "results.pt")],
                         cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the released dsv4 helpers failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return torch.load(workdir / "results.pt", weights_only=False, map_location="cpu")


# ----- case builders (seeded, small: the interpreter runs every program) -------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ints(g, low: int, high: int, shape, dtype=I64) -> torch.Tensor:
    return torch.randint(low, high, shape if isinstance(shape, tuple) else (shape,), generator=g).to(dtype)


def _table(g, rows: int, cols: int, dtype=I32, missing: float = 0.25) -> torch.Tensor:
    """Distinct pages >= 1, a share of them missing (-1)."""
    pages = (torch.randperm(rows * cols + 8, generator=g)[:rows * cols] + 1).view(rows, cols)
    pages[torch.rand(rows, cols, generator=g) < missing] = -1
    return pages.to(dtype)


def _batch(g, requests: int, *, start: int = 0, max_query: int = 4, max_prefix: int = 24, empty: bool = True):
    """(query_start_loc, seq_lens, token_to_req_indices [T], positions [T]) of ``requests``
    requests (an empty query among them when ``empty``), offsets from ``start``."""
    qlens = _ints(g, 0 if empty else 1, max_query + 1, requests)
    if empty and requests > 1:
        qlens[1] = 0
    seq = qlens + _ints(g, 0, max_prefix, requests)
    qsl = torch.cat([torch.zeros(1, dtype=I64), qlens.cumsum(0)]) + start
    req = torch.repeat_interleave(torch.arange(requests), qlens)
    pos = torch.cat([torch.arange(int(s) - int(q), int(s)) for s, q in zip(seq, qlens)]) if requests else \
        torch.zeros(0, dtype=I64)
    return qsl, seq, req, pos


def _gather_lens(g, qsl, seq, window: int, short: bool = False) -> torch.Tensor:
    """Gather lengths covering every window (``short``: some that do not)."""
    need = (qsl[1:] - qsl[:-1]) + window - 1
    lens = torch.minimum(seq, need + _ints(g, 0, 3, seq.shape[0]))
    if short:
        lens = torch.minimum(lens, torch.full_like(lens, 2))
    return lens


def _full(shape, dtype=I32, value=SENTINEL) -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype)


def _cases() -> list[tuple[str, str, dict, bool]]:
    """(key, released name, kwargs, cuda) for the comparisons; ``key`` names the case."""
    out = []

    def add(key, name, cuda=False, **kw):
        out.append((key, name, kw, cuda))

    # dense prefill local indices: the torch path (CPU) and the kernel
    for s in range(4):
        g = _gen(100 + s)
        pos = _ints(g, -1, 40, 9)
        req = _ints(g, 0, 3, 9)
        base = _ints(g, 0, 3, 3)
        variants = {
            "plain": {},
            "capacity": dict(compressed_table_capacity=5),
            "base": dict(token_to_req_indices=req, block_table_base_offsets=base, compressed_block_size=2),
            "base+capacity": dict(token_to_req_indices=req.to(I32), block_table_base_offsets=base.to(I32),
                                  compressed_block_size=3, compressed_table_capacity=4),
        }
        kw = variants[list(variants)[s]]
        for cuda in (False, True):
            add(("dense_prefill", s, cuda), "dsv4_build_dense_prefill_local_compressed_indices", cuda,
                positions=pos if s % 2 else pos.to(I32), compress_ratio=4, width=12,
                out=_full((11, 14), I32 if s != 2 else I64), **kw)
    add(("dense_prefill", "empty"), "dsv4_build_dense_prefill_local_compressed_indices",
        positions=torch.zeros(0, dtype=I64), compress_ratio=4, width=6, out=_full((3, 8)))

    # global top-k: holes, trailing padding, entries beyond the table, invalid and padded tokens
    for s in range(4):
        g = _gen(200 + s)
        t, k, rows, cols, bs = 7, 6, 3, 4, 4
        topk = _ints(g, -1, cols * bs + 6, (t, k), I32)
        topk[:, 4:][torch.rand(t, 2, generator=g) < 0.6] = -1
        topk[1] = -1
        req = _ints(g, -1, rows + 1, t + 2, I32 if s % 2 else I64)
        kw = dict(topk_indices=topk, token_to_req_indices=req, block_table=_table(g, rows, cols, I32 if s < 2 else I64),
                  block_size=bs)
        if s >= 1:
            kw["is_valid_token"] = torch.rand(t + 1, generator=g) < 0.8
        if s >= 2:
            kw["block_table_base_offsets"] = _ints(g, 0, 3, rows, I32)
            kw["out_valid_lens"] = _full((t,))
        for cuda in (False, True):
            add(("global_topk", s, cuda), "dsv4_compute_global_topk_indices_and_lens", cuda, **kw)
    g = _gen(210)
    for label, topk, table in (("no columns", torch.zeros(3, 0, dtype=I32), _table(g, 2, 3)),
                               ("no rows", _ints(g, -1, 8, (3, 4), I32), torch.zeros(0, 3, dtype=I32)),
                               ("no table columns", _ints(g, -1, 8, (3, 4), I32), torch.zeros(2, 0, dtype=I32))):
        add(("global_topk", label), "dsv4_compute_global_topk_indices_and_lens", topk_indices=topk,
            token_to_req_indices=torch.tensor([0, 1, -1]), block_table=table, block_size=4,
            out_valid_lens=_full((3,)))

    # dense decode indices
    for s in range(4):
        g = _gen(300 + s)
        t, rows, cols, bs, width = 8, 3, 4, 4, 10
        kw = dict(positions=_ints(g, -1, 60, t), token_to_req_indices=_ints(g, -1, rows + 1, t + 1, I32),
                  block_table=_table(g, rows, cols), block_size=bs, compress_ratio=4, width=width,
                  block_table_base_offsets=_ints(g, 0, 2, rows) if s >= 2 else None,
                  is_valid_token=(torch.rand(t, generator=g) < 0.75) if s % 2 else None,
                  out_indices=_full((t, width)) if s >= 1 else None, out_lens=_full((t,)) if s >= 1 else None)
        for cuda in (False, True):
            add(("dense_decode", s, cuda), "dsv4_decode_dense_compressed_indices_and_lens", cuda, **kw)
    g = _gen(310)  # torch path: offsets shorter than the table (later requests read no page)
    add(("dense_decode", "short base"), "dsv4_decode_dense_compressed_indices_and_lens",
        positions=_ints(g, 0, 60, 6), token_to_req_indices=torch.tensor([0, 1, 2, 2, 1, 0]),
        block_table=_table(g, 3, 4, missing=0.0), block_size=4, compress_ratio=4, width=10,
        block_table_base_offsets=torch.tensor([1, 0]),
        is_valid_token=torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.uint8),
        out_indices=None, out_lens=None)

    # compact compressed slot mapping: padded tokens, per-group validity, base offsets
    for s in range(4):
        g = _gen(400 + s)
        qsl, seq, req, _ = _batch(g, 3)
        n = req.shape[0] + 2
        req = torch.cat([req, torch.tensor([-1, 5])])
        kw = dict(num_tokens=n, token_to_req_indices=torch.cat([req, torch.tensor([0])]).to(I32),
                  query_start_loc=qsl.to(I32), seq_lens=seq, block_table=_table(g, 3, 4), block_size=2,
                  compress_ratio=4 if s < 2 else 2,
                  block_table_base_offsets=_ints(g, 0, 2, 4) if s >= 2 else None,
                  is_valid_token=None if s == 0 else (torch.rand(n, generator=g) < 0.8 if s != 3 else
                                                     torch.ones(1, dtype=torch.bool)),
                  out=_full((n + 3,), I64) if s % 2 else None)
        for cuda in (False, True):
            add(("compact", s, cuda), "dsv4_compact_compressed_slot_mapping", cuda, **kw)
    add(("compact", "no tokens"), "dsv4_compact_compressed_slot_mapping", num_tokens=0,
        token_to_req_indices=torch.zeros(2, dtype=I64), query_start_loc=torch.tensor([0, 2]),
        seq_lens=torch.tensor([5]), block_table=torch.ones(1, 2, dtype=I32), block_size=2, compress_ratio=4,
        block_table_base_offsets=None,
        is_valid_token=None, out=_full((3,), I64))

    # group slot mapping (the released one runs on CUDA tensors only)
    for s in range(4):
        g = _gen(500 + s)
        n = 12
        kw = dict(positions=_ints(g, -2, 40, n), req_indices=_ints(g, -1, 4, n if s % 2 == 0 else 4, I32),
                  block_table=_table(g, 3, 5, I32 if s < 2 else I64), rows_per_block=4,
                  entry_stride_tokens=1 if s < 2 else 4, base_offsets=_ints(g, 0, 2, 3) if s >= 2 else None,
                  is_valid_token=None if s == 0 else torch.rand(n if s != 3 else 3, generator=g) < 0.8)
        add(("group", s, True), "dsv4_group_slot_mapping", True, **kw)
        if s == 0:
            add(("group", s, False), "dsv4_group_slot_mapping", False, **kw)
    add(("group", "no rows", True), "dsv4_group_slot_mapping", True, positions=torch.tensor([1, 2]),
        req_indices=torch.tensor([0, 0]), block_table=torch.zeros(0, 4, dtype=I32), rows_per_block=4,
        entry_stride_tokens=1, base_offsets=None, is_valid_token=None)

    # validate active cache pages (CUDA tensors only there)
    table = torch.tensor([[3, 4, 0], [5, -1, 6], [0, 2, 9]], dtype=I32)
    for key, seq, bs in (("ok", [8, 3, 0], 3), ("page 0", [9, 3, 1], 3), ("missing", [8, 6, 4], 2),
                         ("negative", [2, -1, 4], 2), ("beyond table", [13, 3, 4], 2), ("beyond pages", [3, 17], 2),
                         ("rows ignored", [1, -5, -5], 1), ("no live rows", [-1, -1, -1], 0)):
        for cuda in (True,) + ((False,) if key == "ok" else ()):
            add(("validate", key, cuda), "dsv4_validate_active_cache_pages", cuda, seq_lens=torch.tensor(seq),
                block_table=table[:len(seq)], actual_bs=bs, raw_tokens_per_page=4, max_page_id=8,
                out=torch.tensor([False, True, False])[1:2])

    # the kernel-only helpers, run as they are on CPU tensors
    for s in range(3):  # compressed slot mapping: missing pages among the group ends
        g = _gen(620 + s)
        qsl, seq, _, _ = _batch(g, 3, max_query=12, max_prefix=8)
        n = int(qsl[-1]) + (2 if s else 0)
        add(("compressed", s), "dsv4_compressed_slot_mapping", num_tokens=n, query_start_loc=qsl,
            seq_lens=seq.to(I32), block_table=_table(g, 3, 3, I32 if s else I64, missing=0.3), block_size=2,
            compress_ratio=4, out=_full((n + 2,), I64) if s != 1 else None)

    for s in range(4):  # decode SWA rows (invalid tokens: departure, compared apart)
        g = _gen(700 + s)
        qsl, seq, req, _ = _batch(g, 3, max_query=3)
        t = req.shape[0] + 2
        req = torch.cat([req, torch.zeros(2, dtype=I64)])
        valid = torch.ones(t, dtype=torch.bool)
        valid[-2:] = False
        kw = dict(query_start_loc=qsl, seq_lens=seq, token_to_req_indices=req.to(I32), block_table=_table(g, 3, 8),
                  window_size=8, block_size=4, block_table_base_offsets=_ints(g, 0, 2, 3) if s >= 2 else None,
                  is_valid_token=valid if s % 2 else None, out_indices=_full((t, 8)) if s >= 1 else None,
                  out_lens=_full((t,)) if s >= 1 else None)
        if not s % 2:
            kw["token_to_req_indices"] = req[:-2].to(I32)
            for name in ("out_indices", "out_lens"):
                if kw[name] is not None:
                    kw[name] = kw[name][:-2]
        add(("decode_swa", s), "dsv4_decode_swa_indices_and_lens", **kw)

    for s in range(3):  # dense combine
        g = _gen(800 + s)
        qsl, seq, req, pos = _batch(g, 3)
        ratio = (1, 4, 4)[s]
        base, window = 6, 8
        add(("dense_combine", s), "dsv4_combine_dense_swa_indices", positions=pos.to(I32) if s else pos,
            token_to_req_indices=req, seq_lens=seq, compressed_lens=_ints(g, 0, base + 1, 3),
            gather_lens=_gather_lens(g, qsl, seq, window), window_size=window, compress_ratio=ratio,
            workspace_width=base + 40, compressed_base=base)
    g = _gen(810)
    qsl, seq, req, pos = _batch(g, 2, empty=False)
    add(("dense_combine", "short gather"), "dsv4_combine_dense_swa_indices", positions=pos, token_to_req_indices=req,
        seq_lens=seq, compressed_lens=torch.tensor([2, 3]), gather_lens=_gather_lens(g, qsl, seq, 8, short=True),
        window_size=8, compress_ratio=4, workspace_width=60, compressed_base=6)

    for s in range(4):  # top-k combine: holes compacted, offsets from qsl[0], base offsets / capacity
        g = _gen(900 + s)
        qsl, seq, req, pos = _batch(g, 2 if s < 3 else 3, start=3 * s, max_prefix=40, empty=s > 0)
        t, k = req.shape[0] + (1 if s == 1 else 0), 6
        topk = _ints(g, -1, 12, (t, k), I32 if s != 2 else I64)
        topk[torch.rand(t, k, generator=g) < 0.3] = -1
        kw = dict(topk_indices=topk, query_start_loc=qsl, seq_lens=seq.to(I32),
                  gather_lens=_gather_lens(g, qsl, seq, 8, short=s == 3), window_size=8, compress_ratio=4,
                  topk=k - (s % 2), workspace_width=64, compressed_base=10)
        if s >= 2:
            kw.update(block_table_base_offsets=_ints(g, 0, 2, seq.shape[0]), compressed_block_size=2,
                      compressed_table_capacity=(None, 7)[s - 2])
        add(("topk_combine", s), "dsv4_combine_topk_swa_indices", **kw)
    add(("topk_combine", "no tokens"), "dsv4_combine_topk_swa_indices", topk_indices=torch.zeros(0, 4, dtype=I32),
        query_start_loc=torch.tensor([2, 2]), seq_lens=torch.tensor([5]), gather_lens=torch.tensor([5]), window_size=8,
        compress_ratio=4, topk=4, workspace_width=32, compressed_base=8)

    # a request beyond the base offsets: the released torch path raises IndexError (departure)
    add(("dense_prefill_oob",), "dsv4_build_dense_prefill_local_compressed_indices",
        positions=torch.tensor([7, 30, 19]), compress_ratio=4, width=8, out=_full((3, 8)),
        token_to_req_indices=torch.tensor([0, 2, 1]), block_table_base_offsets=torch.tensor([1, 0]),
        compressed_block_size=2)

    for s in range(4):  # indexer decode metadata
        g = _gen(1000 + s)
        t, rows, cols = 6, 3, 5
        max_blocks = (3, 5, 7, 5)[s]
        add(("indexer_meta", s), "dsv4_indexer_decode_metadata_compute", positions=_ints(g, -1, 120, t),
            token_to_req_indices=_ints(g, -1, rows + 1, t, I32), block_table=_table(g, rows, cols, I32 if s else I64),
            cache_block_size=4, compress_ratio=4, max_blocks=max_blocks,
            out_context_lens=_full((t, 1)), out_block_tables=_full((t + 1, max_blocks + 2)),
            block_table_base_offsets=_ints(g, 0, 2, rows) if s >= 2 else None)
    return out


# ----- bad input ----------------------------------------------------------------------------------
def _bad_calls():
    """(label, name, kwargs, cuda, error the drop-in raises, whether the released code refuses)."""
    topk = torch.tensor([[0, 5, -1]], dtype=I32)
    table = torch.tensor([[1, 2]], dtype=I32)
    req = torch.tensor([0])
    pos = torch.tensor([3, 9])
    return [
        ("topk int64", "dsv4_compute_global_topk_indices_and_lens",
         dict(topk_indices=topk.long(), token_to_req_indices=req, block_table=table, block_size=4,
              out_valid_lens=_full((1,))), False, InputTypeError, True),
        ("topk 1-D", "dsv4_compute_global_topk_indices_and_lens",
         dict(topk_indices=topk[0], token_to_req_indices=req, block_table=table, block_size=4), False, InputError,
         True),
        ("topk strided", "dsv4_compute_global_topk_indices_and_lens",
         dict(topk_indices=torch.zeros(3, 2, dtype=I32).t(), token_to_req_indices=torch.tensor([0, 0]),
              block_table=table, block_size=4), False, InputError, True),
        ("valid lens shape", "dsv4_compute_global_topk_indices_and_lens",
         dict(topk_indices=topk, token_to_req_indices=req, block_table=table, block_size=4,
              out_valid_lens=_full((2,))), False, InputError, True),
        ("valid lens int64", "dsv4_compute_global_topk_indices_and_lens",
         dict(topk_indices=topk, token_to_req_indices=req, block_table=table, block_size=4,
              out_valid_lens=_full((1,), I64)), False, InputError, True),
        ("dense decode block_size 0", "dsv4_decode_dense_compressed_indices_and_lens",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, block_size=0, compress_ratio=4,
              width=4, block_table_base_offsets=None, is_valid_token=None, out_indices=_full((2, 4)),
              out_lens=_full((2,))), False, InputError, True),
        ("dense decode width < 0", "dsv4_decode_dense_compressed_indices_and_lens",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, block_size=4, compress_ratio=4,
              width=-1, block_table_base_offsets=None, is_valid_token=None, out_indices=None, out_lens=None),
         False, InputError, True),
        ("dense decode short requests", "dsv4_decode_dense_compressed_indices_and_lens",
         dict(positions=pos, token_to_req_indices=req, block_table=table, block_size=4, compress_ratio=4, width=4,
              block_table_base_offsets=None, is_valid_token=None, out_indices=None, out_lens=_full((2,))),
         False, InputError, True),
        ("dense decode out shape", "dsv4_decode_dense_compressed_indices_and_lens",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, block_size=4, compress_ratio=4,
              width=4, block_table_base_offsets=None, is_valid_token=None, out_indices=_full((3, 4)),
              out_lens=_full((2,))), False, InputError, True),
        ("dense decode out int64", "dsv4_decode_dense_compressed_indices_and_lens",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, block_size=4, compress_ratio=4,
              width=4, block_table_base_offsets=None, is_valid_token=None, out_indices=_full((2, 4)),
              out_lens=_full((2,), I64)), False, InputError, True),
        ("compact tokens < 0", "dsv4_compact_compressed_slot_mapping",
         dict(num_tokens=-1, token_to_req_indices=req, query_start_loc=torch.tensor([0, 1]), seq_lens=req + 4,
              block_table=table, block_size=2, compress_ratio=4, block_table_base_offsets=None, is_valid_token=None,
              out=_full((2,), I64)), False, InputError, True),
        ("compact validity", "dsv4_compact_compressed_slot_mapping",
         dict(num_tokens=3, token_to_req_indices=torch.zeros(3, dtype=I64), query_start_loc=torch.tensor([0, 3]),
              seq_lens=torch.tensor([7]), block_table=table, block_size=2, compress_ratio=4,
              block_table_base_offsets=None, is_valid_token=torch.ones(2, dtype=torch.bool),
              out=_full((4,), I64)), False, InputError, True),
        ("compact out int32", "dsv4_compact_compressed_slot_mapping",
         dict(num_tokens=1, token_to_req_indices=req, query_start_loc=torch.tensor([0, 1]), seq_lens=req + 4,
              block_table=table, block_size=2, compress_ratio=4, block_table_base_offsets=None, is_valid_token=None,
              out=_full((2,))), False, InputError, True),
        ("compact out strided", "dsv4_compact_compressed_slot_mapping",
         dict(num_tokens=1, token_to_req_indices=req, query_start_loc=torch.tensor([0, 1]), seq_lens=req + 4,
              block_table=table, block_size=2, compress_ratio=4, block_table_base_offsets=None, is_valid_token=None,
              out=_full((4,), I64)[::2]), False, InputError, None),  # the harness's copy is contiguous
        ("group stride 0", "dsv4_group_slot_mapping",
         dict(positions=pos, req_indices=req.repeat(2), block_table=table, rows_per_block=4, entry_stride_tokens=0,
              base_offsets=None, is_valid_token=None), True, InputError, True),
        ("group requests", "dsv4_group_slot_mapping",
         dict(positions=torch.tensor([1, 2, 3]), req_indices=torch.tensor([0, 0]), block_table=table,
              rows_per_block=4, entry_stride_tokens=1, base_offsets=None, is_valid_token=None), True, InputError, True),
        ("group 2-D table", "dsv4_group_slot_mapping",
         dict(positions=pos, req_indices=req, block_table=table[0], rows_per_block=4, entry_stride_tokens=1,
              base_offsets=None, is_valid_token=None), True, InputError, True),
        ("validate actual_bs", "dsv4_validate_active_cache_pages",
         dict(seq_lens=torch.tensor([3]), block_table=table, actual_bs=2, raw_tokens_per_page=4, max_page_id=8,
              out=torch.tensor([True])), True, InputError, True),
        ("validate no columns", "dsv4_validate_active_cache_pages",
         dict(seq_lens=torch.tensor([3]), block_table=table[:, :0], actual_bs=1, raw_tokens_per_page=4,
              max_page_id=8, out=torch.tensor([True])), True, InputError, True),
        ("validate max_page_id 0", "dsv4_validate_active_cache_pages",
         dict(seq_lens=torch.tensor([3]), block_table=table, actual_bs=1, raw_tokens_per_page=4, max_page_id=0,
              out=torch.tensor([True])), True, InputError, True),
        ("validate out shape", "dsv4_validate_active_cache_pages",
         dict(seq_lens=torch.tensor([3]), block_table=table, actual_bs=1, raw_tokens_per_page=4, max_page_id=8,
              out=torch.tensor([True, True])), True, InputError, True),
        ("validate out int", "dsv4_validate_active_cache_pages",
         dict(seq_lens=torch.tensor([3]), block_table=table, actual_bs=1, raw_tokens_per_page=4, max_page_id=8,
              out=torch.tensor([1])), True, InputTypeError, True),
        ("indexer meta out int64", "dsv4_indexer_decode_metadata_compute",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, cache_block_size=4,
              compress_ratio=4, max_blocks=2, out_context_lens=_full((2,), I64), out_block_tables=_full((2, 2))),
         False, InputTypeError, True),
        ("topk combine block size 0", "dsv4_combine_topk_swa_indices",
         dict(topk_indices=topk, query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([4]),
              gather_lens=torch.tensor([4]), window_size=4, compress_ratio=4, topk=3, workspace_width=16,
              compressed_base=4, compressed_block_size=0), False, InputError, True),
        ("dense prefill strided out", "dsv4_build_dense_prefill_local_compressed_indices",
         dict(positions=pos, compress_ratio=4, width=3, out=_full((4, 2)).t()), False, InputError, True),
        ("dense prefill base without requests", "dsv4_build_dense_prefill_local_compressed_indices",
         dict(positions=pos, compress_ratio=4, width=3, out=_full((2, 3)), block_table_base_offsets=req),
         False, InputError, True),
        # tokenspeed runs these; the drop-in refuses them (documented)
        ("topk combine topk > columns", "dsv4_combine_topk_swa_indices",
         dict(topk_indices=topk, query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([4]),
              gather_lens=torch.tensor([4]), window_size=4, compress_ratio=4, topk=4, workspace_width=16,
              compressed_base=4), False, InputError, False),
        ("dense prefill block size 0", "dsv4_build_dense_prefill_local_compressed_indices",
         dict(positions=pos, compress_ratio=4, width=3, out=_full((2, 3)), token_to_req_indices=req.repeat(2),
              block_table_base_offsets=req, compressed_block_size=0), False, InputError, False),
        ("indexer meta ratio 0", "dsv4_indexer_decode_metadata_compute",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, cache_block_size=4,
              compress_ratio=0, max_blocks=2, out_context_lens=_full((2,)), out_block_tables=_full((2, 2))),
         False, InputError, None),  # the interpreter divides by zero: numpy warns, no refusal
        ("indexer meta narrow tables", "dsv4_indexer_decode_metadata_compute",
         dict(positions=pos, token_to_req_indices=req.repeat(2), block_table=table, cache_block_size=4,
              compress_ratio=4, max_blocks=3, out_context_lens=_full((2,)), out_block_tables=_full((2, 2))),
         False, InputError, False),
        ("group base shorter than the table", "dsv4_group_slot_mapping",
         dict(positions=pos, req_indices=torch.tensor([0, 1]), block_table=torch.ones(2, 2, dtype=I32),
              rows_per_block=4, entry_stride_tokens=1, base_offsets=torch.tensor([0]), is_valid_token=None),
         True, InputError, False),
    ]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(key -> (name, kwargs, the released call's record), the wheel's files)."""
    root = tmp_path_factory.mktemp("tokenspeed-kernel-dsv4")
    try:
        rel.extract(rd.TOKENSPEED_KERNEL_DSV4, root)
    except rel.IndexUnreachable as err:  # the only reason to skip
        pytest.skip(f"tokenspeed-kernel 0.1.4 not fetched: {err}")
    plan = _cases() + [(("bad", label), name, kw, cuda) for label, name, kw, cuda, _, _ in _bad_calls()]
    results = run_released([(name, kw, cuda) for _, name, kw, cuda in plan], root,
                           tmp_path_factory.mktemp("dsv4-indices-run"))
    return {key: (name, kw, res) for (key, name, kw, _), res in zip(plan, results)}, root


# ----- signatures -------------------------------------------------------------------------------
_KINDS = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
          "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def _released_signatures(root: Path) -> dict[str, list[tuple]]:
    """Per helper, (name, kind, default) of each parameter, read with ast from the released triton.py."""
    tree = ast.parse((root / rd.DSV4_TRITON).read_text())
    sigs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in NAMES:
            a = node.args
            assert a.vararg is None and a.kwarg is None
            positional = a.posonlyargs + a.args
            defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
                ast.literal_eval(d) for d in a.defaults]
            params = [(p.arg, _KINDS["posonlyargs" if p in a.posonlyargs else "args"], d)
                      for p, d in zip(positional, defaults)]
            params += [(p.arg, _KINDS["kwonlyargs"], inspect.Parameter.empty if d is None else ast.literal_eval(d))
                       for p, d in zip(a.kwonlyargs, a.kw_defaults)]
            sigs[node.name] = params
    return sigs


def test_signatures_and_names_are_the_released_ones(released):
    _, root = released
    sigs = _released_signatures(root)
    assert set(sigs) == set(NAMES)
    assert set(NAMES) <= set(ts.__all__)
    for name in NAMES:
        got = [(p.name, p.kind, p.default) for p in inspect.signature(getattr(ts, name)).parameters.values()]
        assert got == sigs[name], name


# ----- results ----------------------------------------------------------------------------------
def _copy(a):
    """A copy of an argument with its strides and storage offset (views of ``out`` stay views)."""
    if not isinstance(a, torch.Tensor):
        return a
    base = a if a._base is None else a._base
    copy = base.clone()
    return copy.as_strided(a.shape, a.stride(), a.storage_offset())


def _drop_in(name: str, kwargs: dict):
    """The drop-in's call on copies: (result, arguments after it)."""
    kw = {k: _copy(v) for k, v in kwargs.items()}
    return getattr(ts, name)(**kw), kw


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for e in x for t in _tensors(e)]
    return [] if x is None else [x]


def _view(t: torch.Tensor, kwargs: dict):
    """Which argument ``t`` is a view of, with its offset and strides (None: a fresh tensor)."""
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and t.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
            return k, t.storage_offset() - v.storage_offset(), t.stride()
    return None


def _compare(key, name, kwargs, rec, masks=None) -> None:
    """The drop-in's results and in-place writes equal the released ones; ``masks`` maps a result
    index or argument name to a bool tensor of entries left out (the documented departures)."""
    masks = masks or {}
    assert "error" not in rec, (key, rec.get("error"))
    got, kw = _drop_in(name, kwargs)
    want = rec["result"]
    mine, theirs = _tensors(got), _tensors(want)
    assert len(mine) == len(theirs), key
    for i, (a, b) in enumerate(zip(mine, theirs)):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (key, i)
        assert _view(a, kw) == _view(b, rec["kwargs"]), (key, i)
        if _view(a, kw) is None:
            assert a.is_contiguous() and b.is_contiguous(), (key, i)
        keep = ~masks[i] if i in masks else torch.ones_like(a, dtype=torch.bool)
        assert torch.equal(a[keep], b[keep]), (key, i, a, b)
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            b = rec["kwargs"][k]
            keep = ~masks[k] if k in masks else torch.ones_like(v, dtype=torch.bool)
            assert torch.equal(v[keep], b[keep]), (key, k, v, b)


def _runs(runs, prefix):
    return [(key, *value) for key, value in runs.items() if key[0] == prefix]


@pytest.mark.parametrize("prefix", ["dense_prefill", "global_topk", "dense_decode", "compact", "group", "validate",
                                    "indexer_meta"])
def test_same_results_as_the_released_helpers(released, prefix):
    """Every case of these helpers, on the released torch path and its GPU branch (the kernel),
    bit for bit: returned tensors, views of ``out`` and the whole sentinel-filled outputs."""
    runs, _ = released
    cases = _runs(runs, prefix)
    assert cases
    for key, name, kwargs, rec in cases:
        if prefix in ("group", "validate") and not key[-1]:
            assert rec["error"][0] == "ValueError" and "CUDA" in rec["error"][1], key  # the documented departure
            continue
        _compare(key, name, kwargs, rec)


def test_compressed_slot_mapping_departs_only_at_missing_pages(released):
    """tokenspeed's kernel reads a missing page (-1) as page -1 (slot -block_size + offset); the
    drop-in gives -1 there, and the released slots everywhere else."""
    runs, _ = released
    departed = 0
    for key, name, kwargs, rec in _runs(runs, "compressed"):
        want = rec["result"]
        got, _ = _drop_in(name, kwargs)
        missing = got != want
        departed += int(missing.sum())
        assert bool((got[missing] == -1).all()) and bool((want[missing] < 0).all()), key
        # each departed slot is a group end whose page entry is missing
        assert bool((want[missing] >= -kwargs["block_size"]).all()), key
        mask = {0: missing}
        if kwargs["out"] is not None:
            mask["out"] = torch.cat([missing, torch.zeros(kwargs["out"].shape[0] - missing.shape[0], dtype=torch.bool)])
        _compare(key, name, kwargs, rec, mask)
    assert departed > 0


def test_decode_swa_rows_depart_only_for_invalid_tokens(released):
    """Invalid tokens: tokenspeed writes length 0 and leaves the row as it was (allocated: undefined);
    the drop-in writes an all -1 row. Every other row and length is the released one."""
    runs, _ = released
    for key, name, kwargs, rec in _runs(runs, "decode_swa"):
        valid = kwargs["is_valid_token"]
        n = kwargs["token_to_req_indices"].shape[0]
        invalid = torch.zeros(n, dtype=torch.bool) if valid is None else ~valid[:n]
        rows = invalid.unsqueeze(1).expand(n, kwargs["window_size"])
        masks = {0: rows}
        if kwargs["out_indices"] is not None:
            masks["out_indices"] = rows
            assert bool((rec["kwargs"]["out_indices"][invalid] == SENTINEL).all()), key
        _compare(key, name, kwargs, rec, masks)
        got, _ = _drop_in(name, kwargs)
        assert bool((got[0][invalid] == -1).all()) and bool((got[1][invalid] == 0).all()), key


@pytest.mark.parametrize("prefix", ["dense_combine", "topk_combine"])
def test_combines_depart_only_before_the_gathered_window(released, prefix):
    """Window positions before ``seq_len - gather_len``: tokenspeed points them below the window's
    workspace rows, the drop-in gives -1; every other entry and every length is the released one
    (rows outside every request: tokenspeed's lengths are unwritten, compared as 0 here)."""
    runs, _ = released
    departed = 0
    for key, name, kwargs, rec in _runs(runs, prefix):
        got, _ = _drop_in(name, kwargs)
        want_rows, want_lens = rec["result"]
        n = got[1].shape[0]
        inside = torch.ones(n, dtype=torch.bool)
        if prefix == "topk_combine":
            qsl = kwargs["query_start_loc"]
            tokens = qsl[0] + torch.arange(n)
            req = torch.searchsorted(qsl[1:], tokens, right=True).clamp(max=qsl.shape[0] - 2)
            inside = tokens < qsl[-1]
            assert bool((got[1][~inside] == 0).all()), key
        else:
            req = kwargs["token_to_req_indices"][:n].long()
        differ = got[0] != want_rows
        assert bool((got[0][differ] == -1).all()), key
        # each departed entry is a window entry whose released value lies below its request's window rows
        window_rows = (req * kwargs["workspace_width"] + kwargs["compressed_base"]).unsqueeze(1).expand_as(differ)
        assert bool((want_rows[differ] < window_rows[differ]).all()), key
        departed += int(differ.sum())
        _compare(key, name, kwargs, rec, {0: differ, 1: ~inside})
    assert departed > 0


def test_dense_prefill_request_beyond_the_offsets_reads_no_row(released):
    """tokenspeed's torch path raises IndexError (its kernel reads out of bounds); the drop-in gives
    that token an all -1 row and the others the rows they get without it."""
    runs, _ = released
    name, kwargs, rec = runs[("dense_prefill_oob",)]
    assert rec["error"][0] == "IndexError"
    got, _ = _drop_in(name, kwargs)
    assert bool((got[1] == -1).all())
    keep = torch.tensor([0, 2])
    alone, _ = _drop_in(name, dict(kwargs, positions=kwargs["positions"][keep], out=_full((2, 8)),
                                   token_to_req_indices=kwargs["token_to_req_indices"][keep]))
    assert torch.equal(got[keep], alone) and bool((alone >= 0).any())


def _topk_combine_call(qsl):
    return dict(topk_indices=torch.zeros(4, 2, dtype=I32), query_start_loc=qsl, seq_lens=torch.tensor([9, 9]),
                gather_lens=torch.tensor([9, 9]), window_size=4, compress_ratio=4, topk=2, workspace_width=16,
                compressed_base=4)


def test_topk_combine_checks_decreasing_offsets_as_kvformats_does(monkeypatch):
    """CPU: InputError before anything is returned; the GPU path (CPU tensors routed to it)
    records the violation instead (kvformats.pending_error) and returns rows."""
    from kvformats.runtime import deferred

    with pytest.raises(InputError, match="never decrease"):
        ts.dsv4_combine_topk_swa_indices(**_topk_combine_call(torch.tensor([0, 3, 2])))
    monkeypatch.setattr(deferred, "HOST_CHECKED", set())
    rows, lens = ts.dsv4_combine_topk_swa_indices(**_topk_combine_call(torch.tensor([0, 3, 2])))
    assert rows.shape == (4, 128) and lens.shape == (4,)
    err = deferred.pending_error("cpu")
    assert err is not None and "query_start_loc" in str(err)


# ----- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_input_raises_typed_errors_with_nothing_written(released, case):
    label, name, kwargs, _, error, released_refuses = case
    runs, _ = released
    rec = runs[("bad", label)][2]
    if released_refuses is not None:
        assert ("error" in rec) == released_refuses, rec.get("error")
    if released_refuses:
        assert rec["error"][0] in ("ValueError", "TypeError"), rec["error"]
    kw = {k: _copy(v) for k, v in kwargs.items()}
    with pytest.raises(error):
        getattr(ts, name)(**kw)
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, kw[k]), (label, k)

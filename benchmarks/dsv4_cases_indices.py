"""Benchmark cases of the seven DeepSeek V4 index helpers (kvformats.deepseek_v4.indices).

``cases(sizes)`` builds, for each size n, engine-like CUDA inputs: n <= DECODE_MAX rows are a
decode step (one token per request, n requests), larger n a prefill step (requests of 16,384
tokens). Block tables have 64-row pages (SWA: base offsets past the window, 5 % −1 holes;
compressed ratio 4: 64 rows per page), top-k rows are 512 or 2048 wide with −1 past each
token's compressed length and 5 % −1 holes, the SWA window is 128. ``run_triton`` and
``run_reference`` call the registered implementations directly on the same prepared arguments:
the public functions' validation (host work, the same for both backends; check_sorted reads
query_start_loc back) is not timed.

``min_bytes`` counts every index array the op needs read once (per-request arrays in full),
each distinct block-table entry it looks up read once (counted on the host when the case is
built), only the top-k entries the op must read, and every output written once.
"""

from __future__ import annotations

import torch

from benchmarks.dsv4_case import Case
from benchmarks.dsv4_case import registered_case as _case

DECODE_MAX = 4096
PREFILL_REQUEST = 16384
MAX_SEQ = 65536
WINDOW, PAGE = 128, 64
DEV = "cuda"
WORKSPACE_SWA = PREFILL_REQUEST + WINDOW  # SWA rows of a request's prefill workspace
I64, I32 = 8, 4


def _batch(n: int, g: torch.Generator) -> dict:
    """Requests, positions and tables of one engine step of n tokens (on the GPU)."""
    if n <= DECODE_MAX:
        qlen = torch.ones(n, dtype=torch.long)
    else:
        r = max(1, n // PREFILL_REQUEST)
        qlen = torch.full((r,), n // r, dtype=torch.long)
        qlen[-1] += n - int(qlen.sum())
    r = qlen.shape[0]
    seq = qlen + torch.randint(0, MAX_SEQ - int(qlen.max()) + 1, (r,), generator=g)
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), qlen.cumsum(0)])
    req = torch.repeat_interleave(torch.arange(r), qlen)
    pos = seq[req] - qlen[req] + torch.arange(n) - qsl[req]
    base = torch.div((seq - qlen - WINDOW + 1).clamp_min(0), PAGE, rounding_mode="floor")
    swa_cols = -(-(int(qlen.max()) + WINDOW) // PAGE) + 1
    comp_cols = -(-MAX_SEQ // 4 // PAGE)
    swa_table = torch.randperm(r * swa_cols, generator=g).reshape(r, swa_cols).int()
    swa_table[torch.rand(r, swa_cols, generator=g) < 0.05] = -1
    comp_table = torch.randperm(r * comp_cols, generator=g).reshape(r, comp_cols).int()
    x = dict(qsl=qsl, seq=seq, req=req, pos=pos, base=base, swa_table=swa_table, comp_table=comp_table,
             glen=torch.minimum(seq, torch.full_like(seq, int(qlen.max()) + WINDOW)),
             clens=torch.div(seq, 128, rounding_mode="floor"), valid=torch.ones(n, dtype=torch.bool))
    x = {k: v.to(DEV) for k, v in x.items()}
    x["decode"], x["requests"] = n <= DECODE_MAX, r
    return x


def _topk(x: dict, k: int, g: torch.Generator) -> torch.Tensor:
    """int32 [n, k] local compressed indices below each token's compressed length, −1 past it
    and in 5 % holes."""
    comp = torch.div(x["pos"] + 1, 4, rounding_mode="floor")
    t = (torch.rand(comp.shape[0], k, device=DEV, generator=g) * comp[:, None]).long()
    hole = torch.rand(comp.shape[0], k, device=DEV, generator=g) < 0.05
    t[(torch.arange(k, device=DEV)[None, :] >= comp[:, None]) | hole] = -1
    return t.int()


def _entries(table: torch.Tensor, req: torch.Tensor, cols: torch.Tensor) -> int:
    """Distinct block-table entries looked up at (req, cols) where cols is in range."""
    ok = (cols >= 0) & (cols < table.shape[1])
    req = req.expand_as(cols)
    seen = torch.zeros(table.shape, dtype=torch.bool, device=table.device)
    seen[req[ok], cols[ok]] = True
    return int(seen.sum()) * table.element_size()


def _label(x, n, what=""):
    kind = f"decode {n} rows" if x["decode"] else f"prefill {n} tokens / {x['requests']} requests"
    return f"{kind}{', ' + what if what else ''}"


def _slot_cases(x, n):
    req, pos, base = x["req"], x["pos"], x["base"]
    swa_cols = torch.div(pos, PAGE, rounding_mode="floor") - base[req]
    tokens = n * (2 * I64 + 1)
    yield _case("table_slot_mapping", _label(x, n, "SWA table"), n,
                tokens + _entries(x["swa_table"], req, swa_cols) + base.numel() * I64 + n * I64,
                "positions, req_indices (int64) and is_valid_token read, base offsets of the requests, "
                "each distinct table entry, int64 slots written",
                (pos, req, x["swa_table"], PAGE, 1, base, x["valid"]))
    ends = (pos + 1) % 4 == 0
    comp_cols = torch.div(torch.div(pos[ends], 4, rounding_mode="floor"), PAGE, rounding_mode="floor")
    r = x["requests"]
    out = torch.empty(n, dtype=torch.long, device=DEV)
    yield _case("compressed_slot_mapping", _label(x, n, "ratio 4"), n,
                (2 * r + 1) * I64 + _entries(x["comp_table"], req[ends], comp_cols) + n * I64,
                "query_start_loc and seq_lens (int64), each distinct table entry of a group-ending "
                "token, int64 out written",
                (n, x["qsl"], x["seq"], x["comp_table"], PAGE, 4, None, out))


def _topk_cases(x, n, g):
    req, r = x["req"], x["requests"]
    for k in (512, 2048):
        topk = _topk(x, k, g)
        cols = torch.div(topk.long(), PAGE, rounding_mode="floor")
        cols[topk < 0] = -1
        yield _case("global_topk_indices_and_lens", _label(x, n, f"top-k {k}"), n,
                    n * k * I32 * 2 + n * (I64 + 1 + I32) + _entries(x["comp_table"], req[:, None], cols),
                    "top-k rows read and int32 rows written in full, req_indices, is_valid_token, "
                    "each distinct table entry, int32 lens",
                    (topk, req, x["comp_table"], PAGE, x["valid"]))
        width = -(-(k + WINDOW) // 128) * 128
        topk_len = torch.div(x["pos"] + 1, 4, rounding_mode="floor").clamp(0, k)
        yield _case("combine_topk_swa_indices", _label(x, n, f"top-k {k}, window {WINDOW}"), n,
                    int(topk_len.sum()) * I32 + (3 * r + 1) * I64 + n * width * I32 + n * I32,
                    "the top-k entries inside each row's topk_len, query_start_loc / seq_lens / "
                    "gather_lens (int64), int32 rows (padding included) and lens written",
                    (topk, x["qsl"], x["seq"], x["glen"], WINDOW, 4, k, MAX_SEQ // 4 + WORKSPACE_SWA,
                     MAX_SEQ // 4))


def _row_cases(x, n):
    r = x["requests"]
    cb = MAX_SEQ // 128
    width = -(-(cb + WINDOW) // 128) * 128
    yield _case("combine_dense_swa_indices", _label(x, n, f"ratio 128, compressed_base {cb}"), n,
                n * 2 * I64 + 3 * r * I64 + n * (width + 1) * I32,
                "positions and req_indices (int64), seq_lens / compressed_lens / gather_lens, int32 rows "
                "(padding included) and lens written",
                (x["pos"], x["req"], x["seq"], x["clens"], x["glen"], WINDOW, 128, cb + WORKSPACE_SWA, cb))
    q = x["pos"][:, None] - torch.arange(WINDOW - 1, -1, -1, device=DEV)[None, :]
    cols = torch.div(q, PAGE, rounding_mode="floor") - x["base"][x["req"]][:, None]
    cols[q < 0] = -1
    out_i = torch.empty((n, WINDOW), dtype=torch.int32, device=DEV)
    out_l = torch.empty(n, dtype=torch.int32, device=DEV)
    yield _case("decode_swa_indices_and_lens", _label(x, n, f"window {WINDOW}"), n,
                (3 * r + 1) * I64 + n * (I64 + 1) + _entries(x["swa_table"], x["req"][:, None], cols)
                + n * (WINDOW + 1) * I32,
                "query_start_loc / seq_lens / base offsets, req_indices and is_valid_token, each distinct "
                "table entry of the windows, int32 rows and lens written",
                (x["qsl"], x["seq"], x["req"], x["swa_table"], WINDOW, PAGE, x["base"], x["valid"], out_i, out_l))
    yield _case("dense_prefill_local_compressed_indices", _label(x, n, "ratio 128, width 512"), n,
                n * I64 + n * 512 * I32, "int64 positions read, int32 rows written",
                (x["pos"], 128, 512, None))


def cases(sizes=(64, 131072)) -> list[Case]:
    """Benchmark cases of every index helper at each size (rows = tokens of the step)."""
    g = torch.Generator().manual_seed(0)
    gpu_g = torch.Generator(device=DEV).manual_seed(0)
    out: list[Case] = []
    for n in sizes:
        x = _batch(n, g)
        out += [*_slot_cases(x, n), *_topk_cases(x, n, gpu_g), *_row_cases(x, n)]
    return out

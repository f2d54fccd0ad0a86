"""Benchmark cases of the DeepSeek V4 compressor path: save_compressor_state, the CSA (ratio 4)
and HCA (ratio 128) compressed-KV compress-inserts and the CSA indexer compress-insert (MXFP4
and FP8), at DeepSeek V4's shapes (kv head 512 with rope 64, indexer head 128).

``cases(sizes)`` builds CUDA inputs for each size n (tokens). Up to DECODE_MAX: a decode step
of n requests with one token each, every token ending a group, each request's state window in
a sliding-window table (base offsets). Larger: a prefill step of 4 requests of n / 4 tokens
(positions 0 .. n/4 - 1, pages in random order), every token passed, so 1 / ratio of them
write. Compressed rows go to 64-row pages (CSA, indexer) or 2-row pages (HCA).

``run_triton`` / ``run_reference`` call the registered implementations directly on the same
prepared arguments (the public functions' host-side validation is not timed).

``min_bytes`` (inserts): the state floats the writing tokens need, each once (a window of L
rows of h kv floats and h score floats: CSA 8 half rows, HCA 128 rows, indexer 8 half rows;
CSA windows share no float), the rows written, the token inputs (position, request, state slot,
target slot: 8 B each per token), the block-table entries of each window, one cos_sin row per
writer and the norm weight once. save: kv and score read, the state rows written, positions and
slots, ape once.
"""

from __future__ import annotations

import torch
from benchmarks.dsv4_case import Case
from benchmarks.dsv4_case import registered_case as _case

from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.formats import CompressorState, Fp8DsMla, Fp8Indexer, Mxfp4Indexer

DECODE_MAX = 4096
DEV = "cuda"
ROPE = 64
KV = {4: {"h": 512, "rows": 4, "tps": 64}, 128: {"h": 512, "rows": 8, "tps": 2}}
INDEX = {"h": 128, "rows": 4, "tps": 64}
MAX_SEQ = 1 << 17  # decode requests sit below this position


def _scenario(ratio: int, rows: int, tps: int, n: int, g) -> dict:
    """Tokens, state table (pages in random order) and target slots of one step."""
    window = 8 if ratio == 4 else ratio
    if n <= DECODE_MAX:
        req = torch.arange(n)
        pos = ratio * torch.randint(window // ratio + 1, MAX_SEQ // ratio, (n,), generator=g) - 1
        base = (pos - window + 1) // rows
        per_req = -(-window // rows) + 1
    else:
        per = n // 4
        req = torch.arange(4).repeat_interleave(per)
        pos = torch.arange(per).repeat(4)
        base = torch.zeros(4, dtype=torch.int64)
        per_req = -(-per // rows)
    requests = int(req.max()) + 1
    table = torch.randperm(requests * per_req, generator=g).reshape(requests, per_req)
    state_slots = table[req, pos // rows - base[req]] * rows + pos % rows
    comp = pos // ratio
    tpages = int(comp.max()) // tps + 1
    ttable = torch.randperm(requests * tpages, generator=g).reshape(requests, tpages)
    target = ttable[req, comp // tps] * tps + comp % tps
    out = {"pos": pos, "req": req, "base": base, "table": table, "state_slots": state_slots, "target": target}
    out = {k: v.to(DEV) for k, v in out.items()}
    out.update(pages=requests * per_req, target_pages=requests * tpages, window=window,
               writers=int(((pos + 1) % ratio == 0).sum()), tokens=pos.numel(),
               table_reads=-(-window // rows) + 1)
    return out


def _state(pages: int, rows: int, w: int, gd) -> torch.Tensor:
    state = torch.randn(pages, rows, 2 * w, generator=gd, device=DEV)
    state[:, :, w:] *= 0.5
    return state


def _insert_bytes(s: dict, h: int, row_bytes: int) -> int:
    per_writer = s["window"] * 2 * h * 4 + row_bytes + 8 * s["table_reads"] + ROPE * 4
    return s["writers"] * per_writer + s["tokens"] * 4 * 8 + h * 4


HOW_INSERT = ("state floats the writers need (window x (kv + score) x h x 4 B, each once) + rows written + "
              "32 B of token inputs per token + table entries, a cos_sin row per writer, the norm weight")


def _kv_insert(ratio: int, n: int, g, gd, cs) -> Case:
    k = KV[ratio]
    s = _scenario(ratio, k["rows"], k["tps"], n, g)
    w = 2 * k["h"] if ratio == 4 else k["h"]
    state = _state(s["pages"], k["rows"], w, gd)
    layout = Fp8DsMla(head_dim=k["h"], rope_dim=ROPE, page_size=k["tps"])
    cache = layout.allocate(s["target_pages"], device=DEV)
    weight = torch.rand(k["h"], generator=gd, device=DEV) + 0.5
    args = (state, cache, layout, ratio, s["pos"], s["req"], s["state_slots"], s["table"], s["base"], weight, 1e-6,
            cs, s["target"])
    name = "CSA" if ratio == 4 else "HCA"
    label = f"{'decode' if n <= DECODE_MAX else 'prefill'} {n} tokens, {name}, {s['writers']} rows written"
    return _case("compress_kv_insert", label, n, _insert_bytes(s, k["h"], layout.row_bytes), HOW_INSERT, args)


def _index_insert(layout_cls, n: int, g, gd, cs) -> Case:
    s = _scenario(4, INDEX["rows"], INDEX["tps"], n, g)
    h = INDEX["h"]
    state = _state(s["pages"], INDEX["rows"], 2 * h, gd)
    layout = layout_cls(head_dim=h, page_size=INDEX["tps"])
    cache = layout.allocate(s["target_pages"], device=DEV)
    weight = torch.rand(h, generator=gd, device=DEV) + 0.5
    args = (state, cache, layout, s["pos"], s["req"], s["state_slots"], s["table"], s["base"], weight, 1e-6, cs,
            s["target"])
    label = f"{'decode' if n <= DECODE_MAX else 'prefill'} {n} tokens, {layout.name}, {s['writers']} rows written"
    return _case("indexer_compress_insert", label, n, _insert_bytes(s, h, layout.row_bytes), HOW_INSERT, args)


def _save(n: int, g, gd) -> Case:
    h = KV[4]["h"]
    layout = CompressorState(head_dim=h, ratio=4, page_size=KV[4]["rows"])
    w = layout.width
    s = _scenario(4, KV[4]["rows"], KV[4]["tps"], n, g)
    state = layout.allocate(s["pages"], device=DEV)
    kv, score = (torch.randn(n, w, generator=gd, device=DEV) for _ in range(2))
    ape = torch.randn(4, w, generator=gd, device=DEV)
    args = (layout, kv, score, ape, state, s["pos"], s["state_slots"])
    label = f"{'decode' if n <= DECODE_MAX else 'prefill'} {n} tokens, CSA state (W {w})"
    how = "kv + score read (float32), state rows written (2W float32), positions + slots (8 B each), ape once"
    return _case("save_compressor_state", label, n, n * (4 * w * 4 + 16) + ape.numel() * 4, how, args)


def cases(sizes=(64, 131072)) -> list[Case]:
    g = torch.Generator().manual_seed(0)  # index tensors, built on the host
    gd = torch.Generator(device=DEV).manual_seed(0)  # float inputs, built on the GPU
    cs = cos_sin_cache(ROPE, MAX_SEQ).to(DEV)
    out = []
    for n in sizes:
        out += [_kv_insert(4, n, g, gd, cs), _kv_insert(128, n, g, gd, cs), _index_insert(Mxfp4Indexer, n, g, gd, cs),
                _index_insert(Fp8Indexer, n, g, gd, cs), _save(n, g, gd)]
    return out

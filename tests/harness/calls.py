"""One valid call of every public operation, on prepared inputs: for smoke tests, host-cost
benchmarks and the guard that the default checks never synchronize.

    for name, call in tests.harness.calls.public_calls("cuda", rows=64).items():
        call()        # the same inputs every time, so a call can be captured in a CUDA graph

``rows`` is the tokens of one engine step: up to ``DECODE_MAX`` a decode step (one token per
request), beyond it a prefill of four requests. Shapes are DeepSeek V4's (kv head 512 with
RoPE 64, indexer head 128, 64 query heads); caches hold every slot the calls name. Calls that
return rows write into preallocated outputs where the op takes ``out``.

An op declared with an ``example`` (``kvformats.codec.op.Op``) gets its call from it: the ops of
the package without a call written here, and those of the modules named in
``KVFORMATS_EXTRA_OPS`` (module names separated by commas, imported here): how
tests/test_new_op_suite.py runs the suite on an op declared outside the package.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable

import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.codec import op as declared
from kvformats.codec.registry import get_format, list_formats
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.formats import CompressorState, CompressorStateV41
from kvformats.formats.compressor_state import halves

DECODE_MAX = 4096
HEAD, ROPE, INDEX_HEAD, HEADS, PAGE = 512, 64, 128, 64, 64
WINDOW = 128


_NORMAL: dict[str, torch.Generator] = {}


def _randn(device, *shape, dtype=torch.float32) -> torch.Tensor:
    """Normal values made on ``device`` (a prefill's inputs are GBs: not through the host)."""
    key = str(torch.device(device))
    if key == "meta":  # shapes only: the guard that no check reads values (tests/test_deferred.py)
        return torch.empty(shape, device=device, dtype=dtype)
    if key not in _NORMAL:
        _NORMAL[key] = torch.Generator(device=device).manual_seed(0)
    return torch.randn(shape, generator=_NORMAL[key], device=device).to(dtype)


def _step(rows: int, g: torch.Generator) -> dict:
    """Requests, query lengths, positions (host tensors) of one step of ``rows`` tokens."""
    if rows <= DECODE_MAX:
        qlen = torch.ones(rows, dtype=torch.int64)
        seq = torch.randint(2 * WINDOW, 1 << 16, (rows,), generator=g) + 1
    else:
        qlen = torch.full((4,), rows // 4, dtype=torch.int64)
        qlen[-1] += rows - int(qlen.sum())
        seq = qlen.clone()
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)])
    req = torch.repeat_interleave(torch.arange(qlen.shape[0]), qlen)
    pos = seq[req] - qlen[req] + torch.arange(rows) - qsl[req]
    return {"qlen": qlen, "seq": seq, "qsl": qsl, "req": req, "pos": pos}


def _table(requests: int, cols: int, g) -> torch.Tensor:
    return torch.randperm(requests * cols, generator=g).reshape(requests, cols).to(torch.int32)


def _codec_ops(lay, custom: bool):
    """The layout's methods, or the ``torch.library`` custom ops with the same signatures."""
    if not custom:
        return lay
    import functools

    import kvformats.codec.torch_ops as kops

    class Ops:
        pass

    ops = Ops()
    for name in ("encode", "decode", "gather", "decode_topk", "dequantize_gather", "gather_paged"):
        setattr(ops, name, functools.partial(getattr(kops, name), lay))
    return ops


def _dsv4(custom: bool):
    if not custom:
        return dsv4
    import kvformats.deepseek_v4.torch_ops as dops

    return dops


def codec_calls(fmt: str, rows: int, device, g: torch.Generator, check=True,
                custom: bool = False) -> dict[str, Callable[[], object]]:
    """encode, decode, decode_topk and, where rows decode to one tensor (``Layout.paged_reads``),
    gather and the paged reads of ``fmt`` (through the ``torch.library`` ops when ``custom``), on
    the format's default parameters: each format declares its deployed shape as its defaults."""
    lay = get_format(fmt)
    pages = -(-rows // lay.page_size) + 1
    cache = lay.allocate(pages, device=device)
    slots = torch.randperm(pages * lay.page_size, generator=g)[:rows].to(device)
    if isinstance(lay, CompressorState):
        w = lay.width
        x = (_randn(device, rows, w), _randn(device, rows, w))
        kw = {"positions": torch.arange(rows).to(device), "ape": _randn(device, 4, w)}
    elif isinstance(lay, CompressorStateV41):  # (kv, score), no positions, no ape
        x, kw = (_randn(device, rows, lay.width), _randn(device, rows, lay.width)), {}
    else:
        x, kw = _randn(device, rows, lay.head_dim, dtype=torch.bfloat16), {}
    name, ops = lay.name, _codec_ops(lay, custom)
    calls = {f"{name}.encode": lambda: ops.encode(x, cache, slots, check=check, **kw),
             f"{name}.decode": lambda: ops.decode(cache, slots, check=check),
             f"{name}.decode_topk": lambda: ops.decode_topk(cache, slots.reshape(1, rows), check=check)}
    if not lay.paged_reads:
        return calls
    calls[f"{name}.gather"] = lambda: ops.gather(cache, slots, check=check)
    requests = 1 if rows <= DECODE_MAX else 4
    per = -(-rows // requests)
    cols = -(-per // lay.page_size)
    table = _table(requests, cols, g).remainder(pages).to(device)
    seq = torch.full((requests,), per, dtype=torch.int32).to(device)
    out = torch.empty((requests, per, lay.head_dim), dtype=lay.decode_dtype, device=device)
    cu = torch.arange(requests + 1, dtype=torch.int32).mul(per).to(device)
    ws = tuple(torch.empty((requests * per, s.record_bytes), dtype=torch.uint8, device=device) for s in lay.segments)
    calls[f"{name}.dequantize_gather"] = lambda: ops.dequantize_gather(cache, out, block_table=table, seq_lens=seq,
                                                                      check=check)
    calls[f"{name}.gather_paged"] = lambda: ops.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=ws,
                                                            check=check)
    return calls


def compress_calls(rows: int, device, g: torch.Generator, check=True,
                   custom: bool = False) -> dict[str, Callable[[], object]]:
    """save_compressor_state and the CSA / HCA / indexer compress-inserts of one step."""
    m = _dsv4(custom)
    s = _step(rows, g)
    req, pos = s["req"], s["pos"]
    requests = s["qlen"].shape[0]
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    calls = {}
    for label, ratio, h, rows_pp, fmt in (("csa", 4, HEAD, 4, "fp8_ds_mla"), ("hca", 128, HEAD, 8, "fp8_ds_mla"),
                                          ("indexer_mxfp4", 4, INDEX_HEAD, 4, "mxfp4_indexer"),
                                          ("indexer_fp8", 4, INDEX_HEAD, 4, "fp8_indexer")):
        state_lay = CompressorState(head_dim=h, ratio=ratio, page_size=rows_pp)
        window = ratio * halves(ratio)
        base = ((s["seq"] - s["qlen"] - window + 1).clamp_min(0) // rows_pp).to(torch.int64)
        cols = int(((s["seq"] - 1) // rows_pp - base).max()) + 1
        table = _table(requests, cols, g)
        state_slots = (table[req, pos // rows_pp - base[req]].long() * rows_pp + pos % rows_pp)
        state = _randn(device, requests * cols, rows_pp, 2 * state_lay.width)
        tps = 2 if ratio == 128 else PAGE
        comp = pos // ratio
        tcols = int(comp.max()) // tps + 1
        target = _table(requests, tcols, g)
        target_slots = target[req, comp // tps].long() * tps + comp % tps
        lay = get_format(fmt, page_size=tps, **({"head_dim": h, "rope_dim": ROPE} if fmt == "fp8_ds_mla"
                                                else {"head_dim": h}))
        cache = lay.allocate(requests * tcols, device=device)
        t = {k: v.to(device) for k, v in dict(pos=pos, req=req, state_slots=state_slots, table=table, base=base,
                                              target=target_slots).items()}
        t["state"] = state
        weight = (torch.rand(h, generator=g) + 0.5).to(device)
        common = dict(positions=t["pos"], req_indices=t["req"], state_slots=t["state_slots"], block_table=t["table"],
                      rms_weight=weight, rms_eps=1e-6, cos_sin_cache=cs, block_table_base_offsets=t["base"],
                      check=check)
        if fmt == "fp8_ds_mla":
            calls[f"dsv4.{label}_compress_kv_insert"] = (
                lambda t=t, cache=cache, ratio=ratio, common=common, tps=tps: m.compress_kv_insert(
                    t["state"], cache, ratio=ratio, kv_slots=t["target"], kv_page_size=tps, **common))
        else:
            calls[f"dsv4.{label}_compress_insert"] = (
                lambda t=t, cache=cache, fmt=fmt, common=common: m.indexer_compress_insert(
                    t["state"], cache, index_format=fmt, index_slots=t["target"], index_page_size=PAGE, **common))
        if label == "csa":
            w = state_lay.width
            kv, score = _randn(device, rows, w), _randn(device, rows, w)
            ape = _randn(device, 4, w)
            calls["dsv4.save_compressor_state"] = lambda t=t, kv=kv, score=score, ape=ape: m.save_compressor_state(
                kv, score, ape, t["state"], ratio=4, positions=t["pos"], slots=t["state_slots"], check=check)
    return calls


def query_calls(rows: int, device, g: torch.Generator, check=True,
                custom: bool = False) -> dict[str, Callable[[], object]]:
    """SWA insert, the indexer query preparations, inverse-RoPE FP8 quant, Hadamard."""
    m = _dsv4(custom)
    s = _step(rows, g)
    pos = s["pos"].to(device)
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    lay = get_format("fp8_ds_mla", head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)
    pages = -(-rows // PAGE) + 1
    cache = lay.allocate(pages, device=device)
    slots = torch.randperm(pages * PAGE, generator=g)[:rows].to(device)
    swa_heads = HEADS if rows <= DECODE_MAX else 1  # prefill: the insert without a query-sized copy
    q = _randn(device, rows, swa_heads, HEAD, dtype=torch.bfloat16)
    kv = _randn(device, rows, HEAD, dtype=torch.bfloat16)
    iq = _randn(device, rows, HEADS, INDEX_HEAD, dtype=torch.bfloat16)
    w = _randn(device, rows, HEADS)
    o_tokens = rows if rows <= DECODE_MAX else rows // 8
    o = _randn(device, o_tokens, HEADS, HEAD, dtype=torch.bfloat16)
    x = _randn(device, rows, INDEX_HEAD, dtype=torch.bfloat16)
    sm, hs = INDEX_HEAD ** -0.5, HEADS ** -0.5
    return {
        "dsv4.swa_insert": lambda: m.swa_insert(q, kv, cache, slots, pos, cs, 1e-6, page_size=PAGE, check=check),
        "dsv4.prepare_indexer_q_mxfp4": lambda: m.prepare_indexer_q_mxfp4(iq, pos, cs, w, sm, hs, check=check),
        "dsv4.prepare_indexer_q_fp8": lambda: m.prepare_indexer_q_fp8(iq, pos, cs, w, sm, hs, check=check),
        "dsv4.inv_rope_fp8_quant": lambda: m.inv_rope_fp8_quant(o, pos[:o_tokens], cs, n_groups=8,
                                                                   heads_per_group=HEADS // 8, check=check),
        "dsv4.hadamard_transform": lambda: m.hadamard_transform(x),
    }


def index_inputs(rows: int, device, g: torch.Generator, s: dict, topk: int = 512):
    """(tensors by name, compressed base, the three preallocated outputs) of the index helpers of
    step ``s``: SWA and compressed block tables, top-k indices, gather lengths, compressed lengths."""
    requests = s["qlen"].shape[0]
    base = ((s["seq"] - s["qlen"] - WINDOW + 1).clamp_min(0) // PAGE)
    swa_cols = int(((s["seq"] - 1) // PAGE - base).max()) + 1
    comp_cols = int(s["seq"].max()) // 4 // PAGE + 1
    swa, comp = _table(requests, swa_cols, g), _table(requests, comp_cols, g)
    comp_len = (s["pos"] + 1) // 4
    top = (torch.rand(rows, topk, generator=g) * comp_len[:, None]).long()
    top[torch.arange(topk)[None, :] >= comp_len[:, None]] = -1
    glen = torch.minimum(s["seq"], s["qlen"] + WINDOW)
    d = {k: v.to(device) for k, v in dict(s, base=base, swa=swa, comp=comp, top=top.int(), glen=glen,
                                           clens=s["seq"] // 128).items()}
    cb = int(s["seq"].max()) // 4 + 1
    out_slots = torch.empty(rows, dtype=torch.int64, device=device)
    out_i = torch.empty((rows, WINDOW), dtype=torch.int32, device=device)
    out_l = torch.empty(rows, dtype=torch.int32, device=device)
    return d, cb, out_slots, out_i, out_l


def index_calls(rows: int, device, g: torch.Generator, topk: int = 512,
                custom: bool = False) -> dict[str, Callable[[], object]]:
    """The index helpers of one step (SWA table of 64-row pages, compressed table of ratio 4)."""
    m = _dsv4(custom)
    d, cb, out_slots, out_i, out_l = index_inputs(rows, device, g, _step(rows, g), topk)
    return {
        "dsv4.table_slot_mapping": lambda: m.table_slot_mapping(
            positions=d["pos"], req_indices=d["req"], block_table=d["swa"], page_size=PAGE,
            block_table_base_offsets=d["base"]),
        "dsv4.compressed_slot_mapping": lambda: m.compressed_slot_mapping(
            num_tokens=rows, query_start_loc=d["qsl"], seq_lens=d["seq"], block_table=d["comp"], page_size=PAGE,
            ratio=4, out=out_slots),
        "dsv4.global_topk_indices_and_lens": lambda: m.global_topk_indices_and_lens(
            topk_indices=d["top"], req_indices=d["req"], block_table=d["comp"], page_size=PAGE),
        "dsv4.combine_topk_swa_indices": lambda: m.combine_topk_swa_indices(
            topk_indices=d["top"], query_start_loc=d["qsl"], seq_lens=d["seq"], gather_lens=d["glen"],
            window_size=WINDOW, ratio=4, topk=topk, workspace_width=cb + rows + WINDOW, compressed_base=cb),
        "dsv4.combine_dense_swa_indices": lambda: m.combine_dense_swa_indices(
            positions=d["pos"], req_indices=d["req"], seq_lens=d["seq"], compressed_lens=d["clens"],
            gather_lens=d["glen"], window_size=WINDOW, ratio=128, workspace_width=cb + rows + WINDOW,
            compressed_base=cb),
        "dsv4.decode_swa_indices_and_lens": lambda: m.decode_swa_indices_and_lens(
            query_start_loc=d["qsl"], seq_lens=d["seq"], req_indices=d["req"], block_table=d["swa"],
            window_size=WINDOW, page_size=PAGE, block_table_base_offsets=d["base"], out_indices=out_i,
            out_lens=out_l),
        "dsv4.dense_prefill_local_compressed_indices": lambda: m.dense_prefill_local_compressed_indices(
            positions=d["pos"], ratio=128, width=512),
    }


def dsv41_calls(rows: int, device, g: torch.Generator, check=True,
                custom: bool = False) -> dict[str, Callable[[], object]]:
    """DeepSeek V4.1's model ops (``kvformats.deepseek_v41``; its ``torch_ops`` when ``custom``): the
    SWA rows, the indexer queries, the compressor tail and its pooling, a step of ``rows`` tokens."""
    if custom:
        import kvformats.deepseek_v41.torch_ops as m
    else:
        from kvformats import deepseek_v41 as m
    s = _step(rows, g)
    pos = s["pos"].to(device)
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    swa = get_format("fp8_ds_mla_v41", page_size=PAGE)
    pages = -(-rows // PAGE) + 1
    cache = swa.allocate(pages, device=device)
    slots = torch.randperm(pages * PAGE, generator=g)[:rows].to(device)
    values = _randn(device, rows, HEAD, dtype=torch.bfloat16)
    iq = _randn(device, rows, HEADS, INDEX_HEAD, dtype=torch.bfloat16)
    tail_pages = rows + 2  # 2 rows a page: every token a row of its own, page 0 the null page
    tail = torch.zeros(tail_pages, 2, 2, HEAD, device=device)
    tail_slots = (torch.randperm(2 * tail_pages - 2, generator=g)[:rows] + 2).to(device)
    content, scores = _randn(device, rows, HEAD), _randn(device, rows, HEAD)
    previous = (torch.arange(rows) - 1).to(device)  # each pair's first half the row before; row 0 the tail
    active = (torch.arange(rows) % 2 == 1).to(device)
    weight = _randn(device, HEAD)
    return {
        "dsv41.swa_rope_scatter": lambda: m.swa_rope_scatter(values, pos, cs, cache, slots, check=check),
        "dsv41.index_q_quantize": lambda: m.index_q_quantize(iq, check=check),
        "dsv41.compressor_tail_scatter": lambda: m.compressor_tail_scatter(content, scores, tail, slots=tail_slots,
                                                                           check=check),
        "dsv41.compressor_pool": lambda: m.compressor_pool(content, scores, tail, previous=previous,
                                                           tail_slots=tail_slots, active=active, norm_weight=weight,
                                                           norm_eps=1e-6, check=check),
    }


EXTRA_OP_MODULES = tuple(importlib.import_module(m.strip())
                         for m in os.environ.get("KVFORMATS_EXTRA_OPS", "").split(",") if m.strip())


def example_ops() -> list:
    """The declared ops whose calls come from their ``example``: those of the package and of
    ``EXTRA_OP_MODULES`` (not of other modules a test imported: every worker builds the same
    calls)."""
    modules = {m.__name__ for m in EXTRA_OP_MODULES}
    return [op for op in declared.DECLARED.values() if op.example is not None and op.function is not None and (
        op.function.__module__ in modules or op.function.__module__.startswith("kvformats."))]


def call_name(op) -> str:
    """The name of ``op``'s prepared call: its torch op's prefix, a dot, its name (``dsv4.swa_insert``)."""
    return f"{op.family.torch_prefix.rstrip('_')}.{op.name}"


def example_call(op, rows: int, device, g: torch.Generator, check=True, custom: bool = False) -> Callable[[], object]:
    """A prepared call of ``op`` from its ``example(rows, g)`` on ``device`` (through its torch
    op when ``custom``). Each argument is a free variable of the call under its own name, as in
    the calls written here: the replay fuzzer rebuilds a call by those names (tests/replay_fuzz.py)."""
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in op.example(rows, g).items()}
    names = ", ".join(kwargs)
    source = (f"def make(fn, check, {names}):\n"
              f"    return lambda: fn({', '.join(f'{n}={n}' for n in kwargs)}, check=check)\n")
    scope: dict = {}
    exec(source, scope)  # noqa: S102 - the argument names are the op's parameters
    return scope["make"](op.wrapper if custom else op.function, check, **kwargs)


def declared_calls(rows: int, device, g: torch.Generator, check=True, custom: bool = False,
                   have=()) -> dict[str, Callable[[], object]]:
    """The prepared calls of ``example_ops()`` not among ``have``."""
    return {call_name(op): example_call(op, rows, device, g, check, custom)
            for op in example_ops() if call_name(op) not in have}


def public_calls(device, rows: int = 64, *, check=True, custom: bool = False,
                 seed: int = 0) -> dict[str, Callable[[], object]]:
    """Name -> one prepared call of every public op (codec ops of every format, deepseek_v4 ops,
    index helpers, deepseek_v41 ops, declared ops with an example: ``example_ops``) at ``rows``
    tokens on ``device``; through the ``torch.library`` custom ops (``kvformats.codec.torch_ops``,
    ``kvformats.deepseek_v4.torch_ops``, ``kvformats.deepseek_v41.torch_ops``, the declared ops'
    wrappers) when ``custom``."""
    g = torch.Generator().manual_seed(seed)
    _NORMAL.pop(str(torch.device(device)), None)
    calls: dict[str, Callable[[], object]] = {}
    for fmt in list_formats():
        calls.update(codec_calls(fmt, rows, device, g, check, custom))
    calls.update(compress_calls(rows, device, g, check, custom))
    calls.update(query_calls(rows, device, g, check, custom))
    calls.update(index_calls(rows, device, g, custom=custom))
    calls.update(dsv41_calls(rows, device, g, check, custom))
    calls.update(declared_calls(rows, device, g, check, custom, have=calls))
    return calls

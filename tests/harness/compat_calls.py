"""Pairs of calls on the same prepared inputs: the native kvformats call and its tokenspeed
drop-in (``kvformats.compat.tokenspeed``), for the host-cost benchmarks (the drop-in's host cost
is held to 1.1x the native call's).

    for name, (native, compat) in compat_call_pairs("cuda", rows=64).items():
        native(); compat()

The native call is what an engine writes against kvformats' own API for the same effect (for the
slot-addressed MXFP4 gather into two workspaces: ``gather`` and the two copies). Shapes are
DeepSeek V4's, as in ``tests.harness.calls``; a decode step up to ``DECODE_MAX`` rows.
"""

from __future__ import annotations

from typing import Callable

import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.compat import tokenspeed as _compat
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.formats import CompressorState, Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from tests.harness.calls import HEAD, HEADS, INDEX_HEAD, PAGE, ROPE, WINDOW, _randn, _step, _table, index_inputs

Pair = tuple[Callable[[], object], Callable[[], object]]


def _reorder_c4(ape: torch.Tensor) -> torch.Tensor:
    h = ape.shape[1] // 2
    return torch.cat([ape[:, :h], ape[:, h:]], dim=0).reshape(ape.shape)


def mxfp4_workspace_gather(mx, mcache, slots, rows: int, device):
    """(values [rows, 64], scales [rows, 4] uint8 workspaces, the native call that fills them: the
    layout's gather and two copies), the native side of tokenspeed's MXFP4 gather into workspaces."""
    values = torch.empty((rows, 64), dtype=torch.uint8, device=device)
    scales = torch.empty((rows, 4), dtype=torch.uint8, device=device)

    def gather_native():
        r = mx.gather(mcache, slots)
        values[:rows].copy_(r[:, :64])
        scales[:rows].copy_(r[:, 64:])

    return values, scales, gather_native


def compress_cases(device, g, s) -> list[dict]:
    """The four compressors of one step (CSA, HCA, the MXFP4 and FP8 indexer inserts): per case its
    label, ratio, head dim ``h``, state rows a page ``rows_pp``, target format ``fmt`` and page
    ``tps``, the state layout and cache, the target layout and cache, the RMS weight, the RoPE
    table ``cs``, the step's tensors ``t`` (pos, req, ss: state slots, table, base, target: target
    slots) and ``common``, the native ops' shared keyword arguments."""
    req, pos = s["req"], s["pos"]
    requests = s["qlen"].shape[0]
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    cases = []
    for label, ratio, h, rows_pp, fmt in (("csa", 4, HEAD, 4, "fp8_ds_mla"), ("hca", 128, HEAD, 8, "fp8_ds_mla"),
                                          ("indexer_mxfp4", 4, INDEX_HEAD, 4, "mxfp4"),
                                          ("indexer_fp8", 4, INDEX_HEAD, 4, "fp8")):
        state_lay = CompressorState(head_dim=h, ratio=ratio, page_size=rows_pp)
        window = ratio * (2 if ratio == 4 else 1)
        base = ((s["seq"] - s["qlen"] - window + 1).clamp_min(0) // rows_pp).to(torch.int64)
        cols = int(((s["seq"] - 1) // rows_pp - base).max()) + 1
        table = _table(requests, cols, g)
        state_slots = table[req, pos // rows_pp - base[req]].long() * rows_pp + pos % rows_pp
        state = _randn(device, requests * cols, rows_pp, 2 * state_lay.width)
        tps = 2 if ratio == 128 else PAGE
        comp = pos // ratio
        target = _table(requests, int(comp.max()) // tps + 1, g)
        target_slots = target[req, comp // tps].long() * tps + comp % tps
        lay = (Fp8DsMla(head_dim=h, rope_dim=ROPE, page_size=tps) if fmt == "fp8_ds_mla"
               else (Mxfp4Indexer if fmt == "mxfp4" else Fp8Indexer)(head_dim=h, page_size=tps))
        cache = lay.allocate(target.numel(), device=device)
        t = {k: v.to(device) for k, v in dict(pos=pos, req=req, ss=state_slots, table=table, base=base,
                                              target=target_slots).items()}
        weight = (torch.rand(h, generator=g) + 0.5).to(device)
        common = dict(positions=t["pos"], req_indices=t["req"], state_slots=t["ss"], block_table=t["table"],
                      rms_weight=weight, rms_eps=1e-6, cos_sin_cache=cs, block_table_base_offsets=t["base"])
        cases.append(dict(label=label, ratio=ratio, h=h, rows_pp=rows_pp, fmt=fmt, tps=tps, state_lay=state_lay,
                          state=state, lay=lay, cache=cache, weight=weight, cs=cs, t=t, common=common))
    return cases


def _compress_pairs(rows: int, device, g, s, ts) -> dict[str, Pair]:
    pairs: dict[str, Pair] = {}
    for c in compress_cases(device, g, s):
        label, ratio, rows_pp, fmt, tps = c["label"], c["ratio"], c["rows_pp"], c["fmt"], c["tps"]
        state_lay, state, lay, cache, weight, cs, t, common = (c[k] for k in (
            "state_lay", "state", "lay", "cache", "weight", "cs", "t", "common"))
        ts_args = (state, t["req"], t["pos"], t["ss"], t["table"], rows_pp, weight, 1e-6, cs, cache, t["target"], tps)
        if fmt == "fp8_ds_mla":
            fn = (ts.deepseek_v4_csa_compress_kv_cache_insert if ratio == 4
                  else ts.deepseek_v4_hca_compress_kv_cache_insert)
            pairs[f"{label}_compress_kv_insert"] = (
                lambda state=state, cache=cache, ratio=ratio, common=common, t=t, tps=tps: dsv4.compress_kv_insert(
                    state, cache, ratio=ratio, kv_slots=t["target"], kv_page_size=tps, **common),
                lambda fn=fn, a=ts_args, t=t: fn(*a, block_table_base_offsets=t["base"]))
        else:
            pairs[f"{label}_compress_insert"] = (
                lambda state=state, cache=cache, lay=lay, common=common, t=t: dsv4.indexer_compress_insert(
                    state, cache, index_format=lay.name, index_slots=t["target"], index_page_size=PAGE, **common),
                lambda a=ts_args, fp4=fmt == "mxfp4", t=t: ts.deepseek_v4_csa_indexer_cache_insert(
                    *a, fp4, block_table_base_offsets=t["base"]))
        if label == "csa":
            w = state_lay.width
            kv, score, ape = _randn(device, rows, w), _randn(device, rows, w), _randn(device, 4, w)
            runtime_ape = _reorder_c4(ape)
            pairs["save_compressor_state"] = (
                lambda kv=kv, score=score, ape=ape, state=state, t=t: dsv4.save_compressor_state(
                    kv, score, ape, state, ratio=4, positions=t["pos"], slots=t["ss"]),
                lambda kv=kv, score=score, ape=runtime_ape, state=state, t=t: ts.save_deepseek_v4_compressor_state(
                    kv, score, ape, state, t["ss"], t["pos"], 4, 4))
    return pairs


def compat_call_pairs(device, rows: int = 64, seed: int = 0, api=None) -> dict[str, Pair]:
    """Name -> (native call, tokenspeed drop-in call) on the same inputs. ``api``: any namespace
    with tokenspeed's names to call instead of ``kvformats.compat.tokenspeed`` (tokenspeed's own
    modules, for a side-by-side run on a GPU); a name it lacks raises LookupError when called."""
    ts = _compat if api is None else _Missing(api)
    g = torch.Generator().manual_seed(seed)
    s = _step(rows, g)
    pairs = _compress_pairs(rows, device, g, s, ts)
    pos = s["pos"].to(device)
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    ds = Fp8DsMla(head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)
    pages = -(-rows // PAGE) + 1
    swa = ds.allocate(pages, device=device)
    slots = torch.randperm(pages * PAGE, generator=g)[:rows].to(device)
    q = _randn(device, rows, HEADS, HEAD, dtype=torch.bfloat16)
    kv = _randn(device, rows, HEAD, dtype=torch.bfloat16)
    pairs["swa_insert"] = (lambda: dsv4.swa_insert(q, kv, swa, slots, pos, cs, 1e-6, page_size=PAGE),
                           lambda: ts.fused_qnorm_rope_kv_insert(q, kv, swa, slots, pos, cs, 1e-6, PAGE))
    pairs["fp8_ds_mla.decode"] = (lambda: ds.decode(swa, slots),
                                  lambda: ts.dequantize_deepseek_v4_fp8_ds_mla_cache(swa, slots, PAGE, head_dim=HEAD,
                                                                                     rope_dim=ROPE))
    x = _randn(device, rows, INDEX_HEAD, dtype=torch.bfloat16)
    for name, lay in (("fp8", Fp8Indexer(head_dim=INDEX_HEAD, page_size=PAGE)),
                      ("mxfp4", Mxfp4Indexer(head_dim=INDEX_HEAD, page_size=PAGE))):
        cache = lay.allocate(pages, device=device)
        write = getattr(ts, f"write_deepseek_v4_indexer_{name}_cache")
        read = getattr(ts, f"read_deepseek_v4_indexer_{name}_cache")
        pairs[f"{name}_indexer.encode"] = (lambda lay=lay, c=cache: lay.encode(x, c, slots),
                                           lambda w=write, c=cache: w(x, c, slots, PAGE))
        pairs[f"{name}_indexer.decode"] = (lambda lay=lay, c=cache: lay.decode(c, slots),
                                           lambda r=read, c=cache: r(c, slots, PAGE))
    mx = Mxfp4Indexer(head_dim=INDEX_HEAD, page_size=PAGE)
    mcache = mx.allocate(pages, device=device)
    values, scales, gather_native = mxfp4_workspace_gather(mx, mcache, slots, rows, device)
    pairs["mxfp4_indexer.gather"] = (gather_native, lambda: ts.deepseek_v4_gather_indexer_mxfp4_cache(
        cache_2d=mcache, slot_mapping=slots, values_out=values, scales_out=scales, block_size=PAGE))
    cu = torch.tensor([0, rows], dtype=torch.int32, device=device)
    ptable = torch.randperm(pages, generator=g)[None, :].to(torch.int32).to(device)
    pairs["mxfp4_indexer.gather_paged"] = (
        lambda: mx.gather_paged(mcache, block_table=ptable, cu_seq_lens=cu, out=(values, scales)),
        lambda: ts.indexer_mxfp4_paged_gather(mcache, values, scales, ptable, cu, PAGE))
    f8 = Fp8Indexer(head_dim=INDEX_HEAD, page_size=PAGE)
    fcache = f8.allocate(pages, device=device)
    pairs["fp8_indexer.gather_paged"] = (  # sized from cu_seq_lens[-1]: a host read on both sides
        lambda: f8.gather_paged(fcache, block_table=ptable, cu_seq_lens=cu),
        lambda: ts.gather_paged_indexer_fp8_cache(fcache, ptable, cu, PAGE))
    iq = _randn(device, rows, HEADS, INDEX_HEAD, dtype=torch.bfloat16)
    w = _randn(device, rows, HEADS)
    sm, hs = INDEX_HEAD ** -0.5, HEADS ** -0.5
    pairs["prepare_indexer_q_mxfp4"] = (lambda: dsv4.prepare_indexer_q_mxfp4(iq, pos, cs, w, sm, hs),
                                        lambda: ts.deepseek_v4_prepare_indexer_q_mxfp4(iq, pos, cs, w, sm, hs))
    pairs["prepare_indexer_q_fp8"] = (lambda: dsv4.prepare_indexer_q_fp8(iq, pos, cs, w, sm, hs),
                                      lambda: ts.deepseek_v4_prepare_indexer_q_fp8(iq, pos, cs, w, sm, hs))
    o = _randn(device, rows, HEADS, HEAD, dtype=torch.bfloat16)
    pairs["inv_rope_fp8_quant"] = (
        lambda: dsv4.inv_rope_fp8_quant(o, pos, cs, n_groups=8, heads_per_group=HEADS // 8),
        lambda: ts.deepseek_v4_fused_inv_rope_fp8_quant(o, pos, cs, 8, HEADS // 8))
    pairs["hadamard_transform"] = (lambda: dsv4.hadamard_transform(x, INDEX_HEAD ** -0.5),
                                   lambda: ts.hadamard_transform(x, scale=INDEX_HEAD ** -0.5))
    pairs.update(_index_pairs(rows, device, g, s, ts))
    return pairs


class _Missing:
    """``api``'s names; a name it lacks reads as a function that raises LookupError."""

    def __init__(self, api):
        self._api = api

    def __getattr__(self, name):
        fn = getattr(self._api, name, None)
        return fn if fn is not None else _absent


def _absent(*args, **kwargs):
    raise LookupError("not in this API")


def _index_pairs(rows: int, device, g, s, ts, topk: int = 512) -> dict[str, Pair]:
    requests = s["qlen"].shape[0]
    d, cb, out_slots, out_i, out_l = index_inputs(rows, device, g, s, topk)
    comp = d["comp"]
    out_local = torch.empty((rows, 512), dtype=torch.int32, device=device)
    ds = Fp8DsMla(head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)
    kcache = ds.allocate(int(comp.numel()), device=device)
    per = min(int(s["seq"].max()), 256)
    gout = torch.empty((requests, per, HEAD), dtype=torch.bfloat16, device=device)
    gl = d["seq"].clamp_max(per)
    return {
        "compressed_slot_mapping": (
            lambda: dsv4.compressed_slot_mapping(num_tokens=rows, query_start_loc=d["qsl"], seq_lens=d["seq"],
                                                 block_table=d["comp"], page_size=PAGE, ratio=4, out=out_slots),
            lambda: ts.deepseek_v4_compressed_slot_mapping(num_tokens=rows, query_start_loc=d["qsl"], seq_lens=d["seq"],
                                                           block_table=d["comp"], block_size=PAGE, compress_ratio=4,
                                                           out=out_slots)),
        "global_topk_indices_and_lens": (
            lambda: dsv4.global_topk_indices_and_lens(topk_indices=d["top"], req_indices=d["req"],
                                                      block_table=d["comp"], page_size=PAGE),
            lambda: ts.deepseek_v4_compute_global_topk_indices_and_lens(topk_indices=d["top"],
                                                                        token_to_req_indices=d["req"],
                                                                        block_table=d["comp"], block_size=PAGE)),
        "combine_topk_swa_indices": (
            lambda: dsv4.combine_topk_swa_indices(topk_indices=d["top"], query_start_loc=d["qsl"], seq_lens=d["seq"],
                                                  gather_lens=d["glen"], window_size=WINDOW, ratio=4, topk=topk,
                                                  workspace_width=cb + rows + WINDOW, compressed_base=cb),
            lambda: ts.deepseek_v4_combine_topk_swa_indices(topk_indices=d["top"], query_start_loc=d["qsl"],
                                                            seq_lens=d["seq"], gather_lens=d["glen"],
                                                            window_size=WINDOW, compress_ratio=4, topk=topk,
                                                            workspace_width=cb + rows + WINDOW, compressed_base=cb)),
        "combine_dense_swa_indices": (
            lambda: dsv4.combine_dense_swa_indices(positions=d["pos"], req_indices=d["req"], seq_lens=d["seq"],
                                                   compressed_lens=d["clens"], gather_lens=d["glen"],
                                                   window_size=WINDOW, ratio=128, workspace_width=cb + rows + WINDOW,
                                                   compressed_base=cb),
            lambda: ts.deepseek_v4_combine_dense_swa_indices(positions=d["pos"], token_to_req_indices=d["req"],
                                                             seq_lens=d["seq"], compressed_lens=d["clens"],
                                                             gather_lens=d["glen"], window_size=WINDOW,
                                                             compress_ratio=128, workspace_width=cb + rows + WINDOW,
                                                             compressed_base=cb)),
        "decode_swa_indices_and_lens": (
            lambda: dsv4.decode_swa_indices_and_lens(query_start_loc=d["qsl"], seq_lens=d["seq"], req_indices=d["req"],
                                                     block_table=d["swa"], window_size=WINDOW, page_size=PAGE,
                                                     block_table_base_offsets=d["base"], out_indices=out_i,
                                                     out_lens=out_l),
            lambda: ts.deepseek_v4_decode_swa_indices_and_lens(query_start_loc=d["qsl"], seq_lens=d["seq"],
                                                               token_to_req_indices=d["req"], block_table=d["swa"],
                                                               window_size=WINDOW, block_size=PAGE,
                                                               block_table_base_offsets=d["base"], out_indices=out_i,
                                                               out_lens=out_l)),
        "dense_prefill_local_compressed_indices": (
            lambda: dsv4.dense_prefill_local_compressed_indices(positions=d["pos"], ratio=128, width=512,
                                                                out=out_local),
            lambda: ts.deepseek_v4_build_dense_prefill_local_compressed_indices(positions=d["pos"], compress_ratio=128,
                                                                                width=512, out=out_local)),
        "fp8_ds_mla.dequantize_gather": (
            lambda: ds.dequantize_gather(kcache, gout, block_table=d["comp"], seq_lens=d["seq"], gather_lens=gl),
            lambda: ts.deepseek_v4_dequantize_and_gather_k_cache(out=gout, cache_2d=kcache, seq_lens=d["seq"],
                                                                 gather_lens=gl, block_table=d["comp"],
                                                                 block_size=PAGE, offset=0)),
    }

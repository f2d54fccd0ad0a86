"""Pairs of calls on the same prepared inputs: the native kvformats call and its tokenspeed-kernel
0.1.4 drop-in (``kvformats.compat.tokenspeed_kernel.dsv41`` / ``.dsv4``), for the host-cost
benchmark (``python3 -m benchmarks host_overhead_cpu --compat``: the drop-in's host cost is held
to 1.1x the native call's) and the test that each pair has the same effect
(tests/compat/test_kernel_drop_in_pairs.py).

    for name, (native, drop_in) in kernel_call_pairs("cuda", rows=64).items():
        native(); drop_in()

Names are ``dsv41.<function>[.<cache_format>]`` and ``dsv4.<function>[.<variant>]``. The native
call is what an engine writes against kvformats' own API for the same effect: the layouts'
``encode`` / ``decode`` (plus the copy into the caller's ``out`` where tokenspeed's call form
fills one), ``kvformats.deepseek_v41``'s model ops, ``kvformats.deepseek_v4``'s. Shapes are
DeepSeek V4's / V4.1's, as in ``tests.harness.compat_calls``: a decode step of ``rows`` tokens
(``rows`` up to ``DECODE_MAX``). Inputs are valid for both sides (slots unique and inside the
caches, outside tokenspeed's null page 0 where a drop-in skips it, positions inside the cos/sin
table, top-k rows whose -1 entries trail), so each pair writes the same bytes and returns the
same values: ``written`` (a dict, when given) receives, per name, the tensors either side writes.

Left out: 'global_v4' (the layout of 'swa_v4'). With no native call of the same effect:
``dsv41.cache_pack`` / ``cache_scatter`` of 'index_v4' (a torch reference of tokenspeed's Hopper
row; its reads are paired),
``dsv4_indexer_cache_format`` (no tensor work), ``dsv4_combine_topk_swa_indices`` (0.1.4
compacts the top-k entries), ``dsv4_decode_dense_compressed_indices_and_lens``,
``dsv4_indexer_decode_metadata_compute``, ``dsv4_validate_active_cache_pages`` (torch only), and
the dsv4 names that are the seed-era drop-ins themselves (``dsv4_compressed_slot_mapping``,
``dsv4_decode_swa_indices_and_lens``, ``dsv4_combine_dense_swa_indices``: compat_calls.py's pairs).
"""

from __future__ import annotations

from typing import Callable

import torch

from kvformats import deepseek_v4 as dsv4
from kvformats import deepseek_v41 as v41
from kvformats.codec.registry import get_format
from kvformats.compat.tokenspeed_kernel import dsv4 as ts4
from kvformats.compat.tokenspeed_kernel import dsv41 as ts41
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.formats import Fp8DsMla, Mxfp4Indexer
from tests.harness.calls import HEAD, HEADS, INDEX_HEAD, PAGE, ROPE, _randn, _step, index_inputs
from tests.harness.compat_calls import _reorder_c4, compress_cases, mxfp4_workspace_gather

Pair = tuple[Callable[[], object], Callable[[], object]]

PAGE_ROWS = ts41.PAGE_ROWS  # rows of a page of tokenspeed's V4.1 fields
CODEC_FORMATS = ("swa", "global", "index", "swa_v4")  # cache_format with a native write and read
READ_ONLY_FORMATS = ("index_v4",)  # tokenspeed's Hopper row: a native read only
SWA_FMT = {"swa": "fp8_ds_mla_v41", "swa_v4": "fp8_ds_mla"}  # swa_rope_scatter's cache_format -> kvformats fmt


def _v41_layout(cache_format: str, page_size: int, read: bool):
    """The kvformats layout of ``cache_format``'s rows, built as an engine builds it."""
    spec = ts41.CACHE_FORMATS[cache_format]
    profile = spec.read if read or spec.write is None else spec.write
    return get_format(spec.fmt, page_size=page_size, profile=profile, **spec.params)


def _v41_codec_pairs(rows: int, device, g, written: dict) -> dict[str, Pair]:
    pairs: dict[str, Pair] = {}
    pages = -(-rows // PAGE_ROWS) + 2  # page 0 (tokenspeed's null page) stays unwritten
    order = torch.arange(rows, device=device)
    slots = (PAGE_ROWS + torch.randperm((pages - 1) * PAGE_ROWS, generator=g)[:rows]).to(device)
    for fmt in (*CODEC_FORMATS, *READ_ONLY_FORMATS):
        spec = ts41.CACHE_FORMATS[fmt]
        x = _randn(device, rows, spec.dim, dtype=torch.bfloat16)
        field = torch.randint(0, 256, (pages, PAGE_ROWS, spec.row_bytes), generator=g, dtype=torch.uint8).to(device)
        cache_2d = field.view(pages, PAGE_ROWS * spec.row_bytes)  # the native cache: the same bytes
        read1, read64 = _v41_layout(fmt, 1, True), _v41_layout(fmt, PAGE_ROWS, True)
        packed = torch.empty((rows, spec.row_bytes), dtype=torch.uint8, device=device)
        if spec.write is not None:
            write1, write64 = _v41_layout(fmt, 1, False), _v41_layout(fmt, PAGE_ROWS, False)
            write1.encode(x, packed, order)  # valid packed rows to unpack
            write64.encode(x, cache_2d, slots)  # and valid cache rows to gather
            pack_out = torch.empty_like(packed)
            pairs[f"dsv41.cache_pack.{fmt}"] = (
                lambda w=write1, x=x, o=pack_out: w.encode(x, o, order),
                lambda x=x, f=fmt, o=pack_out: ts41.cache_pack(x, f, o))
            written[f"dsv41.cache_pack.{fmt}"] = (pack_out,)
            pairs[f"dsv41.cache_scatter.{fmt}"] = (
                lambda w=write64, x=x, c=cache_2d: w.encode(x, c, slots),
                lambda x=x, c=field, f=fmt: ts41.cache_scatter(x, c, slots, f))
            written[f"dsv41.cache_scatter.{fmt}"] = (field,)
        else:  # index_v4: tokenspeed's row, as the drop-in packs it
            packed.copy_(ts41.index_v4_rows(x))
            ts41.cache_scatter(x, field, slots, fmt)
        out = torch.empty((rows, spec.dim), dtype=torch.bfloat16, device=device)
        pairs[f"dsv41.cache_unpack.{fmt}"] = (
            lambda r=read1, p=packed, o=out: o.copy_(r.decode(p, order)),
            lambda p=packed, f=fmt, o=out: ts41.cache_unpack(p, f, o))
        pairs[f"dsv41.cache_gather.{fmt}"] = (
            lambda r=read64, c=cache_2d, o=out: o.copy_(r.decode(c, slots)),
            lambda c=field, f=fmt, o=out: ts41.cache_gather(c, slots, f, o))
        written[f"dsv41.cache_unpack.{fmt}"] = written[f"dsv41.cache_gather.{fmt}"] = (out,)
    return pairs


def _v41_model_pairs(rows: int, device, g, written: dict) -> dict[str, Pair]:
    pairs: dict[str, Pair] = {}
    s = _step(rows, g)
    pos = s["pos"].to(device)
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    pages = -(-rows // PAGE_ROWS) + 2
    slots = (PAGE_ROWS + torch.randperm((pages - 1) * PAGE_ROWS, generator=g)[:rows]).to(device)
    values = _randn(device, rows, HEAD, dtype=torch.bfloat16)
    for fmt, native_fmt in SWA_FMT.items():
        spec = ts41.CACHE_FORMATS[fmt]
        field = torch.zeros((pages, PAGE_ROWS, spec.row_bytes), dtype=torch.uint8, device=device)
        cache_2d = field.view(pages, PAGE_ROWS * spec.row_bytes)
        out = torch.empty((rows, HEAD), dtype=torch.bfloat16, device=device)
        pairs[f"dsv41.swa_rope_scatter.{fmt}"] = (
            lambda c=cache_2d, nf=native_fmt, o=out: v41.swa_rope_scatter(values, pos, cs, c, slots, fmt=nf,
                                                                          page_size=PAGE_ROWS, out=o),
            lambda c=field, f=fmt, o=out: ts41.swa_rope_scatter(values, pos, cs, c, slots, f, o))
        written[f"dsv41.swa_rope_scatter.{fmt}"] = (field, out)
    q = _randn(device, rows, HEADS, INDEX_HEAD, dtype=torch.bfloat16)
    for fmt, native_fmt in (("index", "mxfp4_indexer"), ("index_v4", "fp8_indexer")):
        out = torch.empty_like(q)
        pairs[f"dsv41.index_q_quantize.{fmt}"] = (
            lambda nf=native_fmt, o=out: v41.index_q_quantize(q, fmt=nf, out=o),
            lambda f=fmt, o=out: ts41.index_q_quantize(q, f, o))
        written[f"dsv41.index_q_quantize.{fmt}"] = (out,)
    # the V4.1 compressor: tokenspeed's tail field [pages, 2, 2, 512], a decode step pooling
    # each token with its tail row
    width = v41.compressor.WIDTH
    tail_pages = rows + 1
    content, scores = _randn(device, rows, width), _randn(device, rows, width)
    tail = _randn(device, tail_pages, 2, 2, width)
    tail_slots = (2 + torch.randperm((tail_pages - 1) * 2, generator=g)[:rows]).to(device)
    pairs["dsv41.compressor_tail_scatter"] = (
        lambda: v41.compressor_tail_scatter(content, scores, tail, slots=tail_slots),
        lambda: ts41.compressor_tail_scatter(content, scores, tail, tail_slots))
    written["dsv41.compressor_tail_scatter"] = (tail,)
    previous = torch.full((rows,), -1, dtype=torch.int64, device=device)
    active = (torch.rand(rows, generator=g) < 0.9).to(device)
    weight = (torch.rand(width, generator=g) + 0.5).to(device)
    pooled = torch.empty((rows, width), dtype=torch.float32, device=device)
    normed = torch.empty((rows, width), dtype=torch.bfloat16, device=device)
    pairs["dsv41.compressor_pool"] = (
        lambda: v41.compressor_pool(content, scores, tail, previous=previous, tail_slots=tail_slots, active=active,
                                    out=pooled),
        lambda: ts41.compressor_pool(content, scores, previous, tail, tail_slots, active, pooled, None, 1e-6))
    pairs["dsv41.compressor_pool.norm"] = (
        lambda: v41.compressor_pool(content, scores, tail, previous=previous, tail_slots=tail_slots, active=active,
                                    norm_weight=weight, norm_eps=1e-6, out=normed),
        lambda: ts41.compressor_pool(content, scores, previous, tail, tail_slots, active, normed, weight, 1e-6))
    written["dsv41.compressor_pool"] = (pooled,)
    written["dsv41.compressor_pool.norm"] = (normed,)
    return pairs



# ----- DeepSeek V4 (tokenspeed_kernel.ops.attention.dsv4) ------------------------------------------
def _v4_compress_pairs(rows: int, device, g, s, written: dict) -> dict[str, Pair]:
    """The compress inserts and the state save of one step (compat_calls' inputs)."""
    pairs: dict[str, Pair] = {}
    for c in compress_cases(device, g, s):
        label, ratio, rows_pp, fmt, tps = c["label"], c["ratio"], c["rows_pp"], c["fmt"], c["tps"]
        state_lay, state, lay, cache, weight, cs, t, common = (c[k] for k in (
            "state_lay", "state", "lay", "cache", "weight", "cs", "t", "common"))
        kw = dict(state_cache=state, token_to_req_indices=t["req"], positions=t["pos"],
                  compressor_slot_mapping=t["ss"], block_table=t["table"], compressor_block_size=rows_pp,
                  rms_norm_weight=weight, rms_norm_eps=1e-6, cos_sin_cache=cs, kv_cache_2d=cache,
                  kv_slot_mapping=t["target"], kv_cache_block_size=tps, compress_ratio=ratio,
                  block_table_base_offsets=t["base"])
        if fmt == "fp8_ds_mla":
            name = f"dsv4.dsv4_fused_sparse_compress_cache_insert.{label}"
            pairs[name] = (
                lambda state=state, cache=cache, ratio=ratio, common=common, t=t, tps=tps: dsv4.compress_kv_insert(
                    state, cache, ratio=ratio, kv_slots=t["target"], kv_page_size=tps, **common),
                lambda kw=kw, overlap=ratio == 4: ts4.dsv4_fused_sparse_compress_cache_insert(
                    **kw, overlap=overlap, kv_write_mask=None))
            written[name] = (cache,)
        else:
            def native(state=state, cache=cache, lay=lay, common=common, t=t):
                return dsv4.indexer_compress_insert(state, cache, index_format=lay.name, index_slots=t["target"],
                                                    index_page_size=PAGE, **common)
            if fmt == "mxfp4":
                drop_ins = {"dsv4.dsv4_fused_csa_indexer_mxfp4_cache_insert":
                            lambda kw=kw: ts4.dsv4_fused_csa_indexer_mxfp4_cache_insert(**kw)}
            else:
                args = tuple(kw.values())
                drop_ins = {"dsv4.dsv4_csa_indexer_fp8_cache_insert":
                            lambda a=args: ts4.dsv4_csa_indexer_fp8_cache_insert(*a),
                            "dsv4.triton_dsv4_csa_indexer_fp8_cache_insert":
                            lambda kw=kw: ts4.triton_dsv4_csa_indexer_fp8_cache_insert(**kw)}
            for name, drop_in in drop_ins.items():
                pairs[name] = (native, drop_in)
                written[name] = (cache,)
        if label == "csa":
            w = state_lay.width
            kv, score, ape = _randn(device, rows, w), _randn(device, rows, w), _randn(device, 4, w)
            runtime_ape = _reorder_c4(ape)
            pairs["dsv4.dsv4_save_compressor_state"] = (
                lambda kv=kv, score=score, ape=ape, state=state, t=t: dsv4.save_compressor_state(
                    kv, score, ape, state, ratio=4, positions=t["pos"], slots=t["ss"]),
                lambda kv=kv, score=score, ape=runtime_ape, state=state, t=t: ts4.dsv4_save_compressor_state(
                    kv, score, ape, state, t["ss"], t["pos"], 4, 4))
            written["dsv4.dsv4_save_compressor_state"] = (state,)
    return pairs


def _v4_cache_pairs(rows: int, device, g, s, written: dict) -> dict[str, Pair]:
    """The SWA insert, the MXFP4 indexer writer and gather, the indexer query (compat_calls' inputs)."""
    pairs: dict[str, Pair] = {}
    pos = s["pos"].to(device)
    cs = cos_sin_cache(ROPE, int(s["seq"].max()) + 1).to(device)
    ds = Fp8DsMla(head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)
    pages = -(-rows // PAGE) + 1
    swa = ds.allocate(pages, device=device)
    slots = torch.randperm(pages * PAGE, generator=g)[:rows].to(device)
    q = _randn(device, rows, HEADS, HEAD, dtype=torch.bfloat16)
    kv = _randn(device, rows, HEAD, dtype=torch.bfloat16)
    native = lambda: dsv4.swa_insert(q, kv, swa, slots, pos, cs, 1e-6, page_size=PAGE)  # noqa: E731
    pairs["dsv4.dsv4_swa_cache_insert"] = (
        native, lambda: ts4.dsv4_swa_cache_insert(q, kv, swa, slots, pos, cs, 1e-6, PAGE, validate_positions=True))
    pairs["dsv4.triton_dsv4_swa_cache_insert"] = (
        native, lambda: ts4.triton_dsv4_swa_cache_insert(q, kv, swa, slots, pos, cs, 1e-6, PAGE))
    written["dsv4.dsv4_swa_cache_insert"] = written["dsv4.triton_dsv4_swa_cache_insert"] = (swa, q)
    x = _randn(device, rows, INDEX_HEAD, dtype=torch.bfloat16)
    mx = Mxfp4Indexer(head_dim=INDEX_HEAD, page_size=PAGE)
    mcache = mx.allocate(pages, device=device)
    valid = torch.ones(rows, dtype=torch.bool, device=device)
    pairs["dsv4.write_dsv4_indexer_mxfp4_cache_cuda"] = (
        lambda: mx.encode(x, mcache, slots),
        lambda: ts4.write_dsv4_indexer_mxfp4_cache_cuda(x, mcache, slots, valid, PAGE))
    written["dsv4.write_dsv4_indexer_mxfp4_cache_cuda"] = (mcache,)
    values, scales, gather_native = mxfp4_workspace_gather(mx, mcache, slots, rows, device)
    pairs["dsv4.dsv4_gather_indexer_mxfp4_cache"] = (gather_native, lambda: ts4.dsv4_gather_indexer_mxfp4_cache(
        cache_2d=mcache, slot_mapping=slots, values_out=values, scales_out=scales, block_size=PAGE))
    written["dsv4.dsv4_gather_indexer_mxfp4_cache"] = (values, scales)
    iq = _randn(device, rows, HEADS, INDEX_HEAD, dtype=torch.bfloat16)
    w = _randn(device, rows, HEADS)
    sm, hs = INDEX_HEAD ** -0.5, HEADS ** -0.5
    pairs["dsv4.dsv4_fused_indexer_q_rope_hadamard_mxfp4"] = (
        lambda: dsv4.prepare_indexer_q_mxfp4(iq, pos, cs, w, sm, hs),
        lambda: ts4.dsv4_fused_indexer_q_rope_hadamard_mxfp4(index_q=iq, positions=pos, cos_sin_cache=cs, weights=w,
                                                             softmax_scale=sm, head_scale=hs,
                                                             prefer_serial_four_block=False))
    return pairs


def _v4_index_pairs(rows: int, device, g, s, written: dict, topk: int = 512) -> dict[str, Pair]:
    """The slot mappings, the top-k mapping, the dense prefill indices and the sparse-prefill
    gather (compat_calls' index inputs)."""
    requests = s["qlen"].shape[0]
    d, cb, out_slots, _, _ = index_inputs(rows, device, g, s, topk)
    comp = d["comp"]
    ds = Fp8DsMla(head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)
    kcache = ds.allocate(int(comp.numel()), device=device)
    per = min(int(s["seq"].max()), 256)
    gout = torch.empty((requests, per, HEAD), dtype=torch.bfloat16, device=device)
    gl = d["seq"].clamp_max(per)
    out_local = torch.empty((rows, 512), dtype=torch.int32, device=device)
    written["dsv4.dsv4_compact_compressed_slot_mapping"] = (out_slots,)
    written["dsv4.dsv4_dequantize_and_gather_k_cache"] = (gout,)
    written["dsv4.dsv4_build_dense_prefill_local_compressed_indices"] = (out_local,)
    return {
        "dsv4.dsv4_group_slot_mapping.swa": (
            lambda: dsv4.table_slot_mapping(positions=d["pos"], req_indices=d["req"], block_table=d["swa"],
                                            page_size=PAGE, block_table_base_offsets=d["base"]),
            lambda: ts4.dsv4_group_slot_mapping(positions=d["pos"], req_indices=d["req"], block_table=d["swa"],
                                                rows_per_block=PAGE, entry_stride_tokens=1, base_offsets=d["base"],
                                                is_valid_token=None)),
        "dsv4.dsv4_group_slot_mapping.compressed": (
            lambda: dsv4.table_slot_mapping(positions=d["pos"], req_indices=d["req"], block_table=comp,
                                            page_size=PAGE, entry_stride=4),
            lambda: ts4.dsv4_group_slot_mapping(positions=d["pos"], req_indices=d["req"], block_table=comp,
                                                rows_per_block=PAGE, entry_stride_tokens=4, base_offsets=None,
                                                is_valid_token=None)),
        "dsv4.dsv4_compact_compressed_slot_mapping": (
            lambda: dsv4.compressed_slot_mapping(num_tokens=rows, query_start_loc=d["qsl"], seq_lens=d["seq"],
                                                 block_table=comp, page_size=PAGE, ratio=4, out=out_slots,
                                                 req_indices=d["req"]),
            lambda: ts4.dsv4_compact_compressed_slot_mapping(
                num_tokens=rows, token_to_req_indices=d["req"], query_start_loc=d["qsl"], seq_lens=d["seq"],
                block_table=comp, block_size=PAGE, compress_ratio=4, block_table_base_offsets=None,
                is_valid_token=None, out=out_slots)),
        "dsv4.dsv4_compute_global_topk_indices_and_lens": (
            lambda: dsv4.global_topk_indices_and_lens(topk_indices=d["top"], req_indices=d["req"], block_table=comp,
                                                      page_size=PAGE, lens="scan"),
            lambda: ts4.dsv4_compute_global_topk_indices_and_lens(topk_indices=d["top"],
                                                                  token_to_req_indices=d["req"], block_table=comp,
                                                                  block_size=PAGE)),
        "dsv4.dsv4_build_dense_prefill_local_compressed_indices": (
            lambda: dsv4.dense_prefill_local_compressed_indices(positions=d["pos"], ratio=128, width=512,
                                                                out=out_local),
            lambda: ts4.dsv4_build_dense_prefill_local_compressed_indices(positions=d["pos"], compress_ratio=128,
                                                                          width=512, out=out_local)),
        "dsv4.dsv4_dequantize_and_gather_k_cache": (
            lambda: ds.dequantize_gather(kcache, gout, block_table=comp, seq_lens=d["seq"], gather_lens=gl),
            lambda: ts4.dsv4_dequantize_and_gather_k_cache(out=gout, cache_2d=kcache, seq_lens=d["seq"],
                                                           gather_lens=gl, block_table=comp, block_size=PAGE,
                                                           offset=0)),
    }


def kernel_call_pairs(device, rows: int = 64, seed: int = 0, written: dict | None = None) -> dict[str, Pair]:
    """Name -> (native kvformats call, tokenspeed-kernel drop-in call) on the same inputs (module
    doc). ``written``: a dict that receives, per name, the tensors the calls write in place."""
    written = {} if written is None else written
    g = torch.Generator().manual_seed(seed)
    pairs = _v41_codec_pairs(rows, device, g, written)
    pairs.update(_v41_model_pairs(rows, device, g, written))
    s = _step(rows, g)
    pairs.update(_v4_compress_pairs(rows, device, g, s, written))
    pairs.update(_v4_cache_pairs(rows, device, g, s, written))
    pairs.update(_v4_index_pairs(rows, device, g, s, written))
    return pairs

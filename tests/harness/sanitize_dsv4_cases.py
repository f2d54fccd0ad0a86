"""The deepseek_v4 calls of tools/sanitize_driver.py: every public operation, on the paged
batches of tests/harness/dsv4_scenarios.py (missing pages, −1 slots, base offsets) and
sentinel-filled target caches, built on the driver's device (``d.t``, ``d.randn``, ``d.cache``)."""

from __future__ import annotations

import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4


def _batch(d, ratio: int, head_dim: int, target_ps: int, **kw):
    """A dsv4_scenarios paged batch (missing pages, −1 slots, base offsets) on the driver's device."""
    import attrs
    from tests.harness.dsv4_scenarios import make_batch

    b = make_batch(ratio, head_dim, target_ps, **kw)
    return attrs.evolve(b, **{f.name: getattr(b, f.name).to(d.device) for f in attrs.fields(type(b))
                              if isinstance(getattr(b, f.name), torch.Tensor)})


def _csa(d):
    return _batch(d, 4, 128, 4)


def _hca(d):
    return _batch(d, 128, 128, 2, seq_lens=(130, 20), new_tokens=(6, 4), base=(0, 0), missing=())


def _compress(d, ratio: int, beyond: bool = False) -> dict:
    b = _csa(d) if ratio == 4 else _hca(d)
    layout = kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4 if ratio == 4 else 2)
    cache = d.cache(layout, b.target_table.numel(), pad=64)
    kw = b.kwargs()
    if beyond:  # check=False: a target slot beyond the cache must be skipped
        kw["kv_slots"] = kw["kv_slots"].clone()
        kw["kv_slots"][-1] = cache.shape[0] * layout.page_size + 7
    return dict(state_cache=b.state, kv_cache=cache, ratio=ratio, kv_page_size=layout.page_size, check=not beyond,
                **kw)


def _index(d, fmt: str) -> dict:
    b = _csa(d)
    cache = d.cache(kvf.get_format(fmt, head_dim=128, page_size=4), b.target_table.numel(), pad=64)
    return dict(state_cache=b.state, index_cache=cache, index_format=fmt, index_page_size=4, **b.kwargs("index_slots"))


def _save(d, how: str) -> dict:
    b = _csa(d)
    w = kvf.CompressorState(head_dim=128, ratio=4, page_size=4).width
    kw = dict(kv=d.randn(5, w), score=d.randn(5, w), ape=d.randn(4, w), state_cache=b.state, ratio=4,
              positions=b.positions[:5])
    if how == "table":
        return dict(kw, req_indices=b.req[:5], block_table=b.state_table, block_table_base_offsets=b.base)
    slots = b.state_slots[:5].clone()
    if how == "beyond":
        slots[1] = b.state.shape[0] * b.state.shape[1] + 3
        return dict(kw, slots=slots, check=False)
    return dict(kw, slots=slots)


def _swa(d, dtype) -> dict:
    return dict(q=d.randn(4, 2, 512, dtype=dtype), kv=d.randn(4, 512, dtype=dtype), kv_cache=d.cache(kvf.Fp8DsMla(), 2),
                slots=d.t([0, 70, -1, 500]), positions=d.t([5, 64, 3, 9]),
                cos_sin_cache=dsv4.cos_sin_cache(64, 80).to(d.device), rms_eps=1e-6)


def _q(d, fp8: bool) -> dict:
    w = d.randn(3, 4) if fp8 else d.randn(3, 4, 1)
    return dict(index_q=d.randn(3, 4, 128, dtype=torch.bfloat16), positions=d.t([0, 17, 63]),
                cos_sin_cache=dsv4.cos_sin_cache(64, 64).to(d.device), weights=w, softmax_scale=128 ** -0.5,
                head_scale=0.5)


def _pool(d, ratio: int) -> dict:
    b = _csa(d) if ratio == 4 else _hca(d)
    return dict(state_cache=b.state, ratio=ratio, positions=b.positions, req_indices=b.req, block_table=b.state_table,
                rms_weight=b.weight, rms_eps=b.eps, block_table_base_offsets=b.base)


def dsv4_cases(d) -> list[tuple[str, str, object]]:
    """(label, operation, builder of its keyword arguments) for every deepseek_v4 operation; the
    first case of each operation is the one ``--quick`` keeps."""
    t = d.t
    table = lambda: t([[3, 1, -1, 5], [0, 2, 4, 6]])  # noqa: E731
    valid = lambda: t([True, True, False, True], torch.bool)  # noqa: E731
    cs = lambda n: dsv4.cos_sin_cache(64, n).to(d.device)  # noqa: E731
    cases = [
        ("hadamard", "hadamard_transform", lambda: dict(x=d.randn(3, 2, 64))),
        ("hadamard fp16 scale", "hadamard_transform", lambda: dict(x=d.randn(3, 128, dtype=torch.float16), scale=0.25)),
        ("pool csa", "pool_compressor_state", lambda: _pool(d, 4)),
        ("pool hca", "pool_compressor_state", lambda: _pool(d, 128)),
        ("save slots", "save_compressor_state", lambda: _save(d, "slots")),
        ("save table", "save_compressor_state", lambda: _save(d, "table")),
        ("save beyond check=False", "save_compressor_state", lambda: _save(d, "beyond")),
        ("compress csa", "compress_kv_insert", lambda: _compress(d, 4)),
        ("compress hca", "compress_kv_insert", lambda: _compress(d, 128)),
        ("compress csa beyond check=False", "compress_kv_insert", lambda: _compress(d, 4, beyond=True)),
        ("indexer mxfp4", "indexer_compress_insert", lambda: _index(d, "mxfp4_indexer")),
        ("indexer fp8", "indexer_compress_insert", lambda: _index(d, "fp8_indexer")),
        ("swa bf16", "swa_insert", lambda: _swa(d, torch.bfloat16)),
        ("swa fp32", "swa_insert", lambda: _swa(d, torch.float32)),
        ("q mxfp4", "prepare_indexer_q_mxfp4", lambda: _q(d, fp8=False)),
        ("q fp8", "prepare_indexer_q_fp8", lambda: _q(d, fp8=True)),
        ("inv_rope tma", "inv_rope_fp8_quant", lambda: dict(
            o=d.randn(5, 4, 512, dtype=torch.bfloat16), positions=t([0, 3, 7, 1, 9]), cos_sin_cache=cs(10),
            n_groups=2, heads_per_group=2)),
        ("inv_rope f32 scales", "inv_rope_fp8_quant", lambda: dict(
            o=d.randn(3, 2, 256), positions=t([0, 3, 7]), cos_sin_cache=cs(10), n_groups=1, heads_per_group=2,
            quant_group_size=64, tma_aligned_scales=False)),
        ("table_slot_mapping", "table_slot_mapping", lambda: dict(
            positions=t([0, 5, 9, 13]), req_indices=t([0, 1, 1, 0]), block_table=table(), page_size=4,
            entry_stride=2, block_table_base_offsets=t([0, 1]), is_valid_token=valid())),
        ("compressed_slot_mapping", "compressed_slot_mapping", lambda: dict(
            num_tokens=8, query_start_loc=t([0, 5, 8]), seq_lens=t([9, 3]), block_table=table(), page_size=2,
            ratio=2, block_table_base_offsets=t([0, 1]))),
        ("global_topk", "global_topk_indices_and_lens", lambda: dict(
            topk_indices=t([[0, 3, -1], [5, 1, 7], [2, -1, -1], [9, 0, 4]], torch.int32),
            req_indices=t([0, 1, 1, 0]), block_table=table(), page_size=2, is_valid_token=valid())),
        ("combine_topk", "combine_topk_swa_indices", lambda: dict(
            topk_indices=(torch.arange(32, dtype=torch.int32).reshape(8, 4) % 5 - 1).to(d.device),
            query_start_loc=t([0, 5, 8]), seq_lens=t([9, 3]), gather_lens=t([7, 3]), window_size=3, ratio=2,
            topk=4, workspace_width=300, compressed_base=150)),
        ("combine_dense", "combine_dense_swa_indices", lambda: dict(
            positions=t([4, 8, 1, 2]), req_indices=t([0, 0, 1, 2]), seq_lens=t([9, 3]), compressed_lens=t([4, 1]),
            gather_lens=t([9, 2]), window_size=3, ratio=2, workspace_width=200, compressed_base=100)),
        ("decode_swa", "decode_swa_indices_and_lens", lambda: dict(
            query_start_loc=t([0, 1, 2]), seq_lens=t([9, 3]), req_indices=t([0, 1]), block_table=table(),
            window_size=4, page_size=2, block_table_base_offsets=t([1, 0]),
            is_valid_token=t([True, False], torch.bool))),
        ("dense_prefill", "dense_prefill_local_compressed_indices", lambda: dict(
            positions=t([0, 5, 9, 13]), ratio=4, width=3)),
    ]
    if d.quick:
        seen, kept = set(), []
        for case in cases:
            if case[1] not in seen:
                seen.add(case[1])
                kept.append(case)
        return kept
    return cases

"""Paged ops (dequantize_gather, gather_paged, decode_topk) against plain Python loops that
address rows slot by slot, for every format they apply to."""

import pytest
import torch

import kvformats as kvf

SENTINEL = 7.0


def filled(layout, pages, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = layout.allocate(pages, page_stride=layout.page_bytes + 24)
    n = pages * layout.page_size
    layout.encode(torch.randn(n, layout.head_dim, generator=g), cache, torch.randperm(n, generator=g))
    return cache, g


def loop_slot(layout, cache, table, r, pos, base=0):
    """The slot of position pos of request r, or -1: one scalar at a time."""
    if pos < 0:
        return -1
    pidx = pos // layout.page_size - base
    if not 0 <= pidx < table.shape[1]:
        return -1
    entry = int(table[r, pidx])
    if entry < 0 or entry >= cache.shape[0]:
        return -1
    return entry * layout.page_size + pos % layout.page_size


LAYOUTS = [kvf.Fp8DsMla(page_size=4), kvf.Fp8Indexer(page_size=4), kvf.Mxfp4Indexer(page_size=8)]
# ... and every other registered format whose rows decode to one tensor, at its declared small
# parameters (Layout.examples.small_params, Layout.paged_reads)
LAYOUTS += [kvf.get_format(name, **type(kvf.get_format(name)).examples.small_params) for name in kvf.list_formats()
            if kvf.get_format(name).paged_reads and name not in {lay.name for lay in LAYOUTS}]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.name)
@pytest.mark.parametrize("strided_table", [False, True])
def test_dequantize_gather_matches_a_loop(layout, strided_table):
    cache, g = filled(layout, pages=6)
    requests, width, offset = 3, 12, 2
    table = torch.randint(-1, 7, (requests, 10), generator=g)  # -1 holes and entries beyond the cache
    if strided_table:
        table = torch.randint(-1, 7, (10, requests), generator=g).t()  # non-contiguous rows
    seq_lens = torch.tensor([9, 30, 4])
    gather_lens = torch.tensor([6, 10, 0])
    base = torch.tensor([0, 3, 1])
    out = torch.full((requests, width, layout.head_dim), SENTINEL, dtype=layout.decode_dtype)
    layout.dequantize_gather(cache, out, block_table=table, seq_lens=seq_lens, gather_lens=gather_lens,
                             block_table_base_offsets=base, offset=offset)
    for b in range(requests):
        for j in range(width):
            i = j - offset
            if i < 0 or i >= int(gather_lens[b]):
                assert bool((out[b, j] == SENTINEL).all()), (b, j)  # untouched
                continue
            slot = loop_slot(layout, cache, table, b, int(seq_lens[b] - gather_lens[b]) + i, int(base[b]))
            want = layout.decode(cache, torch.tensor([slot]))[0]
            assert torch.equal(out[b, j], want), (b, j, slot)


def test_dequantize_gather_defaults_to_whole_sequences():
    layout = kvf.Fp8DsMla(page_size=4)
    cache, _ = filled(layout, pages=4)
    table = torch.tensor([[3, 1], [0, 2]])
    out = torch.zeros((2, 8, 512), dtype=torch.bfloat16)
    layout.dequantize_gather(cache, out, block_table=table, seq_lens=torch.tensor([8, 5]))
    want = layout.decode(cache, torch.tensor([12, 13, 14, 15, 4, 5, 6, 7]))
    assert torch.equal(out[0], want)
    assert torch.equal(out[1, :5], layout.decode(cache, torch.tensor([0, 1, 2, 3, 8])))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.name)
def test_gather_paged_matches_a_loop(layout):
    cache, g = filled(layout, pages=6)
    table = torch.randint(-1, 7, (3, 4), generator=g)
    cu = torch.tensor([0, 5, 5, 17])
    workspaces = layout.gather_paged(cache, block_table=table, cu_seq_lens=cu)  # one per segment
    assert [tuple(w.shape) for w in workspaces] == [(17, s.record_bytes) for s in layout.segments]
    rows = torch.cat(workspaces, dim=1)
    for t in range(17):
        r = int(torch.searchsorted(cu[1:], torch.tensor(t), right=True))
        slot = loop_slot(layout, cache, table, r, t - int(cu[r]))
        assert torch.equal(rows[t], layout.gather(cache, torch.tensor([slot]))[0]), t


def test_gather_paged_into_workspaces_leaves_the_tail_untouched():
    layout = kvf.Mxfp4Indexer(page_size=4)
    cache, _ = filled(layout, pages=3)
    values = torch.full((10, 64), 0xCC, dtype=torch.uint8)
    scales = torch.full((10,), -1, dtype=torch.int32)  # DeepGEMM's packed ue8m0 word per row
    layout.gather_paged(cache, block_table=torch.tensor([[2, 0]]), cu_seq_lens=torch.tensor([0, 6]),
                        out=(values, scales))
    want = layout.gather(cache, torch.tensor([8, 9, 10, 11, 0, 1]))
    assert torch.equal(values[:6], want[:, :64])
    assert torch.equal(scales[:6], want[:, 64:].contiguous().view(torch.int32).squeeze(1))
    assert bool((values[6:] == 0xCC).all()) and bool((scales[6:] == -1).all())


@pytest.mark.parametrize("name", kvf.list_formats())
def test_decode_topk_is_decode_reshaped(name):
    layout = kvf.get_format(name, **type(kvf.get_format(name)).examples.small_params)
    cache = layout.allocate(3)
    topk = torch.tensor([[0, -1, 5], [11, 2, -1]])
    got = layout.decode_topk(cache, topk)
    want = layout.decode(cache, topk.reshape(-1))
    if isinstance(want, tuple):
        assert all(torch.equal(g, w.reshape(2, 3, -1)) for g, w in zip(got, want))
    else:
        assert torch.equal(got, want.reshape(2, 3, -1))


@pytest.mark.parametrize("kwargs, error, words", [
    ({"seq_lens": torch.tensor([4.0])}, TypeError, "seq_lens"),
    ({"gather_lens": torch.tensor([9])}, ValueError, "gather_lens"),
    ({"offset": 7}, ValueError, "widen"),
    ({"offset": -1}, ValueError, "offset"),
    ({"block_table": torch.zeros(2, 2, dtype=torch.int64)}, ValueError, "block_table"),
    ({"out": torch.zeros(1, 8, 512)}, TypeError, "bfloat16"),
])
def test_dequantize_gather_bad_input_raises_before_writing(kwargs, error, words):
    layout = kvf.Fp8DsMla(page_size=4)
    cache, _ = filled(layout, pages=2)
    args = {"block_table": torch.tensor([[0, 1]]), "seq_lens": torch.tensor([4]),
            "out": torch.full((1, 8, 512), SENTINEL, dtype=torch.bfloat16)}
    args.update(kwargs)
    out = args.pop("out")
    before, out_before = cache.clone(), out.clone()
    with pytest.raises(error, match=words):
        layout.dequantize_gather(cache, out, **args)
    assert torch.equal(cache, before) and torch.equal(out, out_before)


def test_paged_ops_refuse_a_state_dequantize_and_bad_workspaces():
    state = kvf.CompressorState(head_dim=8, page_size=4)
    with pytest.raises(kvf.LayoutError):
        state.dequantize_gather(state.allocate(1), torch.zeros(1, 4, 8), block_table=torch.tensor([[0]]),
                                seq_lens=torch.tensor([1]))
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(2)
    with pytest.raises(kvf.InputError, match="hold 128"):
        layout.gather_paged(cache, block_table=torch.tensor([[0]]), cu_seq_lens=torch.tensor([0, 2]),
                            out=(torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8)))
    with pytest.raises(kvf.InputError, match="start at 0"):
        layout.gather_paged(cache, block_table=torch.tensor([[0]]), cu_seq_lens=torch.tensor([1, 2]))


# ----- issue 35 items 4 and 8: workspaces whose rows overlap; workspaces that require grad --------
def _overlapping(shape, strides, dtype):
    """A sentinel-filled buffer and a view of it with ``strides`` whose elements overlap."""
    size = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    buf = torch.full((size,), SENTINEL if dtype.is_floating_point else 0xA5, dtype=dtype)
    return buf, buf.as_strided(shape, strides)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_dequantize_gather_refuses_overlapping_rows_before_any_write(backend, routed):
    layout = kvf.Fp8DsMla(page_size=4)
    cache, _ = filled(layout, pages=2)
    table, seq = torch.tensor([[0, 1], [1, 0]]), torch.tensor([5, 6])
    shape = (2, 8, 512)
    cases = [(8 * 512, 0, 1), (8 * 512, 256, 1), (0, 512, 1)]  # row stride 0, shorter than a row, one per request
    for strides in cases:
        buf, out = _overlapping(shape, strides, torch.bfloat16)
        before = buf.clone()
        with pytest.raises(kvf.InputError, match="share memory"):
            layout.dequantize_gather(cache, out, block_table=table, seq_lens=seq, backend=backend)
        assert torch.equal(buf, before)
    one = torch.full((1, 8, 512), SENTINEL, dtype=torch.bfloat16)
    with pytest.raises(kvf.InputError, match="share memory"):  # a workspace expanded over the requests
        layout.dequantize_gather(cache, one.expand(*shape), block_table=table, seq_lens=seq, backend=backend)
    assert torch.all(one == SENTINEL)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gather_paged_refuses_overlapping_rows_before_any_write(backend, routed):
    layout = kvf.Fp8Indexer(page_size=4)
    cache, _ = filled(layout, pages=2)
    table, cu = torch.tensor([[0, 1]]), torch.tensor([0, 6])
    for stride in (0, 64):  # every row at one address; a row stride shorter than a 128-byte row
        vbuf, values = _overlapping((6, 128), (stride, 1), torch.uint8)
        scales = torch.full((6, 4), 0xA5, dtype=torch.uint8)
        before = vbuf.clone()
        with pytest.raises(kvf.InputError, match="values workspace has rows that share memory"):
            layout.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=(values, scales), backend=backend)
        assert torch.equal(vbuf, before) and torch.all(scales == 0xA5)
    values = torch.zeros(6, 128, dtype=torch.uint8)
    with pytest.raises(kvf.InputError, match="scales workspace has rows that share memory"):
        layout.gather_paged(cache, block_table=table, cu_seq_lens=cu,
                            out=(values, torch.zeros(1, dtype=torch.float32).expand(6)), backend=backend)
    assert torch.all(values == 0)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_workspace_that_requires_grad_is_filled_on_every_backend(backend, routed):
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"  # else routed: the interpreter
    layout = kvf.Fp8DsMla(page_size=4)
    cache = filled(layout, pages=2)[0].to(dev)
    args = {"block_table": torch.tensor([[0, 1], [1, 0]], device=dev), "seq_lens": torch.tensor([5, 6], device=dev),
            "offset": 1}
    want = torch.full((2, 8, 512), SENTINEL, dtype=torch.bfloat16, device=dev)
    layout.dequantize_gather(cache, want, backend="reference", **args)
    out = torch.full((2, 8, 512), SENTINEL, dtype=torch.bfloat16, device=dev, requires_grad=True)
    assert layout.dequantize_gather(cache, out, backend=backend, **args) is out
    assert torch.equal(out.detach(), want) and out.requires_grad

"""The check modes and the device error record (kvformats.runtime.deferred): what is checked where,
what a violation records, and that the default path on a GPU never reads a tensor value on the
host (guarded here with meta tensors, whose values cannot be read)."""

from __future__ import annotations

import functools

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.runtime import deferred
from kvformats.testing.strategies import storage_bytes

CPU = torch.device("cpu")
FORMATS = kvf.list_formats()
BYTE_FORMATS = [f for f in FORMATS if f != "compressor_state"]
NO_SITE = 1 << 20  # an id no site has (ids are hashes of the names: asserted below)


def _words():
    return deferred.error_record(CPU).tolist()


# ----- the record ------------------------------------------------------------------------------
def test_the_record_of_a_device_that_is_not_here_is_nothing_or_a_typed_error(monkeypatch):
    # issue 35 item 6: engines call raise_pending() every step; on a CPU-only CI it is a no-op
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only torch
    for device in (None, "cuda", "cuda:0", torch.device("cuda")):
        assert kvf.pending_error(device) is None
        assert kvf.raise_pending(device) is None
    with pytest.raises(kvf.BackendUnavailableError, match="'cuda' is not available: no CUDA device"):
        kvf.error_record("cuda")
    with pytest.raises(kvf.BackendUnavailableError, match="'cuda:0' is not available"):
        kvf.Fp8Indexer(page_size=2).allocate(1, device="cuda:0")
    for bad in (3.5, True, [0]):
        for call in (kvf.pending_error, kvf.raise_pending, kvf.error_record,
                     lambda d: kvf.Fp8Indexer(page_size=2).allocate(1, device=d)):
            with pytest.raises(kvf.InputTypeError, match="device"):
                call(bad)
    assert kvf.Fp8Indexer(page_size=2).allocate(1, device="cpu").device.type == "cpu"


def test_record_where_keeps_the_first_violation_until_read():
    site = deferred.site("decode", "slots")
    deferred.record_where(torch.tensor([False, True, True]), torch.tensor([3, 70, 90]), 64,
                          deferred.Check.SLOT_RANGE, site)
    assert _words()[:6] == [1, int(deferred.Check.SLOT_RANGE), site, 1, 70, 64]
    deferred.record_where(torch.tensor([True]), torch.tensor([5]), 2, deferred.Check.POSITION_RANGE, 0)
    assert _words()[3:5] == [1, 70], "a second violation must not overwrite the first"
    err = kvf.pending_error(CPU)
    assert isinstance(err, kvf.InputError)
    assert "decode: slots[1] = 70 is beyond the cache's capacity of 64 slots" in str(err)
    assert _words() == [0] * deferred.WORDS and kvf.pending_error(CPU) is None


def test_record_where_with_nothing_bad_leaves_the_record_clear():
    deferred.record_where(torch.tensor([False, False]), torch.tensor([1, 2]), 64, deferred.Check.SLOT_RANGE, 0)
    deferred.record_where(torch.zeros(0, dtype=torch.bool), torch.zeros(0), 64, deferred.Check.SLOT_RANGE, 0)
    assert _words() == [0] * deferred.WORDS
    kvf.raise_pending(CPU)  # nothing pending: returns


def test_record_where_takes_a_per_element_bound():
    deferred.record_where(torch.tensor([False, True]), torch.tensor([1, 9]), torch.tensor([4, 5]),
                          deferred.Check.GATHER_LEN, deferred.site("dequantize_gather", "gather_lens"))
    with pytest.raises(kvf.InputError, match=r"gather_lens\[1\] = 9 is not in \[0, seq_lens\[1\]\] = \[0, 5\]"):
        kvf.raise_pending(CPU)


@pytest.mark.parametrize("check", [1, 0, "yes", None, "STRICT"])
def test_check_must_be_true_false_or_strict(check):
    lay = kvf.Fp8Indexer(page_size=4)
    with pytest.raises(kvf.InputTypeError, match="check must be True, False or 'strict'"):
        lay.decode(lay.allocate(1), torch.tensor([0]), check=check)


def test_modes_decide_where_values_are_checked():
    cpu, meta = torch.zeros(1), torch.zeros(1, device="meta")
    assert deferred.on_host(True, cpu) and deferred.on_host("strict", cpu) and not deferred.on_host(False, cpu)
    assert not deferred.on_host(True, meta) and deferred.on_host("strict", meta)
    with kvf.strict_checks():
        assert deferred.on_host(True, meta)
    assert not deferred.on_host(True, meta)


# ----- the default GPU path on CPU tensors (device_mode) ----------------------------------------
def _filled(lay, pages=2):
    cache = lay.allocate(pages)
    storage_bytes(cache).fill_(0xA5)
    return cache


def _rows(lay, n):
    if isinstance(lay, kvf.CompressorState):
        w = lay.width
        return (torch.ones(n, w), torch.ones(n, w)), {"positions": torch.arange(n), "ape": torch.zeros(lay.ratio, w)}
    if isinstance(lay, kvf.CompressorStateV41):
        return (torch.ones(n, lay.width), torch.ones(n, lay.width)), {}
    return torch.ones(n, lay.head_dim, dtype=torch.bfloat16), {}


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_beyond_capacity_is_skipped_and_recorded(fmt, device_mode):
    lay = kvf.get_format(fmt, page_size=4)
    cache = _filled(lay)
    before = storage_bytes(cache).clone()
    x, kw = _rows(lay, 3)
    lay.encode(x, cache, torch.tensor([1, 8, 9]), backend="reference", **kw)
    with pytest.raises(kvf.InputError, match=r"encode: slots\[1\] = 8 is beyond the cache's capacity of 8 slots"):
        kvf.raise_pending(CPU)
    written = lay.gather(cache, torch.tensor([1]), backend="reference")
    expect = _filled(lay)
    lay.encode(x, expect, torch.tensor([1, -1, -1]), backend="reference", **kw)
    assert torch.equal(storage_bytes(cache), storage_bytes(expect)), "only slot 1 may change"
    assert not torch.equal(storage_bytes(cache), before) and written.shape[0] == 1


@pytest.mark.parametrize("op", ["decode", "gather"])
def test_reads_beyond_capacity_give_zero_rows_and_record(op, device_mode):
    lay = kvf.Fp8DsMla(page_size=4)
    cache = _filled(lay)
    rows = getattr(lay, op)(cache, torch.tensor([0, 99]), backend="reference")
    assert not rows[1].any()
    with pytest.raises(kvf.InputError, match=rf"{op}: slots\[1\] = 99"):
        kvf.raise_pending(CPU)


def test_decode_topk_records_the_flat_index(device_mode):
    lay = kvf.Fp8Indexer(page_size=4)
    lay.decode_topk(_filled(lay), torch.tensor([[0, -1], [3, 12]]), backend="reference")
    with pytest.raises(kvf.InputError, match=r"decode_topk: topk_slots\[3\] = 12"):
        kvf.raise_pending(CPU)


def test_dequantize_gather_records_bad_lengths(device_mode):
    lay = kvf.Fp8DsMla(page_size=4)
    cache = _filled(lay)
    out = torch.full((2, 4, lay.head_dim), 7.0, dtype=torch.bfloat16)
    table = torch.tensor([[0, 1], [1, 0]])
    lay.dequantize_gather(cache, out, block_table=table, seq_lens=torch.tensor([3, 4]),
                          gather_lens=torch.tensor([2, 6]), backend="reference")
    assert (out[1] == 7).all(), "a request with an invalid gather_len writes no rows"
    with pytest.raises(kvf.InputError, match=r"gather_lens\[1\] = 6 is not in \[0, seq_lens\[1\]\]"):
        kvf.raise_pending(CPU)


def test_gather_paged_records_decreasing_cu(device_mode):
    lay = kvf.Mxfp4Indexer(page_size=4)
    out = (torch.zeros(6, 64, dtype=torch.uint8), torch.zeros(6, 4, dtype=torch.uint8))
    lay.gather_paged(_filled(lay), block_table=torch.tensor([[0], [1]]), cu_seq_lens=torch.tensor([0, 5, 3]),
                     out=out, backend="reference")
    with pytest.raises(kvf.InputError, match=r"cu_seq_lens\[2\] = 3 after 5"):
        kvf.raise_pending(CPU)


def test_gather_paged_records_short_workspaces(device_mode):
    lay = kvf.Fp8Indexer(page_size=4)
    out = (torch.zeros(5, 128, dtype=torch.uint8), torch.zeros(5, 4, dtype=torch.uint8))
    lay.gather_paged(_filled(lay, 3), block_table=torch.tensor([[0, 1, 2]]), cu_seq_lens=torch.tensor([0, 12]),
                     out=out, backend="reference")
    with pytest.raises(kvf.InputError, match=r"cu_seq_lens\[-1\] = 12 rows requested, but the workspaces hold 5"):
        kvf.raise_pending(CPU)


# ----- host mode: CPU default and strict -----------------------------------------------------
def test_gather_paged_refuses_short_workspaces_on_the_host():
    lay = kvf.Fp8Indexer(page_size=4)
    out = (torch.zeros(5, 128, dtype=torch.uint8), torch.zeros(5, 4, dtype=torch.uint8))
    with pytest.raises(kvf.InputError, match="workspaces hold 5"):
        lay.gather_paged(_filled(lay, 3), block_table=torch.tensor([[0, 1, 2]]),
                         cu_seq_lens=torch.tensor([0, 12]), out=out)


def test_gather_paged_checks_cu_before_allocating():
    lay = kvf.Fp8Indexer(page_size=4)
    with pytest.raises(kvf.InputError, match="never decrease"):
        lay.gather_paged(_filled(lay), block_table=torch.tensor([[0], [1]]), cu_seq_lens=torch.tensor([0, 5, -3]))


def test_gather_paged_num_rows_allocates_without_reading_cu():
    lay = kvf.Fp8Indexer(page_size=4)
    values, scales = lay.gather_paged(_filled(lay), block_table=torch.tensor([[0]]), cu_seq_lens=torch.tensor([0, 3]),
                                      num_rows=5)
    assert values.shape == (5, 128) and scales.shape == (5, 4)
    assert (values[3:] == 0).all() and (values[:3] == 0xA5).all()


def test_strict_mode_raises_before_any_write(device_mode):
    lay = kvf.Fp8Indexer(page_size=4)
    cache = _filled(lay)
    before = storage_bytes(cache).clone()
    x, _ = _rows(lay, 2)
    for call in (lambda: lay.encode(x, cache, torch.tensor([0, 8]), check="strict"),
                 lambda: lay.encode(x, cache, torch.tensor([3, 3]), check="strict")):
        with pytest.raises(kvf.InputError):
            call()
    with kvf.strict_checks(), pytest.raises(kvf.InputError, match="beyond the cache's capacity"):
        lay.encode(x, cache, torch.tensor([0, 8]))
    assert torch.equal(storage_bytes(cache), before)
    assert kvf.pending_error(CPU) is None


# ----- no host read on the default GPU path ------------------------------------------------------
class _NoOps:
    """Replace every implementation by a no-op, as a kernel or as the reference."""

    def __init__(self, monkeypatch, kernel: bool):
        self.calls = []

        def fake(*args, **kwargs):
            self.calls.append(args)

        monkeypatch.setattr(registry, "resolve", lambda *a, **k: fake)
        monkeypatch.setattr(registry, "resolve_for", lambda *a, **k: fake)
        monkeypatch.setattr(registry, "is_kernel", lambda fn: kernel)


def _meta_calls(fmt):
    lay = kvf.get_format(fmt, page_size=4)
    meta = torch.device("meta")
    cache = lay.allocate(3).to(meta)
    slots = torch.arange(5, device=meta)
    x, kw = _rows(lay, 5)
    x = tuple(t.to(meta) for t in x) if isinstance(x, tuple) else x.to(meta)
    kw = {k: v.to(meta) for k, v in kw.items()}
    calls = [lambda: lay.encode(x, cache, slots, **kw), lambda: lay.decode(cache, slots),
             lambda: lay.decode_topk(cache, slots.reshape(1, 5))]
    if fmt not in ("compressor_state", "compressor_state_v41"):
        table = torch.zeros(2, 3, dtype=torch.int32, device=meta)
        seq = torch.tensor([3, 5], device=meta)
        out = torch.empty(2, 8, lay.head_dim, dtype=lay.decode_dtype, device=meta)
        ws = tuple(torch.empty(9, s.record_bytes, dtype=torch.uint8, device=meta) for s in lay.segments)
        cu = torch.tensor([0, 4, 9], device=meta)
        calls += [lambda: lay.gather(cache, slots),
                  lambda: lay.dequantize_gather(cache, out, block_table=table, seq_lens=seq),
                  lambda: lay.dequantize_gather(cache, out, block_table=table, seq_lens=seq, gather_lens=seq),
                  lambda: lay.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=ws),
                  lambda: lay.gather_paged(cache, block_table=table, cu_seq_lens=cu, num_rows=9)]
    return calls


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_default_checks_never_read_values_on_the_host(fmt, kernel, monkeypatch):
    """Meta tensors raise on any read of their values (.tolist(), bool(), int()): every public
    op validates them and reaches its implementation, so its default checks read nothing. With
    a reference implementation the violations are recorded by device operations instead."""
    noop = _NoOps(monkeypatch, kernel)
    calls = _meta_calls(fmt)
    for call in calls:
        call()
    assert len(noop.calls) == len(calls)
    with pytest.raises(Exception):  # the guard itself: a host read of a meta tensor raises
        bool(torch.zeros(1, device="meta").any())


def test_rope_tail_off_the_host_leaves_invalid_rows_unrotated_and_records(device_mode):
    from kvformats.deepseek_v4.rope import cos_sin_cache, rope_tail

    cs = cos_sin_cache(64, 16)
    x = torch.randn(3, 128)
    out = rope_tail(x, torch.tensor([2, 40, -1]), cs)
    assert torch.equal(out[1], x[1]) and torch.equal(out[2], x[2])
    assert torch.equal(out[0], rope_tail(x[:1], torch.tensor([2]), cs)[0])
    with pytest.raises(kvf.InputError, match=r"rope_tail: positions\[1\] = 40 is outside \[0, 16\)"):
        kvf.raise_pending(CPU)
    with pytest.raises(kvf.InputError, match=r"positions must lie in \[0, 16\)"):
        rope_tail(x, torch.tensor([2, 40, -1]), cs, check="strict")


@pytest.mark.parametrize("site, error", [(NO_SITE, kvf.InputError), (-1, kvf.InputError),
                                         (deferred.site("encode", "slots"), kvf.InputError),
                                         (float(deferred.site("swa_insert", "positions")), kvf.InputTypeError),
                                         (True, kvf.InputTypeError), ("rope_tail", kvf.InputTypeError)],
                         ids=["unknown", "negative", "slots_site", "float", "bool", "name"])
def test_rope_tail_refuses_a_site_that_is_not_a_positions_site(site, error, device_mode):
    # issue 35 item 5: the site is recorded as given; a bad one broke raise_pending's message
    from kvformats.deepseek_v4.rope import cos_sin_cache, rope_tail

    cs = cos_sin_cache(64, 16)
    with pytest.raises(error, match="site"):
        rope_tail(torch.randn(2, 128), torch.tensor([2, 40]), cs, site=site)
    assert kvf.pending_error(CPU) is None
    out = rope_tail(torch.randn(2, 128), torch.tensor([2, 40]), cs, site=deferred.site("swa_insert", "positions"))
    assert out.shape == (2, 128)
    with pytest.raises(kvf.InputError, match=r"^swa_insert: positions\[1\] = 40"):
        kvf.raise_pending(CPU)


def test_sites_are_allocated_by_the_declarations_and_named_alike_by_their_kernels():
    """The bottom layer holds no table of sites: each declared op allocates its own, and a
    kernel or reference naming a site of a declared op names one the op declared (a typo would
    allocate a site of its own and blame no argument of the op)."""
    pytest.importorskip("triton")
    import kvformats.deepseek_v4  # noqa: F401  (declares its ops)
    import kvformats_kernels.dsv4  # noqa: F401  (names the sites its kernels record at)
    from kvformats.codec.op import DECLARED

    declared = {op.name: op for op in DECLARED.values()}
    assert all(deferred.SITES[i] == (op.name, arg) for op in declared.values() for arg, i in op.sites.items())
    strays = [(name, arg) for name, arg in deferred.SITES.values()
              if name in declared and arg not in declared[name].sites]
    assert strays == []
    assert NO_SITE not in deferred.SITES and all(0 <= i < 2**31 for i in deferred.SITES)


def test_a_site_id_depends_on_its_names_alone():
    """The same id in every process, whatever was imported first (the kernels' SITE constexprs,
    and so what Triton compiles, do not depend on import order)."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    code = ("from kvformats.runtime import deferred; import kvformats_kernels.dsv4; import kvformats.deepseek_v4; "
            "print(deferred.site('swa_insert', 'positions'), deferred.site('encode', 'slots'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == [str(deferred.site("swa_insert", "positions")), str(deferred.site("encode", "slots"))]


@pytest.mark.parametrize("check, where", [(99, 3), (int(deferred.Check.SLOT_RANGE), NO_SITE),
                                          (int(deferred.Check.SLOT_RANGE), -1)])
def test_a_record_that_names_no_known_violation_is_still_reported_once(check, where):
    rec = deferred.error_record(CPU)
    rec.copy_(torch.tensor([1, check, where, 4, 5, 6, 0, 0]))
    err = kvf.pending_error(CPU)
    assert type(err) is kvf.InputError and "unknown kind" in str(err) and "value 5, bound 6" in str(err)
    assert rec.tolist() == [0] * 8 and kvf.pending_error(CPU) is None  # read once, then clear
    rec.copy_(torch.tensor([1, check, where, 4, 5, 6, 0, 0]))
    with pytest.raises(kvf.InputError, match="unknown kind"):
        kvf.raise_pending(CPU)


@pytest.mark.parametrize("op", ["compressed_slot_mapping", "combine_topk_swa_indices", "decode_swa_indices_and_lens"])
def test_decreasing_query_start_loc_is_recorded_off_the_host(op, device_mode):
    from kvformats import deepseek_v4 as dsv4

    qsl, seq = torch.tensor([0, 3, 2]), torch.tensor([8, 9])
    if op == "compressed_slot_mapping":
        call = lambda **kw: dsv4.compressed_slot_mapping(num_tokens=3, query_start_loc=qsl, seq_lens=seq,  # noqa: E731
                                                         block_table=torch.zeros(2, 4, dtype=torch.int32),
                                                         page_size=4, ratio=4, **kw)
    elif op == "decode_swa_indices_and_lens":
        call = lambda **kw: dsv4.decode_swa_indices_and_lens(  # noqa: E731
            query_start_loc=qsl, seq_lens=seq, req_indices=torch.tensor([0, 1, 1]),
            block_table=torch.zeros(2, 4, dtype=torch.int32), window_size=4, page_size=4, **kw)
    else:
        call = lambda **kw: dsv4.combine_topk_swa_indices(  # noqa: E731
            topk_indices=torch.zeros(3, 8, dtype=torch.int32), query_start_loc=qsl, seq_lens=seq,
            gather_lens=seq, window_size=4, ratio=4, topk=8, workspace_width=64, compressed_base=16, **kw)
    call(backend="reference")
    with pytest.raises(kvf.InputError, match=rf"{op}: query_start_loc .*\[2\] = 2 after 3"):
        kvf.raise_pending(CPU)
    with pytest.raises(kvf.InputError, match="never decrease"):
        call(backend="reference", check="strict")


@functools.cache
def _meta_public_calls() -> dict:
    from tests.harness.calls import public_calls

    return public_calls("meta", rows=8)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize("name", sorted(_meta_public_calls()))
def test_no_public_call_reads_values_on_the_host_by_default(name, kernel, monkeypatch):
    """Every prepared call of tests.harness.calls (each codec and paged op of every format, each
    model op, each declared op with an example) on meta tensors: any host read of a value would
    raise, so the default mode's checks on a device read none."""
    noop = _NoOps(monkeypatch, kernel)
    _meta_public_calls()[name]()
    assert len(noop.calls) == 1


def test_every_op_has_a_call_to_guard():
    assert len(_meta_public_calls()) >= 40

"""The benchmark pairs of the tokenspeed-kernel drop-ins (tests/harness/compat_kernel_calls.py),
so that the host-cost ratios of ``python3 -m benchmarks host_overhead_cpu --compat`` compare calls
with the same effect:

* every function of ``kvformats.compat.tokenspeed_kernel.dsv41`` has a pair;
* each pair runs on CPU tensors, and from the same starting bytes the drop-in writes the bytes its
  native kvformats call writes and returns what it returns (where one side returns None, the
  other returns a tensor it wrote);
* with launches logged instead of run (the path CUDA tensors take), every drop-in makes the
  launches of its full path once replay is on; those ``replayed`` (``kvformats.compat._replay``) make
  their native call's launches, are replayed, and still refuse bad arguments.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.compat.tokenspeed_kernel import dsv4 as ts4
from kvformats.compat.tokenspeed_kernel import dsv41 as ts41
from tests.harness.compat_kernel_calls import kernel_call_pairs
from tests.harness.launch_stub import stubbed_launches

ROWS = 8
# no token of an 8-token decode step ends a ratio-128 window: the HCA insert writes nothing there
NO_WRITE_AT_ROWS = {"dsv4.dsv4_fused_sparse_compress_cache_insert.hca"}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(-1).view(torch.uint8).clone()


def _snapshot(result):
    """A result's dtypes, shapes and bytes (NaN compares by its bits), tuples element by element."""
    if isinstance(result, torch.Tensor):
        return ("tensor", result.dtype, tuple(result.shape), _bytes(result))
    if isinstance(result, (tuple, list)):
        return ("tuple", tuple(_snapshot(r) for r in result))
    return ("value", result)


_NONE = ("value", None)


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "tensor":
        return a[1:3] == b[1:3] and torch.equal(a[3], b[3])
    if a[0] == "tuple":
        return len(a[1]) == len(b[1]) and all(_same(x, y) for x, y in zip(a[1], b[1]))
    return a[1] == b[1]


def _scrambled(t: torch.Tensor, seed: int) -> torch.Tensor:
    """Other valid values of ``t``'s dtype and shape (the calls' start: every written byte shows)."""
    g = torch.Generator().manual_seed(1000 + seed)
    if t.dtype.is_floating_point:
        return torch.randn(t.shape, generator=g).to(t.dtype)
    if t.dtype == torch.uint8:
        return torch.randint(0, 256, t.shape, generator=g, dtype=torch.uint8)
    return torch.randint(-5, 1000, t.shape, generator=g).to(t.dtype)


@pytest.fixture(scope="module")
def pairs():
    written: dict = {}
    return kernel_call_pairs("cpu", rows=ROWS, written=written), written


def test_every_dsv41_function_has_a_pair(pairs):
    names = {name.split(".")[1] for name in pairs[0] if name.startswith("dsv41.")}
    assert set(ts41.__all__) <= names, sorted(set(ts41.__all__) - names)
    # the formats each codec is paired on
    for codec in ("cache_pack", "cache_unpack", "cache_scatter", "cache_gather"):
        for fmt in ("swa", "global", "index", "swa_v4"):
            assert f"dsv41.{codec}.{fmt}" in pairs[0]


def test_dsv4_pairs_name_dsv4_functions(pairs):
    dsv4_names = {name.split(".")[1] for name in pairs[0] if name.startswith("dsv4.")}
    assert dsv4_names <= set(ts4.__all__), sorted(dsv4_names - set(ts4.__all__))
    assert len(dsv4_names) >= 15


def test_every_written_tensor_belongs_to_a_pair(pairs):
    assert set(pairs[1]) <= set(pairs[0])


@pytest.mark.parametrize("name", sorted(kernel_call_pairs("cpu", rows=2)))
def test_drop_in_has_the_native_effect(pairs, name):
    """From the same starting bytes of every tensor the pair writes: the same result and the same
    bytes written, with no violation recorded."""
    calls, written = pairs
    native, drop_in = calls[name]
    buffers = written.get(name, ())
    start = [_scrambled(b, i) for i, b in enumerate(buffers)]
    outcome = []
    for call in (native, drop_in):
        for b, s in zip(buffers, start):
            b.copy_(s)
        result = _snapshot(call())
        outcome.append((result, [_bytes(b) for b in buffers]))
        assert kvf.pending_error("cpu") is None, name
    (want, want_bytes), (got, got_bytes) = outcome
    if _NONE in (want, got) and want != got:
        # one side returns None where the other returns a tensor it wrote (tokenspeed's writers
        # return None or their destination; kvformats' ops return theirs): that tensor's bytes
        # are compared below
        result, after = (got, got_bytes) if want == _NONE else (want, want_bytes)
        assert result[0] == "tensor" and any(torch.equal(result[3], a) for a in after), name
    else:
        assert _same(got, want), name
    for i, (a, b) in enumerate(zip(got_bytes, want_bytes)):
        assert torch.equal(a, b), f"{name}: written tensor {i} differs at {int((a != b).nonzero()[0, 0])}"
    if buffers and name not in NO_WRITE_AT_ROWS:  # the pair does write: the bytes changed
        assert any(not torch.equal(a, _bytes(s)) for a, s in zip(want_bytes, start)), name


def test_pairs_run_with_launches_stubbed():
    """The benchmark's setting: every pair runs on the path CUDA tensors take, launches logged."""
    with stubbed_launches(keep_log=False):
        for name, (native, drop_in) in kernel_call_pairs("cpu", rows=ROWS).items():
            native()
            drop_in()


# drop-ins whose adaptation is checks and views (``kvformats.compat._replay.replayed``): replayed
REPLAYED = {
    **{f"dsv41.cache_pack.{fmt}": ts41.cache_pack for fmt in ("swa", "global", "index", "swa_v4")},
    "dsv41.index_q_quantize.index": ts41.index_q_quantize,
    "dsv41.index_q_quantize.index_v4": ts41.index_q_quantize,
    "dsv41.compressor_tail_scatter": ts41.compressor_tail_scatter,
    "dsv41.compressor_pool": ts41.compressor_pool,
    "dsv41.compressor_pool.norm": ts41.compressor_pool,
    "dsv4.dsv4_fused_sparse_compress_cache_insert.csa": ts4.dsv4_fused_sparse_compress_cache_insert,
    "dsv4.dsv4_fused_sparse_compress_cache_insert.hca": ts4.dsv4_fused_sparse_compress_cache_insert,
    "dsv4.dsv4_save_compressor_state": ts4.dsv4_save_compressor_state,
    "dsv4.dsv4_fused_csa_indexer_mxfp4_cache_insert": ts4.dsv4_fused_csa_indexer_mxfp4_cache_insert,
    "dsv4.dsv4_csa_indexer_fp8_cache_insert": ts4.dsv4_csa_indexer_fp8_cache_insert,
    "dsv4.triton_dsv4_csa_indexer_fp8_cache_insert": ts4.triton_dsv4_csa_indexer_fp8_cache_insert,
    "dsv4.dsv4_swa_cache_insert": ts4.dsv4_swa_cache_insert,
    "dsv4.triton_dsv4_swa_cache_insert": ts4.triton_dsv4_swa_cache_insert,
    "dsv4.dsv4_fused_indexer_q_rope_hadamard_mxfp4": ts4.dsv4_fused_indexer_q_rope_hadamard_mxfp4,
    "dsv4.dsv4_group_slot_mapping.swa": ts4.dsv4_group_slot_mapping,
    "dsv4.dsv4_group_slot_mapping.compressed": ts4.dsv4_group_slot_mapping,
    "dsv4.dsv4_build_dense_prefill_local_compressed_indices": ts4.dsv4_build_dense_prefill_local_compressed_indices,
    "dsv4.dsv4_dequantize_and_gather_k_cache": ts4.dsv4_dequantize_and_gather_k_cache,
    "dsv4.dsv4_compact_compressed_slot_mapping": ts4.dsv4_compact_compressed_slot_mapping,
    "dsv4.dsv4_compute_global_topk_indices_and_lens": ts4.dsv4_compute_global_topk_indices_and_lens,
}


def test_replayed_drop_ins_launch_what_their_full_path_and_native_call_launch():
    """With launches logged (the path CUDA tensors take): every drop-in's calls make the launches
    of its full path (replay off) once replay is on; a replayed drop-in makes exactly its native
    call's launches, and is replayed from its third call."""
    from kvformats.runtime.replay_plan import Plan
    from replay_fuzz import addresses, normalized, outcome, stub_with_replay, tensors_of

    with stub_with_replay() as log:
        for name, (native, drop_in) in kernel_call_pairs("cpu", rows=ROWS).items():
            inputs = tensors_of(native) + tensors_of(drop_in)
            full = outcome(drop_in, log, False)[0]
            runs = [outcome(drop_in, log, True)[0] for _ in range(4)]
            at = addresses(full, *runs)
            want = normalized(full, inputs, at)
            assert want, name  # a launch, stubbed
            for got in runs:
                assert normalized(got, inputs, at) == want, name
            if name in REPLAYED:
                # the same launches as the native call's, but where the drop-in passes another tensor:
                # the save's ape (a view of the runtime-order tensor), cache_pack's slots (its own arange)
                if name != "dsv4.dsv4_save_compressor_state" and not name.startswith("dsv41.cache_pack."):
                    theirs = outcome(native, log, False)[0]
                    at = addresses(full, theirs)
                    assert normalized(theirs, inputs, at) == normalized(full, inputs, at), name
                assert any(isinstance(p, Plan) for p in REPLAYED[name].__wrapped_plans__.values()), name


def test_a_replayed_drop_in_still_refuses_what_its_full_path_refuses():
    """Errors are never replayed: once a drop-in's plan exists, a call whose metadata or scalars
    differ runs its full path and raises there."""
    from kvformats.runtime.replay_plan import Plan
    from replay_fuzz import stub_with_replay

    def planned(fn) -> bool:
        return any(isinstance(p, Plan) for p in fn.__wrapped_plans__.values())

    with stub_with_replay():
        q = torch.randn(ROWS, 4, 128).to(torch.bfloat16)
        out = torch.empty_like(q)
        for _ in range(3):
            ts41.index_q_quantize(q, "index", out)
        assert planned(ts41.index_q_quantize)
        with pytest.raises(kvf.InputError):
            ts41.index_q_quantize(q, "bogus", out)
        with pytest.raises(kvf.InputTypeError):
            ts41.index_q_quantize(q.float(), "index", out)
        content = torch.randn(ROWS, 512)
        tail = torch.zeros(3, 2, 2, 512)
        slots = torch.full((ROWS,), -1)
        active = torch.ones(ROWS, dtype=torch.bool)
        pooled = torch.empty(ROWS, 512)
        for _ in range(3):
            ts41.compressor_pool(content, content, slots, tail, slots, active, pooled, None, 1e-6)
        assert planned(ts41.compressor_pool)
        with pytest.raises(kvf.InputError):  # out is content: the same metadata but for the aliasing
            ts41.compressor_pool(content, content, slots, tail, slots, active, content, None, 1e-6)
        with pytest.raises(kvf.LayoutError):
            ts41.compressor_pool(content, content, slots, torch.zeros(3, 2, 2, 256), slots, active, pooled, None,
                                 1e-6)

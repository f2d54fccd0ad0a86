"""``kvformats.deepseek_v41.swa_rope_scatter``'s ``first_slot`` and ``negative_positions``: the two
rules tokenspeed's drop-in (``kvformats.compat.tokenspeed_kernel.dsv41.swa_rope_scatter``) needs
(its null page 0, its clamp of negative positions), applied by the op itself so that the drop-in
is checks, a view and one native call, replayed as the native call is.

* the reference: ``first_slot=f, negative_positions="clamp"`` writes the bytes (and ``out``) the
  defaults write for slots below f made -1 and positions clamped to 0 (what the drop-in did with
  two torch operations before the call);
* the Triton kernel under the interpreter (``routed``) against the reference, byte for byte,
  invalid positions (recorded) included;
* the arguments' validation (typed errors, nothing written) and host checks;
* the torch.library op; the drop-in replayed with its native call's launches.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvformats as kvf
from kvformats.codec.rows import read_rows
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.deepseek_v41 import rows as R
from kvformats.errors import InputError, InputTypeError
from kvformats.runtime import deferred
from tests.deepseek_v41.test_rows_ops import (CPU, DEV, FUZZ, KERNEL_FUZZ, SENTINEL, make_table, make_values,
                                              new_cache, same_bits, same_cache)


@st.composite
def cases(draw, max_t: int = 6):
    """A call with slots on every side of ``first_slot`` and of the cache, and (with clamp)
    negative positions."""
    fmt = draw(st.sampled_from(R.SWA_FORMATS))
    page_size = draw(st.sampled_from([1, 2, 3, 64]))
    pages = draw(st.integers(0, 3))
    cap = pages * page_size
    first = draw(st.sampled_from(sorted({0, 1, page_size, max(cap - 1, 0), cap, cap + 5})))
    t = draw(st.integers(0, max_t))
    live = draw(st.lists(st.integers(0, max(cap - 1, 0)), max_size=t, unique=True)) if cap else []
    dead = [draw(st.sampled_from([-1, -7, cap, cap + 3])) for _ in range(t - len(live))]
    slots = draw(st.permutations(live + dead))
    clamp = draw(st.booleans())
    rows = draw(st.integers(1, 40))
    positions = draw(st.lists(st.integers(-5 if clamp else 0, rows - 1), min_size=t, max_size=t))
    return dict(fmt=fmt, page_size=page_size, pages=pages, first=first, slots=slots, clamp=clamp, rows=rows,
                positions=positions, kind=draw(st.sampled_from(["normal", "wide", "ties", "mixed"])),
                seed=draw(st.integers(0, 2**16)), real=draw(st.booleans()), with_out=draw(st.booleans()),
                int32=draw(st.booleans()), strided=draw(st.booleans()))


def build(case, device=CPU):
    t = len(case["slots"])
    lay, cache = new_cache(case["fmt"], case["page_size"], case["pages"])
    x = make_values(case["kind"], (t, 512), case["seed"])
    if case["strided"]:
        x = torch.cat([x, x], dim=1)[:, ::2]
    itype = torch.int32 if case["int32"] else torch.int64
    out = torch.full((t, 512), float("nan"), dtype=torch.bfloat16) if case["with_out"] else None
    pos, slots = torch.tensor(case["positions"], dtype=itype), torch.tensor(case["slots"], dtype=itype)
    table = make_table(case["rows"], case["real"], case["seed"])
    return lay, *(None if a is None else a.to(device) for a in (cache, x, pos, table, slots, out))


def run(case, backend: str, device=CPU, *, folded: bool = True):
    """The call with the two arguments (``folded``), or the defaults on the inputs the drop-in
    used to make (slots below first_slot -1, positions clamped)."""
    lay, cache, x, pos, table, slots, out = build(case, device)
    kw = dict(fmt=case["fmt"], page_size=case["page_size"], out=out, backend=backend)
    if folded:
        got = R.swa_rope_scatter(x, pos, table, cache, slots, first_slot=case["first"],
                                 negative_positions="clamp" if case["clamp"] else "invalid", **kw)
    else:
        slots = slots.masked_fill(slots < case["first"], -1)
        pos = pos.clamp_min(0) if case["clamp"] else pos
        got = R.swa_rope_scatter(x, pos, table, cache, slots, **kw)
    assert got is out
    return lay, cache, out


@FUZZ
@given(cases())
def test_the_arguments_are_the_drop_ins_former_torch_operations(case):
    _, c_arg, o_arg = run(case, "reference")
    _, c_ops, o_ops = run(case, "reference", folded=False)
    assert torch.equal(c_arg, c_ops)
    if o_arg is not None:
        assert torch.equal(o_arg.view(torch.int16), o_ops.view(torch.int16))


@KERNEL_FUZZ
@given(cases(max_t=5))
def test_the_kernel_applies_them_as_the_reference_does(routed, case):
    lay, c_ref, o_ref = run(case, "reference", DEV)
    _, c_tri, o_tri = run(case, "triton", DEV)
    assert torch.equal(c_ref, c_tri)
    if o_ref is not None:
        assert torch.equal(o_ref.view(torch.int16), o_tri.view(torch.int16))
    assert kvf.pending_error(DEV) is None


@pytest.mark.parametrize("fmt", R.SWA_FORMATS)
def test_device_path_clamps_before_the_range_check(routed, fmt):
    """Device path: a negative position rotates as 0 (nothing recorded); a position beyond the
    table is recorded as before, its row not written; page 0 stays as it was."""
    table = make_table(40, True, 0).to(DEV)
    x = make_values("normal", (5, 512), 3).to(DEV)
    pos = torch.tensor([-3, 0, 40, -100, 7], device=DEV)
    slots = torch.tensor([64, 65, 66, 3, 100], dtype=torch.int32, device=DEV)
    results = []
    for backend in ("reference", "triton"):
        lay, cache = new_cache(fmt, 64, 2)
        cache = cache.to(DEV)
        out = torch.zeros(5, 512, dtype=torch.bfloat16, device=DEV)
        R.swa_rope_scatter(x, pos, table, cache, slots, fmt=fmt, out=out, first_slot=64, negative_positions="clamp",
                           backend=backend)
        err = kvf.pending_error(DEV)
        site = deferred.SITES[R.POSITIONS_SITE][0]
        assert err is not None and str(err).startswith(f"{site}: positions[2] = 40 is outside [0, 40)"), err
        page0 = read_rows(lay, cache, torch.arange(64, device=DEV))
        assert bool((page0 == SENTINEL).all())  # slot 3: below first_slot
        assert bool((read_rows(lay, cache, torch.tensor([66], device=DEV)) == SENTINEL).all())
        results.append((cache, out))
    same_cache(lay, results[0][0], results[1][0])
    same_bits(results[0][1], results[1][1])
    # token 0 (position -3) is token 1 (position 0) rotated: x rows differ, so compare with a call at 0
    lay, want = new_cache(fmt, 64, 2)
    want_out = torch.zeros(5, 512, dtype=torch.bfloat16)
    R.swa_rope_scatter(x.cpu(), pos.cpu().clamp_min(0).clamp_max(39), table.cpu(), want, slots.cpu(), fmt=fmt,
                       out=want_out, backend="reference")
    same_bits(results[1][1][[0, 1, 3, 4]].cpu(), want_out[[0, 1, 3, 4]])


# ----- validation and host checks -------------------------------------------------------------------
def _args(fmt="fp8_ds_mla_v41"):
    lay, cache = new_cache(fmt, 64, 2)
    out = torch.full((3, 512), 7.0, dtype=torch.bfloat16)
    return dict(values=make_values("normal", (3, 512), 0), positions=torch.tensor([0, 1, 2]),
                cos_sin_cache=cos_sin_cache(64, 8), cache=cache, slots=torch.tensor([1, 70, 71]), fmt=fmt,
                page_size=64, out=out)


BAD = [
    (dict(first_slot=-1), InputError, "first_slot must be >= 0"),
    (dict(first_slot=1.0), InputTypeError, "first_slot must be an int"),
    (dict(first_slot=True), InputTypeError, "first_slot must be an int"),
    (dict(first_slot=None), InputTypeError, "first_slot must be an int"),
    (dict(first_slot=torch.tensor(64)), InputTypeError, "first_slot must be an int"),
    (dict(negative_positions="zero"), InputError, "negative_positions must be one of"),
    (dict(negative_positions="Clamp"), InputError, "negative_positions must be one of"),
    (dict(negative_positions=None), InputTypeError, "negative_positions must be a str"),
    (dict(negative_positions=0), InputTypeError, "negative_positions must be a str"),
]


@pytest.mark.parametrize("change,error,match", BAD, ids=[str(b[0]) for b in BAD])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_bad_arguments_raise_typed_errors_with_nothing_written(change, error, match, backend):
    a = _args()
    cache, out = a["cache"].clone(), a["out"].clone()
    with pytest.raises(error, match=match):
        R.swa_rope_scatter(**{**a, **change}, backend=backend)
    assert torch.equal(a["cache"], cache) and torch.equal(a["out"], out)


def test_host_checks_follow_the_rules():
    a = _args()
    with pytest.raises(InputError, match="positions must lie"):
        R.swa_rope_scatter(**{**a, "positions": torch.tensor([0, -1, 2])})
    R.swa_rope_scatter(**{**a, "positions": torch.tensor([0, -1, 2])}, negative_positions="clamp")
    with pytest.raises(InputError, match="positions must lie"):  # clamped, 8 is still beyond the table
        R.swa_rope_scatter(**{**a, "positions": torch.tensor([0, -1, 8])}, negative_positions="clamp")
    a = _args()
    R.swa_rope_scatter(**{**a, "slots": torch.tensor([5, 5, 70])}, first_slot=64)  # repeats below: skipped
    assert bool((read_rows(R.swa_layout("fp8_ds_mla_v41", 64), a["cache"], torch.arange(64)) == SENTINEL).all())
    cache = a["cache"].clone()
    with pytest.raises(InputError, match="repeat|twice"):
        R.swa_rope_scatter(**{**a, "slots": torch.tensor([5, 70, 70])}, first_slot=64)
    assert torch.equal(a["cache"], cache)


def test_a_first_slot_at_or_beyond_the_cache_writes_nothing():
    want = _args()
    R.swa_rope_scatter(**want)
    for first in (128, 129, 2**70):
        a = _args()
        R.swa_rope_scatter(**{**a, "slots": torch.tensor([0, 64, 127])}, first_slot=first)
        assert bool((a["cache"] == SENTINEL).all())
        assert torch.equal(a["out"].view(torch.int16), want["out"].view(torch.int16))  # out is still written


def test_the_torch_library_op_takes_them():
    import kvformats.deepseek_v41.torch_ops as d41ops

    a, b = _args("fp8_ds_mla"), _args("fp8_ds_mla")
    kw = dict(positions=torch.tensor([-4, 1, 2]), slots=torch.tensor([3, 70, 71]))
    want = R.swa_rope_scatter(**{**a, **kw}, first_slot=64, negative_positions="clamp")
    got = d41ops.swa_rope_scatter(**{**b, **kw}, first_slot=64, negative_positions="clamp")
    assert got is b["out"] and torch.equal(a["cache"], b["cache"])
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))
    args = d41ops.op_arguments("swa_rope_scatter", **{**b, **kw}, first_slot=64, negative_positions="clamp")
    assert args["first_slot"] == 64 and args["negative_positions"] == "clamp"


# ----- the drop-in ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache_format", ["swa", "swa_v4"])
def test_the_drop_in_is_replayed_with_its_native_calls_launches(cache_format):
    """With launches logged (the path CUDA tensors take): the drop-in makes no launch and no torch
    operation of its own, so its calls are recorded and replayed, each with the launches of the
    native call given first_slot=64 and negative_positions="clamp"."""
    from kvformats.compat.tokenspeed_kernel import dsv41 as ts41
    from kvformats.runtime.replay_plan import Plan
    from tests.replay_fuzz import addresses, normalized, outcome, stub_with_replay

    fmt = {"swa": "fp8_ds_mla_v41", "swa_v4": "fp8_ds_mla"}[cache_format]
    lay = R.swa_layout(fmt, 64)
    field = torch.full((3, 64, lay.row_bytes), SENTINEL, dtype=torch.uint8)  # tokenspeed's field
    cache = field.view(3, 64 * lay.row_bytes)  # the native cache: the same bytes
    x = make_values("normal", (6, 512), 1)
    pos, slots = torch.tensor([-2, 0, 5, 7, 3, 1]), torch.tensor([2, 64, 130, -1, 191, 70])
    cs, out = cos_sin_cache(64, 8), torch.empty(6, 512, dtype=torch.bfloat16)

    def native():
        return R.swa_rope_scatter(x, pos, cs, cache, slots, fmt=fmt, page_size=64, out=out, first_slot=64,
                                  negative_positions="clamp")

    def drop_in():
        return ts41.swa_rope_scatter(x, pos, cs, field, slots, cache_format, out)

    with stub_with_replay() as log:
        inputs = [x, pos, slots, cs, cache, out]
        full = outcome(drop_in, log, False)[0]
        runs = [outcome(drop_in, log, True)[0] for _ in range(4)]
        theirs = outcome(native, log, False)[0]
        at = addresses(full, theirs, *runs)
        want = normalized(theirs, inputs, at)
        assert len(want) == 1  # one launch, the native call's
        for got in (full, *runs):
            assert normalized(got, inputs, at) == want
        # inside the block: leaving the stand-in launcher forgets every plan
        assert any(isinstance(p, Plan) for p in ts41.swa_rope_scatter.__wrapped_plans__.values())

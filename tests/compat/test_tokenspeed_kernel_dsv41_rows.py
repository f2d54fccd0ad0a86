"""kvformats.compat.tokenspeed_kernel's ``swa_rope_scatter`` and ``index_q_quantize`` against
tokenspeed-kernel 0.1.4's released ones (``tokenspeed_kernel.ops.attention.dsv41``): the wheel is
fetched at test time (tests/harness/released.py; skipped only when the package index cannot be
reached), its ``dsv41/__init__.py`` read with ``ast`` for the signatures and ``__all__``, and its
Triton solutions (``triton_dsv41_swa_rope_scatter`` -> ``_swa_rope_insert``, ``index_q_quantize``
-> ``_pack_kernel`` / ``_gather_kernel``) run in one TRITON_INTERPRET=1 child process with the
GPU's float conversions.

* signatures: names, kinds, defaults and annotations, return annotations; ``__all__``;
* the same call gives the same bytes and values: 'swa' and 'swa_v4' fields (sentinel-filled,
  three pages) after ``swa_rope_scatter`` on the six input kinds of ``rel.input_rows``, with
  slots in page 0 (tokenspeed's null page), -1 and beyond the field, negative positions (clamped
  to the table's row 0), a real and a random cos/sin table, ``out`` or None; 'index' and
  'index_v4' queries (strided too); what each returns (``out`` itself, or a new tensor alike);
* the documented departures: a position beyond the table (tokenspeed's device assertion, which
  the interpreter does not enforce: it writes the row rotated by cos 1, sin 0), repeated slots;
* bad input: the typed error (a ValueError, as tokenspeed's), nothing written.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import kvformats as kvf
from kvformats.codec.rows import read_rows
from kvformats.compat.tokenspeed_kernel import _dsv41_rows as ts
from kvformats.compat.tokenspeed_kernel import dsv41
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.errors import InputError, InputTypeError, LayoutError
from kvformats.runtime import deferred
from tests.harness import released as rel

NAMES = ("swa_rope_scatter", "index_q_quantize")
WIDTH = {"swa": 528, "swa_v4": 584}
SWA, INDEX = ("swa", "swa_v4"), ("index", "index_v4")
N, PAGES, HEADS, TABLE = 8, 3, 3, 64
SENTINEL = rel.SENTINEL
CPU = torch.device("cpu")


def _field(fmt: str) -> torch.Tensor:
    return torch.full((PAGES, 64, WIDTH[fmt]), SENTINEL, dtype=torch.uint8)


def _table(i: int) -> torch.Tensor:
    """A real cos/sin table, or (odd i) random values: row 0 then rotates too."""
    if i % 2 == 0:
        return cos_sin_cache(64, TABLE)
    return torch.randn(TABLE, 64, generator=torch.Generator().manual_seed(i)) * 1.5


def _positions(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(200 + i)
    p = torch.randint(0, TABLE, (N,), generator=g)
    p[0], p[1], p[2] = -1, TABLE - 1, -(10 + i)  # negative positions: clamped to 0
    return p.to(torch.int32 if i % 2 else torch.int64)


def _slots(i: int) -> torch.Tensor:
    """Slots over three pages: two in page 0 (skipped by tokenspeed), -1, one beyond the field."""
    g = torch.Generator().manual_seed(100 + i)
    s = 64 + torch.randperm(2 * 64, generator=g)[:N]
    s[1], s[3] = i, 63 - i  # page 0
    s[5], s[6] = -1, PAGES * 64 + i
    return s.to(torch.int64 if i % 2 else torch.int32)


def _out(t: int = N) -> torch.Tensor:
    return torch.full((t, 512), float("nan"), dtype=torch.bfloat16)


# ----- the released side: every call in one child process ---------------------------------------
def _plan() -> list[tuple[tuple, tuple]]:
    plan = []
    for fmt in SWA:
        for i, kind in enumerate(rel.KINDS):
            x = rel.input_rows(kind, N, 512, seed=i)
            out = _out() if i % 2 == 0 else None
            plan.append(((fmt, kind), ("swa_rope_scatter", (x, _positions(i), _table(i), _field(fmt), _slots(i),
                                                           fmt, out))))
        wide = torch.zeros(N, 530, dtype=torch.bfloat16)
        wide[:, 7:519] = rel.input_rows("normal", N, 512, seed=9)
        plan.append(((fmt, "strided"), ("swa_rope_scatter", (wide[:, 7:519], _positions(1), _table(1), _field(fmt),
                                                             _slots(1), fmt, _out()))))
        plan.append(((fmt, "empty"), ("swa_rope_scatter", (torch.zeros(0, 512, dtype=torch.bfloat16),
                                                           torch.zeros(0, dtype=torch.int32), _table(0), _field(fmt),
                                                           torch.zeros(0, dtype=torch.int32), fmt, _out(0)))))
        beyond = _positions(0)
        beyond[4] = TABLE  # a row past the table
        if rel.released_device() == "cpu":  # compiled, tokenspeed's device assertion ends the CUDA context
            plan.append(((fmt, "beyond"), ("swa_rope_scatter", (rel.input_rows("normal", N, 512, seed=5), beyond,
                                                                _table(0), _field(fmt), _slots(0), fmt, _out()))))
        repeated = _slots(2)
        repeated[7] = repeated[0]
        plan.append(((fmt, "repeated"), ("swa_rope_scatter", (rel.input_rows("normal", N, 512, seed=6),
                                                              _positions(2), _table(2), _field(fmt), repeated, fmt,
                                                              None))))
    for fmt in INDEX:
        for i, kind in enumerate(rel.KINDS):
            q = rel.input_rows(kind, N * HEADS, 128, seed=i).view(N, HEADS, 128)
            out = torch.full((N, HEADS, 128), float("nan"), dtype=torch.bfloat16) if i % 2 else None
            plan.append(((fmt, kind), ("index_q_quantize", (q, fmt, out))))
        q = rel.input_rows("mixed", N * 2 * HEADS, 128, seed=7).view(N, 2 * HEADS, 128)[:, ::2]
        plan.append(((fmt, "strided"), ("index_q_quantize", (q, fmt, None))))
        plan.append(((fmt, "empty"), ("index_q_quantize", (torch.zeros(0, HEADS, 128, dtype=torch.bfloat16), fmt,
                                                           None))))
    plan += [(("bad", name), call) for name, call, _ in _bad_calls()]
    return plan


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(key -> (call, the released call's record: ``rel.call_tokenspeed_dsv41``), the wheel's files)."""
    return rel.run_dsv41_plan(tmp_path_factory, _plan(), "dsv41-rows")


def _drop_in(call):
    """The drop-in's call on copies of the arguments: (result, arguments after it)."""
    name, args = call
    args = tuple(rel.strided_copy(a) for a in args)
    return getattr(ts, name)(*args), args


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


# ----- signatures -------------------------------------------------------------------------------
_KINDS = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
          "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def _source(annotation) -> object:
    return inspect.Parameter.empty if annotation is None else ast.unparse(annotation)


def _released_api(root: Path) -> tuple[list[str], dict[str, list[tuple]]]:
    """``__all__`` and, for NAMES, (name, kind, default, annotation) of each parameter and the
    return annotation, read with ast from the released dsv41/__init__.py."""
    tree = ast.parse((root / rel.TOKENSPEED_DSV41_API).read_text())
    names: list[str] = []
    sigs: dict[str, list[tuple]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name in NAMES:
            a = node.args
            assert a.vararg is None and a.kwarg is None
            positional = a.posonlyargs + a.args
            defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
                ast.literal_eval(d) for d in a.defaults]
            params = [(p.arg, _KINDS["posonlyargs" if p in a.posonlyargs else "args"], defaults[j],
                       _source(p.annotation)) for j, p in enumerate(positional)]
            params += [(p.arg, _KINDS["kwonlyargs"], inspect.Parameter.empty if d is None else ast.literal_eval(d),
                        _source(p.annotation)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
            sigs[node.name] = [*params, _source(node.returns)]
    return names, sigs


def test_signatures_and_names_are_the_released_ones(released):
    _, root = released
    names, sigs = _released_api(root)
    assert set(sigs) == set(NAMES)
    assert ts.__all__ == [n for n in names if n in NAMES]
    for name in NAMES:
        sig = inspect.signature(getattr(ts, name))
        got = [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]
        assert [*got, sig.return_annotation] == sigs[name], name


# ----- the same call, the same bytes and values --------------------------------------------------
@pytest.mark.parametrize("fmt", SWA)
def test_swa_rope_scatter_writes_the_released_bytes_and_values(released, fmt):
    runs, _ = released
    for kind in (*rel.KINDS, "strided", "empty"):
        call, rec = runs[(fmt, kind)]
        assert "error" not in rec, rec["error"]
        got, args = _drop_in(call)
        want_cache, have_cache = rec["args"][3], args[3]
        diff = int((want_cache != have_cache).sum())
        assert diff == 0, f"{fmt} {kind}: {diff} cache bytes differ"
        out = args[6]
        assert (got is out) and (rec["out_returned"] or out is None) and (out is not None or rec["result"] is None)
        if out is not None:
            assert torch.equal(_bits(out), _bits(rec["args"][6])), f"{fmt} {kind}: out differs"
        if kind in rel.KINDS:  # page 0 never written, the other live slots are
            assert bool((have_cache[0] == SENTINEL).all())
            assert int((have_cache[1:] != SENTINEL).any(dim=2).sum()) > 0


@pytest.mark.parametrize("fmt", INDEX)
def test_index_q_quantize_returns_the_released_values(released, fmt):
    runs, _ = released
    for kind in (*rel.KINDS, "strided", "empty"):
        call, rec = runs[(fmt, kind)]
        assert "error" not in rec, rec["error"]
        got, args = _drop_in(call)
        want = rec["result"]
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride()), kind
        assert torch.equal(_bits(got), _bits(want)), f"{fmt} {kind}"
        if args[2] is not None:
            assert got is args[2] and rec["out_returned"]


# ----- documented departures ----------------------------------------------------------------------
def _rows(fmt: str, cache: torch.Tensor) -> torch.Tensor:
    """uint8 ``[PAGES * 64, row_bytes]``: the record of every slot of a paged field."""
    return read_rows(dsv41.layout_of(fmt), dsv41.paged_field(cache, fmt), torch.arange(PAGES * 64))


@pytest.mark.parametrize("fmt", SWA)
def test_a_position_beyond_the_table_is_a_value_check(released, fmt, monkeypatch):
    """tokenspeed asserts on the device (on a GPU the launch fails; the interpreter goes on and
    rotates by cos 1, sin 0). The drop-in: InputError on CPU tensors, nothing written; on the
    device path the row is not stored, ``out`` holds its unrotated round trip (tokenspeed's
    identity rotation of these nonzero values) and the violation is recorded."""
    runs, _ = released
    if (fmt, "beyond") not in runs:
        pytest.skip("the released kernels run compiled (KVFORMATS_RELEASED_DEVICE=cuda): tokenspeed's device "
                    "assertion would end the CUDA context; this case runs under the interpreter")
    call, rec = runs[(fmt, "beyond")]
    assert "error" not in rec
    args = tuple(rel.strided_copy(a) for a in call[1])
    with pytest.raises(InputError, match=r"positions must lie in \[0, 64\)"):
        ts.swa_rope_scatter(*args)
    assert torch.equal(args[3], call[1][3]) and torch.equal(_bits(args[6]), _bits(call[1][6]))

    monkeypatch.setattr(deferred, "HOST_CHECKED", set())
    _, args = _drop_in(call)
    err = kvf.pending_error(CPU)
    assert err is not None and "positions[4] = 64 is outside [0, 64)" in str(err)
    have, want = _rows(fmt, args[3]), _rows(fmt, rec["args"][3])
    slot = int(call[1][4][4])
    differ = (have != want).any(dim=1).nonzero().flatten().tolist()
    assert differ == [slot] and bool((have[slot] == SENTINEL).all())  # that token's row only: not written
    assert torch.equal(_bits(args[6]), _bits(rec["args"][6]))


@pytest.mark.parametrize("fmt", SWA)
def test_repeated_slots_raise_on_the_host(released, fmt, monkeypatch):
    """tokenspeed requires unique slots and does not check (one of the rows lands); the drop-in
    refuses on CPU tensors (nothing written) and on the device path stores one of them."""
    runs, _ = released
    call, rec = runs[(fmt, "repeated")]
    assert "error" not in rec
    args = tuple(rel.strided_copy(a) for a in call[1])
    with pytest.raises(InputError, match="repeat"):
        ts.swa_rope_scatter(*args)
    assert torch.equal(args[3], call[1][3])
    monkeypatch.setattr(deferred, "HOST_CHECKED", set())
    _, args = _drop_in(call)
    assert kvf.pending_error(CPU) is None
    first = tuple(rel.strided_copy(a) for a in call[1])
    first[4][7] = -1  # token 0's row alone at the repeated slot
    ts.swa_rope_scatter(*first)
    slot = int(call[1][4][0])
    have, want, alone = _rows(fmt, args[3]), _rows(fmt, rec["args"][3]), _rows(fmt, first[3])
    keep = torch.arange(PAGES * 64) != slot
    assert torch.equal(have[keep], want[keep])
    assert torch.equal(have[slot], want[slot]) or torch.equal(have[slot], alone[slot])


# ----- bad input ----------------------------------------------------------------------------------
def _bad_calls():
    """(name, call, the error the drop-in raises); the released code refuses each (ValueError)."""
    x = rel.input_rows("normal", 4, 512)
    p, s, cs = torch.arange(4), torch.tensor([64, 65, -1, 70]), cos_sin_cache(64, 8)
    f, f4 = _field("swa"), _field("swa_v4")
    q = rel.input_rows("normal", 8, 128).view(4, 2, 128)
    outq = torch.full((4, 2, 128), 3.0, dtype=torch.bfloat16)
    swa = "swa_rope_scatter"
    return [
        ("not a swa format", (swa, (x, p, cs, f, s, "global", _out(4))), InputError),
        ("format not a str", (swa, (x, p, cs, f, s, None, _out(4))), InputError),
        ("cache row bytes", (swa, (x, p, cs, f4, s, "swa", _out(4))), LayoutError),
        ("cache dtype", (swa, (x, p, cs, f.view(torch.int8), s, "swa", _out(4))), InputTypeError),
        ("cache rows per page", (swa, (x, p, cs, f.view(PAGES * 2, 32, 528), s, "swa", _out(4))), LayoutError),
        ("values fp32", (swa, (x.float(), p, cs, f, s, "swa", _out(4))), InputTypeError),
        ("values width", (swa, (x[:, :448], p, cs, f, s, "swa", _out(4))), InputError),
        ("positions float", (swa, (x, p.float(), cs, f, s, "swa", _out(4))), InputTypeError),
        ("positions length", (swa, (x, p[:3], cs, f, s, "swa", _out(4))), InputError),
        ("slots length", (swa, (x, p, cs, f, s[:2], "swa", _out(4))), InputError),
        ("slots int16", (swa, (x, p, cs, f, s.to(torch.int16), "swa", _out(4))), InputTypeError),
        ("table width", (swa, (x, p, cs[:, :32].contiguous(), f, s, "swa", _out(4))), InputError),
        ("table dtype", (swa, (x, p, cs.double(), f, s, "swa", _out(4))), InputTypeError),
        ("out shape", (swa, (x, p, cs, f, s, "swa", _out(3))), InputError),
        ("out dtype", (swa, (x, p, cs, f, s, "swa", torch.zeros(4, 512))), InputTypeError),
        ("q fp32", ("index_q_quantize", (q.float(), "index", None)), InputTypeError),
        ("q width", ("index_q_quantize", (q[..., :64], "index", None)), InputError),
        ("q 2-D", ("index_q_quantize", (q.reshape(8, 128), "index", None)), InputError),
        ("not an index format", ("index_q_quantize", (q, "swa", outq)), InputError),
        ("unknown format", ("index_q_quantize", (q, "index_v5", outq)), InputError),
        ("q out shape", ("index_q_quantize", (q, "index_v4", outq[:3])), InputError),
        ("q out dtype", ("index_q_quantize", (q, "index_v4", outq.float())), InputTypeError),
    ]


@pytest.mark.parametrize("name", [c[0] for c in _bad_calls()])
def test_bad_input_is_refused_as_released_with_nothing_written(released, name):
    runs, _ = released
    call, rec = runs[("bad", name)]
    error = {c[0]: c[2] for c in _bad_calls()}[name]
    assert "error" in rec and rec["error"][0] == "ValueError", (name, rec.get("error"))
    args = tuple(rel.strided_copy(a) for a in call[1])
    with pytest.raises(error) as info:
        getattr(ts, call[0])(*args)
    assert isinstance(info.value, ValueError)
    for before, after in zip(call[1], args):
        if isinstance(before, torch.Tensor):
            assert torch.equal(before.contiguous().view(torch.uint8), after.contiguous().view(torch.uint8))


def test_strided_fields_and_outputs_are_refused_with_nothing_written():
    """Refused by the released code too (``cache.stride(1) != row_bytes``: "Fused SWA requires
    contiguous page bytes"; ``out`` not contiguous), which the harness cannot show: it passes dense
    copies of the arguments."""
    x, p, cs = rel.input_rows("normal", 4, 512), torch.arange(4), cos_sin_cache(64, 8)
    s = torch.tensor([64, 65, -1, 70])
    arena = torch.full((PAGES, 64, 540), SENTINEL, dtype=torch.uint8)
    for args, error in [((x, p, cs, arena[:, :, :528], s, "swa", _out(4)), LayoutError),
                        ((x, p, cs, _field("swa"), s, "swa", _out(8)[::2]), InputError)]:
        before = [rel.strided_copy(a) for a in args]
        with pytest.raises(error):
            ts.swa_rope_scatter(*args)
        assert torch.equal(arena, torch.full_like(arena, SENTINEL))
        assert torch.equal(args[3], before[3])
        assert torch.equal(_bits(args[6].contiguous()), _bits(before[6].contiguous()))
    q = rel.input_rows("normal", 8, 128).view(4, 2, 128)
    out = torch.full((4, 128, 2), 3.0, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(InputError):
        ts.index_q_quantize(q, "index", out)
    assert bool((out == 3.0).all())

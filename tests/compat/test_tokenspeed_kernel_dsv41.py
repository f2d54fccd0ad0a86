"""kvformats.compat.tokenspeed_kernel.dsv41 against tokenspeed-kernel 0.1.4's released V4.1 cache
codecs (``tokenspeed_kernel.ops.attention.dsv41``): the wheel is fetched at test time
(tests/harness/released.py: ``pip download --no-deps``, cached, sha256 checked; skipped only when
the package index cannot be reached), its ``dsv41/__init__.py`` read with ``ast`` for the
signatures and ``__all__``, and its ``triton.py`` codecs (the registered Triton solutions
``cache_pack``, ``cache_unpack``, ``cache_scatter``, ``cache_gather``; ``_pack_kernel`` and
``_gather_kernel``) run in one TRITON_INTERPRET=1 child process with the GPU's float conversions.

* signatures: names, kinds, defaults and annotations of the four functions; ``__all__`` is the
  released one restricted to them;
* bytes: ``cache_scatter`` (into a sentinel-filled two-page field, slots -1 and beyond the field
  among them) and ``cache_pack`` of every cache_format on the six input kinds of
  ``rel.input_rows`` are the released bytes, whole buffers; 'swa_v4' and 'index_v4' against the
  kvformats profiles of their formats (which ones depart, on which kinds);
* values: ``cache_gather`` (slots of any shape, invalid ones among them) and ``cache_unpack``
  (strided rows too), bf16 and float32 ``out`` or none, equal the released ones bit for bit; on
  caches of random bytes they differ exactly where the module docstring says;
* float32 rows: the documented departure, exactly;
* bad input: the typed error, with ``out`` / the cache untouched, where the released code refuses
  too (``ValueError``) and where only the drop-in does.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import kvformats as kvf
from kvformats.compat.tokenspeed_kernel import dsv41 as ts
from kvformats.errors import InputError, InputTypeError, LayoutError
from kvformats.numerics.profiles import profile_table
from tests.harness import released as rel

FORMATS = tuple(ts.CACHE_FORMATS)
N = 8
SENTINEL = rel.SENTINEL
PAGES = 2
CODECS = rel.DSV41_CODECS


def _dim(fmt: str) -> int:
    return ts.CACHE_FORMATS[fmt].dim


def _width(fmt: str) -> int:
    return ts.CACHE_FORMATS[fmt].row_bytes


def _field(fmt: str, pages: int = PAGES) -> torch.Tensor:
    return torch.full((pages, 64, _width(fmt)), SENTINEL, dtype=torch.uint8)


def _slots(kind_index: int) -> torch.Tensor:
    """N slots over the two pages: every third -1, one beyond the field (skipped by both)."""
    g = torch.Generator().manual_seed(100 + kind_index)
    s = torch.randperm(PAGES * 64, generator=g)[:N]
    s[2::3] = -1
    s[4] = PAGES * 64 + 3
    return s.to(torch.int32 if kind_index % 2 else torch.int64)


def _gather_slots(kind_index: int) -> torch.Tensor:
    """[2, 5] slots: written and unwritten rows, a repeat, -1 and one beyond the field."""
    s = _slots(kind_index).to(torch.int64)
    return torch.cat([s, s[:1], torch.tensor([PAGES * 64 + 64])]).view(2, 5)


def _rows32(fmt: str) -> torch.Tensor:
    return torch.randn(N, _dim(fmt), generator=torch.Generator().manual_seed(7))


# ----- the released side: every call in one child process ---------------------------------------
def _plan() -> list[tuple[tuple, tuple]]:
    """(key, call) pairs: the key names the case, the call is (codec name, arguments)."""
    plan = []
    for fmt in FORMATS:
        for i, kind in enumerate(rel.KINDS):
            x = rel.input_rows(kind, N, _dim(fmt))
            plan.append(((fmt, kind, "scatter"), ("cache_scatter", (x, _field(fmt), _slots(i), fmt))))
            plan.append(((fmt, kind, "pack"), ("cache_pack", (x, fmt, torch.full((N, _width(fmt)), SENTINEL,
                                                                                     dtype=torch.uint8)))))
            # reads of the rows the drop-in wrote (the bytes test shows they are the released ones)
            cache, packed = _field(fmt), ts.cache_pack(x, fmt, None)
            ts.cache_scatter(x, cache, _slots(i), fmt)
            plan.append(((fmt, kind, "gather"), ("cache_gather", (cache, _gather_slots(i), fmt, None))))
            plan.append(((fmt, kind, "unpack"), ("cache_unpack", (packed, fmt, None))))
            if kind in ("normal", "tiny"):
                out32 = torch.full((2, 5, _dim(fmt)), float("nan"))
                plan.append(((fmt, kind, "gather32"), ("cache_gather", (cache, _gather_slots(i), fmt, out32))))
                wide = torch.full((N, _width(fmt) + 13), SENTINEL, dtype=torch.uint8)
                wide[:, 5:5 + _width(fmt)] = packed
                plan.append(((fmt, kind, "unpack32"), ("cache_unpack", (wide[:, 5:5 + _width(fmt)], fmt,
                                                                         torch.empty(N, _dim(fmt))))))
        # random bytes: every code and scale byte, NaN codes and 0xFF / 0x00 scales among them
        noise = torch.randint(0, 256, (PAGES, 64, _width(fmt)), generator=torch.Generator().manual_seed(3),
                              dtype=torch.uint8)
        slots = torch.randperm(PAGES * 64, generator=torch.Generator().manual_seed(4))[:24].view(4, 6)
        scales = ts.layout_of(fmt).segment_view(ts.paged_field(noise, fmt), "scales")
        for k, byte in enumerate((0xFF, 0x00, 0x01)):  # the first scale of three gathered rows
            scales[int(slots[0, k]) // 64, int(slots[0, k]) % 64, 0] = byte
        plan.append(((fmt, "noise", "gather"), ("cache_gather", (noise, slots, fmt, None))))
        plan.append(((fmt, "noise", "gather32"), ("cache_gather", (noise, slots, fmt,
                                                                   torch.empty(4, 6, _dim(fmt))))))
        x32 = _rows32(fmt)
        plan.append(((fmt, "fp32", "pack"), ("cache_pack", (x32, fmt, None))))
        plan.append(((fmt, "fp32-as-bf16", "pack"), ("cache_pack", (x32.bfloat16(), fmt, None))))
    plan += [(("bad", name), call) for name, call, _, _ in _bad_calls()]
    return plan


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(key -> (call, the released call's record: ``rel.call_tokenspeed_dsv41``), the wheel's files)."""
    return rel.run_dsv41_plan(tmp_path_factory, _plan(), "dsv41")


def _drop_in(call):
    """The drop-in's call on copies of the arguments: (result, arguments after it)."""
    name, args = call
    args = tuple(rel.strided_copy(a) for a in args)
    return getattr(ts, name)(*args), args


# ----- signatures -------------------------------------------------------------------------------
_KINDS = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
          "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def _source(annotation) -> object:
    """An annotation as ``inspect`` gives it under ``from __future__ import annotations``."""
    return inspect.Parameter.empty if annotation is None else ast.unparse(annotation)


def _released_api(root: Path) -> tuple[list[str], dict[str, list[tuple]]]:
    """``__all__`` and, per function, (name, kind, default, annotation) of each parameter, then the
    return annotation of the four codecs, read with ast from the released dsv41/__init__.py."""
    tree = ast.parse((root / rel.TOKENSPEED_DSV41_API).read_text())
    names: list[str] = []
    sigs: dict[str, list[tuple]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name in CODECS:
            a = node.args
            params = []
            positional = a.posonlyargs + a.args
            defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
                ast.literal_eval(d) for d in a.defaults]
            for kind_name in ("posonlyargs", "args"):
                for p in getattr(a, kind_name):
                    params.append((p.arg, _KINDS[kind_name], defaults[positional.index(p)], _source(p.annotation)))
            for p, d in zip(a.kwonlyargs, a.kw_defaults):
                params.append((p.arg, _KINDS["kwonlyargs"], inspect.Parameter.empty if d is None
                               else ast.literal_eval(d), _source(p.annotation)))
            assert a.vararg is None and a.kwarg is None
            sigs[node.name] = [*params, _source(node.returns)]
    return names, sigs


def test_signatures_and_names_are_the_released_ones(released):
    _, root = released
    names, sigs = _released_api(root)
    assert set(sigs) == set(CODECS)
    assert [n for n in names if n in CODECS] == list(CODECS)
    # the model ops' own tests (test_tokenspeed_kernel_dsv41_rows.py, _compressor.py) check theirs
    model_ops = ("index_q_quantize", "compressor_tail_scatter", "compressor_pool", "swa_rope_scatter")
    assert ts.__all__ == [n for n in names if n in CODECS or n in model_ops]
    for name in CODECS:
        sig = inspect.signature(getattr(ts, name))
        got = [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]
        assert [*got, sig.return_annotation] == sigs[name], name


# ----- bytes ------------------------------------------------------------------------------------
def _written(call, record):
    """(released buffer, drop-in buffer, drop-in result) of a pack or scatter call."""
    got, args = _drop_in(call)
    at = 1 if call[0] == "cache_scatter" else 2
    return record["args"][at], args[at], got, args


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_and_scatter_write_the_released_bytes(released, fmt):
    runs, _ = released
    for kind in rel.KINDS:
        for op in ("scatter", "pack"):
            call, rec = runs[(fmt, kind, op)]
            assert "error" not in rec, rec["error"]
            want, have, result, args = _written(call, rec)
            diff = int((want != have).sum())
            assert diff == 0, f"{fmt} {kind} {op}: {diff} bytes differ"
            if op == "scatter":
                assert result is None and rec["result"] is None
                assert int((have != SENTINEL).view(PAGES * 64, -1).any(1).sum()) > 0
            else:
                assert result is args[2] and rec["out_returned"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_allocates_like_the_released_code(released, fmt):
    runs, _ = released
    _, rec = runs[(fmt, "fp32-as-bf16", "pack")]
    got, _ = _drop_in(runs[(fmt, "fp32-as-bf16", "pack")][0])
    want = rec["result"]
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert torch.equal(got, want)


# the released 584 B and 132 B rows against the kvformats profiles of fp8_ds_mla / fp8_indexer:
# (cache_format, profile) -> input kinds on which the bytes differ (any pair not listed: none)
V4_DEPARTS = {
    ("swa_v4", "flashmla-ref"): {"zeros", "tiny"},  # the 1e-4 floor on amax / 448, not on amax
    ("global_v4", "flashmla-ref"): {"zeros", "tiny"},
    # 'index_v4': fl32(max(amax, 1e-6) * fl32(1/448)), not a power of two; deepgemm-ref divides
    # max(amax, 1e-4) by 448 (the last bit of most scales, and the floor)
    **{("index_v4", p): set(rel.KINDS) for p in ("tokenspeed", "vllm", "deepgemm-ref")},
}


@pytest.mark.parametrize("fmt", ["swa_v4", "global_v4", "index_v4"])
def test_v4_rows_against_the_kvformats_profiles(released, fmt):
    runs, _ = released
    spec = ts.CACHE_FORMATS[fmt]
    for profile in profile_table(spec.fmt).names:
        lay = kvf.get_format(spec.fmt, profile=profile, **spec.params)
        differ = set()
        for i, kind in enumerate(rel.KINDS):
            call, rec = runs[(fmt, kind, "scatter")]
            field = _field(fmt)
            lay.encode(call[1][0], ts.paged_field(field, fmt), call[1][2].masked_fill(call[1][2] >= PAGES * 64, -1))
            if not torch.equal(field, rec["args"][1]):
                differ.add(kind)
        assert differ == V4_DEPARTS.get((fmt, profile), set()), (fmt, profile)


def test_float32_rows_depart_as_documented(released):
    """'swa', 'global' and the V4 rows: the drop-in quantizes bf16(x) (the released bytes of the
    bf16-rounded rows), tokenspeed x itself; 'index', 'index_v4': tokenspeed's bytes."""
    runs, _ = released
    for fmt in FORMATS:
        x32 = runs[(fmt, "fp32", "pack")][0][1][0]
        got = ts.cache_pack(x32, fmt, None)
        released_32 = runs[(fmt, "fp32", "pack")][1]["result"]
        released_bf16 = runs[(fmt, "fp32-as-bf16", "pack")][1]["result"]
        if fmt.startswith("index"):
            assert torch.equal(got, released_32), fmt
        else:
            assert torch.equal(got, released_bf16), fmt
            assert int((released_32 != released_bf16).sum()) > 0, fmt


# ----- values -----------------------------------------------------------------------------------
def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_and_unpack_read_the_released_values(released, fmt):
    runs, _ = released
    for kind in rel.KINDS:
        for op in ("gather", "unpack", "gather32", "unpack32"):
            if (fmt, kind, op) not in runs:
                continue
            call, rec = runs[(fmt, kind, op)]
            assert "error" not in rec, rec["error"]
            got, args = _drop_in(call)
            want = rec["result"]
            assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride()), (kind, op)
            assert torch.equal(_bits(got), _bits(want)), f"{fmt} {kind} {op}: {rel.first_differences(got, want, _bits)}"
            if call[1][-1] is not None:
                assert got is args[-1] and rec["out_returned"]


def _element_scales(fmt: str, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """int32 ``[*slots.shape, D]``: the scale byte of each element's block (256 for unscaled dims)."""
    lay = ts.layout_of(fmt)
    raw = lay.gather(ts.paged_field(cache, fmt), slots.reshape(-1))
    scales = raw[:, lay.row_span("scale")].to(torch.int32)
    block = getattr(lay, "nope_dim", lay.head_dim) // scales.shape[1]
    per_dim = torch.full((raw.shape[0], _dim(fmt)), 256, dtype=torch.int32)
    per_dim[:, :block * scales.shape[1]] = scales.repeat_interleave(block, dim=1)
    return per_dim.view(*slots.shape, _dim(fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_reads_of_any_bytes_differ_only_where_documented(released, fmt):
    """On random bytes (and a 0xFF, 0x00 and 0x01 scale byte): 'swa' reads a 0xFF scale as NaN
    (tokenspeed: e4m3 * 2^128, +-Inf); a float32 ``out`` of the e4m3 / ue8m0 rows decoded to bf16
    ('swa', 'swa_v4', 'global_v4') holds the bf16 value where tokenspeed's float32 product is not
    one, which takes scale bytes 0x00-0x02; everything else is the same bits (NaN for NaN)."""
    runs, _ = released
    for op in ("gather", "gather32"):
        call, rec = runs[(fmt, "noise", op)]
        got, _ = _drop_in(call)
        want = rec["result"]
        same = (_bits(got) == _bits(want)) | (got.isnan() & want.isnan())
        allowed = torch.zeros_like(same)
        if fmt in ("swa", "swa_v4", "global_v4"):
            scale = _element_scales(fmt, call[1][0], call[1][1])
            if fmt == "swa":
                ff = scale == 0xFF
                assert bool(got[ff].isnan().all()) and bool(want[ff].isinf().any())
                allowed |= ff
            if op == "gather32":
                allowed |= scale <= 2
                assert not bool(same[scale <= 2].all())  # the case is there
        assert bool((same | allowed).all()), f"{fmt} {op}: {int((~(same | allowed)).sum())} values differ"


def _calls(fmt: str, kind: str = "mixed") -> tuple[torch.Tensor, ...]:
    """The four codecs on one case: (field after scatter, packed rows, gathered fp32, unpacked bf16)."""
    x = rel.input_rows(kind, N, _dim(fmt))
    field, slots = _field(fmt), _slots(1)
    ts.cache_scatter(x, field, slots, fmt)
    packed = ts.cache_pack(x, fmt, None)
    gathered = ts.cache_gather(field, _gather_slots(1), fmt, torch.empty(2, 5, _dim(fmt)))
    return field, packed, gathered, ts.cache_unpack(packed, fmt, None)


def test_triton_backend_gives_the_same_results(monkeypatch):
    """backend="auto" on CUDA tensors runs kvformats' Triton kernels: here under the interpreter
    (CPU tensors routed to them), the same bytes and values as the reference."""
    pytest.importorskip("triton")
    from kvformats.codec import registry
    from kvformats.runtime import replay
    from tests.harness.routing import auto_resolves_to_triton

    if torch.cuda.is_available():
        pytest.skip("the interpreter run is for CPU-only machines")
    want = {fmt: _calls(fmt) for fmt in FORMATS}
    auto_resolves_to_triton(monkeypatch)
    replay.clear()  # no launch plan recorded on one path replays on the other
    try:
        cpu = torch.device("cpu")
        for fmt in FORMATS:
            for page_size in (1, 64):
                ops = ("decode",) if ts.CACHE_FORMATS[fmt].write is None else ("encode", "decode")
                for op in ops:
                    lay = ts.layout_of(fmt, page_size, read=op == "decode")
                    assert registry.is_kernel(registry.resolve_for(lay, op, "auto", cpu)), (fmt, page_size, op)
            for a, b in zip(want[fmt], _calls(fmt)):
                assert torch.equal(_bits(a) if a.is_floating_point() else a, _bits(b) if b.is_floating_point() else b)
    finally:
        registry._RESOLVED.clear()
        replay.clear()


def test_strided_pages_and_empty_calls():
    """A field carved from an arena (page stride beyond the page) is written and read in place; no
    rows / no slots write nothing and return empty rows."""
    for fmt in ("swa_v4", "index_v4", "global"):
        w = _width(fmt)
        arena = torch.full((PAGES, 64 * w + 64), SENTINEL, dtype=torch.uint8)
        field = arena.as_strided((PAGES, 64, w), (64 * w + 64, w, 1))
        x = rel.input_rows("normal", N, _dim(fmt))
        slots = _slots(0)
        ts.cache_scatter(x, field, slots, fmt)
        dense = _field(fmt)
        ts.cache_scatter(x, dense, slots, fmt)
        assert torch.equal(arena[:, :64 * w], dense.view(PAGES, -1))
        assert bool((arena[:, 64 * w:] == SENTINEL).all())
        assert torch.equal(ts.cache_gather(field, slots, fmt, None), ts.cache_gather(dense, slots, fmt, None))
        ts.cache_scatter(x[:0], dense, slots[:0], fmt)
        assert ts.cache_gather(dense, slots[:0].view(0, 3), fmt, None).shape == (0, 3, _dim(fmt))
        assert ts.cache_pack(x[:0], fmt, None).shape == (0, w)
        assert ts.cache_unpack(torch.empty(0, w, dtype=torch.uint8), fmt, None).shape == (0, _dim(fmt))


# ----- bad input ----------------------------------------------------------------------------------
def _bad_calls():
    """(name, call, error the drop-in raises, whether the released code refuses it too)."""
    x = rel.input_rows("normal", 4, 512)
    xi = rel.input_rows("normal", 4, 128)
    s = torch.tensor([1, 2, -1, 70])
    f = _field("swa")
    out8 = torch.full((4, 528), SENTINEL, dtype=torch.uint8)
    packed = torch.full((4, 528), 0x38, dtype=torch.uint8)
    outb = torch.full((4, 512), 7.0, dtype=torch.bfloat16)
    wide = torch.full((PAGES, 64, 600), SENTINEL, dtype=torch.uint8)
    return [
        ("unknown format", ("cache_scatter", (x, f, s, "swa_v5")), InputError, True),
        ("format not a str", ("cache_pack", (x, None, out8)), InputError, True),
        ("rows too narrow", ("cache_scatter", (x[:, :256], f, s, "swa")), InputError, True),
        ("rows fp16", ("cache_scatter", (x.half(), f, s, "swa")), InputTypeError, True),
        ("rows 3-D", ("cache_pack", (x.view(4, 1, 512), "swa", out8)), InputError, True),
        ("index rows for swa", ("cache_scatter", (xi, f, s, "swa")), InputError, True),
        ("cache row bytes", ("cache_scatter", (x, _field("swa_v4"), s, "swa")), LayoutError, True),
        ("cache dtype", ("cache_scatter", (x, f.view(torch.int8), s, "swa")), InputTypeError, True),
        ("cache rows per page", ("cache_scatter", (x, f.view(PAGES * 2, 32, 528), s, "swa")), LayoutError, True),
        ("slots float", ("cache_scatter", (x, f, s.float(), "swa")), InputTypeError, True),
        ("slots length", ("cache_scatter", (x, f, s[:3], "swa")), InputError, True),
        ("slots 2-D", ("cache_scatter", (x, f, s.view(4, 1), "swa")), InputError, True),
        ("pack out shape", ("cache_pack", (x, "swa", out8[:, :500])), InputError, True),
        ("pack out dtype", ("cache_pack", (x, "swa", out8.view(torch.int8))), InputTypeError, True),
        ("pack out strided", ("cache_pack", (x, "swa", torch.full((528, 4), SENTINEL, dtype=torch.uint8).t())),
         InputError, True),
        ("unpack width", ("cache_unpack", (packed, "global", None)), InputError, True),
        ("unpack int8", ("cache_unpack", (packed.view(torch.int8), "swa", None)), InputTypeError, True),
        ("unpack out fp16", ("cache_unpack", (packed, "swa", outb.half())), InputTypeError, True),
        ("unpack out shape", ("cache_unpack", (packed, "swa", outb[:3])), InputError, True),
        ("gather out shape", ("cache_gather", (f, s, "swa", outb[:3])), InputError, True),
        ("gather slots float", ("cache_gather", (f, s.double(), "swa", outb)), InputTypeError, True),
        ("index_v4 rows width", ("cache_scatter", (x, _field("index_v4"), s, "index_v4")), InputError, True),
        # tokenspeed runs these; the drop-in refuses them (documented)
        ("page bytes not contiguous", ("cache_scatter", (x, wide[:, :, :528], s, "swa")), LayoutError, False),
        ("repeated slot", ("cache_scatter", (x, f, torch.tensor([1, 2, 1, 70]), "swa")), InputError, False),
        ("repeated slot index_v4", ("cache_scatter", (xi, _field("index_v4"), torch.tensor([5, 5, -1, 9]),
                                                      "index_v4")), InputError, False),
        ("slots None", ("cache_scatter", (x, f, None, "swa")), InputTypeError, False),
    ]


@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_input_raises_typed_errors_with_nothing_written(released, case):
    name, call, error, released_refuses = case
    runs, _ = released
    rec = runs[("bad", name)][1]
    assert ("error" in rec) == released_refuses, rec.get("error")
    if released_refuses:
        assert rec["error"][0] == "ValueError", rec["error"]
    fn, args = call
    copies = tuple(rel.strided_copy(a) for a in args)
    assert all(c.stride() == a.stride() for a, c in zip(args, copies) if isinstance(a, torch.Tensor))
    with pytest.raises(error) as info:
        getattr(ts, fn)(*copies)
    assert isinstance(info.value, ValueError)
    for before, after in zip(args, copies):
        if isinstance(before, torch.Tensor):
            assert torch.equal(before, after), name

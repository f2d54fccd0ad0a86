"""The kernels' row geometry (kvformats_kernels/geometry.py) and the layout classes each kernel
module serves.

The geometry is derived from the regions' roles; these tests read the same numbers another way
(each format's regions by their declared names, the blocking from the format's parameters) for
every format and every parameter set it declares, so a derivation that picked the wrong region
fails here before any kernel runs.
"""

from __future__ import annotations

import attrs
import pytest

from kvformats.errors import LayoutError
from kvformats.formats import (FORMATS, CompressorState, CompressorStateV41, Fp4DsMlaV41, Fp4DsMlaV41Interleaved,
                               Fp8DsMla, Fp8DsMlaV32, Fp8DsMlaV41, Fp8DsMlaV41Interleaved, Fp8Indexer, Mxfp4Indexer,
                               Nvfp4DsMla)
from kvformats.layout import Field, Layout, Segment

pytest.importorskip("triton")

import kvformats_kernels as kk  # noqa: E402  (after conftest chose interpreter or GPU)
from kvformats_kernels import fp8_ds_mla, indexer, nvfp4, state, v41  # noqa: E402
from kvformats_kernels.dsv4 import compress  # noqa: E402
from kvformats_kernels.geometry import (NO_SPAN, block_constants, nope_rope_constants, row_geometry,  # noqa: E402
                                        target_constants)

# Each scaled format's regions by name: (scaled data, scale, unscaled tail, scale pad)
NAMES = {
    Fp8DsMla: ("nope", "scale", "rope", "scale_pad"),
    Fp8DsMlaV32: ("nope", "scale", "rope", None),
    Fp8Indexer: ("values", "scale", None, None),
    Mxfp4Indexer: ("values", "scale", None, None),
    Fp8DsMlaV41: ("values", "scale", None, None),
    Fp4DsMlaV41: ("values", "scale", None, None),
    Fp8DsMlaV41Interleaved: ("values", "scale", None, None),
    Fp4DsMlaV41Interleaved: ("values", "scale", None, None),
    Nvfp4DsMla: ("nope", "scale", "rope", None),
}
PAGE_SIZES = (1, 3, 64)


def _layouts(cls):
    return [cls(**params, page_size=ps) for params in cls.examples.params for ps in PAGE_SIZES]


def _cases():
    return [pytest.param(lay, id=f"{lay.name}-{'-'.join(map(str, lay.params.values()))}")
            for cls in NAMES for lay in _layouts(cls)]


def _span(layout, name):
    """(offset, row stride, bytes, elements, dtype) of a region read by its name."""
    if name is None:
        return 0, 0, 0, 0, "uint8"
    r = layout.region(name)
    elems = r.nbytes * 2 if r.dtype == "float4_e2m1fn_x2" else r.nbytes // r.element.unit_bytes
    return r.offset, r.row_stride, r.nbytes, elems, r.dtype


def _tuple(span):
    return span.offset, span.stride, span.nbytes, span.count, span.dtype


def _block(layout) -> int:
    """The format's own quantization block."""
    return getattr(layout, "quant_block", None) or layout.QUANT_BLOCK


def test_every_format_with_a_scaled_row_is_named_here():
    assert set(NAMES) == set(FORMATS) - {CompressorState, CompressorStateV41}


@pytest.mark.parametrize("layout", _cases())
def test_geometry_is_the_declared_regions(layout):
    data, scale, tail, pad = NAMES[type(layout)]
    g = row_geometry(layout)
    assert _tuple(g.data) == _span(layout, data)
    assert _tuple(g.scale) == _span(layout, scale)
    assert _tuple(g.tail) == _span(layout, tail)
    assert _tuple(g.pad) == _span(layout, pad)
    assert (g.tail is NO_SPAN) == (tail is None) and g.has_tail == (tail is not None)
    assert g.block == _block(layout) and g.blocks == layout.num_blocks and g.page_size == layout.page_size
    assert g.scale.count == layout.num_blocks  # one scale per block
    assert g.fp4 == (layout.region(data).dtype == "float4_e2m1fn_x2")
    assert row_geometry(layout) is g  # worked out once per layout


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@pytest.mark.parametrize("layout", _cases())
def test_kernel_constants_are_the_declared_regions(layout):
    """Each kernel family's constexprs, written out from the regions' names as the launchers
    wrote them before the geometry was derived."""
    data, scale, tail, pad = NAMES[type(layout)]
    off, stride, _, _, _ = _span(layout, data)
    s_off, s_stride, _, _, _ = _span(layout, scale)
    t_off, t_stride, _, _, _ = _span(layout, tail)
    p_off, p_stride, p_bytes, _, _ = _span(layout, pad)
    nb, qb = layout.num_blocks, _block(layout)
    blocks = dict(NB=nb, NB_P2=_pow2(nb), QB=qb)
    if tail is None:
        assert dict(block_constants(layout)) == dict(VAL_OFF=off, VAL_STRIDE=stride, SCALE_OFF=s_off,
                                                     SCALE_STRIDE=s_stride, **blocks)
    else:
        assert dict(nope_rope_constants(layout)) == dict(
            NOPE_OFF=off, NOPE_STRIDE=stride, ROPE_OFF=t_off, ROPE_STRIDE=t_stride, SCALE_OFF=s_off,
            SCALE_STRIDE=s_stride, PAD_OFF=p_off, PAD_STRIDE=p_stride, PAD_BYTES=p_bytes, PAD_P2=_pow2(p_bytes),
            **blocks)
        assert fp8_ds_mla._geometry(layout)["ROPE"] == layout.rope_dim
        assert fp8_ds_mla._geometry(layout)["SCALE_F32"] == (layout.region("scale").dtype == "float32")
    assert dict(target_constants(layout)) == dict(
        PAGE_SIZE=layout.page_size, NB=nb, QB=qb, OFF0=off, STRIDE0=stride, OFF1=t_off, STRIDE1=t_stride,
        SCALE_OFF=s_off, SCALE_STRIDE=s_stride, PAD_OFF=p_off, PAD_STRIDE=p_stride, PAD_BYTES=p_bytes,
        PAD_P2=_pow2(p_bytes) if p_bytes else 1)


@pytest.mark.parametrize("planar,interleaved,data,scale", [(Fp8DsMlaV41, Fp8DsMlaV41Interleaved, 512, 16),
                                                            (Fp4DsMlaV41, Fp4DsMlaV41Interleaved, 256, 32)])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_v41_layouts_place_the_same_records(planar, interleaved, data, scale, page_size):
    """The V4.1 pair: page-planar records at (0, data) and (page_size * data, scale); token
    interleaved at (0, data + scale) and (data, data + scale); the same blocking, record sizes
    and page width, so the kernels differ only in these four constexprs."""
    p, t = block_constants(planar(page_size=page_size)), block_constants(interleaved(page_size=page_size))
    row = data + scale
    assert (p["VAL_OFF"], p["VAL_STRIDE"], p["SCALE_OFF"], p["SCALE_STRIDE"]) == (0, data, page_size * data, scale)
    assert (t["VAL_OFF"], t["VAL_STRIDE"], t["SCALE_OFF"], t["SCALE_STRIDE"]) == (0, row, data, row)
    assert {k: p[k] for k in ("NB", "NB_P2", "QB")} == {k: t[k] for k in ("NB", "NB_P2", "QB")}
    assert planar(page_size=page_size).min_page_bytes == interleaved(page_size=page_size).min_page_bytes
    assert v41._geometry(planar(page_size=page_size))["FP4"] == v41._geometry(interleaved(page_size=page_size))["FP4"]


def test_a_layout_without_a_scaled_row_has_no_geometry():
    with pytest.raises(LayoutError, match="no block-scaled data region"):
        row_geometry(CompressorState())


@attrs.frozen(kw_only=True)
class _TailFirst(Layout):
    name = "tail_first"

    def _segments(self):
        return (Segment("token", (Field("tail", "bfloat16", 8), Field("values", "float8_e4m3fn", 32, scale="scale",
                                                                       block=32))),
                Segment("scales", (Field("scale", "float8_e8m0fnu", 1, role="scale"),)))


def test_an_unscaled_region_before_the_scaled_one_is_refused():
    with pytest.raises(LayoutError, match="comes before the scaled one"):
        row_geometry(_TailFirst(page_size=2))


# ----------------------------------------------------------------------------- served classes

# What the package served by format name before the modules declared their classes, and the
# token-interleaved V4.1 layouts since (the V4.1 module's encode honours every profile since then),
# and the V4.1 compressor ring (the state module's encode, without the APE add)
BEFORE = {"fp8_ds_mla": fp8_ds_mla, "fp8_ds_mla_v32": fp8_ds_mla, "fp8_indexer": indexer, "mxfp4_indexer": indexer,
          "compressor_state": state, "compressor_state_v41": state, "fp8_ds_mla_v41": v41, "fp4_ds_mla_v41": v41,
          "fp8_ds_mla_v41_interleaved": v41, "fp4_ds_mla_v41_interleaved": v41, "nvfp4_ds_mla": nvfp4}
PROFILED_BEFORE = {"fp8_ds_mla", "fp8_ds_mla_v32", "fp8_indexer", "mxfp4_indexer", "fp8_ds_mla_v41", "fp4_ds_mla_v41",
                   "fp8_ds_mla_v41_interleaved", "fp4_ds_mla_v41_interleaved", "nvfp4_ds_mla"}


def test_modules_serve_the_formats_they_served():
    assert kk.IMPLEMENTATIONS == BEFORE
    assert set(kk.PROFILED) == PROFILED_BEFORE and len(kk.PROFILED) == len(PROFILED_BEFORE)
    assert set(kk.kernel_profiles()) == PROFILED_BEFORE
    served = [cls for module in kk.MODULES for cls in module.SERVES]
    assert len(served) == len(set(served)) and set(served) == set(FORMATS)  # each format once
    format_keys = [key for key in kk.kernel_table() if len(key) == 2]  # (format, op); others name their kind
    assert {fmt for fmt, _ in format_keys} == set(BEFORE)
    for fmt, op in format_keys:
        assert kk.kernel_table()[(fmt, op)] is getattr(BEFORE[fmt], op)


def test_compress_modes_follow_the_target_geometry():
    """compress_kernel's branches: 1 writes fp8_ds_mla rows (store_ds_mla), 2 and 3 the indexer
    rows (store_indexer, 3 with e2m1 values)."""
    assert set(compress.TARGETS) == {Fp8DsMla, Fp8Indexer, Mxfp4Indexer}
    assert {cls: compress._mode(cls()) for cls in compress.TARGETS} == {Fp8DsMla: 1, Fp8Indexer: 2, Mxfp4Indexer: 3}
    assert compress.POOL == 0

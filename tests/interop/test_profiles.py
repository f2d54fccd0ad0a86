"""Numerics profiles: the default is byte-identical to before; each profile's rule on targeted
inputs (e2m1 ties, floors, the OCP exponent rule); dispatch refuses Triton for non-default
profiles' encode; the spec JSON carries the profile."""

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.numerics import codes as nx
from kvformats.spec.formats import format_spec, numerics_spec

QUANTIZED = ["fp8_ds_mla", "fp8_ds_mla_v32", "fp8_indexer", "mxfp4_indexer"]


def rows_of(layout, x):
    return layout.encode_rows(x)


@pytest.mark.parametrize("name", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer"])
def test_default_profile_is_tokenspeed_and_explicit_equals_implicit(name):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, kvf.get_format(name).head_dim, generator=g) * torch.exp2(torch.randint(-20, 20, (16, 1), generator=g).float())
    a, b = kvf.get_format(name), kvf.get_format(name, profile="tokenspeed")
    assert a == b and a.profile == "tokenspeed" and a.default_profile
    assert torch.equal(rows_of(a, x), rows_of(b, x))
    assert type(a).scale_rule == a.scale_rule  # class access: the default rule the kernels read


def test_default_rules_keep_their_constants():
    assert kvf.Fp8DsMla.scale_rule == nx.ScaleRule(element_max=448.0, floor=1e-4, floor_on="absmax")
    assert kvf.Fp8Indexer.scale_rule == nx.ScaleRule(element_max=448.0, floor=1e-10, floor_on="scale")
    assert kvf.Mxfp4Indexer.scale_rule == nx.ScaleRule(element_max=6.0, floor=1e-4, floor_on="absmax",
                                                       exponent_min=-127, exponent_max=127)


def test_default_bytes_equal_the_golden_vectors():
    """Vectors A..F (spec/upstream.md §12) still reproduce: see tests/test_golden.py; here one more
    direct check that the ue8m0 / float32 scale paths did not move."""
    x = torch.zeros(1, 512)
    row = kvf.Fp8DsMla().encode_rows(x)
    assert row[0, 576:].tolist() == [0x69] * 7 + [0]
    row = kvf.Fp8Indexer().encode_rows(torch.zeros(1, 128))
    assert row[0, 128:].tolist() == [0, 0, 0, 0x2F]


# ----- e2m1 ties: RNE vs threshold --------------------------------------------------------------
TIES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def test_e2m1_threshold_and_rne_at_every_midpoint():
    assert nx.e2m1_encode(TIES, "threshold").tolist() == [0, 1, 2, 3, 4, 5, 6]  # 0, .5, 1, 1.5, 2, 3, 4
    assert nx.e2m1_encode(TIES, "rne").tolist() == [0, 2, 2, 4, 4, 6, 6]        # 0, 1, 1, 2, 2, 4, 4
    assert nx.e2m1_encode(-TIES, "rne", signed_zero=True).tolist() == [8, 10, 10, 12, 12, 14, 14]


def test_e2m1_rne_agrees_with_ml_dtypes():
    ml = pytest.importorskip("ml_dtypes")
    import numpy as np

    ys = torch.linspace(-7, 7, 2801)
    ys = torch.cat([ys, TIES, -TIES, torch.tensor([0.0, -0.0, 1e-3, -1e-3])])
    codes = nx.e2m1_encode(ys, "rne", signed_zero=True)
    want = np.array(ys.numpy(), dtype=np.float32).astype(ml.float4_e2m1fn).view(np.uint8) & 0xF
    assert codes.tolist() == want.tolist()


def test_mxfp4_profiles_differ_exactly_at_the_ties():
    x = torch.zeros(1, 128)
    x[0, :8] = torch.tensor([6.0, 0.75, 1.75, 3.5, 1.25, 2.5, 5.0, -0.0])  # amax 6 -> e = 0
    ts = kvf.Mxfp4Indexer().encode_rows(x)
    rne = kvf.Mxfp4Indexer(profile="vllm").encode_rows(x)
    dg = kvf.Mxfp4Indexer(profile="deepgemm-ref").encode_rows(x)
    nib = lambda r: [int(r[0, i // 2]) >> (4 * (i % 2)) & 0xF for i in range(8)]  # noqa: E731
    assert nib(ts) == [7, 1, 3, 5, 2, 4, 6, 0]
    assert nib(rne) == [7, 2, 4, 6, 2, 4, 6, 8]
    assert torch.equal(dg, ts)


def test_mxfp4_vllm_floor():
    x = torch.full((1, 128), 1e-30)
    e_ts = int(kvf.Mxfp4Indexer().encode_rows(x)[0, 64]) - 127
    e_v = int(kvf.Mxfp4Indexer(profile="vllm").encode_rows(x)[0, 64]) - 127
    assert e_ts == -15  # ceil(log2(1e-4 / 6)) = ceil(-15.87)
    assert e_v == -102  # ceil(log2(1e-30 / 6)) = ceil(-102.25), above the 6*2^-126 floor
    z = kvf.Mxfp4Indexer(profile="vllm").encode_rows(torch.zeros(1, 128))
    assert z[0, 64:].tolist() == [1] * 4  # zero block: e = -126


@pytest.mark.parametrize("amax, e", [(6.0, 0), (7.99, 0), (8.0, 1), (4.0, 0), (3.99, -1), (1.0, -2),
                                     (2.0**-130, -127), (0.0, -127), (2.0**127, 125)])
def test_ocp_exponent_is_floor_log2_minus_emax(amax, e):
    rule = kvf.Mxfp4Indexer(profile="ocp").scale_rule
    assert int(rule._exponents_of_amax(torch.tensor([amax]))[0]) == e


def test_ocp_saturates_and_rounds_half_even():
    x = torch.zeros(1, 128)
    x[0, :4] = torch.tensor([7.0, -7.5, 0.75, 2.5])  # amax 7.5: e = 0; 7 and 7.5 clip to 6
    r = kvf.Mxfp4Indexer(profile="ocp").encode_rows(x)
    assert r[0, 64] == 127
    assert [int(r[0, 0]) & 0xF, int(r[0, 0]) >> 4, int(r[0, 1]) & 0xF, int(r[0, 1]) >> 4] == [7, 15, 2, 4]
    assert kvf.Mxfp4Indexer().encode_rows(x)[0, 64] == 128  # the ceil rule: e = 1


def test_fp8_ds_mla_flashmla_ref_floor_on_the_scale():
    x = torch.zeros(1, 512)
    x[0, 64:128] = 2.0**-12
    ts, fm = kvf.Fp8DsMla().encode_rows(x), kvf.Fp8DsMla(profile="flashmla-ref").encode_rows(x)
    assert ts[0, 576:578].tolist() == [105, 127 - 20]  # 1e-4 absmax floor; 2^-12/448 -> e = -20
    assert fm[0, 576:578].tolist() == [114, 114]  # ceil(log2(1e-4)) = -13 for both
    assert torch.equal(kvf.Fp8DsMla(profile="vllm").encode_rows(x), ts)
    big = torch.randn(4, 512) * 100  # amax/448 far above 1e-4: all three agree
    assert torch.equal(kvf.Fp8DsMla(profile="flashmla-ref").encode_rows(big), kvf.Fp8DsMla().encode_rows(big))


def test_fp8_indexer_deepgemm_ref_arbitrary_scale_and_division():
    x = torch.linspace(-3, 3, 128).reshape(1, 128)
    r = kvf.Fp8Indexer(profile="deepgemm-ref").encode_rows(x)
    s = r[0, 128:].contiguous().view(torch.float32)
    assert s.item() == torch.tensor(3.0) / torch.tensor(448.0)
    assert torch.equal(r[0, :128], (x[0] / s).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    zero = kvf.Fp8Indexer(profile="deepgemm-ref").encode_rows(torch.zeros(1, 128))
    assert zero[0, 128:].contiguous().view(torch.float32).item() == torch.tensor(1e-4) / 448
    v = kvf.Fp8Indexer(profile="vllm").encode_rows(torch.zeros(1, 128))
    assert v[0, 128:].contiguous().view(torch.float32).item() == 2.0**-22  # ceil(log2(1e-4/448))


def test_v32_profiles_scale_storage():
    x = torch.zeros(1, 576)
    x[0, :128] = 3.0
    fm = kvf.Fp8DsMlaV32().encode_rows(x)[0, 512:528].contiguous().view(torch.float32).tolist()
    vl = kvf.Fp8DsMlaV32(profile="vllm").encode_rows(x)[0, 512:528].contiguous().view(torch.float32).tolist()
    assert fm == [2.0**-7, 2.0**-13, 2.0**-13, 2.0**-13]
    assert vl[0] == torch.tensor(3.0).div(448).item() and vl[1:] == [2.0**-126] * 3


@pytest.mark.parametrize("name", QUANTIZED)
def test_round_trip_bound_of_every_profile(name):
    g = torch.Generator().manual_seed(7)
    for prof in kvf.supported_profiles()[name]:
        lay = kvf.get_format(name, profile=prof)
        d = lay.head_dim
        x = (torch.randn(32, d, generator=g) * torch.exp2(torch.randint(-30, 30, (32, 1), generator=g).float()))
        x = x.to(torch.bfloat16).float()
        y = lay.decode_rows(lay.encode_rows(x)).double()
        nope = getattr(lay, "nope_dim", d)
        xs, ys = x.double()[:, :nope], y[:, :nope]
        err = (xs - ys).abs()
        rows = lay.encode_rows(x)
        if name == "mxfp4_indexer":
            e = rows[:, d // 2:].to(torch.int64) - 127
            unit = torch.exp2(e.double()).repeat_interleave(32, dim=1)
            assert bool((err <= (2 * unit if prof == "ocp" else unit)).all()), prof
            continue
        block = 64 if name == "fp8_ds_mla" else 128
        if name == "fp8_ds_mla":
            s = torch.exp2(rows[:, 576:583].double() - 127)
        elif name == "fp8_ds_mla_v32":
            s = rows[:, 512:528].contiguous().view(torch.float32).double()
        else:
            s = rows[:, d:].contiguous().view(torch.float32).double()
        s = s.repeat_interleave(block, dim=1)
        bound = torch.maximum(xs.abs() / 16, s * 2.0**-10)
        if not lay.scale_rule.power_of_two:
            bound = bound + (2.0**-8 if name == "fp8_ds_mla_v32" else 2.0**-23) * torch.maximum(xs.abs(), ys.abs())
        assert bool((err <= bound).all()), (prof, (err - bound).max())
        if nope < d:
            assert torch.equal(y[:, nope:], x.double()[:, nope:])  # RoPE exact


# ----- declaration, spec, dispatch ---------------------------------------------------------------
def test_supported_profiles_table():
    assert kvf.supported_profiles() == {
        "fp8_ds_mla": ("tokenspeed", "vllm", "flashmla-ref"),
        "fp8_ds_mla_v32": ("flashmla-ref", "vllm"),
        "fp8_ds_mla_v41": ("tokenspeed", "flashmla"), "fp4_ds_mla_v41": ("tokenspeed", "flashmla"),
        "fp8_ds_mla_v41_interleaved": ("flashmla", "vllm", "tokenspeed"),
        "fp4_ds_mla_v41_interleaved": ("flashmla", "vllm", "tokenspeed"),
        **({"nvfp4_ds_mla": ("flashmla",)} if "nvfp4_ds_mla" in kvf.list_formats() else {}),
        "fp8_indexer": ("tokenspeed", "vllm", "deepgemm-ref"),
        "mxfp4_indexer": ("tokenspeed", "vllm", "deepgemm-ref", "ocp")}


@pytest.mark.parametrize("name", QUANTIZED)
def test_spec_json_carries_the_profile(name):
    for prof in kvf.supported_profiles()[name]:
        lay = kvf.get_format(name, profile=prof)
        spec = format_spec(lay)
        assert spec["params"]["profile"] == prof
        num = spec["numerics"]
        assert num["profile"]["name"] == prof and num["profile"]["scale_rule"] == lay.scale_rule.as_dict()
        assert num["scale_rule"] == lay.scale_rule.as_dict()
        assert list(num["profiles"]) == list(kvf.supported_profiles()[name])
    assert numerics_spec(kvf.get_format("mxfp4_indexer", profile="vllm"))["element_rounding"].startswith("e2m1 round-half-even")


def test_fingerprint_follows_the_profile():
    from kvformats.spec.formats import fingerprint

    assert fingerprint(kvf.Fp8DsMla()) != fingerprint(kvf.Fp8DsMla(profile="vllm"))


def test_kernel_profiles_are_declared_and_others_fall_back(monkeypatch):
    """A profile the kernel package did not declare: encode resolves to the reference under auto
    and is refused under triton (naming the fix); a declared one resolves to the kernel."""
    cuda = torch.device("cuda")
    lay = kvf.Mxfp4Indexer(profile="vllm")
    assert registry.resolve_for(lay, "encode", "triton", cuda) is registry.resolve("mxfp4_indexer", "encode",
                                                                                   "triton", cuda)
    monkeypatch.setitem(registry._KERNEL_PROFILES, "mxfp4_indexer", ("tokenspeed",))
    fn = registry.resolve_for(lay, "encode", "auto", cuda)
    assert fn is registry.resolve("mxfp4_indexer", "encode", "reference", cuda)
    with pytest.raises(kvf.BackendUnavailableError, match="numerics profile 'vllm'.*backend='reference'"):
        registry.resolve_for(lay, "encode", "triton", cuda)


def test_triton_on_cpu_refused_through_the_public_method_before_any_write():
    lay = kvf.Fp8Indexer(profile="deepgemm-ref")
    cache = lay.allocate(1)
    with pytest.raises(kvf.BackendUnavailableError):
        lay.encode(torch.ones(2, 128), cache, torch.tensor([0, 1]), backend="triton")
    assert int(cache.count_nonzero()) == 0

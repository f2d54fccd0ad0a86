"""Format and backend registry: names, construction, backend selection, lazy kernels."""

import subprocess
import sys

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.layout import Layout

CLASSES = {"compressor_state": kvf.CompressorState, "fp8_ds_mla": kvf.Fp8DsMla,
           "fp8_indexer": kvf.Fp8Indexer, "mxfp4_indexer": kvf.Mxfp4Indexer}


def test_list_formats_is_sorted_and_complete():
    names = kvf.list_formats()
    assert names == sorted(names) and len(set(names)) == len(names)
    assert set(CLASSES) <= set(names)
    for name in names:
        layout = kvf.get_format(name)
        assert isinstance(layout, Layout) and layout.name == name


def test_every_layout_subclass_exported_is_registered():
    exported = {getattr(kvf, n) for n in kvf.__all__}
    layouts = {c for c in exported if isinstance(c, type) and issubclass(c, Layout) and c is not Layout}
    assert {c.name for c in layouts} <= set(kvf.list_formats())


@pytest.mark.parametrize("name, params", [
    ("fp8_ds_mla", {}), ("fp8_ds_mla", {"page_size": 2}), ("fp8_ds_mla", {"head_dim": 192, "rope_dim": 64}),
    ("fp8_indexer", {"page_size": 64}), ("mxfp4_indexer", {"head_dim": 64, "page_size": 7}),
    ("compressor_state", {"ratio": 128, "page_size": 8}), ("compressor_state", {"head_dim": 128}),
])
def test_get_format_equals_the_class(name, params):
    layout = kvf.get_format(name, **params)
    assert layout == CLASSES[name](**params)
    assert type(layout) is CLASSES[name]
    assert hash(layout) == hash(CLASSES[name](**params))
    assert layout != CLASSES[name](**{**params, "page_size": params.get("page_size", 1) + 1})


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("op", ["encode", "decode", "gather"])
def test_auto_backend_on_cpu_is_the_reference(name, op):
    impl = registry.resolve(name, op, "auto", torch.device("cpu"))
    assert impl is registry.resolve(name, op, "reference", torch.device("cpu"))
    assert impl.__module__ == "kvformats.codec.slot_ops"


def test_auto_on_cpu_does_not_load_kernels():
    code = ("import sys, torch, kvformats as kvf\n"
            "lay = kvf.get_format('mxfp4_indexer')\n"
            "c = lay.allocate(1)\n"
            "lay.encode(torch.ones(1, 128), c, torch.tensor([0]))\n"
            "lay.decode(c, torch.tensor([0]))\n"
            "assert 'kvformats_kernels' not in sys.modules, 'kernels loaded on CPU'\n"
            "assert 'triton' not in sys.modules, 'triton imported on CPU'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_root())


def _root():
    import pathlib
    return str(pathlib.Path(kvf.__file__).resolve().parent.parent)


def test_import_kvformats_does_not_import_triton():
    out = subprocess.run([sys.executable, "-c", "import sys, kvformats; "
                          "print('triton' in sys.modules, 'kvformats_kernels' in sys.modules, "
                          "'hypothesis' in sys.modules)"],
                         capture_output=True, text=True, check=True, cwd=_root())
    assert out.stdout.split() == ["False", "False", "False"]


def test_resolve_rejects_unknown_backend_names():
    with pytest.raises(kvf.InputError, match="'tpu'"):
        registry.resolve("fp8_ds_mla", "encode", "tpu", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown backend"):
        registry.register_op("fp8_ds_mla", "encode", "tpu")


def test_triton_backend_on_cpu_names_the_fix():
    with pytest.raises(kvf.BackendUnavailableError) as info:
        registry.resolve("fp8_ds_mla", "encode", "triton", torch.device("cpu"))
    assert isinstance(info.value, RuntimeError)
    assert "backend='reference'" in str(info.value)


def test_resolve_sees_an_implementation_registered_after_a_call(monkeypatch):
    # resolve() memoises its choice; registering must not leave a stale one behind
    cpu = torch.device("cpu")
    monkeypatch.setitem(registry._OPS, ("zz_fmt", "encode"), {})

    def first(*a):
        return 1

    def second(*a):
        return 2

    registry.register_op("zz_fmt", "encode", "reference")(first)
    assert registry.resolve("zz_fmt", "encode", "auto", cpu) is first
    registry.register_op("zz_fmt", "encode", "reference")(second)
    assert registry.resolve("zz_fmt", "encode", "auto", cpu) is second
    assert registry.resolve("zz_fmt", "encode", "reference", cpu) is second
    with pytest.raises(kvf.BackendUnavailableError):  # errors are raised each time, never stored
        registry.resolve("zz_fmt", "encode", "triton", cpu)
    with pytest.raises(kvf.BackendUnavailableError):
        registry.resolve("zz_fmt", "encode", "triton", cpu)
    registry._RESOLVED.clear()


def test_every_error_class_is_exported():
    from kvformats import errors

    classes = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, kvf.KVFormatError)}
    # StrategyArgumentError needs hypothesis, which ``import kvformats`` must not import: it is
    # exported by kvformats.testing.strategies instead
    classes.discard(getattr(errors, "StrategyArgumentError", None))
    assert classes <= {getattr(kvf, n) for n in kvf.__all__}


def test_a_format_named_like_the_model_ops_family_does_not_collide_with_them():
    """The model ops register under OpFamily("deepseek_v4"), a key no format name equals: a format
    of that name gets its own ops, lists as a format, and unregistering it leaves the model ops."""
    import attrs

    from kvformats import deepseek_v4 as dsv4

    cpu = torch.device("cpu")
    model_op = registry.resolve_model_op(dsv4.FAMILY, "swa_insert", "reference", cpu)
    assert model_op.__module__ == "kvformats.deepseek_v4.swa"
    assert dsv4.FAMILY not in kvf.list_formats()
    assert registry.model_ops(dsv4.FAMILY) == sorted(dsv4.MODEL_OPS)

    @registry.register_format
    @attrs.frozen
    class Clash:
        name = dsv4.FAMILY  # a class attribute, as a layout's name is

    def clash_op(*a):
        return "the format's"

    try:
        registry.register_op(dsv4.FAMILY, "swa_insert", "reference")(clash_op)
        assert dsv4.FAMILY in kvf.list_formats() and type(kvf.get_format(dsv4.FAMILY)) is Clash
        assert registry.resolve(dsv4.FAMILY, "swa_insert", "auto", cpu) is clash_op
        assert registry.resolve_model_op(dsv4.FAMILY, "swa_insert", "auto", cpu) is model_op
    finally:
        registry.unregister_format(dsv4.FAMILY)
    assert dsv4.FAMILY not in kvf.list_formats()
    assert registry.resolve_model_op(dsv4.FAMILY, "swa_insert", "reference", cpu) is model_op
    assert registry.model_ops(dsv4.FAMILY) == sorted(dsv4.MODEL_OPS)


def test_every_key_of_the_kernel_table_is_one_the_registry_reads():
    pytest.importorskip("triton")
    import kvformats_kernels as kk
    from kvformats_kernels import dsv4 as kernels_dsv4

    table = kk.kernel_table()
    assert all(len(k) == 2 or k[0] in (registry.MODEL_OP, registry.LIBRARY) for k in table)
    registry._load_kernels()
    for op, fn in kernels_dsv4.LAUNCHERS.items():
        assert registry._OPS[(registry.OpFamily(kernels_dsv4.FAMILY), op)]["triton"] is fn
        assert (kernels_dsv4.FAMILY, op) not in registry._OPS  # not in the formats' key space
    assert registry.library_kernel("transfer", "page_checksums") is table[(registry.LIBRARY, "transfer",
                                                                             "page_checksums")]


@pytest.mark.parametrize("name", ["../escaped", "a/b", "Upper", "dash-ed", "dot.ted", "", " spaced", "line\n",
                                  "ünï", "..", None, 7])
def test_a_format_name_that_could_leave_the_spec_folder_is_refused(name):
    """Issue 44 item 12: ``spec --write`` and ``docs --write`` build file names from a format's
    name, so a format named "../escaped" wrote outside the spec folder."""
    import attrs

    @attrs.frozen
    class Named:
        pass

    Named.name = name  # a class attribute, as a layout's name is
    before = kvf.list_formats()
    try:
        with pytest.raises(kvf.LayoutError, match=r"\[a-z0-9_\]\+"):
            registry.register_format(Named)
        assert kvf.list_formats() == before
    finally:
        if isinstance(name, str) and name in registry._FORMATS:  # registered after all: undone
            registry.unregister_format(name)


def test_a_plain_format_name_registers():
    import attrs

    @registry.register_format
    @attrs.frozen
    class Plain:
        name = "plain_rows_2"

    try:
        assert "plain_rows_2" in kvf.list_formats()
    finally:
        registry.unregister_format("plain_rows_2")

"""What a registered format can do, read from its declaration and the codec registry: the one
place the test suite asks before it runs a case of a format, so that a format added outside the
package (with no kernels, no committed spec files) is covered by every generic test and skipped
only by a capability it lacks, with that capability named in the skip reason.

    require(name, "kernels", op="decode")   # pytest.skip unless the kernel table registered one
    LAYOUTS = with_declared_cases(CURATED)  # kernel tests: every format with kernels, none listed by hand

Capabilities:

* ``kernels``: the kernel package registered a Triton implementation of ``op`` for the format
  (``kvformats.codec.registry.has_backend``).
* ``published``: the format is one of the package's (``kvformats.formats.FORMATS``), so its spec
  JSON, prose and generated pages are committed files.
* ``paged_reads``: its rows decode to one tensor (``Layout.paged_reads``), which
  ``dequantize_gather`` fills.
* ``one_block``: it names its one-block geometry (``Layout.examples.one_block``).
"""

from __future__ import annotations

from kvformats.codec import registry
from kvformats.errors import InputError
from kvformats.formats import FORMATS

CAPABILITIES = ("kernels", "published", "paged_reads", "one_block")


def has(name: str, capability: str, op: str = "encode") -> bool:
    """Whether the registered format ``name`` has ``capability`` (one of CAPABILITIES)."""
    if capability == "kernels":
        return registry.has_backend(name, op, "triton")
    layout = registry.get_format(name)
    if capability == "published":
        return type(layout) in FORMATS
    if capability == "paged_reads":
        return layout.paged_reads
    if capability == "one_block":
        return type(layout).examples.one_block is not None
    raise InputError(f"unknown capability {capability!r}; capabilities: {', '.join(CAPABILITIES)}")


REASONS = {
    "kernels": "has no Triton kernel for {op} (capability 'kernels': registry.has_backend)",
    "published": "is not one of the package's formats (capability 'published': kvformats.formats.FORMATS), "
                 "so it has no committed spec or docs files",
    "paged_reads": "decodes to several tensors (capability 'paged_reads': Layout.paged_reads)",
    "one_block": "names no one-block geometry (capability 'one_block': Layout.examples.one_block)",
}


def require(name: str, capability: str, op: str = "encode") -> None:
    """``pytest.skip`` the running test, naming the capability, unless ``name`` has it."""
    import pytest  # the suite's runner; the rest of this module does without it

    if not has(name, capability, op):
        pytest.skip(f"{name} " + REASONS[capability].format(op=op))


def kernel_formats(op: str = "encode") -> list[str]:
    """Every registered format with a Triton ``op`` (whatever kernel package registered it)."""
    return [name for name in registry.list_formats() if registry.has_backend(name, op, "triton")]


def declared_layouts(name: str) -> dict:
    """The format's declared test layouts: its small parameters (``examples.small_params``) merged
    with each of its ``examples.params``; id -> layout (the format's name for the first)."""
    examples = type(registry.get_format(name)).examples
    small = dict(examples.small_params or {})
    return {name if i == 0 else f"{name}-ex{i}": registry.get_format(name, **{**small, **params})
            for i, params in enumerate(examples.params)}


def quant_block(layout) -> tuple[int, float]:
    """(the first scaled field's block, the scale rule's element max); (0, 0.0) for a format that
    stores unscaled values (the compressor states)."""
    blocks = [f.block for s in layout.segments for f in s.fields if getattr(f, "block", None)]
    rule = getattr(layout, "scale_rule", None)
    return (blocks[0], float(rule.element_max)) if blocks and rule is not None else (0, 0.0)


def with_declared_cases(curated: dict, op: str = "encode", entry=None) -> dict:
    """``curated`` (id -> a case whose ``entry(case)`` is its layout) and, for every format with a
    Triton ``op`` that no curated case covers (one added outside the package, or by a kernel
    package), its declared layouts as cases (``entry`` None: the layout itself; else the case is
    (layout, block, element max)). A new format's kernels get the kernel suite with no list edited."""
    def layout_of(case):
        return case if entry is None else entry(case)

    covered = {layout_of(case).name for case in curated.values()}
    out = dict(curated)
    for name in kernel_formats(op):
        if name not in covered:
            for key, layout in declared_layouts(name).items():
                out[key] = layout if entry is None else (layout, *quant_block(layout))
    return out

"""What a registered format can do, read from its declaration and the codec registry: the one
place the test suite asks before it runs a case of a format, so that a format added outside the
package (with no kernels, no committed spec files) is covered by every generic test and skipped
only by a capability it lacks, with that capability named in the skip reason.

    require(name, "kernels", op="decode")   # pytest.skip unless the kernel table registered one

Capabilities:

* ``kernels``: the kernel package registered a Triton implementation of ``op`` for the format
  (``kvformats.codec.registry.has_backend``).
* ``published``: the format is one of the package's (``kvformats.formats.FORMATS``), so its spec
  JSON, prose and generated pages are committed files.
* ``paged_reads``: its rows decode to one tensor (``Layout.paged_reads``), which
  ``dequantize_gather`` fills.
* ``one_block``: it names its one-block geometry (``Layout.one_block_params``).
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
        return type(layout).one_block_params is not None
    raise InputError(f"unknown capability {capability!r}; capabilities: {', '.join(CAPABILITIES)}")


REASONS = {
    "kernels": "has no Triton kernel for {op} (capability 'kernels': registry.has_backend)",
    "published": "is not one of the package's formats (capability 'published': kvformats.formats.FORMATS), "
                 "so it has no committed spec or docs files",
    "paged_reads": "decodes to several tensors (capability 'paged_reads': Layout.paged_reads)",
    "one_block": "names no one-block geometry (capability 'one_block': Layout.one_block_params)",
}


def require(name: str, capability: str, op: str = "encode") -> None:
    """``pytest.skip`` the running test, naming the capability, unless ``name`` has it."""
    import pytest  # the suite's runner; the rest of this module does without it

    if not has(name, capability, op):
        pytest.skip(f"{name} " + REASONS[capability].format(op=op))

"""Triton kernels for kvformats, loaded by ``kvformats.codec.registry`` on the first CUDA call.

The registry imports this package by name and reads two tables: ``kernel_table()``, each
format's encode / decode / gather and paged ops (dequantize_gather, gather_paged: byte formats;
decode_topk: all) and each DeepSeek V4 operation, registered as the "triton" backend; and
``kernel_profiles()``, the numerics profiles each Triton encode implements. Both are empty when
Triton does not import, and ``backend="triton"`` then raises BackendUnavailableError. This
package registers nothing itself and imports no dispatch module back. Each implementation takes
the same arguments as the reference (``kvformats.codec.slot_ops``), already validated there, and never
synchronises with the host, so it can be captured in a CUDA graph. Bytes equal the reference's
bytes exactly.
"""

from __future__ import annotations

try:
    import triton  # noqa: F401
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    AVAILABLE = False
else:
    AVAILABLE = True

# the ops a format's kernel module may implement (compressor_state has no single-dtype decode
# and no byte workspaces, so it lacks some)
CODEC_OPS = ("encode", "decode", "gather", "dequantize_gather", "gather_paged", "decode_topk")

if AVAILABLE:
    from kvformats.numerics.profiles import profile_tables
    from kvformats_kernels import dsv4, dsv41, fp8_ds_mla, indexer, nvfp4, state, transfer, v41

    # Each format module names the layout classes it serves (SERVES) and whether its encode's
    # constexprs implement every numerics profile of them (ENCODES_PROFILES); the tables below,
    # keyed by format name as the registry reads them, are derived from those declarations.
    MODULES = (fp8_ds_mla, indexer, state, v41, nvfp4)
    IMPLEMENTATIONS = {cls.name: module for module in MODULES for cls in module.SERVES}  # format name -> module
    PROFILED = tuple(cls.name for module in MODULES if getattr(module, "ENCODES_PROFILES", False)
                     for cls in module.SERVES)


def kernel_table() -> dict:
    """Key -> Triton implementation: (format, op); ("model op", family, op) for a model op;
    ("library", module, name) for a launcher a library module calls (kvformats.codec.registry
    reads these keys: MODEL_OP, LIBRARY)."""
    if not AVAILABLE:
        return {}
    table: dict[tuple, object] = {(fmt, op): getattr(module, op) for fmt, module in IMPLEMENTATIONS.items()
             for op in CODEC_OPS if hasattr(module, op)}
    for family in (dsv4, dsv41):
        table.update({("model op", family.FAMILY, op): fn for op, fn in family.LAUNCHERS.items()})
    table[("library", "transfer", "page_checksums")] = transfer.page_checksums
    return table


def kernel_profiles() -> dict:
    """Format -> the numerics profiles its Triton ``encode`` implements (formats not named get
    their default only)."""
    if not AVAILABLE:
        return {}
    return {fmt: profile_tables()[fmt].names for fmt in PROFILED}

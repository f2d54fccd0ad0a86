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
    from kvformats.numerics.profiles import profile_table
    from kvformats_kernels import dsv4, fp8_ds_mla, indexer, state, transfer, v41

    IMPLEMENTATIONS = {
        "fp8_ds_mla": fp8_ds_mla,
        "fp8_ds_mla_v32": fp8_ds_mla,  # the V3.2 656 B rows: the same kernels with float32 scales
        "fp8_indexer": indexer,
        "mxfp4_indexer": indexer,
        "compressor_state": state,
        "fp8_ds_mla_v41": v41,  # the V4.1 rows (528 B; 288 B fp4 extra cache)
        "fp4_ds_mla_v41": v41,
    }
    # every numerics profile of these formats is a set of encode constexprs (_common.profile_constants)
    PROFILED = ("fp8_ds_mla", "fp8_ds_mla_v32", "fp8_indexer", "mxfp4_indexer")


def kernel_table() -> dict:
    """Key -> Triton implementation: (format, op); ("model op", family, op) for a model op;
    ("library", module, name) for a launcher a library module calls (kvformats.codec.registry
    reads these keys: MODEL_OP, LIBRARY)."""
    if not AVAILABLE:
        return {}
    table = {(fmt, op): getattr(module, op) for fmt, module in IMPLEMENTATIONS.items()
             for op in CODEC_OPS if hasattr(module, op)}
    table.update({("model op", dsv4.FAMILY, op): fn for op, fn in dsv4.LAUNCHERS.items()})
    table[("library", "transfer", "page_checksums")] = transfer.page_checksums
    return table


def kernel_profiles() -> dict:
    """Format -> the numerics profiles its Triton ``encode`` implements (formats not named get
    their default only)."""
    if not AVAILABLE:
        return {}
    return {fmt: profile_table(fmt).names for fmt in PROFILED}

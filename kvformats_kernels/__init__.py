"""Triton kernels for kvformats, imported lazily by ``kvformats.registry`` on the first CUDA call.

If Triton imports, every format's encode / decode / gather and the paged ops
(dequantize_gather, gather_paged: byte formats; decode_topk: all) are registered as the
"triton" backend; if not, nothing is registered and ``backend="triton"`` raises
BackendUnavailableError. Each implementation takes the same arguments as the reference
(``kvformats.ops``), already validated there, and never synchronises with the host, so it
can be captured in a CUDA graph. Bytes equal the reference's bytes exactly.
"""

from __future__ import annotations

try:
    import triton  # noqa: F401
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    AVAILABLE = False
else:
    AVAILABLE = True

if AVAILABLE:
    from kvformats.paged import PAGED_OPS
    from kvformats.profiles import profile_table
    from kvformats.registry import register_kernel_profiles, register_op
    from kvformats_kernels import fp8_ds_mla, indexer, state, v41

    IMPLEMENTATIONS = {
        "fp8_ds_mla": fp8_ds_mla,
        "fp8_ds_mla_v32": fp8_ds_mla,  # the V3.2 656 B rows: the same kernels with float32 scales
        "fp8_indexer": indexer,
        "mxfp4_indexer": indexer,
        "compressor_state": state,
        "fp8_ds_mla_v41": v41,  # the V4.1 rows (528 B; 288 B fp4 extra cache)
        "fp4_ds_mla_v41": v41,
    }
    for _fmt, _module in IMPLEMENTATIONS.items():
        for _op in ("encode", "decode", "gather", *PAGED_OPS):
            # compressor_state has no single-dtype decode / byte workspaces
            if hasattr(_module, _op):
                register_op(_fmt, _op, "triton")(getattr(_module, _op))
    # every numerics profile of these formats is a set of encode constexprs (_common.profile_constants)
    for _fmt in ("fp8_ds_mla", "fp8_ds_mla_v32", "fp8_indexer", "mxfp4_indexer"):
        register_kernel_profiles(_fmt, profile_table(_fmt).names)
    from kvformats_kernels import dsv4  # noqa: E402,F401  (registers the deepseek_v4 operations)

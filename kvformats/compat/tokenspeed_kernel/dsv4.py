"""tokenspeed-kernel 0.1.4's DeepSeek V4 cache-side functions (``tokenspeed_kernel.ops.attention.dsv4``
and its ``.triton`` module) under their own names, on kvformats' layouts and model ops:

    # from tokenspeed_kernel.ops.attention.dsv4.triton import dsv4_save_compressor_state
    from kvformats.compat.tokenspeed_kernel.dsv4 import dsv4_save_compressor_state

The cache writers, readers and the indexer query (``_dsv4_cache``) and the index and slot-mapping
helpers (``_dsv4_indices``); docs/porting-from-tokenspeed.md lists the attention kernels, which are
out of scope.
"""

from kvformats.compat.tokenspeed_kernel import _dsv4_cache, _dsv4_indices
from kvformats.compat.tokenspeed_kernel._dsv4_cache import *  # noqa: F403
from kvformats.compat.tokenspeed_kernel._dsv4_indices import *  # noqa: F403

__all__ = sorted([*_dsv4_cache.__all__, *_dsv4_indices.__all__])

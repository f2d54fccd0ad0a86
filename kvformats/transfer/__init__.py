"""Prefill/decode disaggregation: describe, move and verify a request's cache pages.

``describe_caches`` and ``handshake`` (describe.py) compare both sides' caches, a peer's
descriptions checked first (bounds.py); ``plan_transfer`` (plan.py) lists the byte segments to
move, mapping token rows between pages of other sizes where the two sides' geometries differ
(geometry.py: ``Ring`` for ring caches); ``page_checksums`` and ``row_checksums``
(checksum.py, its argument checks in checks.py) and ``verify`` (verify.py) check what arrived;
``kvformats.transfer.engines`` moves the bytes with NIXL or Mooncake (optional extras, imported
only when used); ``endpoint.Endpoint`` is one side; ``LayerSender`` and ``LayerReceiver``
(layerwise.py, layers grouped by layers.py) move and verify a request layer by layer.
See docs/transfer.md and examples/transfer_two_process.py.
"""

from kvformats.transfer.checksum import page_checksums, reference_checksums, row_checksums
from kvformats.transfer.describe import CacheDesc, describe_cache, describe_caches, from_json, handshake, to_json
from kvformats.transfer.geometry import Ring
from kvformats.transfer.layers import layer_groups
from kvformats.transfer.layerwise import LayerReceiver, LayerSender
from kvformats.transfer.plan import CachePlan, TransferPlan, coalesce, plan_transfer
from kvformats.transfer.verify import expected_checksums, save_request_pages, verify

__all__ = ["CacheDesc", "CachePlan", "LayerReceiver", "LayerSender", "Ring", "TransferPlan", "coalesce",
           "describe_cache", "describe_caches", "expected_checksums", "from_json", "handshake", "layer_groups",
           "page_checksums", "plan_transfer", "reference_checksums", "row_checksums", "save_request_pages", "to_json",
           "verify"]

# tiers (docs/tiers.md): offload a request's rows to host memory or a file, restore them exactly
from kvformats.transfer.tiers import HostTier, RequestPages, TierRows, offload, restore  # noqa: E402
from kvformats.transfer.tiers_file import load_tier, save_tier  # noqa: E402

__all__ += ["HostTier", "RequestPages", "TierRows", "load_tier", "offload", "restore", "save_tier"]
from kvformats.transfer.convert_receive import conversion_route, receive_converted, staging_for  # noqa: E402,F401

"""Prefill/decode disaggregation: describe, move and verify a request's cache pages.

``describe_caches`` and ``handshake`` (describe.py) compare both sides' caches, a peer's
descriptions checked first (bounds.py); ``plan_transfer`` (plan.py) lists the byte segments to
move; ``page_checksums`` (checksum.py, its argument checks in checks.py) and ``verify``
(verify.py) check what arrived; ``kvformats.transfer.engines`` moves the bytes with NIXL or
Mooncake (optional extras, imported only when used); ``endpoint.Endpoint`` is one side.
See docs/transfer.md and examples/transfer_two_process.py.
"""

from kvformats.transfer.checksum import page_checksums, reference_checksums
from kvformats.transfer.describe import CacheDesc, describe_cache, describe_caches, from_json, handshake, to_json
from kvformats.transfer.plan import CachePlan, TransferPlan, coalesce, plan_transfer
from kvformats.transfer.verify import expected_checksums, save_request_pages, verify

__all__ = ["CacheDesc", "CachePlan", "TransferPlan", "coalesce", "describe_cache", "describe_caches", "from_json",
           "expected_checksums", "handshake", "page_checksums", "plan_transfer", "reference_checksums",
           "save_request_pages", "to_json", "verify"]

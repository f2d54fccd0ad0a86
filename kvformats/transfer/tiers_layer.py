"""The tiers on the layer-step reference (``kvformats.dsv4_layer``): where a request's rows of
each of its seven caches lie, and which rows a tier keeps after ``tokens`` positions.

The names are ``LayerCaches.tensors()``'s: ``swa``, ``csa``, ``hca``, ``index`` (fp8_ds_mla and
the indexer record) and ``csa_state``, ``idx_state``, ``hca_state`` (compressor states).
"""

from __future__ import annotations

from kvformats.dsv4_layer.pipeline_config import CSA_RATIO, HCA_RATIO
from kvformats.errors import InputError
from kvformats.transfer.tiers_rows import RequestPages, compressed_rows, state_rows, swa_rows

# cache name -> (block-table attribute of LayerCaches, layout attribute)
TABLES = {"swa": ("swa_table", "kv_layout"), "csa": ("csa_table", "kv_layout"), "hca": ("hca_table", "kv_layout"),
          "index": ("csa_table", "index_layout"), "csa_state": ("csa_state_table", "csa_state_layout"),
          "idx_state": ("idx_state_table", "idx_state_layout"), "hca_state": ("hca_state_table", "hca_state_layout")}


def layer_step_pages(step, request: int) -> dict[str, RequestPages]:
    """Cache name -> the request's pages of ``step`` (a ``LayerStep``): its block-table rows,
    copied to the host once (one read of each table row on a GPU, before anything moves)."""
    if type(request) is not int or not 0 <= request < step.cfg.requests:  # noqa: E721 - not a bool
        raise InputError(f"request must be an int in [0, {step.cfg.requests}), got {request!r}")
    c = step.caches
    tensors = c.tensors()
    return {name: RequestPages(getattr(c, layout), tensors[name], getattr(c, table)[request].cpu())
            for name, (table, layout) in TABLES.items()}


def layer_step_rows(cfg, tokens: int) -> dict[str, tuple[int, int]]:
    """Cache name -> the rows ``[start, stop)`` decode still needs after ``tokens`` positions of
    a request, for a ``LayerConfig`` (the row rules of ``tiers_rows``)."""
    if type(tokens) is not int or not 0 <= tokens <= cfg.max_context:  # noqa: E721 - not a bool
        raise InputError(f"tokens must be an int in [0, {cfg.max_context}], got {tokens!r}")
    return {"swa": swa_rows(tokens, cfg.window), "csa": compressed_rows(tokens, CSA_RATIO),
            "hca": compressed_rows(tokens, HCA_RATIO), "index": compressed_rows(tokens, CSA_RATIO),
            "csa_state": state_rows(tokens, CSA_RATIO), "idx_state": state_rows(tokens, CSA_RATIO),
            "hca_state": state_rows(tokens, HCA_RATIO)}

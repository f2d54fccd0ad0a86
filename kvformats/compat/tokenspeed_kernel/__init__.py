"""tokenspeed-kernel 0.1.4's cache-side functions under their own names: adopt kvformats by changing
one import.

    # from tokenspeed_kernel.ops.attention import dsv41
    from kvformats.compat.tokenspeed_kernel import dsv41

* ``kvformats.compat.tokenspeed_kernel.dsv41``: the DeepSeek V4.1 cache codecs of
  ``tokenspeed_kernel.ops.attention.dsv41`` (``cache_pack``, ``cache_unpack``, ``cache_scatter``,
  ``cache_gather``) for every ``cache_format`` ('swa', 'global', 'index' and the Hopper
  fallbacks 'swa_v4', 'global_v4', 'index_v4'), with tokenspeed's parameters, in-place
  semantics and return values, on kvformats' layouts (docs/porting-from-tokenspeed.md).

Out of scope: the attention and selection kernels (``selected_attention``, ``index_score``,
``index_topk``, ``new_attention_schedule``), the page-table helpers (``decode_rows``,
``decode_window``, ``global_slots``, ``selection_table``, ``compressor_metadata``), the DSpark
helpers, and, not yet ported, the model ops that fill the caches (``swa_rope_scatter``,
``compressor_pool``, ``compressor_tail_scatter``, ``index_q_quantize``, ``rope_inplace``,
``rope_pad_query``).
"""

"""tokenspeed-kernel 0.1.4's cache-side functions under their own names: adopt kvformats by changing
one import.

    # from tokenspeed_kernel.ops.attention.dsv4.triton import dsv4_save_compressor_state
    from kvformats.compat.tokenspeed_kernel.dsv4 import dsv4_save_compressor_state
    # from tokenspeed_kernel.ops.attention import dsv41
    from kvformats.compat.tokenspeed_kernel import dsv41

* ``kvformats.compat.tokenspeed_kernel.dsv4``: DeepSeek V4's cache writers, readers, indexer query
  prep and index / slot-mapping helpers of ``tokenspeed_kernel.ops.attention.dsv4`` and its
  ``.triton`` module (23 functions and the ``DEEPSEEK_V4_*`` constants), on kvformats' layouts and
  ``kvformats.deepseek_v4`` model ops.
* ``kvformats.compat.tokenspeed_kernel.dsv41``: DeepSeek V4.1's cache codecs (``cache_pack``,
  ``cache_unpack``, ``cache_scatter``, ``cache_gather``) for every ``cache_format`` and the model
  ops that fill its caches (``swa_rope_scatter``, ``compressor_pool``, ``compressor_tail_scatter``,
  ``index_q_quantize``: ``kvformats.deepseek_v41``).

Names, parameters, defaults, in-place semantics and return values are tokenspeed's (recorded from
the wheel in spec/tokenspeed-signatures.json); each module's docstring lists where kvformats
departs. Out of scope (docs/porting-from-tokenspeed.md): the attention and selection kernels
(``dsv4_prefill``, ``dsv4_decode``, ``selected_attention``, ``index_score``, ``index_topk``, ...),
V4.1's page-table, DSpark and query-RoPE helpers.
"""

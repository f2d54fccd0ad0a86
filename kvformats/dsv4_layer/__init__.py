"""One DeepSeek V4 attention layer built from the model ops (``kvformats.deepseek_v4``): their
clients, a layer above them.

* ``pipeline``: the layer-step reference (``LayerStep``), with its shapes (``pipeline_config``),
  caches (``pipeline_caches``), random weights (``pipeline_weights``) and float32 sparse
  attention (``pipeline_attention``); docs/pipeline.md;
* ``quality``: the accuracy report of the cache formats in that step (``kvformats quality``);
* ``synthetic``: the synthetic activations the report runs on by default (docs/quality.md).

``import kvformats`` imports none of them."""

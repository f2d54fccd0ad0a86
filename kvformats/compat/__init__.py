"""Drop-in modules under other libraries' names, each a thin adaptation around kvformats' own calls.

* ``kvformats.compat.tokenspeed``: tokenspeed's DeepSeek V4 attention-ops boundary (one changed
  import; docs/porting-from-tokenspeed.md).

``import kvformats`` does not import them.
"""

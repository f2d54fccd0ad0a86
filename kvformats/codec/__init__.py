"""The codec layer: argument checks run, the registry picks a backend, rows move.

Importing it registers every format of ``kvformats.formats`` with its reference ops and gives
the layouts' public methods (``layout.encode`` ...) their functions, so neither the formats nor
the declaration import anything from here.
"""

from kvformats import layout
from kvformats.codec import paged_ops, registry, slot_ops
from kvformats.formats import FORMATS
from kvformats.runtime import replay

for _cls in FORMATS:
    registry.register_format(_cls)
    slot_ops.register_reference_ops(_cls.name)

# A layout is frozen and kept alive by the plans that key it, so replay keys layouts by identity.
replay.by_id(layout.Layout)
layout.bind_codec(slot_ops, paged_ops)

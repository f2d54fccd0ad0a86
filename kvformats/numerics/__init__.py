"""Numerics: element codes and scale rules (``codes``, whose names this package also gives, as
``kvformats.numerics`` always has), the numerics profiles of other engines (``profiles``),
and the element types' table (``elements``)."""

from kvformats.numerics.codes import *  # noqa: F401,F403

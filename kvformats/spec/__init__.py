"""The machine-readable spec and what is generated from it: the format JSON (``formats``, whose
names this package also gives, as ``kvformats.spec`` always has), golden vectors (``vectors``),
the conformance table (``conformance``), SVG byte maps (``diagram``) and the docs pages
(``docgen``)."""

from kvformats.spec.formats import *  # noqa: F401,F403

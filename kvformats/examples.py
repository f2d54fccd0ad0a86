"""What a format declares for its tests and docs, apart from the layout users hold: one
``Examples`` object, ``Layout.examples``, declared in the format's class body beside the rest of
its declaration (``examples = Examples(params=(...), small_params={...})``; a subclass changes a
base's with ``attrs.evolve(Base.examples, ...)``).

The test suite (tests/harness, the hypothesis strategies of ``kvformats.testing``), the demo
(``kvformats demo``) and the spec's worked examples read it; no op does. Read through a layout
(``layout.examples``), it is bound to that layout, so ``encode_args`` and ``decoded_reference``
know the geometry; read through the class (``type(layout).examples``), the declaration itself.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from kvformats.errors import UsageError


def rows_encode_args(layout, n: int, values, gen: torch.Generator) -> tuple[object, dict, torch.Tensor]:
    """Valid ``encode`` arguments for ``n`` rows and the float32 ``[n, D]`` values that ``decode``
    (its outputs side by side) gives back within the format's bound: rows
    ``x = values((n, head_dim))`` (``values``: the caller's random float tensors of a shape) and
    ``x`` itself. A format whose encode takes other inputs declares its own."""
    x = values((n, layout.head_dim))
    return x, {}, x.float()


def rows_reference(layout, x, **kwargs) -> torch.Tensor:
    """The float32 ``[N, D]`` values that ``decode`` (its outputs side by side) gives back, within
    the bound of the format's element types, for ``encode(x, **kwargs)``: ``x`` rounded to the
    layout's ``quant_input_dtype``. A format whose encode takes other inputs declares its own."""
    return x.to(layout.quant_input_dtype).float()


@attrs.frozen
class Examples:
    """A format's fixtures: parameter sets and reference values for tests and docs.

    * ``params``: valid parameter sets worth fuzzing besides the defaults (keyword arguments for
      ``get_format``; ``kvformats.testing.strategies`` draws one, the first when it shrinks), and
      ``page_size_range``, the page sizes to draw;
    * ``small_params``: a small valid parameter set for tests and examples that look at every
      byte of a few pages (cache files, dumps, diffs, paged reads);
    * ``one_block``: the parameters that give every scaled region exactly one quantization block,
      the narrowest geometry; None when the format names none (the tests of it then skip it);
    * ``worked``: the rows the spec's worked example shows, (non-default parameters, slot) each
      (``kvformats.spec.examples``);
    * ``value_idempotent``: whether decode(encode(decode(encode(x)))) == decode(encode(x)) is a
      stated property of the format's default numerics (spec/README.md §5);
    * ``encode_args(n, values, gen)`` and ``decoded_reference(x, **kwargs)``: an encode's example
      arguments and the values decode gives back for them, through ``encode_args_of`` and
      ``reference_of`` (functions of the layout first: ``rows_encode_args`` and
      ``rows_reference`` for an encode of rows ``[N, head_dim]``).
    """

    params: tuple[dict, ...] = ({},)
    page_size_range: tuple[int, int] = (1, 64)
    small_params: dict = attrs.field(factory=lambda: {"page_size": 4})
    one_block: dict | None = None
    worked: tuple[tuple[dict, int], ...] = (({}, 70),)
    value_idempotent: bool = False
    encode_args_of: Callable[..., tuple[object, dict, torch.Tensor]] = rows_encode_args
    reference_of: Callable[..., torch.Tensor] = rows_reference
    # the layout these examples were read through (None on the class: the declaration)
    layout: Any = attrs.field(default=None, repr=False, eq=False)

    def __get__(self, instance: object, owner: type | None = None) -> Examples:
        """Read through a layout: these examples bound to it; through its class: themselves."""
        if instance is None:
            return self
        return attrs.evolve(self, layout=instance)

    def _bound(self):
        if self.layout is None:
            raise UsageError("the examples' encode_args and decoded_reference need a layout: read them "
                            "through one (layout.examples), not through its class")
        return self.layout

    def encode_args(self, n: int, values, gen: torch.Generator) -> tuple[object, dict, torch.Tensor]:
        """Valid ``encode`` arguments ``(x, kwargs)`` for ``n`` rows of the layout and the float32
        ``[n, D]`` values that ``decode`` (its outputs side by side) gives back within the
        format's bound (``values``: the caller's random float tensors of a shape; ``gen``: a
        generator for the other inputs)."""
        return self.encode_args_of(self._bound(), n, values, gen)

    def decoded_reference(self, x, **kwargs) -> torch.Tensor:
        """The float32 ``[N, D]`` values that ``decode`` (its outputs side by side) gives back,
        within the bound of the format's element types, for ``encode(x, **kwargs)``."""
        return self.reference_of(self._bound(), x, **kwargs)

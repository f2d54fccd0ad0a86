"""Cold-tier codec: one declared lossy conversion of ``fp8_ds_mla`` rows to a smaller record for
the host or disk tier, and back.

``FP8_DS_MLA_MXFP4`` (the only one): an ``fp8_ds_mla`` row ``[NoPE e4m3 x 2^e per 64 | RoPE
bf16 | ue8m0 scales]`` becomes a cold row ``[NoPE MXFP4 values | NoPE ue8m0 scales | RoPE bf16]``.
The NoPE dims are the ``mxfp4_indexer`` record with ``head_dim = nope_dim`` and profile
``vllm`` (e2m1 round-half-even, one power-of-two scale per 32 values, the least one with
``amax / scale <= 6``, so no value clips); the RoPE tail is kept byte for byte. Restoring decodes
the MXFP4 values and encodes them into ``fp8_ds_mla`` with the destination layout's own rules,
then puts the kept RoPE bytes back. Sizes: V4's 584 B row (448 NoPE + 64 RoPE) becomes 366 B
(224 + 14 + 128): 218 B per token saved, 37 %.

Error bound (per NoPE element; ``x`` the value the ``fp8_ds_mla`` row decodes to, ``x_hat`` the
value after the round trip; ``s = 2^E`` the element's 32-block MXFP4 scale, ``2^e`` its 64-block
``fp8_ds_mla`` scale after restoring, ``v`` its MXFP4 value)::

    |x - x_hat| <= max(s / 4, |x| / 4) + max(|v| / 16, 2^(e - 10))

The first term is the MXFP4 step (e2m1 spacing: 0.5 s below 2 s, s up to 4 s, 2 s up to 6 s;
half of it at most, and never a clip); the second the e4m3 re-encode, which is 0 whenever
``E >= e - 8`` (an MXFP4 value has at most two significant bits, so e4m3 holds it exactly from
there): only a 32-block more than about 2^8 smaller than its 64-block's maximum is rounded
twice. RoPE: exact. Non-finite NoPE values are not kept (the MXFP4 profile's NaN rule applies).
Tested in tests/transfer/test_tiers_cold.py; the attention error it adds is in docs/tiers.md.

A lossy conversion is never implicit: the tiers use it only when asked (``offload(cold=...)``).
"""

from __future__ import annotations

import attrs
import torch

from kvformats.codec.records import record_of
from kvformats.errors import ConversionError, InputError, describe
from kvformats.formats import Fp8DsMla, Mxfp4Indexer
from kvformats.layout import Layout


@attrs.frozen
class ColdCodec:
    """A declared lossy conversion of one format's rows to a smaller cold record and back.

    ``name`` and ``version`` identify the cold record (a tier file records them); ``source`` is
    the format it converts; ``error_bound`` states what a round trip may change."""

    name: str
    version: int
    source: str
    nope_profile: str
    error_bound: str

    def _check(self, layout: Layout) -> Fp8DsMla:
        if not isinstance(layout, Fp8DsMla):
            raise ConversionError(f"the cold codec {self.name} converts {self.source} rows, not {describe(layout)}")
        return layout

    def _nope(self, layout: Layout) -> Mxfp4Indexer:
        """The MXFP4 record of the NoPE dims (page_size is irrelevant to rows)."""
        lay = self._check(layout)
        return Mxfp4Indexer(head_dim=lay.nope_dim, page_size=1, profile=self.nope_profile)

    def row_bytes(self, layout: Layout) -> int:
        """Bytes of one cold row of ``layout``'s rows (366 for V4's 584 B row)."""
        lay = self._check(layout)
        return self._nope(lay).row_bytes + lay.region("rope").nbytes

    def spans(self, layout: Layout) -> tuple[tuple[str, int, int], ...]:
        """(region, offset in the cold row, bytes) of each region of a cold row."""
        nope = self._nope(layout)
        out = [(r.name, r.row_offset, r.nbytes) for r in nope.regions if not r.per_page]
        return (*out, ("rope", nope.row_bytes, self._check(layout).region("rope").nbytes))

    def identity(self, layout: Layout) -> dict:
        """What a tier records of a cold row: the codec, its version, the source record and size."""
        return {"codec": self.name, "version": self.version, "source": record_of(layout).identity(),
                "bytes_per_token": self.row_bytes(layout)}

    def _rows_arg(self, rows, width: int, what: str) -> None:
        if not isinstance(rows, torch.Tensor) or rows.dtype != torch.uint8 or rows.dim() != 2 \
                or rows.shape[1] != width:
            raise InputError(f"{what} must be a uint8 tensor [N, {width}], got {describe(rows)}")

    def encode(self, layout: Layout, rows: torch.Tensor) -> torch.Tensor:
        """``layout``'s gathered rows (uint8 ``[N, row_bytes]``) -> cold rows ``[N, row_bytes(layout)]``,
        on the rows' device, without a host read."""
        lay, nope = self._check(layout), self._nope(layout)
        self._rows_arg(rows, lay.row_bytes, f"{lay.name} rows")
        values = lay.decode_rows(rows)[:, :lay.nope_dim].float()  # e4m3 x 2^e: exact in float32
        out = torch.empty((rows.shape[0], self.row_bytes(lay)), dtype=torch.uint8, device=rows.device)
        out[:, :nope.row_bytes] = nope.encode_rows(values)
        out[:, nope.row_bytes:] = rows[:, lay.row_span("rope")]
        return out

    def decode(self, layout: Layout, cold: torch.Tensor) -> torch.Tensor:
        """Cold rows -> ``layout``'s rows (uint8 ``[N, row_bytes]``): the MXFP4 values encoded with
        ``layout``'s rules, the kept RoPE bytes put back as they were."""
        lay, nope = self._check(layout), self._nope(layout)
        self._rows_arg(cold, self.row_bytes(lay), f"{self.name} cold rows")
        values = nope.decode_rows(cold[:, :nope.row_bytes])
        x = torch.zeros((cold.shape[0], lay.head_dim), dtype=torch.float32, device=cold.device)
        x[:, :lay.nope_dim] = values  # e2m1 x 2^E: at most two significant bits, exact in bf16
        rows = lay.encode_rows(x)
        rows[:, lay.row_span("rope")] = cold[:, nope.row_bytes:]  # bytes, not values: -0.0 and NaNs kept
        return rows


FP8_DS_MLA_MXFP4 = ColdCodec(
    name="fp8_ds_mla-cold-mxfp4", version=1, source="fp8_ds_mla", nope_profile="vllm",
    error_bound="NoPE: |x - x_hat| <= max(s/4, |x|/4) + max(|v|/16, 2^(e-10)) per element (s: the 32-block's "
                "MXFP4 scale, the least power of two >= amax/6; v: the MXFP4 value; 2^e: the restored 64-block "
                "fp8_ds_mla scale; the second term is 0 where log2(s) >= e - 8); RoPE: exact (bytes kept)")

CODECS = {FP8_DS_MLA_MXFP4.name: FP8_DS_MLA_MXFP4}

"""Hypothesis batches for the DeepSeek V4 index helpers (reference and kernel tests alike)."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def batches(draw):
    """Requests (query_len <= seq_len), a block table with −1 holes, base offsets, validity."""
    r = draw(st.integers(1, 4))
    seq = [draw(st.integers(1, 40)) for _ in range(r)]
    qlen = [draw(st.integers(0, s)) for s in seq]
    qsl = [0]
    for n in qlen:
        qsl.append(qsl[-1] + n)
    page = draw(st.sampled_from([1, 2, 4, 8]))
    width = draw(st.integers(1, 12))
    table = [[draw(st.integers(-1, 30)) for _ in range(width)] for _ in range(r)]
    base = [draw(st.integers(0, 3)) for _ in range(r)]
    return dict(r=r, seq=seq, qlen=qlen, qsl=qsl, page=page, table=table, base=base,
                ratio=draw(st.sampled_from([1, 2, 4, 128])), window=draw(st.sampled_from([1, 3, 8])), draw=draw)

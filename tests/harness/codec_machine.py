"""The per-format state machine: encode to random slots, decode, gather, the paged reads
(gather_paged, dequantize_gather, decode_topk), page reuse and re-encode, each checked against
the ``Arena`` model; after every step the whole arena (guards, pads, unwritten rows) must equal
the expected image."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvformats as kvf
from kvformats.codec import paged_ops as paged
from kvformats.errors import InputError
from kvformats.runtime import deferred
from kvformats.testing import strategies as kst
from tests.harness.reliability_harness import (COUNTS, DEVICE, SENTINELS, Arena, backend_has, row_alone,
                                                   run_op, same_values, strided, table_slot)

PAGE_SIZES = (1, 2, 3, 4, 5, 8, 16, 64)
WS_FILL = 0xEE  # workspace bytes that must stay untouched
OUT_FILL = -7.0  # dequantize_gather rows that must stay untouched


def draw_layout(data, fmt: str, backend: str = "reference"):
    layout = data.draw(kst.layouts(fmt), label="layout")
    ps = data.draw(st.sampled_from(PAGE_SIZES), label="page_size")
    try:
        layout = kvf.get_format(fmt, **{**layout.params, "page_size": ps})
    except (TypeError, ValueError):  # a format with other page-size rules keeps the drawn one
        return layout
    return layout


def draw_arena(data, layout, backend: str = "reference") -> Arena:
    item = torch.empty(0, dtype=layout.container_dtype).element_size()
    pages = data.draw(st.integers(1, 4), label="num_pages")
    width = None
    if layout.container_dtype == torch.uint8:
        width = data.draw(st.sampled_from([layout.page_bytes, layout.min_page_bytes, layout.page_bytes + 13]),
                          label="page_width")
    pad = data.draw(st.sampled_from([0, 1, 3, 37, 576 // item]), label="stride_pad")
    lead = data.draw(st.sampled_from([0, 1, 7, 64 // item]), label="lead_guard")
    tail = data.draw(st.sampled_from([1, 7, 64 // item]), label="tail_guard")
    sentinel = data.draw(st.sampled_from(SENTINELS), label="sentinel")
    return Arena(layout, pages, pad=pad, lead=lead, tail=tail, sentinel=sentinel, width=width)


def to_device(x, kwargs):
    x = tuple(t.to(DEVICE) for t in x) if isinstance(x, tuple) else x.to(DEVICE)
    return x, {k: v.to(DEVICE) for k, v in kwargs.items()}


def index_tensor(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def make_codec_machine(fmt: str, backend: str):
    """A RuleBasedStateMachine class fuzzing format ``fmt`` through ``backend``."""

    class CodecMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.arena = None

        def count(self, op: str) -> None:
            COUNTS[(fmt, backend, op)] += 1

        def has(self, op: str) -> bool:
            return backend_has(backend, fmt, op)

        @initialize(data=st.data())
        def setup(self, data):
            self.layout = draw_layout(data, fmt, backend)
            self.arena = draw_arena(data, self.layout, backend)
            self.cap = self.arena.capacity

        # -- encodes ---------------------------------------------------------------------------
        def _inputs(self, data, n):
            x, kwargs = data.draw(kst.encode_args(self.layout, n), label="x")
            if data.draw(st.booleans(), label="strided_x"):
                x = tuple(strided(t) for t in x) if isinstance(x, tuple) else strided(x)
            return to_device(x, kwargs)

        def _encode(self, x, kwargs, slots, check=True):
            run_op(backend, self.layout.encode, x, self.arena.cache, slots, check=check, **kwargs)
            for i, s in enumerate(slots.tolist()):
                if 0 <= s < self.cap:
                    self.arena.put(s, row_alone(self.layout, x, kwargs, i))
            self.arena.check()

        @rule(data=st.data())
        def encode(self, data):
            n = data.draw(st.integers(1, 5), label="n")
            x, kwargs = self._inputs(data, n)
            slots = data.draw(kst.slot_mappings(self.cap, n), label="slots").to(DEVICE)
            self.count("encode")
            self._encode(x, kwargs, slots)

        @rule(data=st.data())
        def encode_unchecked_out_of_range(self, data):
            """check=False: slots beyond the capacity (up to 2^31 - 1 / 2^40) are skipped."""
            n = data.draw(st.integers(1, 5), label="n")
            x, kwargs = self._inputs(data, n)
            slots = data.draw(kst.slot_mappings(self.cap, n, torch.int64), label="slots")
            dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="slot_dtype")
            huge = 2**31 - 1 if dtype == torch.int32 else 2**40
            wild = data.draw(st.lists(st.sampled_from([self.cap, self.cap + 1, self.cap + 977, huge]),
                                      min_size=n, max_size=n), label="wild")
            which = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="which")
            slots = torch.tensor([w if f else int(s) for s, w, f in zip(slots, wild, which)], dtype=dtype)
            self.count("encode_unchecked")
            self._encode(x, kwargs, slots.to(DEVICE), check=False)

        @rule(data=st.data())
        def encode_rejected(self, data):
            """A slot beyond the capacity or a repeated slot. Checked on the host (CPU tensors, or
            check="strict" on any device): raises before any write. check=True on the GPU checks
            values on the device without synchronizing: the row beyond the capacity is skipped
            and the error record holds it (repeats are only found on the host)."""
            n = data.draw(st.integers(1, 4), label="n")
            x, kwargs = self._inputs(data, n)
            slots = data.draw(kst.slot_mappings(self.cap, n, torch.int64), label="slots")
            i = data.draw(st.integers(0, n - 1), label="bad_index")
            repeat = n > 1 and data.draw(st.booleans(), label="repeat")
            if repeat:
                slots[(i + 1) % n] = slots[i] = max(int(slots[i]), 0)
            else:
                slots[i] = self.cap + data.draw(st.integers(0, 10**6), label="beyond")
            mode = "strict" if repeat else data.draw(st.sampled_from([True, "strict"]), label="check")
            on_device = not deferred.on_host(mode, slots.to(DEVICE))
            self.count("encode_rejected")
            deferred.pending_error(DEVICE)  # start from a clear record
            if on_device:
                self._encode(x, kwargs, slots.to(DEVICE), check=mode)
                if deferred.pending_error(DEVICE) is None:
                    raise AssertionError(f"slots {slots.tolist()} (capacity {self.cap}) left no error record")
                return
            try:
                run_op(backend, self.layout.encode, x, self.arena.cache, slots.to(DEVICE), check=mode, **kwargs)
            except InputError:
                pass
            else:
                raise AssertionError(f"encode accepted invalid slots {slots.tolist()} (capacity {self.cap})")
            self.arena.check()

        @rule(data=st.data())
        def reencode_page(self, data):
            """Re-encode a whole page (rows permuted, some holes) with fresh values."""
            ps = self.layout.page_size
            page = data.draw(st.integers(0, self.arena.num_pages - 1), label="page")
            x, kwargs = self._inputs(data, ps)
            order = data.draw(st.permutations(range(ps)), label="order")
            holes = data.draw(st.lists(st.booleans(), min_size=ps, max_size=ps), label="holes")
            slots = index_tensor([-1 if h else page * ps + r for r, h in zip(order, holes)])
            self.count("reencode_page")
            self._encode(x, kwargs, slots)

        @precondition(lambda self: self.arena is not None and self.arena.rows)
        @rule(data=st.data())
        def reencode_decoded(self, data):
            """Decode written rows and encode the values back: bytes of each row alone, and the
            decoded values do not change (value idempotence)."""
            written = sorted(self.arena.rows)
            chosen = data.draw(st.lists(st.sampled_from(written), min_size=1, max_size=4, unique=True), label="rows")
            slots = index_tensor(chosen)
            before = run_op(backend, self.layout.decode, self.arena.cache, slots)
            if isinstance(before, tuple) and not hasattr(self.layout, "ratio"):  # compressor_state_v41: no ape
                x, kwargs = (before[0].clone(), before[1].clone()), {}
            elif isinstance(before, tuple):  # compressor_state: (kv, score_state); ape 0 keeps the score
                ape = torch.zeros((self.layout.ratio, before[0].shape[1]), device=DEVICE)
                x, kwargs = (before[0].clone(), before[1].clone()), dict(positions=slots.clone(), ape=ape)
            else:
                x, kwargs = before.clone(), {}
            self.count("reencode_decoded")
            self._encode(x, kwargs, slots)
            after = run_op(backend, self.layout.decode, self.arena.cache, slots)
            if self.layout.examples.value_idempotent:
                assert all(torch.equal(a, b) for a, b in zip(as_list(after), as_list(before))), "not value-idempotent"

        @rule(data=st.data())
        def reuse_page(self, data):
            """Page reuse: the engine zeroes a page; its rows read as never written."""
            page = data.draw(st.integers(0, self.arena.num_pages - 1), label="page")
            self.count("reuse_page")
            self.arena.reuse(page)

        # -- reads -----------------------------------------------------------------------------
        def _read_slots(self, data, size):
            values = data.draw(st.lists(st.integers(-1, self.cap - 1), min_size=size, max_size=size), label="slots")
            dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="slot_dtype")
            return index_tensor(values, dtype)

        @rule(data=st.data())
        def gather(self, data):
            slots = self._read_slots(data, data.draw(st.integers(0, 6), label="n"))
            self.count("gather")
            got = run_op(backend, self.layout.gather, self.arena.cache, slots)
            assert torch.equal(got, self.arena.model_rows(slots)), "gather differs from the model"
            self.arena.check()

        @rule(data=st.data())
        def decode(self, data):
            slots = self._read_slots(data, data.draw(st.integers(0, 6), label="n"))
            self.count("decode")
            got = run_op(backend, self.layout.decode, self.arena.cache, slots)
            assert same_values(got, self.layout.decode_rows(self.arena.model_rows(slots))), "decode differs"
            self.arena.check()

        @precondition(lambda self: self.arena is not None and self.has("decode_topk"))
        @rule(data=st.data())
        def decode_topk(self, data):
            t, k = data.draw(st.integers(1, 3), label="T"), data.draw(st.integers(1, 4), label="K")
            slots = self._read_slots(data, t * k).reshape(t, k)
            self.count("decode_topk")
            got = run_op(backend, self.layout.decode_topk, self.arena.cache, slots)
            want = self.layout.decode_rows(self.arena.model_rows(slots.reshape(-1)))
            want = tuple(w.reshape(t, k, -1) for w in want) if isinstance(want, tuple) else want.reshape(t, k, -1)
            assert same_values(got, want), "decode_topk differs"
            self.arena.check()

        def _table(self, data, requests):
            width = data.draw(st.integers(1, 3), label="table_width")
            entries = st.integers(-1, self.arena.num_pages)  # num_pages: beyond the cache (missing)
            table = data.draw(st.lists(st.lists(entries, min_size=width, max_size=width), min_size=requests,
                                       max_size=requests), label="block_table")
            dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="table_dtype")
            return table, index_tensor(table, dtype)

        @precondition(lambda self: self.arena is not None and self.has("gather_paged"))
        @rule(data=st.data())
        def gather_paged(self, data):
            requests = data.draw(st.integers(1, 3), label="requests")
            table, bt = self._table(data, requests)
            ps = self.layout.page_size
            lens = data.draw(st.lists(st.integers(0, len(table[0]) * ps + 2), min_size=requests,
                                      max_size=requests), label="lens")
            cu = [0]
            for n in lens:
                cu.append(cu[-1] + n)
            extra = data.draw(st.integers(0, 2), label="extra_rows")
            ws = tuple(torch.full((cu[-1] + extra, seg.record_bytes), WS_FILL, dtype=torch.uint8, device=DEVICE)
                       for seg in self.layout.segments)
            self.count("gather_paged")
            run_op(backend, paged.gather_paged, self.layout, self.arena.cache, block_table=bt,
                   cu_seq_lens=index_tensor(cu, bt.dtype), out=ws)
            slots = [table_slot(table, r, j, ps, self.arena.num_pages) for r in range(requests) for j in range(lens[r])]
            rows = self.arena.model_rows(slots)
            at = 0
            for seg, w in zip(self.layout.segments, ws):
                assert torch.equal(w[:cu[-1]], rows[:, at:at + seg.record_bytes]), f"gather_paged {seg.name} differs"
                assert bool((w[cu[-1]:] == WS_FILL).all()), "gather_paged wrote past cu_seq_lens[-1]"
                at += seg.record_bytes
            self.arena.check()

        @precondition(lambda self: self.arena is not None and self.layout.decode_dtype is not None
                      and self.has("dequantize_gather"))
        @rule(data=st.data())
        def dequantize_gather(self, data):
            requests = data.draw(st.integers(1, 3), label="requests")
            table, bt = self._table(data, requests)
            ps = self.layout.page_size
            seq = data.draw(st.lists(st.integers(0, len(table[0]) * ps + 2), min_size=requests, max_size=requests),
                            label="seq_lens")
            glen = [data.draw(st.integers(0, s), label="gather_len") for s in seq]
            use_glen = data.draw(st.booleans(), label="use_gather_lens")
            glen = glen if use_glen else seq
            base = data.draw(st.none() | st.lists(st.integers(0, 1), min_size=requests, max_size=requests),
                             label="base_offsets")
            offset = data.draw(st.integers(0, 2), label="offset")
            width = offset + max(glen) + data.draw(st.integers(0, 2), label="extra")
            out = torch.full((requests, width, self.layout.head_dim), OUT_FILL, dtype=self.layout.decode_dtype,
                             device=DEVICE)
            want = out.clone()
            self.count("dequantize_gather")
            run_op(backend, paged.dequantize_gather, self.layout, self.arena.cache, out, block_table=bt,
                   seq_lens=index_tensor(seq), gather_lens=index_tensor(glen) if use_glen else None,
                   block_table_base_offsets=None if base is None else index_tensor(base), offset=offset)
            for b in range(requests):
                for i in range(glen[b]):
                    s = table_slot(table, b, seq[b] - glen[b] + i, ps, self.arena.num_pages, base)
                    want[b, offset + i] = self.layout.decode_rows(self.arena.model_rows([s]))[0].to(out.dtype)
            assert same_values(out, want), "dequantize_gather differs from the model"
            self.arena.check()

        @invariant()
        def arena_intact(self):
            if self.arena is not None:
                self.arena.check()

    CodecMachine.__name__ = CodecMachine.__qualname__ = f"CodecMachine_{fmt}_{backend}"
    return CodecMachine


def as_list(t):
    return list(t) if isinstance(t, tuple) else [t]

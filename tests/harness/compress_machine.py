"""State machine of the compressor pipeline: ``save_compressor_state`` of token chunks into a
paged compressor-state cache (through its block table), then ``csa_compress_kv_insert`` /
``hca_compress_kv_insert`` of group-ending tokens into an fp8_ds_mla cache; plus state-page
reuse. Both caches live in guarded arenas checked byte for byte after every step.

The model keeps every saved state row (float32 ``[kv | score + ape[p % ratio]]``, computed
here) and every compressed row; a compressed row's expected bytes are recomputed from the
model's state alone (a fresh state tensor built from the model, then pooling, the RoPE
rotation and the fp8_ds_mla codec of the reference), never from the cache under test. The
reference backend must reproduce those bytes exactly; a Triton kernel pools in another order,
so its rows are held to tokenspeed's bar (kvformats.testing.tolerance: scale bytes equal, values at most
one code apart): a row within it becomes the model's row, so every other arena byte, and where
each row landed, is still checked exactly.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.deepseek_v4.pooling import pool_reference
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.deepseek_v4.transforms import rope_tail
from tests.harness.reliability_harness import COUNTS, DEVICE, POOLED_APART, SENTINELS, Arena, run_op, table_slot
from kvformats.testing.tolerance import code_distance

RMS_EPS = 1e-6


def make_compress_machine(backend: str = "reference"):
    class CompressMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.ready = False

        def count(self, op: str) -> None:
            COUNTS[("compress_pipeline", backend, op)] += 1

        @initialize(data=st.data())
        def setup(self, data):
            self.ratio = data.draw(st.sampled_from([4, 128]), label="ratio")
            self.h, rope = data.draw(st.sampled_from([(66, 2), (128, 64)]), label="head_rope")
            rows = data.draw(st.sampled_from([2, 4, 8] if self.ratio == 4 else [32, 64]), label="state_rows")
            self.requests = data.draw(st.integers(1, 2), label="requests")
            self.max_len = 3 * self.ratio + 3
            per_req = -(-self.max_len // rows)
            self.state_layout = kvf.CompressorState(head_dim=self.h, ratio=self.ratio, page_size=rows)
            pages = self.requests * per_req + data.draw(st.integers(0, 2), label="spare_pages")
            sentinel = data.draw(st.sampled_from(SENTINELS), label="sentinel")
            self.state = Arena(self.state_layout, pages, pad=data.draw(st.sampled_from([0, 3, 64])),
                               lead=data.draw(st.sampled_from([0, 5])), tail=7, sentinel=sentinel)
            perm = data.draw(st.permutations(range(pages)), label="page_order")
            self.table = [perm[r * per_req:(r + 1) * per_req] for r in range(self.requests)]
            for r in range(self.requests):  # occasionally a page missing from the table
                if data.draw(st.integers(0, 5), label="missing") == 0:
                    self.table[r][data.draw(st.integers(0, per_req - 1))] = -1
            self.bt = torch.tensor(self.table, dtype=torch.int32, device=DEVICE)
            kv_rows = data.draw(st.sampled_from([1, 2, 4]))
            self.kv_layout = kvf.Fp8DsMla(head_dim=self.h, rope_dim=rope, page_size=kv_rows)
            kv_pages = -(-self.requests * (self.max_len // self.ratio + 1) // self.kv_layout.page_size) + 1
            self.kv = Arena(self.kv_layout, kv_pages, pad=data.draw(st.sampled_from([0, 1, 576])),
                            lead=data.draw(st.sampled_from([0, 7])), tail=9, sentinel=sentinel,
                            width=data.draw(st.sampled_from([self.kv_layout.page_bytes,
                                                             self.kv_layout.min_page_bytes])))
            g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
            w = self.state_layout.width
            self.ape = (torch.randn(self.ratio, w, generator=g) * 0.1).to(DEVICE)
            self.weight = (torch.rand(self.h, generator=g) + 0.5).to(DEVICE)
            self.cos_sin = cos_sin_cache(rope, self.max_len + self.ratio).to(DEVICE)
            self.next_pos = [0] * self.requests
            self.ready = True

        # -- save ------------------------------------------------------------------------------
        @rule(data=st.data())
        def save(self, data):
            r = data.draw(st.integers(0, self.requests - 1), label="request")
            contiguous = data.draw(st.booleans(), label="continue_sequence")
            start = self.next_pos[r] if contiguous else data.draw(st.integers(0, self.max_len - 1), label="start")
            n = data.draw(st.integers(1, 6 if self.ratio == 4 else 70), label="n")
            positions = [p for p in range(start, start + n) if p < self.max_len]
            if not positions:
                self.next_pos[r] = 0
                return
            n = len(positions)
            g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
            w = self.state_layout.width
            dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]), label="dtype")
            kv = (torch.randn(n, w, generator=g) * 2).to(dtype).to(DEVICE)
            score = torch.randn(n, w, generator=g).to(dtype).to(DEVICE)
            pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
            slots = [table_slot(self.table, r, p, self.state_layout.page_size, self.state.num_pages) for p in positions]
            by_table = data.draw(st.booleans(), label="slots_by_table")
            self.count("save_compressor_state")
            kwargs = dict(ratio=self.ratio, positions=pos)
            if by_table:
                kwargs.update(req_indices=torch.full((n,), r, dtype=torch.int32, device=DEVICE), block_table=self.bt)
            else:
                kwargs.update(slots=torch.tensor(slots, dtype=torch.int64, device=DEVICE))
            run_op(backend, dsv4.save_compressor_state, kv, score, self.ape, self.state.cache, **kwargs)
            for i, (p, s) in enumerate(zip(positions, slots)):
                if s >= 0:
                    row = torch.cat([kv[i].float(), score[i].float() + self.ape[p % self.ratio].float()])
                    self.state.put(s, row.view(torch.uint8))
            self.next_pos[r] = positions[-1] + 1
            self.state.check()

        # -- compress + insert -----------------------------------------------------------------
        def _model_state(self) -> torch.Tensor:
            """A fresh state cache holding only what the model says (zeros elsewhere)."""
            t = self.state_layout.allocate(self.state.num_pages, device=DEVICE)
            ps = self.state_layout.page_size
            for s, row in self.state.rows.items():
                t[s // ps, s % ps] = row.view(torch.float32)
            return t

        @rule(data=st.data())
        def compress_insert(self, data):
            n = data.draw(st.integers(1, 5), label="tokens")
            reqs = data.draw(st.lists(st.integers(0, self.requests - 1), min_size=n, max_size=n), label="reqs")
            group = st.integers(0, self.max_len // self.ratio - 1).map(lambda k: (k + 1) * self.ratio - 1)
            positions = data.draw(st.lists(group | st.integers(0, self.max_len - 1), min_size=n, max_size=n),
                                  label="positions")
            state_slots = [table_slot(self.table, r, p, self.state_layout.page_size, self.state.num_pages)
                           if data.draw(st.integers(0, 7), label="state_hole") else -1
                           for r, p in zip(reqs, positions)]
            kv_slots = data.draw(st.lists(st.integers(-1, self.kv.capacity - 1), min_size=n, max_size=n,
                                          unique_by=lambda s: s if s >= 0 else None), label="kv_slots")
            kv_slots = [s if s >= 0 else -1 for s in kv_slots]
            fn = dsv4.csa_compress_kv_insert if self.ratio == 4 else dsv4.hca_compress_kv_insert
            idx = lambda v: torch.tensor(v, dtype=torch.int64, device=DEVICE)  # noqa: E731
            self.count("csa_compress_kv_insert" if self.ratio == 4 else "hca_compress_kv_insert")
            run_op(backend, fn, self.state.cache, self.kv.cache, positions=idx(positions), req_indices=idx(reqs),
                   state_slots=idx(state_slots), block_table=self.bt, rms_weight=self.weight, rms_eps=RMS_EPS,
                   cos_sin_cache=self.cos_sin, kv_slots=idx(kv_slots), kv_page_size=self.kv_layout.page_size)
            model = self._model_state()
            for p, r, ss, ks in zip(positions, reqs, state_slots, kv_slots):
                if (p + 1) % self.ratio or ss < 0 or ks < 0:
                    continue
                normed = pool_reference(model, self.ratio, idx([p]), idx([r]), self.bt, None, self.weight, RMS_EPS)
                x = rope_tail(normed, idx([p // self.ratio * self.ratio]), self.cos_sin)
                self.kv.put(ks, self._accepted_row(ks, self.kv_layout.encode_rows(x)[0]))
            self.kv.check()
            self.state.check()

        def _accepted_row(self, slot: int, want: torch.Tensor) -> torch.Tensor:
            """The row the model takes for ``slot``: ``want`` (the reference's bytes), or, for a
            kernel, the row it wrote where that is within one code of ``want``."""
            if backend == "reference":
                return want
            got = self.kv_layout.gather(self.kv.cache, torch.tensor([slot], device=DEVICE), backend="reference")
            d = code_distance(self.kv_layout, got, want[None])
            if not d.within_one_code():
                return want  # the arena check reports the row's bytes
            POOLED_APART[0] += d.apart
            POOLED_APART[1] += d.values
            return got[0]

        @rule(data=st.data())
        def reuse_state_page(self, data):
            page = data.draw(st.integers(0, self.state.num_pages - 1), label="page")
            self.count("reuse_state_page")
            self.state.reuse(page)

        @invariant()
        def arenas_intact(self):
            if self.ready:
                self.state.check()
                self.kv.check()

    CompressMachine.__name__ = CompressMachine.__qualname__ = f"CompressMachine_{backend}"
    return CompressMachine

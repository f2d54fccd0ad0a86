"""Invalid-argument table for every public method: each bad call raises a typed error (also a
builtin ValueError/TypeError, RuntimeError for backends) whose message names what was expected
and what came, before any byte of the cache is written."""

import pytest
import torch

import kvformats as kvf
from kvformats import validation as checks
from kvformats.testing.strategies import storage_bytes

FORMATS = kvf.list_formats()


class Ctx:
    """A valid call's arguments for one format, on a sentinel-filled cache with a padded stride."""

    def __init__(self, fmt):
        self.layout = lay = kvf.get_format(fmt)
        page_elems = lay.allocate(1).stride(0)
        self.cache = lay.allocate(2, page_stride=page_elems + 16)
        storage_bytes(self.cache).fill_(0xA5)
        self.capacity = 2 * lay.page_size
        n = 3
        self.slots = torch.tensor([1, -1, self.capacity - 1])
        if isinstance(lay, kvf.CompressorState):
            w = lay.width
            self.x = (torch.ones(n, w), torch.ones(n, w))
            self.kw = {"positions": torch.arange(n), "ape": torch.zeros(lay.ratio, w)}
            self.width = w
        elif isinstance(lay, kvf.CompressorStateV41):  # (kv, score), no keyword arguments
            self.x, self.kw, self.width = (torch.ones(n, lay.width), torch.ones(n, lay.width)), {}, lay.width
        else:
            self.x = torch.ones(n, lay.head_dim, dtype=torch.bfloat16)
            self.kw = {}
            self.width = lay.head_dim

    def encode(self, x=None, cache=None, slots=None, **kw):
        kwargs = {**self.kw, **kw}
        kwargs = {k: v for k, v in kwargs.items() if v is not _DROP}
        self.layout.encode(self.x if x is None else x, self.cache if cache is None else cache,
                           self.slots if slots is None else slots, **kwargs)

    def bad_x(self, fn):
        """Apply ``fn`` to the row tensor (to kv for compressor_state)."""
        if isinstance(self.x, tuple):
            return (fn(self.x[0]), self.x[1])
        return fn(self.x)

    def narrow(self):
        if self.cache.dtype == torch.uint8:
            return self.cache[:, :self.layout.min_page_bytes - 1]
        return self.cache[:, :, :-1]

    def wrong_container(self):
        return self.cache.view(torch.uint8) if self.cache.dtype != torch.uint8 else self.cache.view(torch.int8)


_DROP = object()
META = torch.device("meta")
BT = kvf.BackendUnavailableError

# (id, call(ctx), error type, words(ctx) that the message must contain)
COMMON = [
    ("encode-x-int-dtype", lambda c: c.encode(x=c.bad_x(lambda t: t.to(torch.int32))), kvf.InputTypeError,
     lambda c: ["float32", "int32"]),
    ("encode-x-float64", lambda c: c.encode(x=c.bad_x(lambda t: t.double())), kvf.InputTypeError,
     lambda c: ["bfloat16", "float64"]),
    ("encode-x-not-tensor", lambda c: c.encode(x=c.bad_x(lambda t: t.tolist())), TypeError,
     lambda c: ["Tensor", "list"]),
    ("encode-x-rank3", lambda c: c.encode(x=c.bad_x(lambda t: t.unsqueeze(-1))), kvf.InputError,
     lambda c: [f"2-D tensor [N, {c.width}]", f"got a 3-D", f"(3, {c.width}, 1)"]),
    ("encode-x-width", lambda c: c.encode(x=c.bad_x(lambda t: t[:, :-1])), kvf.InputError,
     lambda c: [str(c.width), str(c.width - 1)]),
    ("encode-x-meta", lambda c: c.encode(x=c.bad_x(lambda t: t.to(META))), kvf.InputError,
     lambda c: ["cpu", "meta"]),
    ("encode-slots-float", lambda c: c.encode(slots=c.slots.float()), kvf.InputTypeError,
     lambda c: ["int32 or int64", "float32"]),
    ("encode-slots-2d", lambda c: c.encode(slots=c.slots[:, None]), kvf.InputError,
     lambda c: ["[3]", "(3, 1)"]),
    ("encode-slots-count", lambda c: c.encode(slots=torch.tensor([0, 1, 2, 3])), kvf.InputError,
     lambda c: ["[3]", "(4,)"]),
    ("encode-slots-meta", lambda c: c.encode(slots=c.slots.to(META)), kvf.InputError,
     lambda c: ["cpu", "meta"]),
    ("encode-slot-beyond-capacity", lambda c: c.encode(slots=torch.tensor([0, c.capacity, -1])), kvf.InputError,
     lambda c: [str(c.capacity), f"0..{c.capacity - 1}"]),
    ("encode-duplicate-slots", lambda c: c.encode(slots=torch.tensor([1, -1, 1])), kvf.InputError,
     lambda c: ["repeat"]),
    ("encode-cache-narrow", lambda c: c.encode(cache=c.narrow()), kvf.LayoutError,
     lambda c: [str(c.layout.min_page_bytes) if c.cache.dtype == torch.uint8 else str(list(c.cache.shape[1:]))]),
    ("encode-cache-dtype", lambda c: c.encode(cache=c.wrong_container()), kvf.InputTypeError,
     lambda c: [str(c.layout.container_dtype), str(c.wrong_container().dtype)]),
    ("encode-cache-not-tensor", lambda c: c.encode(cache=[0]), kvf.InputTypeError, lambda c: ["Tensor", "list"]),
    ("encode-backend-unknown", lambda c: c.encode(backend="cuda"), kvf.InputError,
     lambda c: ["'reference'", "'cuda'"]),
    ("encode-backend-triton-cpu", lambda c: c.encode(backend="triton"), BT,
     lambda c: ["CUDA", "cpu", "backend='reference'"]),
    ("decode-slots-float", lambda c: c.layout.decode(c.cache, c.slots.double()), kvf.InputTypeError,
     lambda c: ["int32 or int64", "float64"]),
    ("decode-slots-2d", lambda c: c.layout.decode(c.cache, c.slots[None]), kvf.InputError,
     lambda c: ["a 1-D tensor [N]", "got a 2-D", "(1, 3)"]),
    ("decode-slots-meta", lambda c: c.layout.decode(c.cache, c.slots.to(META)), kvf.InputError,
     lambda c: ["cpu", "meta"]),
    ("decode-slot-beyond-capacity", lambda c: c.layout.decode(c.cache, torch.tensor([c.capacity + 5])),
     kvf.InputError, lambda c: [str(c.capacity + 5), str(c.capacity)]),
    ("decode-cache-narrow", lambda c: c.layout.decode(c.narrow(), c.slots), kvf.LayoutError,
     lambda c: [str(c.layout.page_size)]),
    ("decode-backend-unknown", lambda c: c.layout.decode(c.cache, c.slots, backend="gpu"), kvf.InputError,
     lambda c: ["'auto'", "'gpu'"]),
    ("decode-backend-triton-cpu", lambda c: c.layout.decode(c.cache, c.slots, backend="triton"), BT,
     lambda c: ["CUDA", "cpu"]),
    ("gather-slots-bool", lambda c: c.layout.gather(c.cache, c.slots > 0), kvf.InputTypeError,
     lambda c: ["int32 or int64", "bool"]),
    ("gather-slots-int16", lambda c: c.layout.gather(c.cache, c.slots.to(torch.int16)), kvf.InputTypeError,
     lambda c: ["int32 or int64", "int16"]),
    ("gather-slot-beyond-capacity", lambda c: c.layout.gather(c.cache, torch.tensor([-1, c.capacity])),
     kvf.InputError, lambda c: [str(c.capacity), "capacity"]),
    ("gather-cache-narrow", lambda c: c.layout.gather(c.narrow(), c.slots), kvf.LayoutError,
     lambda c: [str(c.layout.page_size)]),
    ("gather-cache-dtype", lambda c: c.layout.gather(c.wrong_container(), c.slots), kvf.InputTypeError,
     lambda c: [str(c.layout.container_dtype)]),
    ("gather-backend-triton-cpu", lambda c: c.layout.gather(c.cache, c.slots, backend="triton"), BT,
     lambda c: ["CUDA", "cpu"]),
    ("views-cache-narrow", lambda c: c.layout.views(c.narrow()), kvf.LayoutError,
     lambda c: [str(c.layout.page_size)]),
    ("views-cache-dtype", lambda c: c.layout.views(c.wrong_container()), kvf.InputTypeError,
     lambda c: [str(c.layout.container_dtype), str(c.wrong_container().dtype)]),
    ("allocate-negative-pages", lambda c: c.layout.allocate(-2), kvf.LayoutError, lambda c: ["num_pages", "-2"]),
    ("allocate-stride-too-small", lambda c: c.layout.allocate(2, page_stride=1), kvf.LayoutError,
     lambda c: [str(c.layout.allocate(1).stride(0)), "1"]),
]

STATE_ONLY = [
    ("encode-missing-positions", lambda c: c.encode(positions=_DROP), kvf.InputError,
     lambda c: ["positions=", "['ape']"]),
    ("encode-missing-ape", lambda c: c.encode(ape=_DROP), kvf.InputError, lambda c: ["ape=", "['positions']"]),
    ("encode-extra-kwarg", lambda c: c.encode(rope_position=torch.zeros(3)), kvf.InputError,
     lambda c: ["positions=", "rope_position"]),
    ("encode-ape-shape", lambda c: c.encode(ape=torch.zeros(c.layout.ratio + 1, c.width)), kvf.InputError,
     lambda c: [f"[{c.layout.ratio}, {c.width}]", f"({c.layout.ratio + 1}, {c.width})"]),
    ("encode-ape-transposed", lambda c: c.encode(ape=torch.zeros(c.width, c.layout.ratio)), kvf.InputError,
     lambda c: [f"[{c.layout.ratio}, {c.width}]"]),
    ("encode-positions-float", lambda c: c.encode(positions=torch.zeros(3)), kvf.InputTypeError,
     lambda c: ["positions", "float32"]),
    ("encode-positions-count", lambda c: c.encode(positions=torch.zeros(2, dtype=torch.int64)), kvf.InputError,
     lambda c: ["[3]", "(2,)"]),
    ("encode-score-rows", lambda c: c.encode(x=(c.x[0], c.x[1][:2])), kvf.InputError,
     lambda c: ["score", f"[3, {c.width}]", f"(2, {c.width})"]),
    ("encode-x-not-pair", lambda c: c.encode(x=c.x[0]), kvf.InputTypeError, lambda c: ["(kv, score)", "tensor of shape (3, "]),
]
BYTES_ONLY = [
    ("encode-unexpected-kwarg", lambda c: c.encode(positions=torch.zeros(3, dtype=torch.int64)), kvf.InputError,
     lambda c: ["no keyword arguments", "positions"]),
]


# compressor_state_v41 takes the state's (kv, score) pair and, like the byte formats, no keyword arguments
RING_ONLY = BYTES_ONLY + [case for case in STATE_ONLY if case[0] in ("encode-score-rows", "encode-x-not-pair")]


def _cases():
    for fmt in FORMATS:
        extra = {"compressor_state": STATE_ONLY, "compressor_state_v41": RING_ONLY}.get(fmt, BYTES_ONLY)
        for name, call, err, words in COMMON + extra:
            yield pytest.param(fmt, call, err, words, id=f"{fmt}-{name}")


@pytest.mark.parametrize("fmt, call, err, words", list(_cases()))
def test_invalid_argument(fmt, call, err, words):
    ctx = Ctx(fmt)
    before = storage_bytes(ctx.cache).clone()
    with pytest.raises(err) as info:
        call(ctx)
    assert isinstance(info.value, kvf.KVFormatError)
    builtin = RuntimeError if err is BT else (ValueError, TypeError)
    assert isinstance(info.value, builtin)
    message = str(info.value)
    for w in words(ctx):
        assert w in message, f"{w!r} not in {message!r}"
    assert torch.equal(storage_bytes(ctx.cache), before), "a rejected call wrote bytes"


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_valid_call_of_the_table_succeeds(fmt):
    """The table's base call is valid, so each case fails for its own reason only."""
    ctx = Ctx(fmt)
    before = storage_bytes(ctx.cache).clone()
    ctx.encode()
    assert not torch.equal(storage_bytes(ctx.cache), before)
    ctx.layout.decode(ctx.cache, ctx.slots)
    ctx.layout.gather(ctx.cache, ctx.slots, backend="reference")
    ctx.layout.views(ctx.cache)


def test_float_slots_error_is_a_type_error():
    lay = kvf.get_format("fp8_indexer")
    with pytest.raises(TypeError):
        lay.decode(lay.allocate(1), torch.zeros(2))


@pytest.mark.parametrize("name, params, err, words", [
    ("fp8_ds_mla2", {}, kvf.LayoutError, ["'fp8_ds_mla2'", "fp8_ds_mla", "compressor_state"]),
    ("", {}, kvf.LayoutError, ["''", "registered"]),
    ("fp8_indexer", {"rope_dim": 64}, kvf.LayoutError, ["fp8_indexer", "rope_dim"]),
    ("fp8_indexer", {"head_dim": 100}, kvf.LayoutError, ["128", "100"]),
    ("compressor_state", {"ratio": 5}, kvf.LayoutError, ["ratio", "5"]),
], ids=["unknown-name", "empty-name", "unknown-param", "bad-head-dim", "bad-ratio"])
def test_get_format_errors(name, params, err, words):
    with pytest.raises(err) as info:
        kvf.get_format(name, **params)
    assert isinstance(info.value, ValueError)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_unchecked_out_of_range_slots_are_skipped_not_written():
    """check=False (CUDA-graph capture semantics): out-of-range slots are skipped, never written."""
    ctx = Ctx("fp8_indexer")
    before = storage_bytes(ctx.cache).clone()
    ctx.layout.encode(ctx.x, ctx.cache, torch.tensor([ctx.capacity, -1, ctx.capacity + 100]), check=False)
    assert torch.equal(storage_bytes(ctx.cache), before)
    out = ctx.layout.gather(ctx.cache, torch.tensor([ctx.capacity]), check=False)
    assert int(out.count_nonzero()) == 0


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_slot_checks_allow_repeated_holes_and_rank_range_before_repeats(dtype, path, monkeypatch):
    """Both check_slots paths (short lists read to the host, long ones reduced to device flags):
    -1 holes may repeat, a repeated real slot among many holes is caught, and a slot beyond the
    capacity is reported (its index) before a repeat."""
    if path == "device":
        monkeypatch.setattr(checks, "HOST_CHECK_MAX", 0)
    lay = kvf.get_format("fp8_indexer", page_size=4)
    cache = lay.allocate(2)
    x = torch.randn(6, lay.head_dim)
    lay.encode(x, cache, torch.tensor([-1, 7, -1, -1, 0, -1], dtype=dtype))  # holes repeat: fine
    before = storage_bytes(cache).clone()
    with pytest.raises(kvf.InputError, match="repeat"):
        lay.encode(x, cache, torch.tensor([-1, 5, -1, -1, 5, -1], dtype=dtype))
    with pytest.raises(kvf.InputError, match=r"slots\[3\] = 8 is beyond the cache's capacity"):
        lay.encode(x, cache, torch.tensor([3, 3, -1, 8, -1, -1], dtype=dtype))
    assert torch.equal(storage_bytes(cache), before)  # nothing written by the rejected calls

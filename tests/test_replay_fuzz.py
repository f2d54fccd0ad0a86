"""The replay invariant under a differential fuzzer (spec/checks.md §4): hypothesis draws sequences
of public calls (API and custom ops) with other tensors of the same metadata, storage offsets,
dtypes, one tensor passed for two arguments, signed zeros, check modes and launch-setting changes,
and every call's launches with replay on must equal its launches with replay off (kernels,
grids, scalars by their bits, each input address), as must its result and its error.

Runs on a CPU through the stand-in launcher (tests.harness.launch_stub). Each of the fixes it
holds in place was checked to make it fail when reverted (the closing note of issue 34 lists
them): argument aliasing in the key, floats keyed by their bits, launch settings dropping the
plans, and the refusal of kernels launched outside kvformats_kernels.launch. A launch setting
that moves the launches of one of a program's ops is changed after a plan of it exists (issue 44
item 10: with random changes alone, about 1 program in 25 caught a revert of ``settings.change``'s
``replay.clear()``, so a fixed set of programs could let it through; now every program with an
op other than the canary does).

The ci profile is derandomized: CI explores the same programs on every run. .ci/run adds a run
from a fresh seed, time-boxed (``test_programs_from_a_fresh_seed``; it prints its seed):

    KVFORMATS_REPLAY_FUZZ_SECONDS=30 [KVFORMATS_REPLAY_FUZZ_SEED=N] python3 -m pytest -n 0 \
        tests/test_replay_fuzz.py -k fresh_seed
"""

from __future__ import annotations

import functools
import os
import random
import secrets
import sys
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from replay_fuzz import (FLOAT_NAMES, addresses, base_calls, check_replay, normalized, outcome,  # noqa: E402
                         stub_with_replay, tensors_of, variant)

import kvformats as kvf  # noqa: E402
from kvformats.codec import slot_ops  # noqa: E402
from kvformats.errors import SettingsError  # noqa: E402
from kvformats.runtime import deferred, replay, replay_plan  # noqa: E402
from tests.harness.launch_stub import stubbed_launches  # noqa: E402
from kvformats_kernels import settings as ks  # noqa: E402
from kvformats_kernels import triton_abi, tuning  # noqa: E402
from kvformats_kernels.launch import fast  # noqa: E402

NAMES = sorted(base_calls(8, False, True, 0))


def _other(table: str, key, **entries) -> tuple:
    """A change of entry ``key`` of ``table`` between its value as declared and that value with
    ``entries`` replaced."""
    declared = dict(ks.SETTINGS.tables[table][key])
    return table, key, (declared, {**declared, **entries})


# (table, key, values): changes a step may make, each moving some launches of the calls drawn
# (moving_changes finds which); every op of NAMES has one that moves its launches at 4 and 12 rows
CHANGES = [("bounds", "few_rows", (0, 128)), ("bounds", "small_rows", (0, 512)),
           ("small", ("fp8_ds_mla", "encode"), ({"block_m": 1, "num_warps": 1}, {"block_m": 4, "num_warps": 2})),
           ("compress_bounds", "one_token_max_t", (0, 2048)), ("swa", "block_kv", (8, 2)),
           ("indices", "table_slot_mapping", ({"block": 512, "num_warps": 4}, {"block": 64, "num_warps": 1})),
           ("query", "indexer_q", ({"block_h": 32, "num_warps": 1, "lane_load": 1, "lane_store": 0, "maxnreg": 160},
                                   {"block_h": 8, "num_warps": 1, "lane_load": 0, "lane_store": 0, "maxnreg": 0})),
           ("compress_bounds", "split_max_t", (2048, 0)), ("swa", "block_h", (8, 4)),
           *(_other("v41", key, block_m=2) for key in ("encode", "encode_lanes", "decode", "paged")),
           *(_other("nvfp4", key, block_m=2) for key in ("encode", "decode", "paged")),
           _other("config", ("rows", "gather_paged"), tile_bytes=1024),
           _other("config", ("fp8_ds_mla", "dequantize_gather"), block_m=2),
           _other("config", ("indexer", "dequantize_gather"), block_m=2),
           _other("indices", "compressed_slot_mapping", block=64, num_warps=1),
           *(_other("indices", key, few_rows=0) for key in (
               "global_topk_indices_and_lens", "combine_topk_swa_indices", "combine_dense_swa_indices",
               "decode_swa_indices_and_lens", "dense_prefill_local_compressed_indices")),
           _other("query", "inv_rope", lanes=4), _other("query", "hadamard", num_warps=2)]


def fresh_stub():
    return stub_with_replay(name for name, _, _ in CHANGES)


@functools.lru_cache(maxsize=4096)
def moving_changes(name: str, config: tuple) -> tuple[int, ...]:
    """Indices of the CHANGES whose two values give the full path of ``name``'s variant
    ``config`` (``_call``'s items) other launches: kernels, grids or scalars (the declared
    settings otherwise)."""
    fn = _call(name, dict(config))
    inputs = tensors_of(fn)
    moving = []
    with fresh_stub() as log:
        for i, (table, key, values) in enumerate(CHANGES):
            saved = ks.snapshot(table)
            launches = []
            for value in values:
                ks.change(table, key, value)
                got = outcome(fn, log, enabled=False)[0]
                launches.append(normalized(got, inputs, addresses(got)))
            ks.restore(table, saved)
            if launches[0] != launches[1]:
                moving.append(i)
    return tuple(moving)


@pytest.fixture
def stub():
    with fresh_stub() as log:
        yield log


@triton.jit
def _fill(out, n, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out + i, VALUE, mask=i < n)


@replay.replayable
def canary(x: torch.Tensor, y: torch.Tensor):
    """A replayable op that launches one kernel through the launcher and one around it: it must
    never be recorded (a replay would lose the second launch)."""
    fast(_fill)[(1,)](x, x.shape[0], VALUE=1, BLOCK=16)
    _fill[(1,)](y, y.shape[0], VALUE=2, BLOCK=16)
    return None


def _canary_call(seed: int):
    x, y = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    return lambda: canary(x, y)


def _call(name: str, cfg: dict):
    if name == "canary":
        return _canary_call(cfg["seed"])
    base = base_calls(cfg["rows"], cfg["custom"], cfg["check"], cfg["seed"])[name]
    return variant(base, offset=cfg["offset"], alias=cfg["alias"], slots32=cfg["slots32"], x_dtype=cfg["x_dtype"],
                   zero=cfg["zero"])


def _fields(name: str) -> list[str]:
    """The variant fields that change something in a call of ``name`` (so that flipping one
    gives another key, or the same key with other tensors)."""
    if name == "canary":
        return ["seed"]
    held = tensors_of(base_calls(8, False, True, 0)[name])
    metas = [(t.dtype, tuple(t.shape), t.stride()) for t in held]
    fields = ["seed", "offset"]
    if len(set(metas)) < len(metas):
        fields.append("alias")
    closure = repr(base_calls(8, False, True, 0)[name].__code__.co_freevars)
    if any(n in closure for n in FLOAT_NAMES) or "compress_" in name:
        fields.append("zero")
    if "slots" in closure:
        fields.append("slots32")
    if "x" in base_calls(8, False, True, 0)[name].__code__.co_freevars:
        fields.append("x_dtype")
    return fields


FIELDS = {name: _fields(name) for name in NAMES + ["canary"]}
FLIPS = {"seed": lambda v: 1 - v, "alias": lambda v: not v, "offset": lambda v: {0: 4, 4: 1, 1: 0}[v],
         "zero": lambda v: -v, "slots32": lambda v: not v,
         "x_dtype": lambda v: torch.float32 if v is None else None}


@st.composite
def programs(draw):
    """Steps over variants of one or two ops: ("call", variant), ("clear",) (forget every plan)
    or ("set", table, key, values) (a launch setting to the other of two values). Each op has a
    base variant and, per field that matters to it, one with that field flipped (other tensors,
    storage offset, one tensor for two arguments, signed zero, index or row dtype); each flipped
    variant is called after a plan of the base exists and the base after a plan of the flipped
    one, so a key that misses the field replays the wrong plan. Then, for an op whose launches a
    launch setting of CHANGES moves (``moving_changes``), that setting is changed after a plan
    exists and changed back after a plan of the new value exists, a call following each: a
    change that leaves the plans in place replays the other setting's launches. Random steps
    follow."""
    # the canary last: hypothesis draws the first entry most, and the canary has no launch settings
    names = draw(st.lists(st.sampled_from(NAMES + ["canary"]), min_size=1, max_size=2, unique=True))
    variants, steps = [], []
    for name in names:
        # two sizes of decode step; the launch-setting changes of "bounds" move either across the
        # small- and few-row configurations (a step's compressed caches take ~20 MB a token here)
        base = {"rows": draw(st.sampled_from([4, 12])), "custom": draw(st.booleans()),
                "check": draw(st.sampled_from([True, True, True, False, "strict"])), "seed": draw(st.integers(0, 1)),
                "alias": draw(st.booleans()), "offset": draw(st.sampled_from([0, 1, 4])),
                "zero": draw(st.sampled_from([0.0, -0.0])), "slots32": draw(st.booleans()),
                "x_dtype": draw(st.sampled_from([None, torch.float16]))}
        first = len(variants)
        variants.append((name, base))
        for field in FIELDS[name]:
            variants.append((name, dict(base, **{field: FLIPS[field](base[field])})))
            flipped = len(variants) - 1
            steps += [("clear",), ("call", first), ("call", first), ("call", flipped),
                      ("clear",), ("call", flipped), ("call", flipped), ("call", first)]
        # strict checks never replay: this part calls the op in a replaying mode
        replaying = dict(base, check=True if base["check"] == "strict" else base["check"])
        moving = moving_changes(name, tuple(replaying.items())) if name != "canary" else ()
        if moving:
            checked = len(variants)
            variants.append((name, replaying))
            change = ("set", *CHANGES[draw(st.sampled_from(moving))])
            steps += [("clear",), ("call", checked), ("call", checked), change, ("call", checked),
                      ("call", checked), change, ("call", checked)]
    for _ in range(draw(st.integers(2, 10))):
        if draw(st.integers(0, 3)) == 0:
            steps.append(("set", *draw(st.sampled_from(CHANGES))))
        else:
            steps.append(("call", draw(st.integers(0, len(variants) - 1))))
    return variants, steps


_check = check_replay


def run_program(program) -> None:
    variants, steps = program
    calls = [_call(name, cfg) for name, cfg in variants]
    with fresh_stub() as log:
        for step in steps:
            if step[0] == "clear":
                replay.clear()
            elif step[0] == "set":  # to the other value of the two
                table, key, values = step[1:]
                now = ks.SETTINGS.tables[table].get(key)
                ks.change(table, key, values[1] if now == values[0] else values[0])
            else:
                _check(calls[step[1]], log)


@settings(max_examples=100)
@given(program=programs())
def test_a_replayed_call_launches_exactly_what_its_full_path_launches(program):
    run_program(program)


FUZZ_SECONDS = float(os.environ.get("KVFORMATS_REPLAY_FUZZ_SECONDS", "0") or 0)
BATCH = 25  # programs per hypothesis run of the timed fuzz (a few seconds each); the budget is checked between runs


@pytest.mark.skipif(not FUZZ_SECONDS, reason="a timed run from a fresh seed: KVFORMATS_REPLAY_FUZZ_SECONDS (.ci/run)")
def test_programs_from_a_fresh_seed():
    """New programs on every run (the ci profile's are fixed), for KVFORMATS_REPLAY_FUZZ_SECONDS
    (the run in progress finishes); KVFORMATS_REPLAY_FUZZ_SEED repeats a run. A failure is
    reported unshrunk (shrinking has no time bound) with the seed that repeats it."""
    master = int(os.environ.get("KVFORMATS_REPLAY_FUZZ_SEED") or secrets.randbits(64))
    rng = random.Random(master)
    deadline = time.monotonic() + FUZZ_SECONDS
    runs = 0
    while runs == 0 or time.monotonic() < deadline:
        run_seed = rng.getrandbits(64)
        test = settings(max_examples=BATCH, derandomize=False, database=None, deadline=None, phases=[Phase.generate],
                        suppress_health_check=list(HealthCheck))(given(program=programs())(run_program))
        try:
            seed(run_seed)(test)()
        except BaseException as err:
            note = (f"replay fuzz: failed with KVFORMATS_REPLAY_FUZZ_SEED={master} (hypothesis run {runs}, "
                    f"seed {run_seed}); repeat: KVFORMATS_REPLAY_FUZZ_SEED={master} "
                    f"KVFORMATS_REPLAY_FUZZ_SECONDS={FUZZ_SECONDS:g} python3 -m pytest -n 0 "
                    f"tests/test_replay_fuzz.py -k fresh_seed")
            print(note, file=sys.stderr)
            err.add_note(note)
            raise
        runs += 1
    print(f"replay fuzz: seed {master}, {runs} runs of {BATCH} programs", file=sys.stderr)


def test_the_fuzzer_replays(stub):
    """The fuzzer's calls do get replayed (a fuzzer of the full path alone would prove nothing)."""
    fn = _call("fp8_indexer.encode", {"rows": 8, "custom": False, "check": True, "seed": 0, "offset": 0,
                                      "alias": False, "slots32": False, "x_dtype": None, "zero": None})
    for _ in range(3):
        _check(fn, stub)
    assert any(isinstance(p, replay_plan.Plan) for t in replay._TABLES for p in t.values())


def test_a_tensor_passed_twice_is_keyed_apart(stub):
    lay = kvf.get_format("compressor_state", head_dim=64, ratio=4, page_size=4)
    cache = lay.allocate(4)
    kv, score, ape = torch.randn(4, lay.width), torch.randn(4, lay.width), torch.randn(4, lay.width)
    ar = torch.arange(4)
    for _ in range(3):  # a warm-up that passes one arange for slots and positions
        lay.encode((kv, score), cache, ar, positions=ar, ape=ape)
    slots, positions = torch.tensor([9, 3, 14, 6]), torch.arange(4)
    _check(lambda: lay.encode((kv, score), cache, slots, positions=positions, ape=ape), stub)


def test_floats_are_keyed_by_their_bits():
    key = []
    for v in (0.0, -0.0, float("nan")):
        key.append(replay._signature((v,), [], [], [], {}))
    assert key[0] != key[1] and key[2] == replay._signature((float("nan"),), [], [], [], {})


def test_a_launch_around_the_launcher_refuses_the_recording(stub):
    fn = _canary_call(0)
    for _ in range(4):
        _check(fn, stub)
    assert not any(isinstance(p, replay_plan.Plan) for p in canary.__wrapped_plans__.values())


def test_settings_change_only_through_their_function(stub):
    with pytest.raises(SettingsError, match="settings.change"):
        tuning.CONFIG[("rows", "gather")] = {"tile_bytes": 1}
    with pytest.raises(TypeError):
        tuning.CONFIG[("rows", "gather")]["tile_bytes"] = 1  # entries are read-only too
    with pytest.raises(SettingsError, match="settings.change"):
        del tuning.CONFIG[("rows", "gather")]
    with pytest.raises(SettingsError, match="rebinding"):
        tuning.BOUNDS = {"small_rows": 0, "few_rows": 0}
    with pytest.raises(SettingsError, match="known"):
        ks.change("nosuch", "x", 1)
    lay, x = kvf.get_format("fp8_indexer"), torch.randn(8, 128, dtype=torch.bfloat16)
    cache, slots = lay.allocate(2), torch.arange(8)
    for _ in range(3):
        lay.encode(x, cache, slots)
    plans = [p for t in replay._TABLES for p in t.values() if isinstance(p, replay_plan.Plan)]
    assert plans
    generation = ks.SETTINGS.generation
    ks.change("bounds", "few_rows", 0)
    assert ks.SETTINGS.generation == generation + 1
    assert not any(isinstance(p, replay_plan.Plan) for t in replay._TABLES for p in t.values())
    _check(lambda: lay.encode(x, cache, slots), stub)


def test_replay_starts_on_the_third_call(stub):
    lay, x = kvf.get_format("fp8_indexer"), torch.randn(8, 128, dtype=torch.bfloat16)
    cache, slots = lay.allocate(2), torch.arange(8)
    table = slot_ops.encode.__wrapped_plans__
    for n in range(1, 4):
        lay.encode(x, cache, slots)
        assert any(isinstance(p, replay_plan.Plan) for p in table.values()) == (n >= 2)
    plan = next(p for p in table.values() if isinstance(p, replay_plan.Plan))
    used = []
    real = plan.replay
    plan.replay = lambda *a: used.append(1) or real(*a)
    lay.encode(x, cache, slots)
    assert used == [1]


@pytest.mark.parametrize("version,direct", [("3.6.0", True), ("3.6.1+git5", True), ("3.5.1", False),
                                            ("3.7.0", False), ("3.9.0", False), ("4.0.0", False)])
def test_direct_launches_only_on_a_verified_triton(version, direct, monkeypatch):
    assert triton_abi.verified(version) is direct
    before = replay.SWITCHES.enabled
    replay.SWITCHES.enabled = True
    try:
        with stubbed_launches(triton_version=version) as log:
            fn = _call("fp8_ds_mla.decode", {"rows": 8, "custom": False, "check": True, "seed": 0, "offset": 0,
                                             "alias": False, "slots32": False, "x_dtype": None, "zero": None})
            for _ in range(3):
                _check(fn, log)
            planned = any(isinstance(p, replay_plan.Plan) for t in replay._TABLES for p in t.values())
            assert planned is direct  # another release: every launch through Triton, nothing replayed
    finally:
        replay.SWITCHES.enabled = before


def test_strict_checks_are_per_thread_and_nest():
    assert not deferred.strict_on()
    with kvf.strict_checks():
        assert deferred.strict_on()
        with kvf.strict_checks(False):
            assert not deferred.strict_on()
        assert deferred.strict_on()
        seen = []
        t = threading.Thread(target=lambda: seen.append(deferred.strict_on()))
        t.start()
        t.join()
        assert seen == [False]  # another thread's calls are not strict
    assert not deferred.strict_on()


def test_two_threads_record_their_own_plans(stub):
    """Two threads replaying at once, one inside strict_checks(): each plan recorded meanwhile
    launches what the full path launches, and the strict thread records none."""
    cfg = {"rows": 8, "custom": False, "check": True, "offset": 0, "alias": False, "slots32": False,
           "x_dtype": None, "zero": None}
    a = [_call(n, dict(cfg, seed=0)) for n in ("fp8_indexer.encode", "mxfp4_indexer.decode", "dsv4.swa_insert")]
    b = [_call(n, dict(cfg, seed=1)) for n in ("fp8_ds_mla.encode", "dsv4.table_slot_mapping")]
    barrier, errors = threading.Barrier(2), []

    def run(fns, strict):
        try:
            barrier.wait(timeout=30)
            with kvf.strict_checks(strict):
                for _ in range(4):
                    for f in fns:
                        f()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a, False)), threading.Thread(target=run, args=(b, True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    plans = [p for t in replay._TABLES for p in t.values() if isinstance(p, replay_plan.Plan)]
    assert len(plans) == len(a)  # the strict thread's calls took the full path every time
    for f in a:  # each plan recorded under concurrency is right
        _check(f, stub)


def test_the_first_signature_of_a_process_is_recorded_on_its_second_call():
    """Loading the kernel package (on the first call) keeps the replay counts (it once cleared
    them, so the first signature of a process was recorded on its third call)."""
    import subprocess
    import sys

    code = """
import torch
import kvformats as kvf
from kvformats.codec import registry, slot_ops
from kvformats.runtime import replay, replay_plan
from tests.harness.launch_stub import stubbed_launches
assert not registry._kernels_loaded
lay, x = kvf.get_format("fp8_indexer"), torch.randn(8, 128, dtype=torch.bfloat16)
cache, slots = lay.allocate(2), torch.arange(8)
replay.SWITCHES.enabled = True
with stubbed_launches():
    for n in (1, 2):
        lay.encode(x, cache, slots)
        plans = [p for p in slot_ops.encode.__wrapped_plans__.values() if isinstance(p, replay_plan.Plan)]
        print(n, len(plans))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["1", "0", "2", "1"], out.stdout + out.stderr

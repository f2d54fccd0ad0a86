"""``kvformats quality``: the accuracy report of the DeepSeek V4 cache formats (kvformats.dsv4_layer.quality).

    kvformats quality [--json] [--out FILE] [--activations FILE.safetensors] [--topk K] [--tiny]

Inputs: synthetic activations (kvformats.dsv4_layer.synthetic) by default, or a safetensors
file holding one float tensor ``x`` of shape ``[requests, tokens, hidden]`` (a layer's input
activations per request); the layer's weights are random with that ``hidden``. Each request is
prefilled with its first ``tokens - decode`` tokens, then decoded one token at a time; the
decode tokens are the ones measured.
"""

from __future__ import annotations

import json
from typing import Any
from pathlib import Path

from kvformats.cli.args import check_memory, check_output, out_of_memory, write_output
from kvformats.dsv4_layer.pipeline_config import HCA_RATIO, LayerConfig
from kvformats.errors import KVFormatError, UsageError

DEFAULTS = dict(heads=4, head_dim=512, rope_dim=64, index_heads=8, index_dim=128, window=128, page_size=64,
                out_groups=2, hidden=256)
# Peak memory of a report per request and context position at these shapes, measured (peak RSS
# less the interpreter's, 2 requests): 120 KB at 1024 positions, 165-170 KB at 2048 and 4096 (both
# runs' caches and compressor states, the float32 exact rows, the prefill's intermediate rows).
BYTES_PER_POSITION = 192 << 10
SEEDS = (-(1 << 63), (1 << 64) - 1)  # what torch's generators take (torch.Generator.manual_seed)


def add_parser(sub) -> None:
    q = sub.add_parser("quality", help="attention error and indexer recall@k of the DeepSeek V4 formats")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.add_argument("--out", type=Path, help="also write the JSON report to this file")
    q.add_argument("--activations", type=Path, help="safetensors file with x [requests, tokens, hidden]")
    q.add_argument("--topk", type=int, default=64, help="indexer top-k (default 64 at the default shapes)")
    q.add_argument("--requests", type=int, default=2)
    q.add_argument("--tokens", type=int, default=1000, help="tokens per request (synthetic input)")
    q.add_argument("--decode", type=int, default=16, help="decode steps measured after the prefill")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--tiny", action="store_true", help="tiny shapes (tests; seconds)")
    q.set_defaults(fn=cmd_quality)


def _load(path: Path):
    try:
        from safetensors.torch import load_file
    except ImportError as e:
        raise UsageError("--activations needs the safetensors package (pip install safetensors)") from e
    try:
        x = load_file(str(path)).get("x")
    except Exception as e:  # a missing or malformed file is a usage error, reported in one line
        raise UsageError(f"cannot read {path}: {e}") from e
    if x is None or x.dim() != 3 or not x.dtype.is_floating_point:
        raise UsageError(f"{path}: needs a float tensor 'x' [requests, tokens, hidden]")
    return x.float()


def cmd_quality(args, out) -> int:
    import torch

    from kvformats.dsv4_layer.quality import report
    from kvformats.dsv4_layer.synthetic import activations

    if not SEEDS[0] <= args.seed <= SEEDS[1]:
        raise UsageError(f"--seed must be in [-2**63, 2**64 - 1] (what torch's generators take), got {args.seed}")
    shapes: dict[str, Any] = dict(DEFAULTS)
    if args.tiny:
        shapes.update(head_dim=128, index_heads=4, window=16, page_size=16, hidden=64)
    if args.activations:
        x3 = _load(args.activations)
        requests, tokens, hidden = x3.shape
        shapes["hidden"] = hidden
        x = x3.reshape(-1, hidden)
    else:
        requests, tokens = args.requests, (200 if args.tiny else args.tokens)
        x = None
    if tokens <= args.decode or args.decode < 1:
        raise UsageError(f"need 1 <= decode ({args.decode}) < tokens per request ({tokens})")
    if args.out:  # before a minute of work, not after
        check_output(args.out, "quality report", "--out")
    ctx = -(-tokens // HCA_RATIO) * HCA_RATIO
    try:
        cfg = LayerConfig(topk=(8 if args.tiny and args.topk == 64 else args.topk), requests=requests,
                          max_context=ctx, **shapes).check()
    except KVFormatError as e:
        raise UsageError(str(e)) from e
    # before any of it is allocated: the activations (drawn in float32, three copies at once) and
    # the run itself
    need = requests * ctx * BYTES_PER_POSITION + 3 * requests * tokens * cfg.hidden * 4
    check_memory(need, "cpu", f"quality with {requests} requests of {tokens} tokens",
                 "pass fewer --requests or --tokens")
    try:
        if x is None:
            x = activations(cfg.hidden, [tokens] * requests, seed=args.seed)
        torch.manual_seed(args.seed)
        rep = report(cfg, x, tokens - args.decode, args.decode)
    except Exception as err:  # noqa: BLE001  (re-raised unless an allocator refused)
        if not out_of_memory(err):
            raise
        raise UsageError(f"quality with {requests} requests of {tokens} tokens ran out of memory; "
                         f"pass fewer --requests or --tokens") from None
    rep["input"] = str(args.activations) if args.activations else "synthetic"
    if args.out:
        write_output(str(args.out), json.dumps(rep, indent=1), "quality report")
    if args.json:
        out(json.dumps(rep, indent=1))
        return 0
    out(f"{rep['tokens_measured']} decode tokens, top-k {cfg.topk}, input {rep['input']} "
        f"(relative error of the attention output against bf16 caches; recall@k of the indexer)")
    out(f"{'run':48s} {'SWA':>8s} {'CSA':>8s} {'HCA':>8s} {'layer':>8s} {'recall':>8s}")
    for row in rep["rows"]:
        cells = [("—" if row[k] is None else f"{row[k]:.4f}") for k in ("swa", "csa", "hca", "layer", "recall")]
        out(f"{row['run']:48s} " + " ".join(f"{c:>8s}" for c in cells))
    if cfg.topk >= rep["fewest_visible_rows"]:
        out(f"note: top-k {cfg.topk} covers every compressed row of some measured tokens (as few as "
            f"{rep['fewest_visible_rows']}): their recall is 1.0 whatever the indexer scores; pass a smaller "
            f"--topk or more --tokens for a recall that measures the indexer")
    return 0

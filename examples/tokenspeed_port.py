"""A DeepSeek V4 attention layer's cache writes and reads through tokenspeed's function names, on
CPU: the end-to-end example of docs/porting-from-tokenspeed.md (tests/compat/test_porting_example.py
runs it). One request of 12 tokens in a prefill: its SWA rows, its compressor state, the CSA
(ratio 4) compressed rows of its three complete groups, and both caches read back.

    python3 examples/tokenspeed_port.py
"""

import torch

# from tokenspeed.runtime.layers.attention.deepseek_v4_ops import ...   # the one changed import
from kvformats.compat.tokenspeed import (
    deepseek_v4_csa_compress_kv_cache_insert,
    dequantize_deepseek_v4_fp8_ds_mla_cache,
    fused_qnorm_rope_kv_insert,
    save_deepseek_v4_compressor_state,
)
import kvformats as kvf
from kvformats import deepseek_v4 as dsv4

torch.manual_seed(0)
HEAD, ROPE, HEADS, PAGE, RATIO, STATE_ROWS = 512, 64, 4, 64, 4, 8
T = 12  # one request, positions 0..11: three complete groups of 4

# Cache shapes: tokenspeed's 2-D views ([pages, page bytes]; [pages, rows, 2W] float32 state).
swa = kvf.Fp8DsMla(head_dim=HEAD, rope_dim=ROPE, page_size=PAGE)
swa_cache = swa.allocate(num_pages=4)                     # uint8 [4, 37440]
csa_cache = swa.allocate(num_pages=2)                     # the compressed rows: the same fp8_ds_mla rows
state_cache = torch.zeros(3, STATE_ROWS, 2 * 2 * HEAD)    # CSA state: [kv 2h | score 2h] per row

# The RoPE table (float32 [max_pos, 64]: cos then sin, as tokenspeed's rotary embedding builds it).
cos_sin = dsv4.cos_sin_cache(ROPE, 4096)
positions = torch.arange(T)
req = torch.zeros(T, dtype=torch.int32)

# 1. SWA: q normalised and rotated in place, each token's kv row written at its slot (page 1).
q = torch.randn(T, HEADS, HEAD, dtype=torch.bfloat16)
kv = torch.randn(T, HEAD, dtype=torch.bfloat16)
swa_slots = PAGE + positions
fused_qnorm_rope_kv_insert(q, kv, swa_cache, swa_slots, positions, cos_sin, 1e-6, PAGE)

# 2. The compressor state: one [kv | score + ape] row per token (ape as tokenspeed keeps it at
#    runtime: reordered at weight loading), at the state slots of the request's state table.
state_table = torch.tensor([[2, 1]], dtype=torch.int32)
state_slots = state_table[0, positions // STATE_ROWS] * STATE_ROWS + positions % STATE_ROWS
ckpt_ape = torch.randn(RATIO, 2 * HEAD)
runtime_ape = torch.cat([ckpt_ape[:, :HEAD], ckpt_ape[:, HEAD:]], 0).reshape(RATIO, 2 * HEAD)
c_kv, c_score = torch.randn(T, 2 * HEAD), torch.randn(T, 2 * HEAD)
save_deepseek_v4_compressor_state(c_kv, c_score, runtime_ape, state_cache, state_slots, positions, STATE_ROWS, RATIO)

# 3. The CSA insert: at each group's last token (positions 3, 7, 11) the state window is pooled,
#    RMS-normalised, rotated and written as one compressed row at that token's compressed slot.
csa_slots = torch.where(positions % RATIO == RATIO - 1, positions // RATIO, -1)   # rows 0, 1, 2 of page 0
norm_weight = torch.ones(HEAD)
deepseek_v4_csa_compress_kv_cache_insert(state_cache, req, positions, state_slots, state_table, STATE_ROWS,
                                         norm_weight, 1e-6, cos_sin, csa_cache, csa_slots, PAGE)

# 4. Read back: bf16 rows of both caches (zero rows for slot -1).
swa_rows = dequantize_deepseek_v4_fp8_ds_mla_cache(swa_cache, swa_slots, PAGE, head_dim=HEAD, rope_dim=ROPE)
csa_rows = dequantize_deepseek_v4_fp8_ds_mla_cache(csa_cache, torch.arange(4), PAGE, head_dim=HEAD, rope_dim=ROPE)

rope = dsv4.rope_tail(kv.float(), positions, cos_sin).bfloat16()   # what the SWA rows hold, unquantized
error = ((swa_rows.float() - rope.float()).abs().max() / rope.float().abs().max()).item()
written = csa_rows.abs().amax(1) > 0
print(f"SWA rows: {tuple(swa_rows.shape)}, max error {error:.3f} of the largest value (fp8 e4m3: < 0.07)")
print(f"CSA rows written: {written.tolist()} (three complete groups of {RATIO}; row 3 empty)")
assert error < 0.07 and written.tolist() == [True, True, True, False]

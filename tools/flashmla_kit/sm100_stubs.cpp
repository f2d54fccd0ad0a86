// kvformats interop build: FlashMLA's sparse_decode.h dispatches to SM100 decode kernels that this
// SM90-only build does not compile. Their entry points are defined here to raise instead, so the
// module links and loads; on an SM90 GPU the dispatcher never reaches them.
#include <stdexcept>

#include "params.h"
#include "sm100/decode/head64/kernel.h"
#include "sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h"

namespace {
[[noreturn]] void not_built() {
    throw std::runtime_error("FlashMLA SM100 kernels are not in this SM90-only build (kvformats interop kit)");
}
}

namespace sm100::decode::head64 {
template<ModelType MODEL_TYPE>
void run_flash_splitkv_mla_fp8_sparse_kernel(const SparseAttnDecodeParams &) { not_built(); }
template void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(const SparseAttnDecodeParams &);
template void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(const SparseAttnDecodeParams &);
}

namespace sm100::fwd_for_small_topk::head128 {
template<SparseAttnFwdMode FWD_MODE, int D_QK>
void run_fwd_for_small_topk_phase1_kernel(const SparseFwdArgT<FWD_MODE> &) { not_built(); }
template void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(
    const SparseFwdArgT<SparseAttnFwdMode::DecodeWithSplitKV> &);
}

// kvformats interop build of FlashMLA: the module flash_mla.cuda with only sparse_decode_fwd
// (FlashMLA's own csrc/api/api.cpp binds every kernel family; this binds the sparse decode only).
#include <pybind11/pybind11.h>

#include "sparse_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashMLA sparse fp8 decode (SM90 only; kvformats interop build)";
    m.def("sparse_decode_fwd", &sparse_attn_decode_interface);
}

// The Python extension module torchfeed._C: build facts, and the classes bound with pybind11.
// The ops themselves register with the dispatcher when this library is loaded.
#include <torch/extension.h>

#include <string>

#include "common/cpu_isa.h"

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["version"] = TORCHFEED_VERSION;
  info["torch_version"] = TORCHFEED_TORCH_VERSION;
#ifdef TORCHFEED_WITH_CUDA
  info["cuda_compiled"] = true;
  info["cuda_version"] = TORCHFEED_CUDA_VERSION;
  info["cuda_archs"] = TORCHFEED_CUDA_ARCHS;
#else
  info["cuda_compiled"] = false;
  info["cuda_version"] = pybind11::none();
  info["cuda_archs"] = "";
#endif
  return info;
}

std::string isa_name(torchfeed::CpuIsa isa) {
  return isa == torchfeed::CpuIsa::kAvx2 ? "avx2" : "baseline";
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchfeed compiled kernels";
  m.def("build_info", &build_info, "What the compiled extension was built with.");
  m.def("cpu_isa", [] { return isa_name(torchfeed::cpu_isa()); },
        "Instruction set the CPU kernels use: 'avx2' or 'baseline'.");
  m.def(
      "limit_cpu_isa",
      [](const std::string& limit) {
        TORCH_CHECK_VALUE(limit == "avx2" || limit == "baseline",
                          "limit_cpu_isa: expected 'avx2' or 'baseline', got '", limit, "'");
        return isa_name(torchfeed::limit_cpu_isa(limit == "avx2" ? torchfeed::CpuIsa::kAvx2
                                                                 : torchfeed::CpuIsa::kBaseline));
      },
      "Caps the CPU kernels' instruction set (for tests); returns the one now in use.");
}

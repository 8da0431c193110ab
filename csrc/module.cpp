// The Python extension module torchfeed._C: build facts, and the classes bound with pybind11.
// The ops themselves register with the dispatcher when this library is loaded.
#include <torch/extension.h>

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

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchfeed compiled kernels";
  m.def("build_info", &build_info, "What the compiled extension was built with.");
}

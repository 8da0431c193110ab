#include "testing/bindings.h"

#include <string>

#include "common/cpu_isa.h"
#include "memory/fence.h"
#ifdef TORCHFEED_WITH_JPEG
#include "io/jpeg.h"
#endif

namespace torchfeed::testing {

void bind(pybind11::module_& m) {
  pybind11::module_ t = m.def_submodule("_testing", "Test hooks (not part of the API).");
  t.def(
      "limit_cpu_isa",
      [](const std::string& limit) {
        CpuIsa isa = CpuIsa::kBaseline;
        TORCH_CHECK_VALUE(cpu_isa_from_name(limit, &isa),
                          "limit_cpu_isa: expected 'avx512', 'avx2' or 'baseline', got '", limit,
                          "'");
        return std::string(cpu_isa_name(limit_cpu_isa(isa)));
      },
      "Caps the CPU kernels' instruction set; returns the one now in use.");
  t.def("manual_fences", &set_manual_fences, pybind11::arg("on"),
        "Holds the rings' fences (whatever their stream) until complete_fences().");
  t.def("complete_fences", &complete_manual_fences, "Runs the held fences; returns how many.");
  t.def("pending_fences", &pending_manual_fences, "How many fences are held.");
#ifdef TORCHFEED_WITH_JPEG
  t.def(
      "jpeg_unread_scans_dropped",
      [](const at::Tensor& data, int64_t scale_denom) {
        const io::ScanFilter f = io::jpeg_unread_scans_dropped(data, scale_denom);
        const pybind11::bytes kept(reinterpret_cast<const char*>(f.data.data()), f.data.size());
        return pybind11::make_tuple(kept, f.scans, f.dropped);
      },
      pybind11::arg("data"), pybind11::arg("scale_denom"),
      "(bytes, scans, dropped): the progressive JPEG the window decoder decodes at this scale.");
#endif
}

}  // namespace torchfeed::testing

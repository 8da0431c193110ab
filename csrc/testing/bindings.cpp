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
      "jpeg_scans_filtered",
      [](const at::Tensor& data, int64_t scale_denom, int64_t bottom) {
        const io::ScanFilter f = io::jpeg_scans_filtered(data, scale_denom, bottom);
        const pybind11::bytes kept(reinterpret_cast<const char*>(f.data.data()), f.data.size());
        return pybind11::make_tuple(kept, f.scans, f.dropped, f.rows);
      },
      pybind11::arg("data"), pybind11::arg("scale_denom"), pybind11::arg("bottom") = 0,
      "(bytes, scans, dropped, rows): the progressive JPEG the window decoder decodes at this "
      "scale for a window whose last row is bottom - 1 (0: the image's last row).");
  t.def(
      "jpeg_warning_refused",
      [](const std::string& text, bool rows_cut) {
        return io::jpeg_warning_refused(text.c_str(), rows_cut);
      },
      pybind11::arg("text"), pybind11::arg("rows_cut") = false,
      "Whether the window decoder refuses a decode on this libjpeg warning text.");
#endif
}

}  // namespace torchfeed::testing

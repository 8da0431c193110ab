// The Python extension module torchfeed._C: build facts, and the classes bound with pybind11.
// The ops themselves register with the dispatcher when this library is loaded.
#include <torch/extension.h>

#include <string>

#include "common/cpu_isa.h"
#include "memory/fence.h"
#include "memory/pinned_ring.h"
#include "memory/shared_ring.h"
#include "testing/bindings.h"
#ifdef TORCHFEED_WITH_JPEG
#include "io/jpeg.h"
#endif

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
#ifdef TORCHFEED_WITH_JPEG
  info["jpeg"] = torchfeed::io::jpeg_library_version();
  info["jpeg_runtime"] = torchfeed::io::jpeg_runtime_library();
#else
  info["jpeg"] = pybind11::none();
  info["jpeg_runtime"] = pybind11::none();
#endif
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchfeed compiled kernels";
  m.def("build_info", &build_info, "What the compiled extension was built with.");
  m.def(
      "cpu_isa", [] { return std::string(torchfeed::cpu_isa_name(torchfeed::cpu_isa())); },
      "Instruction set the CPU kernels use: 'avx2' or 'baseline'.");
  m.def("process_alive", &torchfeed::process_alive, pybind11::arg("pid"),
        "False only when there is no process `pid` (kill(pid, 0) says ESRCH), or pid <= 0.");
  m.def("physical_memory", &torchfeed::physical_memory,
        "This machine's physical memory in bytes (0 when unknown), the bound on a ring's arena.");
#ifdef TORCHFEED_WITH_JPEG
  m.def(
      "jpeg_info",
      [](const at::Tensor& data) {
        const torchfeed::io::JpegInfo i = torchfeed::io::jpeg_info(data);
        return pybind11::make_tuple(i.height, i.width, i.components, i.rgb_decodable);
      },
      pybind11::arg("data"),
      "(height, width, components, rgb_decodable) from a JPEG's header, without decoding.");
#endif

  torchfeed::testing::bind(m);

  using torchfeed::PinnedRing;
  pybind11::register_exception<torchfeed::RingTimeoutError>(m, "RingTimeoutError",
                                                            PyExc_TimeoutError);
  pybind11::class_<PinnedRing, std::shared_ptr<PinnedRing>>(m, "_PinnedRing")
      .def(pybind11::init(&PinnedRing::create), pybind11::arg("capacity"),
           pybind11::arg("alignment"), pybind11::arg("pinned"), pybind11::arg("mlock"))
      .def("allocate", &PinnedRing::allocate, pybind11::arg("nbytes"), pybind11::arg("timeout"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("record_many", &PinnedRing::record_many, pybind11::arg("views"), pybind11::arg("stream"),
           pybind11::arg("device"))
      .def("stage_and_copy", &PinnedRing::stage_and_copy, pybind11::arg("sources"),
           pybind11::arg("offsets"), pybind11::arg("block"), pybind11::arg("target"),
           pybind11::arg("stream"), pybind11::arg("chunk_bytes"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("close", &PinnedRing::close, pybind11::arg("timeout"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("stats",
           [](PinnedRing& r) {
             const torchfeed::RingStats s = r.stats();
             pybind11::dict d;
             d["capacity"] = s.capacity;
             d["bytes_in_use"] = s.bytes_in_use;
             d["high_water"] = s.high_water;
             d["blocks_in_flight"] = s.blocks_in_flight;
             d["allocations"] = s.allocations;
             d["waits"] = s.waits;
             d["wait_seconds"] = s.wait_seconds;
             d["pinned"] = s.pinned;
             d["locked"] = s.locked;
             return d;
           })
      .def("blocks",
           [](PinnedRing& r) {
             pybind11::list out;
             for (const auto& b : r.blocks()) {
               out.append(
                   pybind11::make_tuple(b.id, b.offset, b.size, b.host_held, b.pending_copies));
             }
             return out;
           })
      .def_property_readonly("capacity", &PinnedRing::capacity)
      .def_property_readonly("alignment", &PinnedRing::alignment)
      .def_property_readonly("pinned", &PinnedRing::pinned)
      .def_property_readonly("data_address", &PinnedRing::data_address)
      .def_property_readonly("closed", &PinnedRing::closed);

  using torchfeed::SharedRing;
  pybind11::class_<SharedRing, std::shared_ptr<SharedRing>>(m, "_SharedRing")
      .def_static("create", &SharedRing::create, pybind11::arg("fd"), pybind11::arg("capacity"),
                  pybind11::arg("alignment"))
      .def_static("attach", &SharedRing::attach, pybind11::arg("fd"))
      .def("region", &SharedRing::region, pybind11::arg("offset"), pybind11::arg("nbytes"))
      .def("acquire", &SharedRing::acquire, pybind11::arg("nbytes"), pybind11::arg("timeout"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("abandon", &SharedRing::abandon, pybind11::arg("slot"), pybind11::arg("generation"))
      .def("lend", &SharedRing::lend, pybind11::arg("nbytes"))
      .def("hand_over", &SharedRing::hand_over, pybind11::arg("slot"), pybind11::arg("generation"))
      .def("view", &SharedRing::view, pybind11::arg("slot"), pybind11::arg("generation"),
           pybind11::arg("nbytes"))
      .def("record_many", &SharedRing::record_many, pybind11::arg("views"), pybind11::arg("stream"),
           pybind11::arg("device"))
      .def("register_pinned", &SharedRing::register_pinned)
      .def("populate", &SharedRing::populate, pybind11::arg("nbytes"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("reclaim_dead", &SharedRing::reclaim_dead)
      .def("reclaim_before", &SharedRing::reclaim_before, pybind11::arg("generation"))
      .def("next_generation", &SharedRing::next_generation)
      .def("stats", &SharedRing::stats)
      .def_property_readonly("capacity", &SharedRing::capacity)
      .def_property_readonly("data_address", &SharedRing::data_address)
      .def_property_readonly("pinned", &SharedRing::pinned);
}

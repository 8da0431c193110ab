// Which instruction set the CPU kernels use: the best the machine supports, or the one a test
// forces (so every code path is tested on one machine).
#pragma once

#include <string_view>

namespace torchfeed {

// Ordered: each level includes the one below it.
enum class CpuIsa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// AVX-512F (with AVX2, FMA and F16C) or AVX2 with FMA and F16C when the CPU has them, capped by
// TORCHFEED_CPU_ISA ("baseline" or "avx2") when it is set.
CpuIsa cpu_isa();
// The best supported ISA not above `limit`; returns the one now in use.
CpuIsa limit_cpu_isa(CpuIsa limit);
// "avx512", "avx2" or "baseline".
inline const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 ? "avx512" : isa == CpuIsa::kAvx2 ? "avx2" : "baseline";
}
// The ISA of that name; false when the name is none of them.
inline bool cpu_isa_from_name(std::string_view name, CpuIsa* isa) {
  for (CpuIsa i : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == cpu_isa_name(i)) {
      *isa = i;
      return true;
    }
  }
  return false;
}

}  // namespace torchfeed

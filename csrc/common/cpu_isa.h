// Which instruction set the CPU kernels use: the best the machine supports, or the one a test
// forces (so both code paths are tested on one machine).
#pragma once

namespace torchfeed {

enum class CpuIsa { kBaseline = 0, kAvx2 = 1 };

// AVX2 with FMA and F16C when the CPU has them (and TORCHFEED_CPU_ISA != "baseline").
CpuIsa cpu_isa();
// The best supported ISA not above `limit`; returns the one now in use.
CpuIsa limit_cpu_isa(CpuIsa limit);
// "avx2" or "baseline".
inline const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "baseline"; }

}  // namespace torchfeed

#include "common/cpu_isa.h"

#include <atomic>
#include <cstdlib>

namespace torchfeed {
namespace {

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return __builtin_cpu_supports("avx512f") ? CpuIsa::kAvx512 : CpuIsa::kAvx2;
  }
#endif
  return CpuIsa::kBaseline;
}

CpuIsa capped(CpuIsa limit) {
  const CpuIsa best = detect();
  return static_cast<int>(limit) < static_cast<int>(best) ? limit : best;
}

CpuIsa initial() {
  CpuIsa limit = CpuIsa::kAvx512;
  const char* env = std::getenv("TORCHFEED_CPU_ISA");
  if (env != nullptr && !cpu_isa_from_name(env, &limit)) limit = CpuIsa::kAvx512;
  return capped(limit);
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(initial())};
  return isa;
}

}  // namespace

CpuIsa cpu_isa() { return static_cast<CpuIsa>(current().load(std::memory_order_relaxed)); }

CpuIsa limit_cpu_isa(CpuIsa limit) {
  const CpuIsa chosen = capped(limit);
  current().store(static_cast<int>(chosen));
  return chosen;
}

}  // namespace torchfeed

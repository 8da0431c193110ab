#include "common/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace torchfeed {
namespace {

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return CpuIsa::kAvx2;
  }
#endif
  return CpuIsa::kBaseline;
}

CpuIsa initial() {
  const char* env = std::getenv("TORCHFEED_CPU_ISA");
  if (env != nullptr && std::strcmp(env, "baseline") == 0) return CpuIsa::kBaseline;
  return detect();
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(initial())};
  return isa;
}

}  // namespace

CpuIsa cpu_isa() { return static_cast<CpuIsa>(current().load(std::memory_order_relaxed)); }

CpuIsa limit_cpu_isa(CpuIsa limit) {
  const CpuIsa best = detect();
  const CpuIsa chosen = static_cast<int>(limit) < static_cast<int>(best) ? limit : best;
  current().store(static_cast<int>(chosen));
  return chosen;
}

}  // namespace torchfeed

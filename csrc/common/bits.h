// Opaque element storage for copy-only kernels: one type per element size. No torch includes.
#pragma once

#include <cstdint>

namespace torchfeed {

struct alignas(16) Bits128 {
  uint64_t lo, hi;
};

}  // namespace torchfeed

// Copy-only kernels (padding, staging) move elements as opaque bit patterns, so one
// instantiation per element size serves every dtype: bool, integers, floats, float8, complex.
#pragma once

#include <cstdint>
#include <cstring>

#include <c10/util/Exception.h>

#include "common/bits.h"

namespace torchfeed {

// Calls f(T{}) with an unsigned storage type as wide as one element.
template <typename F>
void dispatch_element_bits(int64_t element_size, const char* op, F&& f) {
  switch (element_size) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    case 8:
      f(uint64_t{});
      return;
    case 16:
      f(Bits128{});
      return;
    default:
      TORCH_CHECK_TYPE(false, op, ": unsupported element size ", element_size, " bytes");
  }
}

template <typename T>
T load_bits(const void* src) {
  T value;
  std::memcpy(&value, src, sizeof(T));
  return value;
}

}  // namespace torchfeed

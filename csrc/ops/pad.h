// Per-element math of the fused pad-and-mask op, shared by the CPU and CUDA kernels.
// No torch includes: nvcc compiles this for the device too.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace torchfeed::pad {

// Where one sequence of n elements lands in a padded row of `length` positions.
struct Window {
  int64_t kept;       // elements of the sequence that survive truncation
  int64_t out_start;  // first output position holding a real element
  int64_t src_skip;   // elements dropped from the front of the sequence
};

// max_length < 0 means no limit. `length` also bounds what is kept, so a row can never be
// overrun even when the caller's length is smaller than a sequence (the Python API never does
// that: it computes length from the kept lengths).
TF_HOST_DEVICE TF_INLINE Window window(int64_t n, int64_t length, int64_t max_length,
                                       bool left_pad, bool truncate_left) {
  int64_t kept = n;
  if (max_length >= 0 && kept > max_length) kept = max_length;
  if (kept > length) kept = length;
  return Window{kept, left_pad ? length - kept : 0, truncate_left ? n - kept : 0};
}

// Index into the sequence of the element at output position t, or -1 for a pad position.
TF_HOST_DEVICE TF_INLINE int64_t source_index(const Window& w, int64_t t) {
  const int64_t r = t - w.out_start;
  return (r >= 0 && r < w.kept) ? w.src_skip + r : -1;
}

}  // namespace torchfeed::pad

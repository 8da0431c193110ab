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
TF_HOST_DEVICE TF_INLINE Window window(int64_t n, int64_t length, int64_t max_length, bool left_pad,
                                       bool truncate_left) {
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

// One thread of the packed pad kernel (CUDA, or its CPU emulation in tests). Element i of
// max(B * L * max(F, 1), B): threads i < B also write lengths[i]; with F == 0 (an empty feature
// shape) the mask is still [B, L]. T is the element's bit pattern (one type per element size).
// Returns false when the offsets are inconsistent (decreasing, or past the values).
template <typename T>
TF_HOST_DEVICE TF_INLINE bool packed_element(int64_t i,
                                             const T* values,         // [N, F]
                                             const int64_t* offsets,  // [B+1]
                                             T* padded,               // [B, L, F]
                                             bool* mask,              // [B, L]
                                             int64_t* lengths,        // [B]
                                             int64_t batch, int64_t length, int64_t features,
                                             int64_t total_values, int64_t max_length,
                                             bool left_pad, bool truncate_left, T pad_value) {
  const int64_t per_pos = features > 0 ? features : 1;
  if (i < batch) {
    const int64_t n = offsets[i + 1] - offsets[i];
    if (n < 0) return false;
    lengths[i] = window(n, length, max_length, left_pad, truncate_left).kept;
  }
  if (i < batch * length * per_pos) {
    const int64_t f = i % per_pos;
    const int64_t bt = i / per_pos;
    const int64_t t = bt % length;
    const int64_t b = bt / length;
    const int64_t start = offsets[b];
    const int64_t n = offsets[b + 1] - start;
    if (n < 0) return false;
    const Window w = window(n, length, max_length, left_pad, truncate_left);
    const int64_t s = source_index(w, t);
    if (f == 0) mask[bt] = s >= 0;
    if (features > 0) {
      if (s >= 0 && (start < 0 || start + s >= total_values)) return false;
      padded[i] = s >= 0 ? values[(start + s) * features + f] : pad_value;
    }
  }
  return true;
}

// Threads of one packed pad launch.
TF_HOST_DEVICE TF_INLINE int64_t packed_threads(int64_t batch, int64_t length, int64_t features) {
  const int64_t elements = batch * length * (features > 0 ? features : 1);
  return elements > batch ? elements : batch;
}

}  // namespace torchfeed::pad

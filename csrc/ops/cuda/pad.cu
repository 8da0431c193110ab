// CUDA launcher of the fused pad-and-mask op: one kernel launch for a packed batch, on the
// current stream; a thread's whole body is pad::packed_element (ops/pad.h), which the CPU
// tests also run through the emulation op.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/element_bits.h"
#include "ops/pad.h"
#include "ops/pad_args.h"

namespace torchfeed {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void pad_packed_kernel(const T* __restrict__ values, const int64_t* __restrict__ offsets,
                                  T* __restrict__ padded, bool* __restrict__ mask,
                                  int64_t* __restrict__ lengths, int64_t batch, int64_t length,
                                  int64_t features, int64_t total_values, int64_t max_length,
                                  bool left_pad, bool truncate_left, T pad_value) {
  const int64_t total = pad::packed_threads(batch, length, features);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool ok =
        pad::packed_element(i, values, offsets, padded, mask, lengths, batch, length, features,
                            total_values, max_length, left_pad, truncate_left, pad_value);
    CUDA_KERNEL_ASSERT(ok &&
                       "pad_packed: offsets must be non-decreasing and end at values.size(0)");
  }
}

void launch_pad_packed(const at::Tensor& values,   // [N, *feat], contiguous
                       const at::Tensor& offsets,  // [B+1] int64, contiguous, on the device
                       const at::Scalar& pad_value, int64_t max_length, bool left_pad,
                       bool truncate_left, pad::Outputs& out, const char* op) {
  const int64_t batch = offsets.size(0) - 1;
  const int64_t length = out.mask.size(1);
  const int64_t features = pad::row_numel(values);
  const int64_t total = pad::packed_threads(batch, length, features);
  if (total == 0) return;  // no launch for empty work
  const at::Tensor pad_el = pad::pad_element(op, pad_value, values.scalar_type());
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 1 << 16);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(values.device().index()).stream();
  dispatch_element_bits(values.element_size(), op, [&](auto tag) {
    using T = decltype(tag);
    pad_packed_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const T*>(values.data_ptr()), offsets.data_ptr<int64_t>(),
        static_cast<T*>(out.padded.data_ptr()), out.mask.data_ptr<bool>(),
        out.lengths.data_ptr<int64_t>(), batch, length, features, values.size(0), max_length,
        left_pad, truncate_left, load_bits<T>(pad_el.data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pad_packed_cuda(
    const at::Tensor& values,   // [N, *feat]
    const at::Tensor& offsets,  // [B+1] int64
    int64_t length, const at::Scalar& pad_value, bool left_pad, int64_t max_length,
    bool truncate_left) {
  constexpr const char* op = "pad_packed";
  pad::check_packed(op, values, offsets);
  pad::check_options(op, length, max_length);
  // The offsets' values live on the device: checking them here would synchronize. The kernel
  // asserts instead; the Python API validates them on the host, where it knows the lengths.
  c10::cuda::CUDAGuard guard(values.device());
  const at::Tensor v = values.contiguous();
  pad::Outputs out = pad::allocate(v, offsets.size(0) - 1, length);
  launch_pad_packed(v, offsets.contiguous(), pad_value, max_length, left_pad, truncate_left, out,
                    op);
  return {out.padded, out.mask, out.lengths};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pad_list_cuda(at::TensorList sequences,
                                                             int64_t length,
                                                             const at::Scalar& pad_value,
                                                             bool left_pad, int64_t max_length,
                                                             bool truncate_left, int64_t multiple) {
  constexpr const char* op = "pad_list";
  pad::check_sequences(op, sequences);
  length = pad::resolve_length(op, sequences, length, max_length, multiple);
  pad::check_options(op, length, max_length);
  c10::cuda::CUDAGuard guard(sequences[0].device());
  // The lengths are known on the host: build the offsets there, in pinned memory, so the copy
  // to the device is asynchronous; then pack once and run the packed kernel.
  const int64_t batch = static_cast<int64_t>(sequences.size());
  at::Tensor host_offsets =
      at::empty({batch + 1}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* o = host_offsets.data_ptr<int64_t>();
  o[0] = 0;
  for (int64_t b = 0; b < batch; ++b) o[b + 1] = o[b] + sequences[b].size(0);
  const at::Tensor offsets = host_offsets.to(sequences[0].device(), /*non_blocking=*/true);
  const at::Tensor values = at::cat(sequences, 0);
  pad::Outputs out = pad::allocate(values, batch, length);
  launch_pad_packed(values, offsets, pad_value, max_length, left_pad, truncate_left, out, op);
  return {out.padded, out.mask, out.lengths};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CUDA, m) {
  m.impl("pad_packed", &pad_packed_cuda);
  m.impl("pad_list", &pad_list_cuda);
}

}  // namespace torchfeed

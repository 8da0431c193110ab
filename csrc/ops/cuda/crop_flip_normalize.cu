// CUDA launcher of the fused crop/flip/resize/normalize op: two launches for the whole batch on
// the current stream, in the CPU kernel's order: a vertical pass over the uint8 rows into a float
// scratch buffer, then a horizontal pass that normalizes and writes the output. A thread's whole
// body is a TF_HOST_DEVICE function of ops/crop_flip_normalize.h (vertical_element,
// horizontal_element), which the CPU tests also run through the emulation op.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/crop_flip_normalize.h"
#include "ops/crop_flip_normalize_args.h"

namespace torchfeed {
namespace {

using cfn::ChannelAffine;
using cfn::ImageDesc;
using cfn::LaunchShape;

constexpr int kThreads = 256;

struct Affines {
  ChannelAffine c[cfn::kMaxChannels];
};

__global__ void vertical_kernel(const ImageDesc* __restrict__ images,
                                const double* __restrict__ grid, float* __restrict__ scratch,
                                LaunchShape p) {
  const int64_t total = p.batch * p.channels * p.out_h * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool inside = cfn::vertical_element(i, images, grid, scratch, p);
    CUDA_KERNEL_ASSERT(inside && "crop_flip_normalize: grid reaches outside the image");
  }
}

template <typename OutT>
__global__ void horizontal_kernel(const double* __restrict__ grid, const bool* __restrict__ flips,
                                  const float* __restrict__ scratch, OutT* __restrict__ out,
                                  Affines affines, LaunchShape p) {
  const int64_t total = p.batch * p.channels * p.out_h * p.out_w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offset;
    const float v = cfn::horizontal_element(i, grid, flips, scratch, affines.c, p, &offset);
    out[offset] = static_cast<OutT>(v);
  }
}

int64_t blocks_for(int64_t total) {
  return std::min<int64_t>((total + kThreads - 1) / kThreads, 1 << 20);
}

void run(const std::vector<ImageDesc>& descs, const at::Tensor& grid, const at::Tensor& flips,
         int64_t interpolation, bool antialias, at::ArrayRef<double> mean, at::ArrayRef<double> std,
         at::Tensor& out) {
  const int64_t batch = static_cast<int64_t>(descs.size());
  if (out.numel() == 0) return;  // no launch for empty work
  c10::cuda::CUDAGuard guard(out.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();

  // Image descriptors travel in one asynchronous copy from pinned memory. The grid values live
  // on the device and are not read here (that would synchronize); the Python API validates
  // them on the host, and the kernels assert that every tap stays inside its image.
  static_assert(sizeof(ImageDesc) == 6 * sizeof(int64_t), "ImageDesc layout");
  at::Tensor host = at::empty({batch, 6}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::memcpy(host.data_ptr(), descs.data(), batch * sizeof(ImageDesc));
  const at::Tensor device_descs = host.to(out.device(), /*non_blocking=*/true);

  const LaunchShape p = cfn::launch_shape(descs, out, interpolation, antialias);
  Affines affines{};
  const std::vector<ChannelAffine> a = cfn::channel_affine(mean, std);
  std::copy(a.begin(), a.end(), affines.c);

  const at::Tensor g = grid.contiguous();
  const at::Tensor f = flips.contiguous();
  at::Tensor scratch =
      at::empty({batch, p.channels, p.out_h, p.cols}, out.options().dtype(at::kFloat));
  vertical_kernel<<<blocks_for(scratch.numel()), kThreads, 0, stream>>>(
      reinterpret_cast<const ImageDesc*>(device_descs.data_ptr<int64_t>()), g.data_ptr<double>(),
      scratch.data_ptr<float>(), p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, out.scalar_type(), "crop_flip_normalize", [&] {
        horizontal_kernel<scalar_t><<<blocks_for(out.numel()), kThreads, 0, stream>>>(
            g.data_ptr<double>(), f.data_ptr<bool>(), scratch.data_ptr<float>(),
            out.data_ptr<scalar_t>(), affines, p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void crop_flip_normalize_out_cuda(const at::Tensor& images,  // [B, C, H, W] uint8, any strides
                                  const at::Tensor& grid,    // [B, 10] float64
                                  const at::Tensor& flips,   // [B] bool
                                  int64_t interpolation, bool antialias, at::ArrayRef<double> mean,
                                  at::ArrayRef<double> std,
                                  at::Tensor& out) {  // [B, C, H_out, W_out] float
  constexpr const char* op = "crop_flip_normalize";
  const std::vector<cfn::ImageDesc> descs =
      cfn::checked_dense(op, images, {grid, flips, interpolation, mean, std, out});
  run(descs, grid, flips, interpolation, antialias, mean, std, out);
}

void crop_flip_normalize_list_out_cuda(at::TensorList images,  // B x [C, H_i, W_i] uint8
                                       const at::Tensor& grid, const at::Tensor& flips,
                                       int64_t interpolation, bool antialias,
                                       at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                       at::Tensor& out) {
  constexpr const char* op = "crop_flip_normalize_list";
  const std::vector<cfn::ImageDesc> descs =
      cfn::checked_list(op, images, {grid, flips, interpolation, mean, std, out});
  run(descs, grid, flips, interpolation, antialias, mean, std, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CUDA, m) {
  m.impl("crop_flip_normalize_out", &crop_flip_normalize_out_cuda);
  m.impl("crop_flip_normalize_list_out", &crop_flip_normalize_list_out_cuda);
}

}  // namespace torchfeed

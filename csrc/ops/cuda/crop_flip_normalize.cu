// CUDA launcher of the fused crop/flip/resize/normalize op. The host checks every argument and
// every geometry value (ops/crop_flip_normalize_args.h), then sends the batch's image
// descriptors, geometry and flips to the device in ONE asynchronous copy from page-locked memory
// and launches, on the current stream, nothing that synchronizes:
//  - the one-pass kernel (a thread block per output tile, its intermediate in shared memory;
//    ops/crop_flip_normalize.h: tile_taps, tile_vertical, tile_output), whenever a tile of the
//    batch's most extreme scale fits in shared memory, which is every realistic case;
//  - otherwise the two-pass kernel (a vertical pass into a global scratch buffer, then the
//    horizontal one: vertical_element, horizontal_element), which has no size limit.
// Both compute the same sums in the same order as the CPU kernel; the CPU tests run both bodies
// through the emulation op (testing/cuda_emulation.cpp).
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
#include "ops/crop_flip_normalize_tiles.h"

namespace torchfeed {
namespace {

using cfn::ChannelAffine;
using cfn::ImageDesc;
using cfn::LaunchShape;
using cfn::TilePlan;

constexpr int kThreads = 256;

struct Affines {
  ChannelAffine c[cfn::kMaxChannels];
};

template <typename OutT>
__global__ void __launch_bounds__(kThreads)
    one_pass_kernel(const ImageDesc* __restrict__ images, const double* __restrict__ grid,
                    const bool* __restrict__ flips, OutT* __restrict__ out, Affines affines,
                    LaunchShape p, TilePlan tp) {
  extern __shared__ __align__(16) unsigned char smem[];
  const cfn::TileTables tt = cfn::tile_tables(smem, cfn::tile_layout(tp, p.channels));
  const int64_t b = blockIdx.z;
  const int64_t y0 = static_cast<int64_t>(blockIdx.y) * tp.rows;
  const int64_t x0 = static_cast<int64_t>(blockIdx.x) * tp.cols;
  const double* geom = grid + b * cfn::kGeomPerImage;
  const cfn::AxisPlan py = cfn::plan_axis(cfn::load_axis(geom));
  const cfn::AxisPlan px = cfn::plan_axis(cfn::load_axis(geom + cfn::kGeomFields));
  const bool flip = flips[b];
  for (int64_t t = threadIdx.x; t < tp.rows + tp.cols; t += blockDim.x) {
    cfn::tile_taps(t, y0, x0, py, px, flip, p, tp, tt);
  }
  __syncthreads();
  int64_t x_lo, x_hi;
  cfn::tile_window(tt, std::min<int64_t>(tp.cols, p.out_w - x0), flip, &x_lo, &x_hi);
  const ImageDesc im = images[b];
  const int64_t nv = tp.rows * tp.span * p.channels;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const bool inside = cfn::tile_vertical(i, im, py, px, x_lo, x_hi, p, tp, tt);
    CUDA_KERNEL_ASSERT(inside && "crop_flip_normalize: a tap outside the image or the tile");
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < tp.rows * tp.cols; i += blockDim.x) {
    cfn::tile_output(i, b, y0, x0, x_lo, affines.c, p, tp, tt,
                     [out](int64_t offset, float v) { out[offset] = static_cast<OutT>(v); });
  }
}

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

void run(const char* op, const std::vector<ImageDesc>& descs, const at::Tensor& grid,
         const at::Tensor& flips, int64_t interpolation, bool antialias, at::ArrayRef<double> mean,
         at::ArrayRef<double> std, at::Tensor& out) {
  const int64_t batch = static_cast<int64_t>(descs.size());
  const at::Tensor g = grid.contiguous();
  const at::Tensor f = flips.contiguous();
  cfn::check_grid_values(op, g.data_ptr<double>(), batch, descs, out.size(2), out.size(3));
  if (out.numel() == 0) return;  // no launch for empty work
  c10::cuda::CUDAGuard guard(out.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();

  // Descriptors, geometry and flips in one page-locked buffer, one asynchronous copy (the
  // caching host allocator keeps the buffer until the copy has finished).
  static_assert(sizeof(ImageDesc) == 6 * sizeof(int64_t), "ImageDesc layout");
  const int64_t desc_bytes = batch * static_cast<int64_t>(sizeof(ImageDesc));
  const int64_t grid_bytes = batch * cfn::kGeomPerImage * static_cast<int64_t>(sizeof(double));
  at::Tensor host = at::empty({desc_bytes + grid_bytes + batch},
                              at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  uint8_t* h = host.data_ptr<uint8_t>();
  std::memcpy(h, descs.data(), desc_bytes);
  std::memcpy(h + desc_bytes, g.data_ptr<double>(), grid_bytes);
  std::memcpy(h + desc_bytes + grid_bytes, f.data_ptr<bool>(), batch);
  const at::Tensor dev = host.to(out.device(), /*non_blocking=*/true);
  const uint8_t* d = dev.data_ptr<uint8_t>();
  const auto* d_descs = reinterpret_cast<const ImageDesc*>(d);
  const auto* d_grid = reinterpret_cast<const double*>(d + desc_bytes);
  const auto* d_flips = reinterpret_cast<const bool*>(d + desc_bytes + grid_bytes);

  const LaunchShape p = cfn::launch_shape(descs, out, interpolation, antialias);
  Affines affines{};
  const std::vector<ChannelAffine> a = cfn::channel_affine(mean, std);
  std::copy(a.begin(), a.end(), affines.c);

  int max_smem = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        out.device().index()));
  TilePlan tp{};
  if (cfn::plan_tiles(g.data_ptr<double>(), batch, p, std::min(max_smem, 96 * 1024), &tp)) {
    const int64_t smem = cfn::tile_layout(tp, p.channels).bytes;
    const dim3 blocks(static_cast<unsigned>((p.out_w + tp.cols - 1) / tp.cols),
                      static_cast<unsigned>((p.out_h + tp.rows - 1) / tp.rows),
                      static_cast<unsigned>(batch));
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, out.scalar_type(), "crop_flip_normalize", [&] {
          auto kernel = one_pass_kernel<scalar_t>;
          if (smem > 48 * 1024) {
            C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem)));
          }
          kernel<<<blocks, kThreads, smem, stream>>>(d_descs, d_grid, d_flips,
                                                     out.data_ptr<scalar_t>(), affines, p, tp);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
    return;
  }
  at::Tensor scratch =
      at::empty({batch, p.channels, p.out_h, p.cols}, out.options().dtype(at::kFloat));
  vertical_kernel<<<blocks_for(scratch.numel()), kThreads, 0, stream>>>(
      d_descs, d_grid, scratch.data_ptr<float>(), p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, out.scalar_type(), "crop_flip_normalize", [&] {
        horizontal_kernel<scalar_t><<<blocks_for(out.numel()), kThreads, 0, stream>>>(
            d_grid, d_flips, scratch.data_ptr<float>(), out.data_ptr<scalar_t>(), affines, p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void crop_flip_normalize_out_cuda(const at::Tensor& images,  // [B, C, H, W] uint8, any strides
                                  const at::Tensor& grid,    // [B, 10] float64, host
                                  const at::Tensor& flips,   // [B] bool, host
                                  int64_t interpolation, bool antialias, at::ArrayRef<double> mean,
                                  at::ArrayRef<double> std,
                                  at::Tensor& out) {  // [B, C, H_out, W_out] float
  constexpr const char* op = "crop_flip_normalize";
  const std::vector<ImageDesc> descs =
      cfn::checked_dense(op, images, {grid, flips, interpolation, mean, std, out});
  run(op, descs, grid, flips, interpolation, antialias, mean, std, out);
}

void crop_flip_normalize_list_out_cuda(at::TensorList images,  // B x [C, H_i, W_i] uint8
                                       const at::Tensor& grid, const at::Tensor& flips,
                                       int64_t interpolation, bool antialias,
                                       at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                       at::Tensor& out, bool images_hwc) {
  constexpr const char* op = "crop_flip_normalize_list";
  const std::vector<ImageDesc> descs =
      cfn::checked_list(op, images, images_hwc, {grid, flips, interpolation, mean, std, out});
  run(op, descs, grid, flips, interpolation, antialias, mean, std, out);
}

void crop_flip_normalize_packed_out_cuda(const at::Tensor& data,    // [N] uint8
                                         const at::Tensor& shapes,  // [B, 4] int64, host
                                         const at::Tensor& grid, const at::Tensor& flips,
                                         int64_t interpolation, bool antialias,
                                         at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                         at::Tensor& out, bool images_hwc) {
  constexpr const char* op = "crop_flip_normalize_packed";
  const std::vector<ImageDesc> descs = cfn::checked_packed(
      op, data, shapes, images_hwc, {grid, flips, interpolation, mean, std, out});
  run(op, descs, grid, flips, interpolation, antialias, mean, std, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CUDA, m) {
  m.impl("crop_flip_normalize_out", &crop_flip_normalize_out_cuda);
  m.impl("crop_flip_normalize_list_out", &crop_flip_normalize_list_out_cuda);
  m.impl("crop_flip_normalize_packed_out", &crop_flip_normalize_packed_out_cuda);
}

}  // namespace torchfeed

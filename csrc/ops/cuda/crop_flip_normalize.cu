// CUDA launcher of the fused crop/flip/resize/normalize op: two launches for the whole batch on
// the current stream, a horizontal pass into a float scratch buffer and a vertical pass that
// normalizes and writes the output. Each thread computes its taps with the same functions the
// CPU kernel builds its weight tables from (ops/crop_flip_normalize.h).
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

using cfn::AxisPlan;
using cfn::ChannelAffine;
using cfn::ImageDesc;

constexpr int kThreads = 256;

struct Affines {
  ChannelAffine c[cfn::kMaxChannels];
};

struct Params {
  int64_t batch, channels, rows, out_h, out_w;  // rows: scratch rows per image plane
  int64_t mode;
  bool antialias;
  int64_t osb, osc, osh, osw;
};

// Scratch [B, C, rows, W_out]: row r of image b holds the horizontally resampled source row
// base_y + row_lo + r, where [row_lo, row_hi) are the rows the vertical taps read.
__global__ void horizontal_kernel(const ImageDesc* __restrict__ images,
                                  const double* __restrict__ grid, const bool* __restrict__ flips,
                                  float* __restrict__ scratch, Params p) {
  const int64_t total = p.batch * p.channels * p.rows * p.out_w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = i % p.out_w;
    int64_t rest = i / p.out_w;
    const int64_t r = rest % p.rows;
    rest /= p.rows;
    const int64_t c = rest % p.channels;
    const int64_t b = rest / p.channels;
    const double* geom = grid + b * cfn::kGeomPerImage;
    const AxisPlan py = cfn::plan_axis(cfn::load_axis(geom));
    int64_t row_lo, row_hi;
    cfn::tap_bounds(py, p.out_h, p.mode, p.antialias, &row_lo, &row_hi);
    if (row_lo + r >= row_hi) continue;
    const AxisPlan px = cfn::plan_axis(cfn::load_axis(geom + cfn::kGeomFields));
    const cfn::TapSpan s =
        cfn::tap_span(px, cfn::flip_index(x, p.out_w, flips[b]), p.mode, p.antialias);
    const ImageDesc im = images[b];
    const int64_t y = py.base + row_lo + r;
    CUDA_KERNEL_ASSERT(y >= 0 && y < im.height && "crop_flip_normalize: grid outside the image");
    CUDA_KERNEL_ASSERT(px.base + s.first >= 0 && px.base + s.first + s.count <= im.width &&
                       "crop_flip_normalize: grid outside the image");
    const uint8_t* row = im.data + c * im.stride_c + y * im.stride_h +
                         (px.base + s.first) * im.stride_w;
    float acc = 0.0f;
    for (int64_t j = 0; j < s.count; ++j) {
      acc += cfn::normalized_weight(s, j) * static_cast<float>(row[j * im.stride_w]);
    }
    scratch[i] = acc;
  }
}

template <typename OutT>
__global__ void vertical_kernel(const double* __restrict__ grid,
                                const float* __restrict__ scratch, OutT* __restrict__ out,
                                Affines affines, Params p) {
  const int64_t total = p.batch * p.channels * p.out_h * p.out_w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = i % p.out_w;
    int64_t rest = i / p.out_w;
    const int64_t y = rest % p.out_h;
    rest /= p.out_h;
    const int64_t c = rest % p.channels;
    const int64_t b = rest / p.channels;
    const AxisPlan py = cfn::plan_axis(cfn::load_axis(grid + b * cfn::kGeomPerImage));
    const cfn::TapSpan first_row = cfn::tap_span(py, 0, p.mode, p.antialias);
    const cfn::TapSpan s = cfn::tap_span(py, y, p.mode, p.antialias);
    const float* plane = scratch + (b * p.channels + c) * p.rows * p.out_w;
    const float* col = plane + (s.first - first_row.first) * p.out_w + x;
    float acc = 0.0f;
    for (int64_t j = 0; j < s.count; ++j) {
      acc += cfn::normalized_weight(s, j) * col[j * p.out_w];
    }
    out[b * p.osb + c * p.osc + y * p.osh + x * p.osw] =
        static_cast<OutT>(cfn::finish(acc, affines.c[c]));
  }
}

int64_t blocks_for(int64_t total) {
  return std::min<int64_t>((total + kThreads - 1) / kThreads, 1 << 20);
}

void run(const char* op, const std::vector<ImageDesc>& descs, int64_t channels,
         const at::Tensor& grid, const at::Tensor& flips, int64_t interpolation, bool antialias,
         at::ArrayRef<double> mean, at::ArrayRef<double> std, at::Tensor& out) {
  const int64_t batch = static_cast<int64_t>(descs.size());
  if (out.numel() == 0) return;
  c10::cuda::CUDAGuard guard(out.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();

  // Image descriptors travel in one asynchronous copy from pinned memory. The grid values live
  // on the device and are not read here (that would synchronize); the Python API validates
  // them on the host, and the kernels assert that every tap stays inside its image.
  static_assert(sizeof(ImageDesc) == 6 * sizeof(int64_t), "ImageDesc layout");
  at::Tensor host = at::empty({batch, 6}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::memcpy(host.data_ptr(), descs.data(), batch * sizeof(ImageDesc));
  const at::Tensor device_descs = host.to(out.device(), /*non_blocking=*/true);

  int64_t max_height = 0;
  for (const ImageDesc& d : descs) max_height = std::max(max_height, d.height);
  Params p{batch, channels, max_height, out.size(2), out.size(3), interpolation, antialias,
           out.stride(0), out.stride(1), out.stride(2), out.stride(3)};
  Affines affines{};
  const std::vector<ChannelAffine> a = cfn::channel_affine(mean, std);
  std::copy(a.begin(), a.end(), affines.c);

  const at::Tensor g = grid.contiguous();
  const at::Tensor f = flips.contiguous();
  at::Tensor scratch = at::empty({batch, channels, p.rows, p.out_w},
                                 out.options().dtype(at::kFloat));
  const int64_t h_total = scratch.numel();
  horizontal_kernel<<<blocks_for(h_total), kThreads, 0, stream>>>(
      reinterpret_cast<const ImageDesc*>(device_descs.data_ptr<int64_t>()), g.data_ptr<double>(),
      f.data_ptr<bool>(), scratch.data_ptr<float>(), p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "crop_flip_normalize", [&] {
    vertical_kernel<scalar_t><<<blocks_for(out.numel()), kThreads, 0, stream>>>(
        g.data_ptr<double>(), scratch.data_ptr<float>(), out.data_ptr<scalar_t>(), affines, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void crop_flip_normalize_out_cuda(const at::Tensor& images,  // [B, C, H, W] uint8, any strides
                                  const at::Tensor& grid,    // [B, 10] float64
                                  const at::Tensor& flips,   // [B] bool
                                  int64_t interpolation, bool antialias,
                                  at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                  at::Tensor& out) {  // [B, C, H_out, W_out] float
  constexpr const char* op = "crop_flip_normalize";
  const std::vector<ImageDesc> descs = cfn::describe_dense(op, images);
  cfn::check_common(op, images.size(0), images.size(1), images.device(), grid, flips,
                    interpolation, mean, std, out);
  run(op, descs, images.size(1), grid, flips, interpolation, antialias, mean, std, out);
}

void crop_flip_normalize_list_out_cuda(at::TensorList images,  // B x [C, H_i, W_i] uint8
                                       const at::Tensor& grid, const at::Tensor& flips,
                                       int64_t interpolation, bool antialias,
                                       at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                       at::Tensor& out) {
  constexpr const char* op = "crop_flip_normalize_list";
  TORCH_CHECK_VALUE(!images.empty(), op, ": images must hold at least one image, got none");
  const std::vector<ImageDesc> descs = cfn::describe_list(op, images);
  cfn::check_common(op, static_cast<int64_t>(images.size()), images[0].size(0),
                    images[0].device(), grid, flips, interpolation, mean, std, out);
  run(op, descs, images[0].size(0), grid, flips, interpolation, antialias, mean, std, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CUDA, m) {
  m.impl("crop_flip_normalize_out", &crop_flip_normalize_out_cuda);
  m.impl("crop_flip_normalize_list_out", &crop_flip_normalize_list_out_cuda);
}

}  // namespace torchfeed

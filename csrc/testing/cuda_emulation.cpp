// Test hooks: the CUDA kernels' thread bodies (TF_HOST_DEVICE functions of ops/pad.h and
// ops/crop_flip_normalize.h) run one thread at a time on the CPU, with the CUDA launchers'
// launch shapes and buffers. A machine without a GPU thereby tests the CUDA kernels' indexing
// and arithmetic, not only the shared weight math; what it cannot test (launch configuration,
// streams, memory transfers) scripts/gpu_check.sh runs on a GPU.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "common/element_bits.h"
#include "ops/crop_flip_normalize.h"
#include "ops/crop_flip_normalize_args.h"
#include "ops/crop_flip_normalize_tiles.h"
#include "ops/pad.h"
#include "ops/pad_args.h"

namespace torchfeed {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> emulate_pad_packed(
    const at::Tensor& values, const at::Tensor& offsets, int64_t length,
    const at::Scalar& pad_value, bool left_pad, int64_t max_length, bool truncate_left) {
  constexpr const char* op = "emulate_cuda_pad_packed";
  pad::check_packed(op, values, offsets);
  pad::check_options(op, length, max_length);
  const at::Tensor v = values.contiguous();
  const at::Tensor o = offsets.contiguous();
  const int64_t batch = o.size(0) - 1;
  pad::Outputs out = pad::allocate(v, batch, length);
  const int64_t features = pad::row_numel(v);
  const at::Tensor pad_el = pad::pad_element(op, pad_value, v.scalar_type());
  dispatch_element_bits(v.element_size(), op, [&](auto tag) {
    using T = decltype(tag);
    const T pad_bits = load_bits<T>(pad_el.data_ptr());
    const int64_t total = pad::packed_threads(batch, length, features);
    for (int64_t i = 0; i < total; ++i) {
      const bool ok =
          pad::packed_element(i, static_cast<const T*>(v.data_ptr()), o.data_ptr<int64_t>(),
                              static_cast<T*>(out.padded.data_ptr()), out.mask.data_ptr<bool>(),
                              out.lengths.data_ptr<int64_t>(), batch, length, features, v.size(0),
                              max_length, left_pad, truncate_left, pad_bits);
      TORCH_CHECK_VALUE(ok, op, ": thread ", i, " found inconsistent offsets");
    }
  });
  return {out.padded, out.mask, out.lengths};
}

// The two-pass kernel's threads, one at a time.
template <typename scalar_t>
void emulate_two_pass(const std::vector<cfn::ImageDesc>& descs, const double* grid,
                      const bool* flips, const std::vector<cfn::ChannelAffine>& affine,
                      const cfn::LaunchShape& p, scalar_t* o, const char* op) {
  // NaN-filled, so a scratch element the horizontal pass reads but no thread wrote shows up.
  std::vector<float> scratch(p.batch * p.channels * p.out_h * p.cols,
                             std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < static_cast<int64_t>(scratch.size()); ++i) {
    TORCH_CHECK_VALUE(cfn::vertical_element(i, descs.data(), grid, scratch.data(), p), op,
                      ": vertical thread ", i, " reads outside its image");
  }
  const int64_t total = p.batch * p.channels * p.out_h * p.out_w;
  for (int64_t i = 0; i < total; ++i) {
    int64_t offset;
    const float v =
        cfn::horizontal_element(i, grid, flips, scratch.data(), affine.data(), p, &offset);
    o[offset] = static_cast<scalar_t>(v);
  }
}

// The one-pass kernel's blocks, one at a time, each thread's steps in the kernel's order with
// the kernel's barriers between them; shared memory is NaN-filled, so a value read but never
// written shows up.
template <typename scalar_t>
void emulate_one_pass(const std::vector<cfn::ImageDesc>& descs, const double* grid,
                      const bool* flips, const std::vector<cfn::ChannelAffine>& affine,
                      const cfn::LaunchShape& p, const cfn::TilePlan& tp, scalar_t* o,
                      const char* op) {
  const cfn::TileLayout layout = cfn::tile_layout(tp, p.channels);
  std::vector<float> smem(layout.bytes / 4 + 1);
  const cfn::TileTables tt =
      cfn::tile_tables(reinterpret_cast<unsigned char*>(smem.data()), layout);
  const int64_t tiles_y = (p.out_h + tp.rows - 1) / tp.rows;
  const int64_t tiles_x = (p.out_w + tp.cols - 1) / tp.cols;
  for (int64_t b = 0; b < p.batch; ++b) {
    const double* geom = grid + b * cfn::kGeomPerImage;
    const cfn::AxisPlan py = cfn::plan_axis(cfn::load_axis(geom));
    const cfn::AxisPlan px = cfn::plan_axis(cfn::load_axis(geom + cfn::kGeomFields));
    for (int64_t by = 0; by < tiles_y; ++by) {
      for (int64_t bx = 0; bx < tiles_x; ++bx) {
        std::fill(smem.begin(), smem.end(), std::numeric_limits<float>::quiet_NaN());
        const int64_t y0 = by * tp.rows, x0 = bx * tp.cols;
        for (int64_t t = 0; t < tp.rows + tp.cols; ++t) {
          cfn::tile_taps(t, y0, x0, py, px, flips[b], p, tp, tt);
        }
        int64_t x_lo, x_hi;
        cfn::tile_window(tt, std::min<int64_t>(tp.cols, p.out_w - x0), flips[b], &x_lo, &x_hi);
        for (int64_t i = 0; i < tp.rows * tp.span * p.channels; ++i) {
          TORCH_CHECK_VALUE(cfn::tile_vertical(i, descs[b], py, px, x_lo, x_hi, p, tp, tt), op,
                            ": block (", bx, ", ", by, ", ", b, ") thread ", i,
                            " reads outside its image or its tile (span ", tp.span, ", window ",
                            x_hi - x_lo, ")");
        }
        for (int64_t i = 0; i < tp.rows * tp.cols; ++i) {
          cfn::tile_output(i, b, y0, x0, x_lo, affine.data(), p, tp, tt,
                           [o](int64_t offset, float v) { o[offset] = static_cast<scalar_t>(v); });
        }
      }
    }
  }
}

// kernel: 0 the one the CUDA launcher would pick for smem_budget, 1 the one-pass kernel (an
// error if no tile fits), 2 the two-pass kernel. Returns the one that ran (1 or 2).
int64_t emulate_crop_flip_normalize_list_out(at::TensorList images, const at::Tensor& grid,
                                             const at::Tensor& flips, int64_t interpolation,
                                             bool antialias, at::ArrayRef<double> mean,
                                             at::ArrayRef<double> std, at::Tensor& out,
                                             int64_t kernel, int64_t smem_budget) {
  constexpr const char* op = "emulate_cuda_crop_flip_normalize_list";
  const std::vector<cfn::ImageDesc> descs =
      cfn::checked_list(op, images, false, {grid, flips, interpolation, mean, std, out});
  const at::Tensor g = grid.contiguous();
  const at::Tensor f = flips.contiguous();
  cfn::check_grid_values(op, g.data_ptr<double>(), static_cast<int64_t>(descs.size()), descs,
                         out.size(2), out.size(3));
  if (out.numel() == 0) return 0;
  const cfn::LaunchShape p = cfn::launch_shape(descs, out, interpolation, antialias);
  const std::vector<cfn::ChannelAffine> affine = cfn::channel_affine(mean, std);
  cfn::TilePlan tp{};
  const bool tiles =
      kernel != 2 && cfn::plan_tiles(g.data_ptr<double>(), p.batch, p, smem_budget, &tp);
  TORCH_CHECK_VALUE(tiles || kernel != 1, op, ": no tile of the one-pass kernel fits in ",
                    smem_budget, " bytes for this batch");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "emulate", [&] {
    if (tiles) {
      emulate_one_pass(descs, g.data_ptr<double>(), f.data_ptr<bool>(), affine, p, tp,
                       out.data_ptr<scalar_t>(), op);
    } else {
      emulate_two_pass(descs, g.data_ptr<double>(), f.data_ptr<bool>(), affine, p,
                       out.data_ptr<scalar_t>(), op);
    }
  });
  return tiles ? 1 : 2;
}

}  // namespace

// Test hooks only, in a namespace of their own: torch.ops.torchfeed holds the public ops alone.
TORCH_LIBRARY(torchfeed_testing, m) {
  // pad_packed with the CUDA kernel's thread body (ops/pad.h: packed_element), one thread at a
  // time on the CPU.
  m.def(
      "emulate_cuda_pad_packed(Tensor values, Tensor offsets, SymInt length, Scalar pad_value=0, "
      "bool left_pad=False, int max_length=-1, bool truncate_left=False) "
      "-> (Tensor padded, Tensor mask, Tensor lengths)");
  // crop_flip_normalize_list_out with the CUDA kernels' thread bodies (ops/crop_flip_normalize.h):
  // the one-pass kernel's blocks, or the two-pass kernel's threads.
  m.def(
      "emulate_cuda_crop_flip_normalize_list_out(Tensor[] images, Tensor grid, Tensor flips, "
      "int interpolation, bool antialias, float[] mean, float[] std, Tensor(a!) out, "
      "int kernel=0, int smem_budget=98304) -> int");
}

TORCH_LIBRARY_IMPL(torchfeed_testing, CPU, m) {
  m.impl("emulate_cuda_pad_packed", &emulate_pad_packed);
  m.impl("emulate_cuda_crop_flip_normalize_list_out", &emulate_crop_flip_normalize_list_out);
}

}  // namespace torchfeed

// Test hooks: the CUDA kernels' thread bodies (TF_HOST_DEVICE functions of ops/pad.h and
// ops/crop_flip_normalize.h) run one thread at a time on the CPU, with the CUDA launchers'
// launch shapes and buffers. A machine without a GPU thereby tests the CUDA kernels' indexing
// and arithmetic, not only the shared weight math; what it cannot test (launch configuration,
// streams, memory transfers) scripts/gpu_check.sh runs on a GPU.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "common/element_bits.h"
#include "ops/crop_flip_normalize.h"
#include "ops/crop_flip_normalize_args.h"
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

void emulate_crop_flip_normalize_list_out(at::TensorList images, const at::Tensor& grid,
                                          const at::Tensor& flips, int64_t interpolation,
                                          bool antialias, at::ArrayRef<double> mean,
                                          at::ArrayRef<double> std, at::Tensor& out) {
  constexpr const char* op = "emulate_cuda_crop_flip_normalize_list";
  const std::vector<cfn::ImageDesc> descs =
      cfn::checked_list(op, images, {grid, flips, interpolation, mean, std, out});
  if (out.numel() == 0) return;
  const cfn::LaunchShape p = cfn::launch_shape(descs, out, interpolation, antialias);
  const std::vector<cfn::ChannelAffine> affine = cfn::channel_affine(mean, std);
  const at::Tensor g = grid.contiguous();
  const at::Tensor f = flips.contiguous();
  // NaN-filled, so a scratch element the horizontal pass reads but no thread wrote shows up.
  std::vector<float> scratch(p.batch * p.channels * p.out_h * p.cols,
                             std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < static_cast<int64_t>(scratch.size()); ++i) {
    TORCH_CHECK_VALUE(
        cfn::vertical_element(i, descs.data(), g.data_ptr<double>(), scratch.data(), p), op,
        ": vertical thread ", i, " reads outside its image");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "emulate", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    const int64_t total = p.batch * p.channels * p.out_h * p.out_w;
    for (int64_t i = 0; i < total; ++i) {
      int64_t offset;
      const float v = cfn::horizontal_element(i, g.data_ptr<double>(), f.data_ptr<bool>(),
                                              scratch.data(), affine.data(), p, &offset);
      o[offset] = static_cast<scalar_t>(v);
    }
  });
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
  // crop_flip_normalize_list_out with the CUDA kernel's thread bodies (ops/crop_flip_normalize.h).
  m.def(
      "emulate_cuda_crop_flip_normalize_list_out(Tensor[] images, Tensor grid, Tensor flips, "
      "int interpolation, bool antialias, float[] mean, float[] std, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(torchfeed_testing, CPU, m) {
  m.impl("emulate_cuda_pad_packed", &emulate_pad_packed);
  m.impl("emulate_cuda_crop_flip_normalize_list_out", &emulate_crop_flip_normalize_list_out);
}

}  // namespace torchfeed

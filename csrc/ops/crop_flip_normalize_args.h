// Host-side argument checks and image descriptors of the crop/flip/normalize ops, shared by the
// CPU and CUDA backends.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/crop_flip_normalize.h"

namespace torchfeed::cfn {

inline void check_image(const char* op, const char* name, const at::Tensor& image) {
  TORCH_CHECK_TYPE(image.scalar_type() == at::kByte, op, ": ", name, " must be uint8, got ",
                   image.scalar_type());
}

inline void check_common(const char* op, int64_t batch, int64_t channels, const at::Device& device,
                         const at::Tensor& grid, const at::Tensor& flips, int64_t interpolation,
                         at::ArrayRef<double> mean, at::ArrayRef<double> std,
                         const at::Tensor& out) {
  TORCH_CHECK_VALUE(channels >= 1 && channels <= kMaxChannels, op,
                    ": images must have 1 to 4 channels, got ", channels);
  TORCH_CHECK_VALUE(interpolation == kNearest || interpolation == kBilinear, op,
                    ": interpolation must be 0 (nearest) or 1 (bilinear), got ", interpolation);
  TORCH_CHECK_TYPE(grid.scalar_type() == at::kDouble, op, ": grid must be float64, got ",
                   grid.scalar_type());
  TORCH_CHECK_VALUE(grid.dim() == 2 && grid.size(0) == batch && grid.size(1) == kGeomPerImage, op,
                    ": grid must have shape [", batch, ", ", kGeomPerImage, "], got ",
                    grid.sizes());
  TORCH_CHECK_TYPE(flips.scalar_type() == at::kBool, op, ": flips must be bool, got ",
                   flips.scalar_type());
  TORCH_CHECK_VALUE(flips.dim() == 1 && flips.size(0) == batch, op, ": flips must have shape [",
                    batch, "], got ", flips.sizes());
  TORCH_CHECK_VALUE(grid.device() == device && flips.device() == device, op,
                    ": grid and flips must be on the images' device ", device, ", got ",
                    grid.device(), " and ", flips.device());
  TORCH_CHECK_VALUE(
      static_cast<int64_t>(mean.size()) == channels && static_cast<int64_t>(std.size()) == channels,
      op, ": mean and std must have one value per channel (", channels, "), got ", mean.size(),
      " and ", std.size());
  for (size_t c = 0; c < std.size(); ++c) {
    TORCH_CHECK_VALUE(std[c] != 0.0, op, ": std[", c, "] is 0");
  }
  const auto dtype = out.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
                   ": out must be float32, float16 or bfloat16, got ", dtype);
  TORCH_CHECK_VALUE(out.dim() == 4 && out.size(0) == batch && out.size(1) == channels, op,
                    ": out must have shape [", batch, ", ", channels, ", H_out, W_out], got ",
                    out.sizes());
  TORCH_CHECK_VALUE(out.device() == device, op, ": out must be on the images' device ", device,
                    ", got ", out.device());
  TORCH_CHECK_VALUE(out.numel() == 0 || out.is_non_overlapping_and_dense(), op,
                    ": out must be a dense tensor without overlapping elements (NCHW or "
                    "channels_last)");
}

inline std::vector<ChannelAffine> channel_affine(at::ArrayRef<double> mean,
                                                 at::ArrayRef<double> std) {
  std::vector<ChannelAffine> a(mean.size());
  for (size_t c = 0; c < mean.size(); ++c) {
    a[c].scale = static_cast<float>(1.0 / (255.0 * std[c]));
    a[c].bias = static_cast<float>(-mean[c] / std[c]);
  }
  return a;
}

// The arguments the ops take besides the images, checked by checked_dense/checked_list.
struct OpArgs {
  const at::Tensor& grid;
  const at::Tensor& flips;
  int64_t interpolation;
  at::ArrayRef<double> mean, std;
  const at::Tensor& out;
};

// Descriptors of a dense batch [B, C, H, W].
inline std::vector<ImageDesc> describe_dense(const char* op, const at::Tensor& images) {
  check_image(op, "images", images);
  TORCH_CHECK_VALUE(images.dim() == 4, op, ": images must be [B, C, H, W], got ", images.sizes());
  std::vector<ImageDesc> d(images.size(0));
  const uint8_t* base = images.data_ptr<uint8_t>();
  for (int64_t b = 0; b < images.size(0); ++b) {
    d[b] = ImageDesc{base + b * images.stride(0),
                     images.size(2),
                     images.size(3),
                     images.stride(1),
                     images.stride(2),
                     images.stride(3)};
  }
  return d;
}

// Descriptors of a list of images [C, H_i, W_i] of one channel count on one device.
inline std::vector<ImageDesc> describe_list(const char* op, at::TensorList images) {
  TORCH_CHECK_VALUE(!images.empty(), op, ": images must hold at least one image, got none");
  std::vector<ImageDesc> d(images.size());
  for (size_t b = 0; b < images.size(); ++b) {
    const at::Tensor& im = images[b];
    TORCH_CHECK_TYPE(im.scalar_type() == at::kByte, op, ": images[", b, "] must be uint8, got ",
                     im.scalar_type());
    TORCH_CHECK_VALUE(im.dim() == 3, op, ": images[", b, "] must be [C, H, W], got ", im.sizes());
    TORCH_CHECK_VALUE(im.size(0) == images[0].size(0), op, ": images[", b, "] has ", im.size(0),
                      " channels but images[0] has ", images[0].size(0));
    TORCH_CHECK_VALUE(im.device() == images[0].device(), op, ": images[", b, "] is on ",
                      im.device(), " but images[0] is on ", images[0].device());
    d[b] = ImageDesc{im.data_ptr<uint8_t>(), im.size(1),   im.size(2),
                     im.stride(0),           im.stride(1), im.stride(2)};
  }
  return d;
}

// Every check of an op on a dense batch; its image descriptors.
inline std::vector<ImageDesc> checked_dense(const char* op, const at::Tensor& images,
                                            const OpArgs& a) {
  std::vector<ImageDesc> descs = describe_dense(op, images);
  check_common(op, images.size(0), images.size(1), images.device(), a.grid, a.flips,
               a.interpolation, a.mean, a.std, a.out);
  return descs;
}

// Every check of an op on a list of images; their descriptors.
inline std::vector<ImageDesc> checked_list(const char* op, at::TensorList images, const OpArgs& a) {
  std::vector<ImageDesc> descs = describe_list(op, images);
  check_common(op, static_cast<int64_t>(images.size()), images[0].size(0), images[0].device(),
               a.grid, a.flips, a.interpolation, a.mean, a.std, a.out);
  return descs;
}

// The launch shape of the two-pass kernel for these images and this output.
inline LaunchShape launch_shape(const std::vector<ImageDesc>& images, const at::Tensor& out,
                                int64_t mode, bool antialias) {
  int64_t max_width = 0;
  for (const ImageDesc& d : images) max_width = std::max(max_width, d.width);
  return LaunchShape{static_cast<int64_t>(images.size()),
                     out.size(1),
                     out.size(2),
                     out.size(3),
                     max_width,
                     mode,
                     antialias,
                     out.stride(0),
                     out.stride(1),
                     out.stride(2),
                     out.stride(3)};
}

// Geometry read on the host (CPU backend): every tap must land inside its image.
inline void check_grid_values(const char* op, const double* grid, int64_t batch,
                              const std::vector<ImageDesc>& images) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int axis = 0; axis < 2; ++axis) {
      const AxisGeom g = load_axis(grid + b * kGeomPerImage + axis * kGeomFields);
      const int64_t size = axis == 0 ? images[b].height : images[b].width;
      TORCH_CHECK_VALUE(g.start >= 0 && g.extent > 0 && g.out_virtual >= 1 && g.hi <= size &&
                            g.hi > g.start && g.out_offset >= 0,
                        op, ": grid[", b, "] describes taps outside image ", b, " (",
                        axis == 0 ? "height " : "width ", size, "): start=", g.start,
                        " extent=", g.extent, " end=", g.hi);
    }
  }
}

}  // namespace torchfeed::cfn

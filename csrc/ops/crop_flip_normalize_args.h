// Host-side argument checks and image descriptors of the crop/flip/normalize ops, shared by the
// CPU and CUDA backends so that both refuse the same inputs with the same words. The geometry
// (grid) and flips always live on the host: the checks read every value, and no device is ever
// synchronized to do it.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/py_repr.h"
#include "ops/crop_flip_normalize.h"

namespace torchfeed::cfn {

inline void check_common(const char* op, int64_t batch, int64_t channels, const at::Device& device,
                         const at::Tensor& grid, const at::Tensor& flips, int64_t interpolation,
                         at::ArrayRef<double> mean, at::ArrayRef<double> std,
                         const at::Tensor& out) {
  TORCH_CHECK_VALUE(channels >= 1 && channels <= kMaxChannels, op,
                    ": images must have 1 to 4 channels, got ", channels);
  TORCH_CHECK_VALUE(interpolation == kNearest || interpolation == kBilinear, op,
                    ": interpolation must be 0 (nearest) or 1 (bilinear), got ", interpolation);
  TORCH_CHECK_TYPE(grid.scalar_type() == at::kDouble, op, ": grid must be float64, got ",
                   py_dtype(grid.scalar_type()));
  TORCH_CHECK_VALUE(grid.dim() == 2 && grid.size(0) == batch && grid.size(1) == kGeomPerImage, op,
                    ": grid must have shape [", batch, ", ", kGeomPerImage, "], got ",
                    grid.sizes());
  TORCH_CHECK_TYPE(flips.scalar_type() == at::kBool, op, ": flips must be bool, got ",
                   py_dtype(flips.scalar_type()));
  TORCH_CHECK_VALUE(flips.dim() == 1 && flips.size(0) == batch, op, ": flips must have shape [",
                    batch, "], got ", flips.sizes());
  TORCH_CHECK_VALUE(grid.device().is_cpu() && flips.device().is_cpu(), op,
                    ": grid and flips must be CPU tensors (the geometry is planned and checked "
                    "on the host, whatever the images' device), got ",
                    grid.device(), " and ", flips.device());
  TORCH_CHECK_VALUE(
      static_cast<int64_t>(mean.size()) == channels && static_cast<int64_t>(std.size()) == channels,
      op, ": mean and std must have one value per channel (", channels, "), got ", mean.size(),
      " and ", std.size());
  for (size_t c = 0; c < std.size(); ++c) {
    TORCH_CHECK_VALUE(std::isfinite(mean[c]), op, ": mean[", c, "] must be finite, got ", mean[c]);
    TORCH_CHECK_VALUE(std::isfinite(std[c]) && std[c] != 0.0, op, ": std[", c,
                      "] must be finite and non-zero, got ", std[c]);
  }
  const auto dtype = out.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
                   ": out must be float32, float16 or bfloat16, got ", py_dtype(dtype));
  TORCH_CHECK_VALUE(out.dim() == 4 && out.size(0) == batch && out.size(1) == channels, op,
                    ": out must have shape [", batch, ", ", channels, ", H_out, W_out], got ",
                    out.sizes());
  TORCH_CHECK_VALUE(out.size(2) <= kMaxImageSide && out.size(3) <= kMaxImageSide, op,
                    ": out's height and width must be at most ", kMaxImageSide, ", got ",
                    out.sizes());
  TORCH_CHECK_VALUE(out.device() == device, op, ": out must be on the images' device ", device,
                    ", got ", out.device());
  TORCH_CHECK_VALUE(out.numel() == 0 || out.is_non_overlapping_and_dense(), op,
                    ": out must be a dense tensor without overlapping elements (NCHW or "
                    "channels_last)");
}

// out must not share memory with an input: its elements are written while inputs are read.
inline void check_no_overlap(const at::Tensor& out, const at::Tensor& input) {
  if (out.numel() > 0 && input.numel() > 0) at::assert_no_overlap(out, input);
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

// The arguments the ops take besides the images, checked by checked_dense/list/packed.
struct OpArgs {
  const at::Tensor& grid;
  const at::Tensor& flips;
  int64_t interpolation;
  at::ArrayRef<double> mean, std;
  const at::Tensor& out;
};

inline void check_image_size(const char* op, const std::string& name, int64_t h, int64_t w) {
  TORCH_CHECK_VALUE(h >= 1 && w >= 1 && h <= kMaxImageSide && w <= kMaxImageSide, op, ": ", name,
                    " must be 1 to ", kMaxImageSide, " pixels a side, got ", h, " x ", w);
}

// Descriptors of a dense batch [B, C, H, W] (any strides).
inline std::vector<ImageDesc> describe_dense(const char* op, const at::Tensor& images) {
  TORCH_CHECK_TYPE(images.scalar_type() == at::kByte, op, ": images must be uint8, got ",
                   py_dtype(images.scalar_type()));
  TORCH_CHECK_VALUE(images.dim() == 4, op, ": images must be [B, C, H, W], got ", images.sizes());
  if (images.size(0) > 0) check_image_size(op, "images", images.size(2), images.size(3));
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

// Descriptors of a list of images of one channel count on one device: [C, H_i, W_i], or
// [H_i, W_i, C] with images_hwc.
inline std::vector<ImageDesc> describe_list(const char* op, at::TensorList images,
                                            bool images_hwc) {
  TORCH_CHECK_VALUE(!images.empty(), op, ": images must hold at least one image, got none");
  const int64_t cdim = images_hwc ? 2 : 0, hdim = images_hwc ? 0 : 1, wdim = images_hwc ? 1 : 2;
  const char* layout = images_hwc ? "[H, W, C]" : "[C, H, W]";
  std::vector<ImageDesc> d(images.size());
  for (size_t b = 0; b < images.size(); ++b) {
    const at::Tensor& im = images[b];
    const std::string name = "images[" + std::to_string(b) + "]";
    TORCH_CHECK_TYPE(im.scalar_type() == at::kByte, op, ": ", name, " must be uint8, got ",
                     py_dtype(im.scalar_type()));
    TORCH_CHECK_VALUE(im.dim() == 3, op, ": ", name, " must be 3-D ", layout, ", got shape ",
                      im.sizes());
    TORCH_CHECK_VALUE(im.size(cdim) == images[0].size(cdim), op, ": ", name, " has ", im.size(cdim),
                      " channels but images[0] has ", images[0].size(cdim));
    TORCH_CHECK_VALUE(im.device() == images[0].device(), op, ": ", name, " is on ", im.device(),
                      " but images[0] is on ", images[0].device());
    check_image_size(op, name, im.size(hdim), im.size(wdim));
    d[b] = ImageDesc{im.data_ptr<uint8_t>(), im.size(hdim),   im.size(wdim),
                     im.stride(cdim),        im.stride(hdim), im.stride(wdim)};
  }
  return d;
}

// Descriptors of images packed in one buffer: `shapes` [B, 4] int64 on the host holds (offset
// into data, C, H, W) per image, each stored whole in CHW (or, images_hwc, HWC) order.
inline std::vector<ImageDesc> describe_packed(const char* op, const at::Tensor& data,
                                              const at::Tensor& shapes, bool images_hwc,
                                              int64_t* channels) {
  TORCH_CHECK_TYPE(data.scalar_type() == at::kByte, op, ": data must be uint8, got ",
                   py_dtype(data.scalar_type()));
  TORCH_CHECK_VALUE(data.dim() == 1 && data.is_contiguous(), op,
                    ": data must be a contiguous 1-D buffer, got shape ", data.sizes());
  TORCH_CHECK_VALUE(shapes.device().is_cpu() && shapes.scalar_type() == at::kLong &&
                        shapes.dim() == 2 && shapes.size(1) == 4,
                    op, ": shapes must be an int64 CPU tensor [B, 4] (offset, C, H, W), got ",
                    py_dtype(shapes.scalar_type()), " ", shapes.sizes(), " on ", shapes.device());
  TORCH_CHECK_VALUE(shapes.size(0) >= 1, op, ": images must hold at least one image, got none");
  const auto s = shapes.accessor<int64_t, 2>();
  const int64_t total = data.numel();
  const uint8_t* base = data.data_ptr<uint8_t>();
  *channels = s[0][1];
  std::vector<ImageDesc> d(shapes.size(0));
  for (int64_t b = 0; b < shapes.size(0); ++b) {
    const int64_t offset = s[b][0], c = s[b][1], h = s[b][2], w = s[b][3];
    const std::string name = "image " + std::to_string(b);
    TORCH_CHECK_VALUE(c == *channels, op, ": ", name, " has ", c, " channels but image 0 has ",
                      *channels);
    TORCH_CHECK_VALUE(c >= 1 && c <= kMaxChannels, op, ": images must have 1 to 4 channels, got ",
                      c);
    check_image_size(op, name, h, w);
    // h, w < 2^24 and c <= 4: the product cannot overflow; compared without adding to offset.
    TORCH_CHECK_VALUE(offset >= 0 && offset <= total && c * h * w <= total - offset, op, ": ", name,
                      " (offset ", offset, ", ", c, " x ", h, " x ", w,
                      ") reaches outside the buffer of ", total, " bytes");
    const uint8_t* p = base + offset;
    d[b] = images_hwc ? ImageDesc{p, h, w, 1, w * c, c} : ImageDesc{p, h, w, h * w, w, 1};
  }
  return d;
}

// Every check of an op on a dense batch; its image descriptors.
inline std::vector<ImageDesc> checked_dense(const char* op, const at::Tensor& images,
                                            const OpArgs& a) {
  std::vector<ImageDesc> descs = describe_dense(op, images);
  check_common(op, images.size(0), images.size(1), images.device(), a.grid, a.flips,
               a.interpolation, a.mean, a.std, a.out);
  check_no_overlap(a.out, images);
  return descs;
}

// Every check of an op on a list of images; their descriptors.
inline std::vector<ImageDesc> checked_list(const char* op, at::TensorList images, bool images_hwc,
                                           const OpArgs& a) {
  std::vector<ImageDesc> descs = describe_list(op, images, images_hwc);
  check_common(op, static_cast<int64_t>(images.size()), images[0].size(images_hwc ? 2 : 0),
               images[0].device(), a.grid, a.flips, a.interpolation, a.mean, a.std, a.out);
  for (const at::Tensor& im : images) check_no_overlap(a.out, im);
  return descs;
}

// Every check of an op on packed images; their descriptors.
inline std::vector<ImageDesc> checked_packed(const char* op, const at::Tensor& data,
                                             const at::Tensor& shapes, bool images_hwc,
                                             const OpArgs& a) {
  int64_t channels = 0;
  std::vector<ImageDesc> descs = describe_packed(op, data, shapes, images_hwc, &channels);
  check_common(op, shapes.size(0), channels, data.device(), a.grid, a.flips, a.interpolation,
               a.mean, a.std, a.out);
  check_no_overlap(a.out, data);
  return descs;
}

// The launch shape of the kernels for these images and this output.
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

inline bool whole(double v) { return std::isfinite(v) && v == std::floor(v); }

// Every value of the geometry, read on the host: finite, every tap inside its image, and no
// index computed from it near overflow. Written so that NaN fails every comparison.
inline void check_grid_values(const char* op, const double* grid, int64_t batch,
                              const std::vector<ImageDesc>& images, int64_t out_h, int64_t out_w) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int axis = 0; axis < 2; ++axis) {
      const AxisGeom g = load_axis(grid + b * kGeomPerImage + axis * kGeomFields);
      const double size = static_cast<double>(axis == 0 ? images[b].height : images[b].width);
      const double out_size = static_cast<double>(axis == 0 ? out_h : out_w);
      const bool ok = std::isfinite(g.start) && std::isfinite(g.extent) && g.start >= 0 &&
                      g.extent > 0 && g.start + g.extent <= size && whole(g.hi) && g.hi > g.start &&
                      g.hi <= size && whole(g.out_virtual) && g.out_virtual >= 1 &&
                      g.out_virtual <= static_cast<double>(kMaxVirtualSize) &&
                      whole(g.out_offset) && g.out_offset >= 0 &&
                      g.out_offset + out_size <= g.out_virtual;
      TORCH_CHECK_VALUE(ok, op, ": grid[", b, "] describes taps outside image ", b, " (",
                        axis == 0 ? "height " : "width ",
                        images[b].height * (axis == 0) + images[b].width * (axis == 1),
                        "): start=", py_float(g.start), " extent=", py_float(g.extent),
                        " end=", py_float(g.hi), " resized=", py_float(g.out_virtual),
                        " offset=", py_float(g.out_offset), " for ", out_size, " outputs");
    }
  }
}

}  // namespace torchfeed::cfn

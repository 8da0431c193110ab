// Host-side planning of the crop/flip/normalize op: the image sizes of a batch, the random
// crop boxes, and the per-image sampling geometry (the `grid` the kernels take), each one call
// for the whole batch so the Python side has no per-image loop. All of it runs on the host and
// reads no image data, so none of it synchronizes a device.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <ATen/core/Generator.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "ops/crop_flip_normalize.h"
#include "ops/crop_flip_normalize_args.h"

namespace torchfeed {
namespace {

using cfn::kGeomPerImage;

// [B, 2] int64 (H, W) per image, after checking what the kernels will check (so a bad batch is
// refused before anything is drawn).
at::Tensor image_sizes(at::TensorList images, bool images_hwc) {
  constexpr const char* op = "image_sizes";
  const std::vector<cfn::ImageDesc> descs = cfn::describe_list(op, images, images_hwc);
  at::Tensor sizes = at::empty({static_cast<int64_t>(descs.size()), 2}, at::kLong);
  int64_t* s = sizes.data_ptr<int64_t>();
  for (size_t b = 0; b < descs.size(); ++b) {
    s[2 * b] = descs[b].height;
    s[2 * b + 1] = descs[b].width;
  }
  return sizes;
}

struct Sizes {
  std::vector<int64_t> h, w;
};

Sizes read_sizes(const char* op, const at::Tensor& sizes) {
  TORCH_CHECK_VALUE(sizes.device().is_cpu(), op, ": sizes must be a CPU tensor, got ",
                    sizes.device());
  TORCH_CHECK_TYPE(sizes.scalar_type() == at::kLong, op, ": sizes must be int64, got ",
                   py_dtype(sizes.scalar_type()));
  TORCH_CHECK_VALUE(sizes.dim() == 2 && sizes.size(1) == 2, op,
                    ": sizes must have shape [B, 2] (height, width), got ", sizes.sizes());
  const auto a = sizes.accessor<int64_t, 2>();
  Sizes out;
  out.h.resize(sizes.size(0));
  out.w.resize(sizes.size(0));
  for (int64_t b = 0; b < sizes.size(0); ++b) {
    out.h[b] = a[b][0];
    out.w[b] = a[b][1];
    TORCH_CHECK_VALUE(out.h[b] >= 1 && out.w[b] >= 1 && out.h[b] <= cfn::kMaxImageSide &&
                          out.w[b] <= cfn::kMaxImageSide,
                      op, ": sizes[", b, "] = (", out.h[b], ", ", out.w[b],
                      ") must be an image of 1 to ", cfn::kMaxImageSide, " pixels a side");
  }
  return out;
}

void check_out_size(const char* op, int64_t out_h, int64_t out_w) {
  TORCH_CHECK_VALUE(
      out_h >= 1 && out_w >= 1 && out_h <= cfn::kMaxImageSide && out_w <= cfn::kMaxImageSide, op,
      ": the output size must be 1 to ", cfn::kMaxImageSide, " pixels a side, got (", out_h, ", ",
      out_w, ")");
}

// Crop-then-resize geometry: taps stay inside each box, as in torchvision's resized_crop.
// boxes: [B, 4] (top, left, height, width), any real dtype; each box inside its image.
at::Tensor resized_crop_grid(const at::Tensor& sizes, const at::Tensor& boxes, int64_t out_h,
                             int64_t out_w) {
  constexpr const char* op = "resized_crop_grid";
  const Sizes s = read_sizes(op, sizes);
  check_out_size(op, out_h, out_w);
  const int64_t batch = static_cast<int64_t>(s.h.size());
  TORCH_CHECK_VALUE(boxes.device().is_cpu(), op, ": boxes must be a CPU tensor, got ",
                    boxes.device());
  TORCH_CHECK_VALUE(boxes.dim() == 2 && boxes.size(0) == batch && boxes.size(1) == 4, op,
                    ": boxes must have shape [", batch,
                    ", 4] (top, left, height, width per image), got ", boxes.sizes());
  TORCH_CHECK_TYPE(!boxes.is_complex() && boxes.scalar_type() != at::kBool, op,
                   ": boxes must be real numbers, got ", py_dtype(boxes.scalar_type()));
  const at::Tensor b64 = boxes.to(at::kDouble).contiguous();
  const double* bx = b64.data_ptr<double>();
  at::Tensor grid = at::empty({batch, kGeomPerImage}, at::kDouble);
  double* g = grid.data_ptr<double>();
  for (int64_t b = 0; b < batch; ++b) {
    const double top = bx[4 * b], left = bx[4 * b + 1], height = bx[4 * b + 2],
                 width = bx[4 * b + 3];
    // Written so that NaN fails every comparison; sizes are < 2^31, so no sum overflows.
    const bool inside = std::isfinite(top) && std::isfinite(left) && std::isfinite(height) &&
                        std::isfinite(width) && height > 0 && width > 0 && top >= 0 && left >= 0 &&
                        top + height <= static_cast<double>(s.h[b]) &&
                        left + width <= static_cast<double>(s.w[b]);
    TORCH_CHECK_VALUE(inside, "boxes[", b, "] = [", py_float(top), ", ", py_float(left), ", ",
                      py_float(height), ", ", py_float(width),
                      "] (top, left, height, width) must have a positive size and lie inside "
                      "image ",
                      b, " of size (H, W) = (", s.h[b], ", ", s.w[b], ")");
    double* row = g + b * kGeomPerImage;
    const double ys[5] = {top, height, static_cast<double>(out_h), 0.0,
                          std::min(std::ceil(top + height), static_cast<double>(s.h[b]))};
    const double xs[5] = {left, width, static_cast<double>(out_w), 0.0,
                          std::min(std::ceil(left + width), static_cast<double>(s.w[b]))};
    std::copy(ys, ys + 5, row);
    std::copy(xs, xs + 5, row + 5);
  }
  return grid;
}

// torchvision's resize(size) output size: an int (resize_w < 0) sets the shorter side and keeps
// the aspect ratio (the longer side truncated, as int() does); else (resize_h, resize_w).
void resized_size(int64_t h, int64_t w, int64_t resize_h, int64_t resize_w, int64_t* new_h,
                  int64_t* new_w) {
  if (resize_w >= 0) {
    *new_h = resize_h;
    *new_w = resize_w;
    return;
  }
  const bool wide = w >= h;
  const int64_t shorter = wide ? h : w, longer = wide ? w : h;
  const int64_t new_short = resize_h;
  const int64_t new_long = static_cast<int64_t>(
      static_cast<double>(new_short) * static_cast<double>(longer) / static_cast<double>(shorter));
  *new_h = wide ? new_short : new_long;
  *new_w = wide ? new_long : new_short;
}

// Resize-then-crop geometry: resize (torchvision's size rule) then center_crop(crop); taps may
// read the whole image, as the resize does before the crop.
at::Tensor resize_center_crop_grid(const at::Tensor& sizes, int64_t resize_h, int64_t resize_w,
                                   int64_t crop_h, int64_t crop_w) {
  constexpr const char* op = "resize_center_crop_grid";
  const Sizes s = read_sizes(op, sizes);
  check_out_size(op, crop_h, crop_w);
  TORCH_CHECK_VALUE(resize_h >= 1 && resize_h <= cfn::kMaxImageSide &&
                        (resize_w < 0 || (resize_w >= 1 && resize_w <= cfn::kMaxImageSide)),
                    op, ": resize must be 1 to ", cfn::kMaxImageSide, " pixels, got (", resize_h,
                    ", ", resize_w, ")");
  const int64_t batch = static_cast<int64_t>(s.h.size());
  at::Tensor grid = at::empty({batch, kGeomPerImage}, at::kDouble);
  double* g = grid.data_ptr<double>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t new_h = 0, new_w = 0;
    resized_size(s.h[b], s.w[b], resize_h, resize_w, &new_h, &new_w);
    TORCH_CHECK_VALUE(new_h >= crop_h && new_w >= crop_w, op, ": crop (", crop_h, ", ", crop_w,
                      ") is larger than image (", s.h[b], ", ", s.w[b], ") resized to (", new_h,
                      ", ", new_w, ")");
    TORCH_CHECK_VALUE(new_h <= cfn::kMaxVirtualSize && new_w <= cfn::kMaxVirtualSize, op,
                      ": image ", b, " resized to (", new_h, ", ", new_w, ") is too large");
    // torchvision: int(round((new - crop) / 2.0)), Python's round being half-to-even.
    const double top = std::nearbyint(static_cast<double>(new_h - crop_h) / 2.0);
    const double left = std::nearbyint(static_cast<double>(new_w - crop_w) / 2.0);
    const double row[kGeomPerImage] = {0.0,
                                       static_cast<double>(s.h[b]),
                                       static_cast<double>(new_h),
                                       top,
                                       static_cast<double>(s.h[b]),
                                       0.0,
                                       static_cast<double>(s.w[b]),
                                       static_cast<double>(new_w),
                                       left,
                                       static_cast<double>(s.w[b])};
    std::copy(row, row + kGeomPerImage, g + b * kGeomPerImage);
  }
  return grid;
}

void check_crop_ranges(const char* op, double scale_lo, double scale_hi, double ratio_lo,
                       double ratio_hi) {
  TORCH_CHECK_VALUE(
      std::isfinite(scale_lo) && std::isfinite(scale_hi) && scale_lo >= 0 && scale_lo <= scale_hi,
      op, ": scale must be (min, max) with 0 <= min <= max, finite, got (", scale_lo, ", ",
      scale_hi, ")");
  TORCH_CHECK_VALUE(
      std::isfinite(ratio_lo) && std::isfinite(ratio_hi) && ratio_lo > 0 && ratio_lo <= ratio_hi,
      op, ": ratio must be (min, max) with 0 < min <= max, finite, got (", ratio_lo, ", ", ratio_hi,
      ")");
}

// torchvision's RandomResizedCrop.get_params per image, from 22 uniforms per image (row b of
// `u`, `stride` doubles apart): 10 attempts (area, aspect), then the placement (top, left), as
// the Python samplers use them (torchfeed.sampling). int64 [B, 4] (top, left, height, width).
at::Tensor crops_from_uniforms(const Sizes& s, const double* u, int64_t stride, double scale_lo,
                               double scale_hi, double ratio_lo, double ratio_hi) {
  const int64_t batch = static_cast<int64_t>(s.h.size());
  const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
  at::Tensor boxes = at::empty({batch, 4}, at::kLong);
  int64_t* out = boxes.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const double* ub = u + b * stride;
    const double height = static_cast<double>(s.h[b]), width = static_cast<double>(s.w[b]);
    const double area = height * width;
    double h = 0, w = 0;
    bool found = false;
    for (int i = 0; i < 10 && !found; ++i) {
      const double target = area * (scale_lo + (scale_hi - scale_lo) * ub[2 * i]);
      const double aspect = std::exp(log_lo + (log_hi - log_lo) * ub[2 * i + 1]);
      w = std::nearbyint(std::sqrt(target * aspect));  // half-to-even, as torch.round
      h = std::nearbyint(std::sqrt(target / aspect));
      found = w > 0 && w <= width && h > 0 && h <= height;
    }
    double top, left;
    if (found) {
      top = std::floor(ub[20] * (height - h + 1));
      left = std::floor(ub[21] * (width - w + 1));
    } else {  // the central crop at the nearest allowed aspect ratio
      const double in_ratio = width / height;
      if (in_ratio < ratio_lo) {
        w = width;
        h = std::nearbyint(width / ratio_lo);
      } else if (in_ratio > ratio_hi) {
        w = std::nearbyint(height * ratio_hi);
        h = height;
      } else {
        w = width;
        h = height;
      }
      top = std::floor((height - h) / 2);
      left = std::floor((width - w) / 2);
    }
    out[4 * b] = static_cast<int64_t>(top);
    out[4 * b + 1] = static_cast<int64_t>(left);
    out[4 * b + 2] = static_cast<int64_t>(h);
    out[4 * b + 3] = static_cast<int64_t>(w);
  }
  return boxes;
}

// The [B, width] uniforms a sampling op reads: `uniforms` when given (checked: float64 on the
// host, one row per image, `width` wide), else one draw from `generator`.
at::Tensor uniforms_for(const char* op, int64_t batch, int64_t width,
                        const std::optional<at::Generator>& generator,
                        const std::optional<at::Tensor>& uniforms) {
  if (!uniforms.has_value()) {
    return at::rand({batch, width}, generator, at::TensorOptions().dtype(at::kDouble));
  }
  const at::Tensor& u = *uniforms;
  TORCH_CHECK_VALUE(u.device().is_cpu() && u.scalar_type() == at::kDouble && u.dim() == 2 &&
                        u.size(0) == batch && u.size(1) == width,
                    op, ": uniforms must be a float64 CPU tensor of shape [", batch, ", ", width,
                    "] (one row per image), got ", py_dtype(u.scalar_type()), " ", u.sizes(),
                    " on ", u.device());
  return u.contiguous();
}

// RandomResizedCrop's boxes: one draw of [B, 22] uniforms from `generator` (what
// torchfeed.sampling.sample_resized_crop_params draws), or the rows of `uniforms`.
at::Tensor sample_resized_crop(const at::Tensor& sizes, double scale_lo, double scale_hi,
                               double ratio_lo, double ratio_hi,
                               std::optional<at::Generator> generator,
                               std::optional<at::Tensor> uniforms) {
  constexpr const char* op = "sample_resized_crop";
  const Sizes s = read_sizes(op, sizes);
  check_crop_ranges(op, scale_lo, scale_hi, ratio_lo, ratio_hi);
  const int64_t batch = static_cast<int64_t>(s.h.size());
  const at::Tensor u = uniforms_for(op, batch, 22, generator, uniforms);
  return crops_from_uniforms(s, u.data_ptr<double>(), 22, scale_lo, scale_hi, ratio_lo, ratio_hi);
}

// SplitMix64's finalizer with one part mixed in: torchfeed.data._seeding._mix.
uint64_t mix(uint64_t h, uint64_t part) {
  h = (h ^ part) + 0x9E3779B97F4A7C15ULL;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
  return h ^ (h >> 31);
}

// Uniforms in [0, 1), [N, count] float64, row j from a generator of its own seeded with
// mix(mix(base, keys[j]), stream): a sample's row is the same in whatever batch, position or
// process it is drawn, and `stream` gives it another (a second draw in one batch).
at::Tensor sample_uniforms(const at::Tensor& keys, int64_t base, int64_t stream, int64_t count) {
  constexpr const char* op = "sample_uniforms";
  TORCH_CHECK_VALUE(keys.device().is_cpu() && keys.scalar_type() == at::kLong && keys.dim() == 1,
                    op, ": keys must be a 1-D int64 CPU tensor (one per image), got ",
                    py_dtype(keys.scalar_type()), " ", keys.sizes(), " on ", keys.device());
  TORCH_CHECK_VALUE(count >= 0 && count <= (1 << 16), op,
                    ": count must be in [0, 65536] (uniforms per image), got ", count);
  const at::Tensor k = keys.contiguous();
  const int64_t n = k.numel();
  at::Tensor out = at::empty({n, count}, at::kDouble);
  double* o = out.data_ptr<double>();
  const int64_t* pk = k.data_ptr<int64_t>();
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t seed = mix(mix(static_cast<uint64_t>(base), static_cast<uint64_t>(pk[j])),
                              static_cast<uint64_t>(stream));
    at::CPUGeneratorImpl generator(seed);
    at::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int64_t c = 0; c < count; ++c) o[j * count + c] = uniform(&generator);
  }
  return out;
}

// The same boxes and a horizontal flip per image with probability p_flip, from one draw of
// [B, 23] uniforms: the box's 22, then the flip's (u < p_flip, as torchvision's rand(1) < p).
std::tuple<at::Tensor, at::Tensor> sample_crops_and_flips(const at::Tensor& sizes, double scale_lo,
                                                          double scale_hi, double ratio_lo,
                                                          double ratio_hi, double p_flip,
                                                          std::optional<at::Generator> generator,
                                                          std::optional<at::Tensor> uniforms) {
  constexpr const char* op = "sample_crops_and_flips";
  const Sizes s = read_sizes(op, sizes);
  check_crop_ranges(op, scale_lo, scale_hi, ratio_lo, ratio_hi);
  TORCH_CHECK_VALUE(p_flip >= 0.0 && p_flip <= 1.0, op, ": p_flip must be in [0, 1], got ",
                    py_float(p_flip));
  const int64_t batch = static_cast<int64_t>(s.h.size());
  const at::Tensor u = uniforms_for(op, batch, 23, generator, uniforms);
  const double* pu = u.data_ptr<double>();
  at::Tensor boxes = crops_from_uniforms(s, pu, 23, scale_lo, scale_hi, ratio_lo, ratio_hi);
  at::Tensor flips = at::empty({batch}, at::kBool);
  bool* f = flips.data_ptr<bool>();
  for (int64_t b = 0; b < batch; ++b) f[b] = pu[b * 23 + 22] < p_flip;
  return {boxes, flips};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CPU, m) {
  m.impl("image_sizes", &image_sizes);
  m.impl("resized_crop_grid", &resized_crop_grid);
  m.impl("resize_center_crop_grid", &resize_center_crop_grid);
  m.impl("sample_resized_crop", &sample_resized_crop);
  m.impl("sample_crops_and_flips", &sample_crops_and_flips);
  m.impl("sample_uniforms", &sample_uniforms);
}

// image_sizes reads only the images' shapes: the same host function serves CUDA images.
TORCH_LIBRARY_IMPL(torchfeed, CUDA, m) { m.impl("image_sizes", &image_sizes); }

}  // namespace torchfeed

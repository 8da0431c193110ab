// Per-element math of the fused crop/flip/resize/normalize op, shared by the CPU and CUDA
// kernels. No torch includes: nvcc compiles this for the device too.
//
// Semantics are torchvision's resized_crop -> horizontal_flip -> to_dtype(scale=True) ->
// normalize, computed in float. The index and weight arithmetic reproduces PyTorch's
// interpolate() (UpSample.h, UpSampleKernel.cpp) operation by operation, including where it
// rounds through double and where through float, so that integer crop boxes give torchvision's
// results to float rounding.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace torchfeed::cfn {

enum Interpolation : int64_t { kNearest = 0, kBilinear = 1 };

// Values per image in the geometry tensor: for each axis (y, then x) the fields of AxisGeom.
constexpr int64_t kGeomFields = 5;
constexpr int64_t kGeomPerImage = 2 * kGeomFields;

// One axis of one image. Output index i (after flipping) samples the source at
//   start + extent / out_virtual * (out_offset + i + 0.5)   (pixel centers at k + 0.5),
// with taps restricted to [floor(start), hi).
//  - crop then resize (RandomResizedCrop): start = box top, extent = box height,
//    out_virtual = output size, out_offset = 0, hi = ceil(top + height): taps stay in the box.
//  - resize then crop (Resize + CenterCrop): start = 0, extent = image size, out_virtual = the
//    resized size, out_offset = the crop's offset in the resized image, hi = image size.
struct AxisGeom {
  double start;
  double extent;
  double out_virtual;
  double out_offset;
  double hi;
};

TF_HOST_DEVICE TF_INLINE AxisGeom load_axis(const double* g) {
  return AxisGeom{g[0], g[1], g[2], g[3], g[4]};
}

struct AxisPlan {
  int64_t base;    // floor(start): taps are relative to it
  int64_t hi;      // end of the taps, relative to base
  int64_t offset;  // out_offset
  float frac;      // start - base
  float scale;     // extent / out_virtual, in float as PyTorch computes it
  bool identity;   // extent == out_virtual on a whole pixel: PyTorch copies
};

TF_HOST_DEVICE TF_INLINE AxisPlan plan_axis(const AxisGeom& g) {
  AxisPlan p;
  const double base = floor(g.start);
  p.base = static_cast<int64_t>(base);
  p.hi = static_cast<int64_t>(g.hi) - p.base;
  p.offset = static_cast<int64_t>(g.out_offset);
  p.frac = static_cast<float>(g.start - base);
  // area_pixel_compute_scale<float>(input_size, output_size): float division.
  p.scale = static_cast<float>(g.extent) / static_cast<float>(g.out_virtual);
  p.identity = p.frac == 0.0f && g.extent == g.out_virtual;
  return p;
}

// Bilinear (triangle) filter of PyTorch's antialiased resize.
TF_HOST_DEVICE TF_INLINE float triangle(float x) {
  x = fabsf(x);
  return x < 1.0f ? 1.0f - x : 0.0f;
}

// The taps of one output index: source indices [first, first + count) relative to the axis
// base. Weights come from tap_weight(); for antialiased bilinear they are normalized by total.
struct TapSpan {
  int64_t first;
  int64_t count;
  float center;    // antialias: the sampling center; bilinear: lambda1
  float invscale;  // antialias only
  float total;     // sum of the unnormalized weights (1 when there is nothing to normalize)
  int mode;        // 0 nearest, 1 bilinear, 2 antialiased bilinear
};

TF_HOST_DEVICE TF_INLINE float tap_weight(const TapSpan& s, int64_t j) {
  if (s.mode == 2) {
    // PyTorch: filter((j + xmin - center + 0.5) * invscale); the int-minus-float is float, the
    // rest double, the filter's argument float.
    const float d = static_cast<float>(j + s.first) - s.center;
    return triangle(
        static_cast<float>((static_cast<double>(d) + 0.5) * static_cast<double>(s.invscale)));
  }
  if (s.mode == 1) {
    if (s.count == 1) return 1.0f;
    return j == 0 ? 1.0f - s.center : s.center;  // lambda0, lambda1
  }
  return 1.0f;
}

// Taps of output index i (already flipped) along an axis.
TF_HOST_DEVICE TF_INLINE TapSpan tap_span(const AxisPlan& p, int64_t i, int64_t mode,
                                          bool antialias) {
  TapSpan s;
  s.invscale = 1.0f;
  s.total = 1.0f;
  s.center = 0.0f;
  const int64_t o = p.offset + i;
  if (mode == kNearest) {
    s.mode = 0;
    s.count = 1;
    int64_t src;
    if (p.identity) {
      src = o;
    } else {
      // nearest_neighbor_compute_source_index: floorf(dst * scale) in float.
      src = static_cast<int64_t>(floorf(p.frac + static_cast<float>(o) * p.scale));
    }
    if (src > p.hi - 1) src = p.hi - 1;
    if (src < 0) src = 0;
    s.first = src;
    return s;
  }
  if (!antialias) {
    s.mode = 1;
    if (p.identity) {
      s.first = o;
      s.count = 1;
      return s;
    }
    // area_pixel_compute_source_index: scale * (dst + 0.5) - 0.5 through double, clamped at 0.
    float real =
        static_cast<float>(static_cast<double>(p.scale) * (static_cast<double>(o) + 0.5) - 0.5);
    if (real < 0.0f) real = 0.0f;
    real += p.frac;
    // guard_index_and_lambda
    int64_t i0 = static_cast<int64_t>(floorf(real));
    if (i0 > p.hi - 1) i0 = p.hi - 1;
    float lambda1 = real - static_cast<float>(i0);
    lambda1 = lambda1 < 0.0f ? 0.0f : (lambda1 > 1.0f ? 1.0f : lambda1);
    s.first = i0;
    s.count = i0 < p.hi - 1 ? 2 : 1;
    s.center = lambda1;
    return s;
  }
  // Antialiased bilinear (_upsample_bilinear2d_aa): a triangle of support max(scale, 1).
  s.mode = 2;
  const float scale = p.scale;
  const float support = scale >= 1.0f ? scale : 1.0f;
  s.invscale = scale >= 1.0f ? 1.0f / scale : 1.0f;
  s.center =
      static_cast<float>(static_cast<double>(scale) * (static_cast<double>(o) + 0.5)) + p.frac;
  int64_t xmin = static_cast<int64_t>(static_cast<double>(s.center - support) + 0.5);
  if (xmin < 0) xmin = 0;
  int64_t xmax = static_cast<int64_t>(static_cast<double>(s.center + support) + 0.5);
  if (xmax > p.hi) xmax = p.hi;
  s.first = xmin;
  s.count = xmax > xmin ? xmax - xmin : 0;
  float total = 0.0f;
  for (int64_t j = 0; j < s.count; ++j) total += tap_weight(s, j);
  s.total = total != 0.0f ? total : 1.0f;
  return s;
}

// The normalized weight of tap j, as both kernels use it.
TF_HOST_DEVICE TF_INLINE float normalized_weight(const TapSpan& s, int64_t j) {
  return s.mode == 2 ? tap_weight(s, j) / s.total : tap_weight(s, j);
}

// Rows (or columns) of the source, relative to the base, that any output index reads.
TF_HOST_DEVICE TF_INLINE void tap_bounds(const AxisPlan& p, int64_t out_size, int64_t mode,
                                         bool antialias, int64_t* lo, int64_t* hi) {
  const TapSpan a = tap_span(p, 0, mode, antialias);
  const TapSpan b = tap_span(p, out_size - 1, mode, antialias);
  *lo = a.first;
  *hi = b.first + b.count;
  if (*hi < *lo) *hi = *lo;
}

// The flip is applied after the resize: output column x shows resized column W_out - 1 - x.
TF_HOST_DEVICE TF_INLINE int64_t flip_index(int64_t x, int64_t out_size, bool flip) {
  return flip ? out_size - 1 - x : x;
}

// to_dtype(scale=True) then normalize, folded into one multiply-add per element:
// (v / 255 - mean) / std = v * scale + bias.
struct ChannelAffine {
  float scale;  // 1 / (255 * std)
  float bias;   // -mean / std
};

TF_HOST_DEVICE TF_INLINE float finish(float v, ChannelAffine a) { return v * a.scale + a.bias; }

constexpr int64_t kMaxChannels = 4;

// Where one uint8 image [C, H, W] lives: any strides, so NCHW, NHWC and views all work.
struct ImageDesc {
  const uint8_t* data;
  int64_t height, width;
  int64_t stride_c, stride_h, stride_w;
};

// The shape of one launch of the two-pass kernel (CUDA, or its CPU emulation in tests).
struct LaunchShape {
  int64_t batch, channels, out_h, out_w;
  int64_t cols;  // scratch columns per row: the widest image
  int64_t mode;
  bool antialias;
  int64_t osb, osc, osh, osw;  // output strides
};

// One thread of the vertical pass. Element i of the scratch [B, C, out_h, cols]: row y of image
// b, column k holds the vertically resampled source column x_base + x_lo + k, [x_lo, x_hi)
// being the columns the horizontal taps read. Returns false if a tap falls outside the image.
TF_HOST_DEVICE TF_INLINE bool vertical_element(int64_t i, const ImageDesc* images,
                                               const double* grid, float* scratch,
                                               const LaunchShape& p) {
  const int64_t k = i % p.cols;
  int64_t rest = i / p.cols;
  const int64_t y = rest % p.out_h;
  rest /= p.out_h;
  const int64_t c = rest % p.channels;
  const int64_t b = rest / p.channels;
  const double* geom = grid + b * kGeomPerImage;
  const AxisPlan px = plan_axis(load_axis(geom + kGeomFields));
  int64_t x_lo, x_hi;
  tap_bounds(px, p.out_w, p.mode, p.antialias, &x_lo, &x_hi);
  if (x_lo + k >= x_hi) return true;  // beyond this image's columns
  const AxisPlan py = plan_axis(load_axis(geom));
  const TapSpan s = tap_span(py, y, p.mode, p.antialias);
  const ImageDesc im = images[b];
  const int64_t col = px.base + x_lo + k;
  if (col < 0 || col >= im.width || py.base + s.first < 0 ||
      py.base + s.first + s.count > im.height) {
    return false;
  }
  const uint8_t* src =
      im.data + c * im.stride_c + (py.base + s.first) * im.stride_h + col * im.stride_w;
  float acc = 0.0f;
  for (int64_t j = 0; j < s.count; ++j) {
    acc += normalized_weight(s, j) * static_cast<float>(src[j * im.stride_h]);
  }
  scratch[i] = acc;
  return true;
}

// One thread of the horizontal pass: output element i of [B, C, out_h, out_w] (in that
// logical order), normalized; *offset receives its position in the strided output.
TF_HOST_DEVICE TF_INLINE float horizontal_element(int64_t i, const double* grid, const bool* flips,
                                                  const float* scratch, const ChannelAffine* affine,
                                                  const LaunchShape& p, int64_t* offset) {
  const int64_t x = i % p.out_w;
  int64_t rest = i / p.out_w;
  const int64_t y = rest % p.out_h;
  rest /= p.out_h;
  const int64_t c = rest % p.channels;
  const int64_t b = rest / p.channels;
  const AxisPlan px = plan_axis(load_axis(grid + b * kGeomPerImage + kGeomFields));
  int64_t x_lo, x_hi;
  tap_bounds(px, p.out_w, p.mode, p.antialias, &x_lo, &x_hi);
  const TapSpan s = tap_span(px, flip_index(x, p.out_w, flips[b]), p.mode, p.antialias);
  const float* row = scratch + ((b * p.channels + c) * p.out_h + y) * p.cols + (s.first - x_lo);
  float acc = 0.0f;
  for (int64_t j = 0; j < s.count; ++j) acc += normalized_weight(s, j) * row[j];
  *offset = b * p.osb + c * p.osc + y * p.osh + x * p.osw;
  return finish(acc, affine[c]);
}

}  // namespace torchfeed::cfn

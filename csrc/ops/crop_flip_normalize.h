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

// Taps of output index i (already flipped) along an axis, without their total (1): tap_span()
// sums it, span_weights() computes each weight once and sums them.
TF_HOST_DEVICE TF_INLINE TapSpan tap_range(const AxisPlan& p, int64_t i, int64_t mode,
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
  return s;
}

// Antialiasing normalizes by the sum of the unnormalized weights, taken in tap order.
TF_HOST_DEVICE TF_INLINE float checked_total(float total) { return total != 0.0f ? total : 1.0f; }

// Taps of output index i (already flipped) along an axis.
TF_HOST_DEVICE TF_INLINE TapSpan tap_span(const AxisPlan& p, int64_t i, int64_t mode,
                                          bool antialias) {
  TapSpan s = tap_range(p, i, mode, antialias);
  if (s.mode == 2) {
    float total = 0.0f;
    for (int64_t j = 0; j < s.count; ++j) total += tap_weight(s, j);
    s.total = checked_total(total);
  }
  return s;
}

// The normalized weight of tap j, as both kernels use it.
TF_HOST_DEVICE TF_INLINE float normalized_weight(const TapSpan& s, int64_t j) {
  return s.mode == 2 ? tap_weight(s, j) / s.total : tap_weight(s, j);
}

// A tap_range()'s normalized weights into w[0, count), each weight computed once: the values
// normalized_weight() gives for tap_span()'s span, which this sets s->total to.
TF_HOST_DEVICE TF_INLINE void span_weights(TapSpan* s, float* w) {
  float total = 0.0f;
  for (int64_t j = 0; j < s->count; ++j) {
    w[j] = tap_weight(*s, j);
    total += w[j];
  }
  if (s->mode != 2) return;
  s->total = checked_total(total);
  for (int64_t j = 0; j < s->count; ++j) w[j] /= s->total;
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
// Bounds the argument checks enforce, so that no index or size computed from an image, a box or
// a grid row can overflow: 2^24 pixels a side for images and outputs (products stay < 2^48),
// and for the size an image is resized to before a crop.
constexpr int64_t kMaxImageSide = int64_t{1} << 24;
constexpr int64_t kMaxVirtualSize = int64_t{1} << 24;

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

// Element i of a [batch, channels, rows, cols] array, in that logical order: its coordinates
// (the thread-to-element mapping of both two-pass kernels).
struct Element4 {
  int64_t b, c, y, x;
};

TF_HOST_DEVICE TF_INLINE Element4 unflatten(int64_t i, int64_t channels, int64_t rows,
                                            int64_t cols) {
  const int64_t x = i % cols;
  int64_t rest = i / cols;
  const int64_t y = rest % rows;
  rest /= rows;
  return Element4{rest / channels, rest % channels, y, x};
}

// The CUDA kernels' sums use explicit fused multiply-adds (what nvcc would contract them to
// anyway), so the emulation op computes the GPU's bits exactly on any host.
//
// One thread of the vertical pass. Element i of the scratch [B, C, out_h, cols]: row y of image
// b, column k holds the vertically resampled source column x_base + x_lo + k, [x_lo, x_hi)
// being the columns the horizontal taps read. Returns false if a tap falls outside the image.
TF_HOST_DEVICE TF_INLINE bool vertical_element(int64_t i, const ImageDesc* images,
                                               const double* grid, float* scratch,
                                               const LaunchShape& p) {
  const Element4 e = unflatten(i, p.channels, p.out_h, p.cols);
  const int64_t b = e.b, c = e.c, y = e.y, k = e.x;
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
    acc = fmaf(normalized_weight(s, j), static_cast<float>(src[j * im.stride_h]), acc);
  }
  scratch[i] = acc;
  return true;
}

// One thread of the horizontal pass: output element i of [B, C, out_h, out_w] (in that
// logical order), normalized; *offset receives its position in the strided output.
TF_HOST_DEVICE TF_INLINE float horizontal_element(int64_t i, const double* grid, const bool* flips,
                                                  const float* scratch, const ChannelAffine* affine,
                                                  const LaunchShape& p, int64_t* offset) {
  const Element4 e = unflatten(i, p.channels, p.out_h, p.out_w);
  const int64_t b = e.b, c = e.c, y = e.y, x = e.x;
  const AxisPlan px = plan_axis(load_axis(grid + b * kGeomPerImage + kGeomFields));
  int64_t x_lo, x_hi;
  tap_bounds(px, p.out_w, p.mode, p.antialias, &x_lo, &x_hi);
  const TapSpan s = tap_span(px, flip_index(x, p.out_w, flips[b]), p.mode, p.antialias);
  const float* row = scratch + ((b * p.channels + c) * p.out_h + y) * p.cols + (s.first - x_lo);
  float acc = 0.0f;
  for (int64_t j = 0; j < s.count; ++j) acc = fmaf(normalized_weight(s, j), row[j], acc);
  *offset = b * p.osb + c * p.osc + y * p.osh + x * p.osw;
  return fmaf(acc, affine[c].scale, affine[c].bias);
}

// The one-pass kernel, one thread block per output tile.
//
// A block computes a tile of `rows` x `cols` outputs of one image, every channel: (1) the tap
// tables of its rows and columns, once; (2) the vertical pass over the source columns the tile's
// horizontal taps read, into shared memory; (3) the horizontal pass, flip, normalization and the
// store. Nothing goes through global memory in between. The sums are the two-pass kernel's and
// the CPU kernel's, term for term and in the same order, with explicit fused multiply-adds, so
// the three give the same bits (the CPU's AVX2 path fuses them too). These functions are a
// block's whole body; the CUDA kernel runs them per thread, the emulation op per block on the
// CPU.

// Taps of one output row (or column) at most, for a scale (extent / size) and a mode.
TF_HOST_DEVICE TF_INLINE int64_t taps_bound(double scale, int64_t mode, bool antialias) {
  if (mode == kNearest) return 1;
  if (!antialias) return 2;
  const double support = scale >= 1.0 ? scale : 1.0;
  return static_cast<int64_t>(2.0 * support) + 3;
}

// A launch's tile shape and table sizes, chosen on the host for the whole batch.
struct TilePlan {
  int64_t rows, cols;      // outputs per tile
  int64_t max_ky, max_kx;  // taps per output row / column, at most
  int64_t span;            // source columns one tile's vertical pass covers, at most
};

// Where a block's tables live in its shared memory (offsets in bytes; floats and ints, 4 bytes).
struct TileLayout {
  int64_t y_first, y_count, y_w, x_first, x_count, x_w, v, bytes;
};

TF_HOST_DEVICE TF_INLINE TileLayout tile_layout(const TilePlan& t, int64_t channels) {
  TileLayout l;
  l.y_first = 0;
  l.y_count = l.y_first + 4 * t.rows;
  l.y_w = l.y_count + 4 * t.rows;
  l.x_first = l.y_w + 4 * t.rows * t.max_ky;
  l.x_count = l.x_first + 4 * t.cols;
  l.x_w = l.x_count + 4 * t.cols;
  l.v = l.x_w + 4 * t.cols * t.max_kx;
  l.bytes = l.v + 4 * t.rows * t.span * channels;
  return l;
}

struct TileTables {
  int32_t *y_first, *y_count, *x_first, *x_count;
  float *y_w, *x_w, *v;  // v: [rows][span][channels]
};

TF_HOST_DEVICE TF_INLINE TileTables tile_tables(unsigned char* smem, const TileLayout& l) {
  return TileTables{
      reinterpret_cast<int32_t*>(smem + l.y_first), reinterpret_cast<int32_t*>(smem + l.y_count),
      reinterpret_cast<int32_t*>(smem + l.x_first), reinterpret_cast<int32_t*>(smem + l.x_count),
      reinterpret_cast<float*>(smem + l.y_w),       reinterpret_cast<float*>(smem + l.x_w),
      reinterpret_cast<float*>(smem + l.v)};
}

// Step 1, thread t of [0, rows + cols): the taps of tile row t, or of tile column t - rows
// (flipped). Rows and columns outside the output get no taps.
TF_HOST_DEVICE TF_INLINE void tile_taps(int64_t t, int64_t y0, int64_t x0, const AxisPlan& py,
                                        const AxisPlan& px, bool flip, const LaunchShape& p,
                                        const TilePlan& tp, const TileTables& tt) {
  const bool is_row = t < tp.rows;
  const int64_t i = is_row ? t : t - tp.rows;
  const int64_t o = (is_row ? y0 : x0) + i;
  const int64_t n = is_row ? p.out_h : p.out_w;
  int32_t* first = is_row ? tt.y_first : tt.x_first;
  int32_t* count = is_row ? tt.y_count : tt.x_count;
  float* w = (is_row ? tt.y_w : tt.x_w) + i * (is_row ? tp.max_ky : tp.max_kx);
  if (o >= n) {
    first[i] = is_row ? 0 : first[0];
    count[i] = 0;
    return;
  }
  const TapSpan s = is_row ? tap_span(py, o, p.mode, p.antialias)
                           : tap_span(px, flip_index(o, n, flip), p.mode, p.antialias);
  first[i] = static_cast<int32_t>(s.first);
  count[i] = static_cast<int32_t>(s.count);
  for (int64_t j = 0; j < s.count; ++j) w[j] = normalized_weight(s, j);
}

// The source columns [lo, hi) (relative to the x base) the tile's horizontal taps read: the
// taps move right as the resampled index grows, so the extremes are two columns' taps.
TF_HOST_DEVICE TF_INLINE void tile_window(const TileTables& tt, int64_t valid_cols, bool flip,
                                          int64_t* lo, int64_t* hi) {
  const int64_t a = flip ? valid_cols - 1 : 0, b = flip ? 0 : valid_cols - 1;
  *lo = tt.x_first[a];
  *hi = tt.x_first[b] + tt.x_count[b];
  if (*hi < *lo) *hi = *lo;
}

// Step 2, element i of v: row r, window column k, channel c (c fastest when the image's
// channels are interleaved, so that neighbouring threads read neighbouring bytes). Returns false
// if a tap falls outside the image or the window outside the plan (never, for checked inputs).
TF_HOST_DEVICE TF_INLINE bool tile_vertical(int64_t i, const ImageDesc& im, const AxisPlan& py,
                                            const AxisPlan& px, int64_t x_lo, int64_t x_hi,
                                            const LaunchShape& p, const TilePlan& tp,
                                            const TileTables& tt) {
  const int64_t width = x_hi - x_lo;
  if (width > tp.span) return false;
  const int64_t channels = p.channels;
  int64_t r, k, c;
  if (im.stride_c < im.stride_w) {  // interleaved (HWC memory): channel fastest
    c = i % channels;
    k = (i / channels) % tp.span;
    r = i / (channels * tp.span);
  } else {  // planar: column fastest
    k = i % tp.span;
    c = (i / tp.span) % channels;
    r = i / (tp.span * channels);
  }
  if (k >= width || tt.y_count[r] == 0) return true;
  const int64_t col = px.base + x_lo + k;
  const int64_t row = py.base + tt.y_first[r];
  if (col < 0 || col >= im.width || row < 0 || row + tt.y_count[r] > im.height) return false;
  const uint8_t* src = im.data + c * im.stride_c + row * im.stride_h + col * im.stride_w;
  const float* w = tt.y_w + r * tp.max_ky;
  float acc = 0.0f;
  for (int64_t j = 0; j < tt.y_count[r]; ++j) {
    acc = fmaf(w[j], static_cast<float>(src[j * im.stride_h]), acc);
  }
  tt.v[(r * tp.span + k) * channels + c] = acc;
  return true;
}

// Step 3, output i of the tile (row i / cols, column i % cols), every channel: the horizontal
// taps over v, then to_dtype + normalize. Calls store(offset, value) for each channel of an
// output inside the image.
template <typename Store>
TF_HOST_DEVICE TF_INLINE void tile_output(int64_t i, int64_t b, int64_t y0, int64_t x0,
                                          int64_t x_lo, const ChannelAffine* affine,
                                          const LaunchShape& p, const TilePlan& tp,
                                          const TileTables& tt, Store store) {
  const int64_t r = i / tp.cols, xc = i % tp.cols;
  const int64_t y = y0 + r, x = x0 + xc;
  if (y >= p.out_h || x >= p.out_w) return;
  const float* w = tt.x_w + xc * tp.max_kx;
  const float* v = tt.v + (r * tp.span + (tt.x_first[xc] - x_lo)) * p.channels;
  for (int64_t c = 0; c < p.channels; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < tt.x_count[xc]; ++j) acc = fmaf(w[j], v[j * p.channels + c], acc);
    store(b * p.osb + c * p.osc + y * p.osh + x * p.osw,
          fmaf(acc, affine[c].scale, affine[c].bias));
  }
}

}  // namespace torchfeed::cfn

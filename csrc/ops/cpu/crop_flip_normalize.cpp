// CPU launcher of the fused crop/flip/resize/normalize op: per image, weight tables computed
// once from ops/crop_flip_normalize.h, then per band of output rows a vertical pass over the rows
// the crop needs into float rows that stay in cache, then a horizontal pass that normalizes and
// writes the output once.
// Parallel over images and, for small batches, over blocks of output rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/cpu_isa.h"
#include "ops/crop_flip_normalize.h"
#include "ops/crop_flip_normalize_args.h"

// The passes, once for the baseline instruction set, once for AVX2+FMA and once for AVX-512
// (chosen at run time; the AVX-512 build has the AVX2 code paths too, TF_CPU_AVX2 set).
#define TF_CPU_ISA baseline
#include "ops/cpu/crop_flip_normalize_passes.h"
#undef TF_CPU_ISA
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TF_HAVE_SIMD_PASSES 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define TF_CPU_ISA avx2
#define TF_CPU_AVX2 1
#include "ops/cpu/crop_flip_normalize_passes.h"
#undef TF_CPU_ISA
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif
#define TF_CPU_ISA avx512
#define TF_CPU_AVX512 1
#include "ops/cpu/crop_flip_normalize_passes.h"
#undef TF_CPU_AVX512
#undef TF_CPU_AVX2
#undef TF_CPU_ISA
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace torchfeed {
namespace {

void run_block(const cfn::cpu::BlockJob& b, CpuIsa isa) {
#ifdef TF_HAVE_SIMD_PASSES
  if (isa == CpuIsa::kAvx512) return cfn::cpu::avx512::run_block(b);
  if (isa == CpuIsa::kAvx2) return cfn::cpu::avx2::run_block(b);
#endif
  cfn::cpu::baseline::run_block(b);
}

using cfn::AxisPlan;
using cfn::ChannelAffine;
using cfn::ImageDesc;

// Taps of a range of output indices along one axis, weights normalized and zero-padded to a
// common width so the inner loops have no per-index bounds.
struct AxisTable {
  std::vector<int64_t> first;  // first tap, relative to the axis base
  std::vector<float> weights;  // [n][width]
  int64_t width = 1;
  std::vector<cfn::TapSpan> spans;  // [n], kept between calls for its memory

  void build(const AxisPlan& p, int64_t begin, int64_t end, int64_t out_size, bool flip,
             int64_t mode, bool antialias) {
    const int64_t n = end - begin;
    first.resize(n);
    spans.resize(n);
    width = 1;
    // Spans first, to size the table.
    for (int64_t i = 0; i < n; ++i) {
      spans[i] = cfn::tap_range(p, cfn::flip_index(begin + i, out_size, flip), mode, antialias);
      width = std::max(width, spans[i].count);
    }
    weights.assign(n * width, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      cfn::TapSpan& s = spans[i];
      // Shift the window left at the far edge so that all `width` taps stay inside [0, hi);
      // the extra taps carry weight 0.
      const int64_t start = std::max<int64_t>(0, std::min(s.first, p.hi - width));
      first[i] = start;
      cfn::span_weights(&s, weights.data() + i * width + (s.first - start));
    }
  }
};

struct Scratch {
  AxisTable xs, ys;
  std::vector<int32_t> x_first;  // [x_pad]
  std::vector<float> x_weights;  // [kx][x_pad]
  std::vector<float> rows;       // [ny][C * cols]
  // AVX-512's transposed columns, 64-byte aligned (16 floats over, for the alignment)
  std::vector<float> columns;
};

Scratch& thread_scratch() {
  // Reused across calls: a fresh multi-megabyte buffer per image would cost page faults.
  thread_local Scratch scratch;
  return scratch;
}

struct Job {
  int64_t channels, out_h, out_w;
  int64_t mode;
  bool antialias;
  const ChannelAffine* affine;
  int64_t osb, osc, osh, osw;  // out strides
  cfn::cpu::OutType out_type;
  int64_t element_size;
};

void process(const ImageDesc& img, const double* geom, bool flip, const Job& job, int64_t y_begin,
             int64_t y_end, char* out /* image b's [C, H_out, W_out] */) {
  Scratch& s = thread_scratch();
  const AxisPlan py = cfn::plan_axis(cfn::load_axis(geom));
  const AxisPlan px = cfn::plan_axis(cfn::load_axis(geom + cfn::kGeomFields));
  s.ys.build(py, y_begin, y_end, job.out_h, false, job.mode, job.antialias);
  s.xs.build(px, 0, job.out_w, job.out_w, flip, job.mode, job.antialias);

  // Only the columns some horizontal tap reads (the crop, or the centre of a resized image).
  const int64_t kx = s.xs.width;
  int64_t x_lo = px.hi, x_hi = 0;
  for (int64_t f : s.xs.first) {
    x_lo = std::min(x_lo, f);
    x_hi = std::max(x_hi, f + kx);
  }
  // Tables for 8 (AVX2) or 16 (AVX-512) columns at a time: first tap as int32, weights
  // transposed to [kx][x_pad]; the padding columns read column 0 with weight 0.
  const int64_t x_pad = (job.out_w + 15) / 16 * 16;
  s.x_first.assign(x_pad, 0);
  s.x_weights.assign(kx * x_pad, 0.0f);
  for (int64_t x = 0; x < job.out_w; ++x) {
    s.x_first[x] = static_cast<int32_t>(s.xs.first[x] - x_lo);
    for (int64_t k = 0; k < kx; ++k) s.x_weights[k * x_pad + x] = s.xs.weights[x * kx + k];
  }
  const int64_t cols = x_hi - x_lo;
  const int64_t ny = y_end - y_begin;
  // Bands of output rows whose float rows fit in about half a core's L2 (128 KiB): each band's
  // vertical pass writes them and its horizontal pass reads them back while they are still in
  // cache (a whole block's rows, 4.8 MB for a 1792-pixel crop, went to memory and back).
  const int64_t row_floats = job.channels * cols;
  constexpr int64_t kBandBytes = 128 * 1024;
  // scratch rows hold all channels interleaved (as the source) or one plane per channel
  const bool interleaved = job.channels > 1 && img.stride_c == 1 && img.stride_w == job.channels;
  // AVX-512's horizontal pass takes 16 rows at a time: bands of 16 rows or more (up to 700 KB
  // of float rows at 16x, still inside a 1 MB L2).
  const CpuIsa isa = cpu_isa();
  int64_t band = std::clamp<int64_t>(kBandBytes / std::max<int64_t>(1, row_floats * 4), 1, ny);
  if (isa == CpuIsa::kAvx512) band = std::min(ny, std::max<int64_t>(16, band / 16 * 16));
  // + 16 zeroed floats: the horizontal passes read past a row's last pixel (the pixel-wise one
  // by one float, the AVX-512 transposition by up to 15)
  s.rows.resize(band * row_floats + 16);
  std::fill(s.rows.end() - 16, s.rows.end(), 0.0f);
  float* columns = nullptr;
  if (isa == CpuIsa::kAvx512) {
    // A chunk of output columns reads at most a plane's whole width (every tap lies in
    // [0, cols)), rounded up to 16 floats: 16 such transposed rows, 64-byte aligned.
    const int64_t plane = interleaved ? row_floats : cols;
    s.columns.resize((plane + 15) / 16 * 16 * 16 + 16);
    const uintptr_t address = reinterpret_cast<uintptr_t>(s.columns.data());
    columns = s.columns.data() + (64 - address % 64) % 64 / sizeof(float);
  }

  cfn::cpu::BlockJob b;
  b.src = img.data + py.base * img.stride_h + (px.base + x_lo) * img.stride_w;
  b.sc = img.stride_c;
  b.sh = img.stride_h;
  b.sw = img.stride_w;
  b.channels = job.channels;
  b.cols = cols;
  b.ky = s.ys.width;
  b.x_first = s.x_first.data();
  b.x_weights = s.x_weights.data();
  b.kx = kx;
  b.out_w = job.out_w;
  b.x_pad = x_pad;
  b.interleaved = interleaved;
  b.scratch = s.rows.data();
  b.columns = columns;
  b.affine = job.affine;
  b.osc = job.osc;
  b.osh = job.osh;
  b.osw = job.osw;
  b.out_type = job.out_type;
  for (int64_t i0 = 0; i0 < ny; i0 += band) {
    b.y_first = s.ys.first.data() + i0;
    b.y_weights = s.ys.weights.data() + i0 * b.ky;
    b.ny = std::min(band, ny - i0);
    b.out = out + (y_begin + i0) * job.osh * job.element_size;
    run_block(b, isa);
  }
}

void run(const char* op, const std::vector<ImageDesc>& images, int64_t channels,
         const at::Tensor& grid, const at::Tensor& flips, int64_t interpolation, bool antialias,
         at::ArrayRef<double> mean, at::ArrayRef<double> std, at::Tensor& out) {
  const int64_t batch = static_cast<int64_t>(images.size());
  const at::Tensor g = grid.contiguous();
  const at::Tensor f = flips.contiguous();
  const int64_t out_h = out.size(2), out_w = out.size(3);
  cfn::check_grid_values(op, g.data_ptr<double>(), batch, images, out_h, out_w);
  if (out.numel() == 0) return;
  const std::vector<ChannelAffine> affine = cfn::channel_affine(mean, std);
  const auto out_type = out.scalar_type() == at::kFloat  ? cfn::cpu::OutType::kFloat
                        : out.scalar_type() == at::kHalf ? cfn::cpu::OutType::kHalf
                                                         : cfn::cpu::OutType::kBFloat16;
  const Job job{channels,      out_h,         out_w,
                interpolation, antialias,     affine.data(),
                out.stride(0), out.stride(1), out.stride(2),
                out.stride(3), out_type,      static_cast<int64_t>(out.element_size())};
  // Enough tasks for every thread even when the batch is small; row blocks of >= 16 rows keep
  // the taps shared between blocks (re-read at block edges) a small fraction.
  const int64_t threads = at::get_num_threads();
  const int64_t blocks =
      std::clamp<int64_t>((2 * threads + batch - 1) / batch, 1, std::max<int64_t>(1, out_h / 16));
  const int64_t rows_per_block = (out_h + blocks - 1) / blocks;
  const double* gp = g.data_ptr<double>();
  const bool* fp = f.data_ptr<bool>();

  char* base = static_cast<char*>(out.data_ptr());
  const int64_t image_bytes = out.stride(0) * static_cast<int64_t>(out.element_size());
  at::parallel_for(0, batch * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / blocks;
      const int64_t y0 = (t % blocks) * rows_per_block;
      const int64_t y1 = std::min(out_h, y0 + rows_per_block);
      if (y0 >= y1) continue;
      process(images[b], gp + b * cfn::kGeomPerImage, fp[b], job, y0, y1, base + b * image_bytes);
    }
  });
}

void crop_flip_normalize_out_cpu(const at::Tensor& images,  // [B, C, H, W] uint8, any strides
                                 const at::Tensor& grid,    // [B, 10] float64, host
                                 const at::Tensor& flips,   // [B] bool, host
                                 int64_t interpolation, bool antialias, at::ArrayRef<double> mean,
                                 at::ArrayRef<double> std,
                                 at::Tensor& out) {  // [B, C, H_out, W_out] float
  constexpr const char* op = "crop_flip_normalize";
  const std::vector<cfn::ImageDesc> descs =
      cfn::checked_dense(op, images, {grid, flips, interpolation, mean, std, out});
  run(op, descs, images.size(1), grid, flips, interpolation, antialias, mean, std, out);
}

void crop_flip_normalize_list_out_cpu(at::TensorList images,  // B x [C, H_i, W_i] uint8
                                      const at::Tensor& grid, const at::Tensor& flips,
                                      int64_t interpolation, bool antialias,
                                      at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                      at::Tensor& out, bool images_hwc) {
  constexpr const char* op = "crop_flip_normalize_list";
  const std::vector<cfn::ImageDesc> descs =
      cfn::checked_list(op, images, images_hwc, {grid, flips, interpolation, mean, std, out});
  run(op, descs, out.size(1), grid, flips, interpolation, antialias, mean, std, out);
}

void crop_flip_normalize_packed_out_cpu(const at::Tensor& data,    // [N] uint8
                                        const at::Tensor& shapes,  // [B, 4] int64, host
                                        const at::Tensor& grid, const at::Tensor& flips,
                                        int64_t interpolation, bool antialias,
                                        at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                        at::Tensor& out, bool images_hwc) {
  constexpr const char* op = "crop_flip_normalize_packed";
  const std::vector<cfn::ImageDesc> descs = cfn::checked_packed(
      op, data, shapes, images_hwc, {grid, flips, interpolation, mean, std, out});
  run(op, descs, out.size(1), grid, flips, interpolation, antialias, mean, std, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CPU, m) {
  m.impl("crop_flip_normalize_out", &crop_flip_normalize_out_cpu);
  m.impl("crop_flip_normalize_list_out", &crop_flip_normalize_list_out_cpu);
  m.impl("crop_flip_normalize_packed_out", &crop_flip_normalize_packed_out_cpu);
}

}  // namespace torchfeed

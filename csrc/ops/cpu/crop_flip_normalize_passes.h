// The two resampling passes of the CPU crop/flip/normalize kernel, for one block of output rows
// of one image. crop_flip_normalize.cpp includes this twice: once for the baseline instruction
// set and once under a target pragma for AVX2+FMA, each time with TF_CPU_ISA naming the
// namespace (and TF_CPU_AVX2 set for the second). A pragma rather than a second file compiled
// with -mavx2: inline functions of shared headers then stay baseline code, so the linker can
// never hand the baseline path an AVX2 copy of them.
//
// Order: vertical first, on the uint8 rows (contiguous, so it vectorizes), into a float row per
// output row; then horizontal, which gathers the taps, applies finish() and stores the output.
// The CUDA kernel runs the same two passes in the same order with the same tap functions
// (ops/crop_flip_normalize.h), so both accumulate 0 + w0 * v0 + w1 * v1 + ...
// No include guard: included once per instruction set.

#ifndef TF_CPU_ISA
#error "define TF_CPU_ISA before including crop_flip_normalize_passes.h"
#endif

#ifndef TORCHFEED_CFN_BLOCK_JOB
#define TORCHFEED_CFN_BLOCK_JOB
namespace torchfeed::cfn::cpu {

enum class OutType { kFloat, kHalf, kBFloat16 };

// One block of output rows of one image.
struct BlockJob {
  // source pixel (channel c, row r, column k), rows and columns relative to the axis bases:
  // src[c * sc + r * sh + k * sw]
  const uint8_t* src;
  int64_t sc, sh, sw;
  int64_t channels;
  int64_t cols;  // the horizontal taps read columns [0, cols)
  // vertical taps per output row of the block: first source row, weights [ny][ky]
  const int64_t* y_first;
  const float* y_weights;
  int64_t ky, ny;
  // horizontal taps per output column: first column (int32), weights transposed [kx][x_pad]
  const int32_t* x_first;
  const float* x_weights;
  int64_t kx, out_w, x_pad;
  // interleaved: scratch rows hold all channels interleaved (source with sc == 1, sw == C);
  // otherwise one plane per channel
  bool interleaved;
  float* scratch;  // [ny][channels * cols], then 16 floats of slack
  float* columns;  // AVX-512: the transposed columns of 16 scratch rows (64-byte aligned)
  const ChannelAffine* affine;
  void* out;  // element (c, i, x) of the block at out[c * osc + i * osh + x * osw]
  int64_t osc, osh, osw;
  OutType out_type;
};

}  // namespace torchfeed::cfn::cpu
#endif  // TORCHFEED_CFN_BLOCK_JOB

namespace torchfeed::cfn::cpu::TF_CPU_ISA {

// scratch row i = sum_k w[i][k] * source row (first[i] + k), over the columns the taps read.
#ifdef TF_CPU_AVX2
// Columns [t, n) of one scratch row, one at a time: the tail of the vector loops below, with
// the same fused multiply-adds in the same order.
inline void column_sums(const uint8_t* row, int64_t sh, const float* w, int64_t ky, int64_t t,
                        int64_t n, float* d) {
  for (; t < n; ++t) {
    float a = 0.0f;
    for (int64_t k = 0; k < ky; ++k) a = std::fma(w[k], static_cast<float>(row[t + k * sh]), a);
    d[t] = a;
  }
}
#endif

#if defined(TF_CPU_AVX2) && !defined(TF_CPU_AVX512)
// 8 bytes as 8 floats.
inline __m256 bytes_to_floats(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Row i of the block, for n contiguous bytes per source row: dst + i * dst_stride gets
// sum_k w[i][k] * src[(first[i] + k) * sh + x]. In panels of kPanel columns, every output row
// of a panel before the next panel: the source rows a panel reads (ky of them per output row,
// each shared by about two output rows at a downscale) stay in cache until the next output row
// reads them again, while each row's part is still read contiguously. Each sum is kept in a
// register over all its taps (8 independent chains of FMAs) and written once: the same fused
// multiply-adds in the same order as the scalar loop, so the same bits.
inline void vertical_runs(const uint8_t* __restrict__ src, int64_t sh, const int64_t* first,
                          const float* weights, int64_t ky, int64_t ny, int64_t n,
                          float* __restrict__ dst, int64_t dst_stride) {
  constexpr int64_t kPanel = 512;
  constexpr int64_t kPrefetch = 512;  // bytes ahead in the same row: 8 blocks
  const int64_t whole = n / 64 * 64;
  for (int64_t x0 = 0; x0 < whole; x0 += kPanel) {
    const int64_t x1 = std::min(whole, x0 + kPanel);
    for (int64_t i = 0; i < ny; ++i) {
      const float* w = weights + i * ky;
      const uint8_t* row = src + first[i] * sh;
      float* d = dst + i * dst_stride;
      for (int64_t x = x0; x < x1; x += 64) {
        const uint8_t* p = row + x;
        __m256 a[8];
        for (int q = 0; q < 8; ++q) a[q] = _mm256_setzero_ps();
        for (int64_t k = 0; k < ky; ++k, p += sh) {
          // Each tap row is read 64 bytes at a time, a page apart from the next tap's: too
          // many streams for the hardware prefetcher at a large downscale (33 taps at 16x,
          // where this halves the pass), so ask for the panel's next lines ourselves.
          _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
          const __m256 wk = _mm256_set1_ps(w[k]);
          for (int q = 0; q < 8; ++q) a[q] = _mm256_fmadd_ps(wk, bytes_to_floats(p + 8 * q), a[q]);
        }
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(d + x + 8 * q, a[q]);
      }
    }
  }
  const int64_t x = whole;
  for (int64_t i = 0; i < ny; ++i) {
    const float* w = weights + i * ky;
    const uint8_t* row = src + first[i] * sh;
    float* d = dst + i * dst_stride;
    int64_t t = x;
    for (; t + 8 <= n; t += 8) {
      __m256 a = _mm256_setzero_ps();
      const uint8_t* p = row + t;
      for (int64_t k = 0; k < ky; ++k, p += sh) {
        a = _mm256_fmadd_ps(_mm256_set1_ps(w[k]), bytes_to_floats(p), a);
      }
      _mm256_storeu_ps(d + t, a);
    }
    column_sums(row, sh, w, ky, t, n, d);
  }
}
#endif

#ifdef TF_CPU_AVX512
// 16 bytes as 16 floats.
inline __m512 bytes_to_floats16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// 64 columns of up to two output rows: row 0 sums w0[k] * tap row k for k in [0, ky); row 1
// (when `two`) sums w1[k] * tap row d + k, 0 <= d < ky. Rows d .. ky - 1 are tap rows of both:
// each is loaded and converted once and multiplied into both sums (at a downscale by f,
// neighbouring output rows share about ky - f of their ky rows). Each sum still takes its own
// taps in order, the same fused multiply-adds as one row at a time: the same bits.
template <bool two>
inline void rows64(const uint8_t* p, int64_t sh, const float* w0, const float* w1, int64_t ky,
                   int64_t d, float* o0, float* o1) {
  constexpr int64_t kPrefetch = 512;  // bytes ahead in the same row, as in vertical_runs
  __m512 s0[4], s1[4];
  for (int q = 0; q < 4; ++q) s0[q] = s1[q] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k < (two ? d : ky); ++k, p += sh) {  // row 0's taps alone
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
    const __m512 w = _mm512_set1_ps(w0[k]);
    for (int q = 0; q < 4; ++q) s0[q] = _mm512_fmadd_ps(w, bytes_to_floats16(p + 16 * q), s0[q]);
  }
  if constexpr (two) {
    for (; k < ky; ++k, p += sh) {  // shared
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
      const __m512 a = _mm512_set1_ps(w0[k]), b = _mm512_set1_ps(w1[k - d]);
      for (int q = 0; q < 4; ++q) {
        const __m512 v = bytes_to_floats16(p + 16 * q);
        s0[q] = _mm512_fmadd_ps(a, v, s0[q]);
        s1[q] = _mm512_fmadd_ps(b, v, s1[q]);
      }
    }
    for (; k < ky + d; ++k, p += sh) {  // row 1's alone
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
      const __m512 w = _mm512_set1_ps(w1[k - d]);
      for (int q = 0; q < 4; ++q) s1[q] = _mm512_fmadd_ps(w, bytes_to_floats16(p + 16 * q), s1[q]);
    }
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(o1 + 16 * q, s1[q]);
  }
  for (int q = 0; q < 4; ++q) _mm512_storeu_ps(o0 + 16 * q, s0[q]);
}

// vertical_runs with AVX-512: output rows in pairs that share their common tap rows (rows64),
// in panels of columns as below; the last < 64 columns 16 and then 1 at a time.
inline void vertical_runs(const uint8_t* __restrict__ src, int64_t sh, const int64_t* first,
                          const float* weights, int64_t ky, int64_t ny, int64_t n,
                          float* __restrict__ dst, int64_t dst_stride) {
  constexpr int64_t kPanel = 512;
  const int64_t whole = n / 64 * 64;
  for (int64_t x0 = 0; x0 < whole; x0 += kPanel) {
    const int64_t x1 = std::min(whole, x0 + kPanel);
    for (int64_t i = 0; i < ny; i += 2) {
      const float* w = weights + i * ky;
      const uint8_t* row = src + first[i] * sh;
      float* o = dst + i * dst_stride;
      const int64_t d = i + 1 < ny ? first[i + 1] - first[i] : ky;
      if (d >= 0 && d < ky) {
        for (int64_t x = x0; x < x1; x += 64) {
          rows64<true>(row + x, sh, w, w + ky, ky, d, o + x, o + dst_stride + x);
        }
        continue;
      }
      for (int64_t r = i; r < std::min(ny, i + 2); ++r) {  // no rows in common
        for (int64_t x = x0; x < x1; x += 64) {
          rows64<false>(src + first[r] * sh + x, sh, weights + r * ky, nullptr, ky, 0,
                        dst + r * dst_stride + x, nullptr);
        }
      }
    }
  }
  for (int64_t i = 0; i < ny; ++i) {
    const float* w = weights + i * ky;
    const uint8_t* row = src + first[i] * sh;
    float* d = dst + i * dst_stride;
    int64_t t = whole;
    for (; t + 16 <= n; t += 16) {
      __m512 a = _mm512_setzero_ps();
      const uint8_t* p = row + t;
      for (int64_t k = 0; k < ky; ++k, p += sh) {
        a = _mm512_fmadd_ps(_mm512_set1_ps(w[k]), bytes_to_floats16(p), a);
      }
      _mm512_storeu_ps(d + t, a);
    }
    column_sums(row, sh, w, ky, t, n, d);
  }
}
#endif

template <int K>  // K taps (0: runtime)
void vertical(const BlockJob& j) {
  // Fields in locals, pointers restrict: the float stores would otherwise make the compiler
  // reload the job's fields in the inner loops (and give up vectorizing them).
  const int64_t ky = K > 0 ? K : j.ky;
  const int64_t channels = j.channels, cols = j.cols, ny = j.ny;
  const int64_t sc = j.sc, sh = j.sh, sw = j.sw;
  const int64_t width = channels * cols;
  const uint8_t* __restrict__ src = j.src;
  const int64_t* __restrict__ y_first = j.y_first;
  const float* __restrict__ y_weights = j.y_weights;
  float* __restrict__ scratch = j.scratch;
  const bool contiguous = j.interleaved || (sw == 1 && channels == 1);
#ifdef TF_CPU_AVX2
  if (contiguous) {  // one contiguous run of bytes per row covers every channel
    vertical_runs(src, sh, y_first, y_weights, ky, ny, width, scratch, width);
    return;
  }
  if (sw == 1) {  // planes: one run per channel
    for (int64_t c = 0; c < channels; ++c) {
      vertical_runs(src + c * sc, sh, y_first, y_weights, ky, ny, cols, scratch + c * cols, width);
    }
    return;
  }
#endif
  for (int64_t i = 0; i < ny; ++i) {
    const float* w = y_weights + i * ky;
    const uint8_t* first = src + y_first[i] * sh;
    float* __restrict__ dst = scratch + i * width;
    if (contiguous) {
      // one contiguous run of bytes covers every channel
      const float w0 = w[0];
      for (int64_t x = 0; x < width; ++x) dst[x] = 0.0f + w0 * static_cast<float>(first[x]);
      for (int64_t k = 1; k < ky; ++k) {
        const uint8_t* __restrict__ row = first + k * sh;
        const float wk = w[k];
        for (int64_t x = 0; x < width; ++x) dst[x] += wk * static_cast<float>(row[x]);
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        const uint8_t* plane = first + c * sc;
        float* __restrict__ d = dst + c * cols;
        const float w0 = w[0];
        if (sw == 1) {
          for (int64_t x = 0; x < cols; ++x) d[x] = 0.0f + w0 * static_cast<float>(plane[x]);
          for (int64_t k = 1; k < ky; ++k) {
            const uint8_t* __restrict__ row = plane + k * sh;
            const float wk = w[k];
            for (int64_t x = 0; x < cols; ++x) d[x] += wk * static_cast<float>(row[x]);
          }
        } else {
          for (int64_t x = 0; x < cols; ++x) d[x] = 0.0f + w0 * static_cast<float>(plane[x * sw]);
          for (int64_t k = 1; k < ky; ++k) {
            const uint8_t* __restrict__ row = plane + k * sh;
            const float wk = w[k];
            for (int64_t x = 0; x < cols; ++x) d[x] += wk * static_cast<float>(row[x * sw]);
          }
        }
      }
    }
  }
}

template <typename OutT>
inline void store(OutT* out, int64_t stride, const float* values, int64_t n) {
  for (int64_t x = 0; x < n; ++x) out[x * stride] = static_cast<OutT>(values[x]);
}

// out[c][i][x] = finish(sum_k w[k][x] * scratch row i at column first[x] + k, channel c).
template <int K, typename OutT>
void horizontal(const BlockJob& j) {
  const int64_t kx = K > 0 ? K : j.kx;
  const int64_t channels = j.channels, cols = j.cols, ny = j.ny, out_w = j.out_w;
  const int64_t x_pad = j.x_pad, osc = j.osc, osh = j.osh, osw = j.osw;
  const int64_t width = channels * cols;
  const bool interleaved = j.interleaved;
  const int64_t step = interleaved ? channels : 1;  // distance between columns
  const int32_t* __restrict__ x_first = j.x_first;
  const float* __restrict__ x_weights = j.x_weights;
  const float* __restrict__ scratch = j.scratch;
  OutT* __restrict__ out_base = static_cast<OutT*>(j.out);
  alignas(32) float lanes[8];
  for (int64_t i = 0; i < ny; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const float* row = scratch + i * width + (interleaved ? c : c * cols);
      const ChannelAffine a = j.affine[c];
      OutT* out = out_base + c * osc + i * osh;
      for (int64_t x0 = 0; x0 < out_w; x0 += 8) {
#ifdef TF_CPU_AVX2
        const __m256i first =
            _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_first + x0)),
                               _mm256_set1_epi32(static_cast<int>(step)));
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = 0; k < kx; ++k) {
          const __m256i idx =
              _mm256_add_epi32(first, _mm256_set1_epi32(static_cast<int>(k * step)));
          const __m256 v = _mm256_i32gather_ps(row, idx, 4);
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(x_weights + k * x_pad + x0), v, acc);
        }
        acc = _mm256_fmadd_ps(acc, _mm256_set1_ps(a.scale), _mm256_set1_ps(a.bias));
        _mm256_store_ps(lanes, acc);
#else
        for (int l = 0; l < 8; ++l) {
          const float* p = row + x_first[x0 + l] * step;
          float acc = 0.0f;
          for (int64_t k = 0; k < kx; ++k) acc += x_weights[k * x_pad + x0 + l] * p[k * step];
          lanes[l] = finish(acc, a);
        }
#endif
        const int64_t n = out_w - x0 < 8 ? out_w - x0 : 8;
        if constexpr (std::is_same_v<OutT, float>) {
#ifdef TF_CPU_AVX2
          if (n == 8 && osw == 1) {
            _mm256_storeu_ps(out + x0, acc);
            continue;
          }
#endif
        }
        store(out + x0 * osw, osw, lanes, n);
      }
    }
  }
}

#ifdef TF_CPU_AVX2
// Pixels l and l + 4 of eight ([c0 c1 c2 c3] each) -> one vector per channel, then finish() and
// the stores of output row `out` (channel c at out + c * osc, columns at osw apart).
template <typename OutT>
inline void store_pixels(const __m256 (&pair)[4], int64_t channels, const __m256* scale,
                         const __m256* bias, int64_t n, OutT* out, int64_t osc, int64_t osw) {
  // a 4 x 4 transpose per half
  const __m256 lo01 = _mm256_unpacklo_ps(pair[0], pair[1]);  // c0 c0 c1 c1 of pixels 0 1 | 4 5
  const __m256 hi01 = _mm256_unpackhi_ps(pair[0], pair[1]);  // c2 c2 c3 c3
  const __m256 lo23 = _mm256_unpacklo_ps(pair[2], pair[3]);
  const __m256 hi23 = _mm256_unpackhi_ps(pair[2], pair[3]);
  const __m256 channel[4] = {
      _mm256_shuffle_ps(lo01, lo23, 0x44), _mm256_shuffle_ps(lo01, lo23, 0xEE),
      _mm256_shuffle_ps(hi01, hi23, 0x44), _mm256_shuffle_ps(hi01, hi23, 0xEE)};
  alignas(32) float lanes[8];
  for (int64_t c = 0; c < channels; ++c) {
    const __m256 v = _mm256_fmadd_ps(channel[c], scale[c], bias[c]);
    if constexpr (std::is_same_v<OutT, float>) {
      if (n == 8 && osw == 1) {
        _mm256_storeu_ps(out + c * osc, v);
        continue;
      }
    }
    _mm256_store_ps(lanes, v);
    store(out + c * osc, osw, lanes, n);
  }
}

// The horizontal pass for interleaved rows of 3 or 4 channels: all channels of one output pixel
// at once, from plain 4-float loads of each tap's pixel (one load per tap instead of one
// 8-lane gather per channel and tap), then 8 pixels transposed to one vector per channel.
// Two output rows at a time (they share every tap's column and weight): row i's pixel in the
// low half of a register, row i + 1's in the high half, one weight broadcast and one 8-lane
// multiply-add for both. Taps outside, pixels inside: eight independent chains of multiply-adds
// in flight (one chain would wait out each one's latency), each sum still over its taps in
// order, the same products as horizontal(): bit-identical results. A tap of the last pixel of
// a row reads one float past it (the next row's, or the scratch buffer's zeroed slack); that
// lane is dropped.
template <int K, typename OutT>
void horizontal_pixels(const BlockJob& j) {
  // Every field in a local: the stores below go through OutT*, which the compiler cannot tell
  // apart from the job's own fields, so it would reload them at every pixel.
  const int64_t kx = K > 0 ? K : j.kx;
  const int64_t channels = j.channels, out_w = j.out_w, x_pad = j.x_pad, ny = j.ny;
  const int64_t width = channels * j.cols;
  const int64_t step = channels;
  const int64_t osc = j.osc, osh = j.osh, osw = j.osw;
  const int32_t* __restrict__ x_first = j.x_first;
  const float* __restrict__ x_weights = j.x_weights;
  const float* __restrict__ scratch = j.scratch;
  OutT* __restrict__ out_base = static_cast<OutT*>(j.out);
  __m256 scale[4], bias[4];
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = _mm256_set1_ps(j.affine[c].scale);
    bias[c] = _mm256_set1_ps(j.affine[c].bias);
  }
  for (int64_t i = 0; i < ny; i += 2) {
    const float* row = scratch + i * width;
    // a last odd row pairs with itself (the same loads twice; its copy is not stored)
    const int64_t next = i + 1 < ny ? width : 0;
    for (int64_t x0 = 0; x0 < out_w; x0 += 8) {
      const float* p[8];  // the padding columns read column 0 with weight 0
      __m256 acc[8];
      for (int l = 0; l < 8; ++l) {
        p[l] = row + int64_t{x_first[x0 + l]} * step;
        acc[l] = _mm256_setzero_ps();
      }
      const float* w = x_weights + x0;
      for (int64_t k = 0; k < kx; ++k, w += x_pad) {
        const int64_t at = k * step;
        for (int l = 0; l < 8; ++l) {
          const __m256 v = _mm256_loadu2_m128(p[l] + at + next, p[l] + at);
          acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(w[l]), v, acc[l]);
        }
      }
      const int64_t n = out_w - x0 < 8 ? out_w - x0 : 8;
      OutT* out = out_base + i * osh + x0 * osw;
      // row i: the low halves of pixels l and l + 4; row i + 1: the high halves
      const __m256 low[4] = {_mm256_permute2f128_ps(acc[0], acc[4], 0x20),
                             _mm256_permute2f128_ps(acc[1], acc[5], 0x20),
                             _mm256_permute2f128_ps(acc[2], acc[6], 0x20),
                             _mm256_permute2f128_ps(acc[3], acc[7], 0x20)};
      store_pixels<OutT>(low, channels, scale, bias, n, out, osc, osw);
      if (next == 0) continue;
      const __m256 high[4] = {_mm256_permute2f128_ps(acc[0], acc[4], 0x31),
                              _mm256_permute2f128_ps(acc[1], acc[5], 0x31),
                              _mm256_permute2f128_ps(acc[2], acc[6], 0x31),
                              _mm256_permute2f128_ps(acc[3], acc[7], 0x31)};
      store_pixels<OutT>(high, channels, scale, bias, n, out + osh, osc, osw);
    }
  }
}
#endif

#ifdef TF_CPU_AVX512
// Transposes 16 x 16 floats held in registers: afterwards r[j] holds what was lane j of each.
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: pairs of rows interleaved
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[4a + m], lane q: rows 4a .. 4a + 3 of column 4q + m
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {  // then the 128-bit lanes
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Columns at .. at + 15 of 16 rows, transposed: afterwards r[q] holds column at + q, row j in
// lane j. The 128-bit lanes are put in place by the loads themselves (one load and three
// inserts from memory, which need no shuffle port), so only the 4 x 4 transpositions inside
// each 128-bit lane are shuffles: half of transpose16()'s.
inline void load_transposed16(const float* const (&row)[16], int64_t at, __m512 (&r)[16]) {
  for (int qb = 0; qb < 4; ++qb) {  // columns 4 qb .. 4 qb + 3
    __m512 a[4];                    // a[i]: lane b holds row 4 b + i's four columns
    for (int i = 0; i < 4; ++i) {
      const float* p = row[i] + at + 4 * qb;
      __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(p));
      v = _mm512_insertf32x4(v, _mm_loadu_ps(row[4 + i] + at + 4 * qb), 1);
      v = _mm512_insertf32x4(v, _mm_loadu_ps(row[8 + i] + at + 4 * qb), 2);
      a[i] = _mm512_insertf32x4(v, _mm_loadu_ps(row[12 + i] + at + 4 * qb), 3);
    }
    const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
    const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
    r[4 * qb] = _mm512_shuffle_ps(t0, t2, 0x44);
    r[4 * qb + 1] = _mm512_shuffle_ps(t0, t2, 0xEE);
    r[4 * qb + 2] = _mm512_shuffle_ps(t1, t3, 0x44);
    r[4 * qb + 3] = _mm512_shuffle_ps(t1, t3, 0xEE);
  }
}

// The horizontal pass with AVX-512: 16 output rows at a time, one row per lane. For each chunk
// of 16 output pixels, the floats its taps read from the 16 scratch rows are transposed into
// `columns` (16 x 16 at a time), where one tap of one channel is a single aligned 16-float load
// for all 16 rows: one load and one multiply-add per tap (the pixel-wise pass needs two
// half-register loads, an insert and a multiply-add for two rows' three channels). Each sum is
// still one chain over its taps in order, the same products as horizontal(): the same bits.
// The 16 x 16 sums (pixels x rows) are transposed back to rows, finished and stored.
template <int K, typename OutT>
void horizontal_rows16(const BlockJob& j) {
  const int64_t kx = K > 0 ? K : j.kx;
  const int64_t channels = j.channels, cols = j.cols, ny = j.ny, out_w = j.out_w;
  const int64_t x_pad = j.x_pad, osc = j.osc, osh = j.osh, osw = j.osw;
  const int64_t width = channels * cols;
  const bool interleaved = j.interleaved;
  const int64_t step = interleaved ? channels : 1;  // floats between neighbouring columns
  const int64_t planes = interleaved ? 1 : channels;
  const int32_t* __restrict__ x_first = j.x_first;
  const float* __restrict__ x_weights = j.x_weights;
  float* __restrict__ columns = j.columns;
  OutT* __restrict__ out_base = static_cast<OutT*>(j.out);
  alignas(64) float lanes[16];
  for (int64_t i0 = 0; i0 < ny; i0 += 16) {
    const int64_t rows = std::min<int64_t>(16, ny - i0);
    const float* row[16];  // a group of fewer rows repeats its last (not stored)
    for (int r = 0; r < 16; ++r) row[r] = j.scratch + std::min<int64_t>(i0 + r, ny - 1) * width;
    for (int64_t x0 = 0; x0 < out_w; x0 += 16) {
      const int64_t n = std::min<int64_t>(16, out_w - x0);
      int64_t lo = x_first[x0], hi = x_first[x0];  // flipped rows run backwards
      for (int64_t l = 1; l < n; ++l) {
        lo = std::min<int64_t>(lo, x_first[x0 + l]);
        hi = std::max<int64_t>(hi, x_first[x0 + l]);
      }
      const int64_t span = (hi + kx - lo) * step;  // floats of each plane the chunk reads
      int64_t at[16];  // where each pixel's first tap is in `columns` (padding: anywhere)
      for (int64_t l = 0; l < 16; ++l) at[l] = l < n ? (x_first[x0 + l] - lo) * step * 16 : 0;
      for (int64_t plane = 0; plane < planes; ++plane) {
        const int64_t begin = interleaved ? lo * channels : plane * cols + lo;
        for (int64_t f0 = 0; f0 < span; f0 += 16) {  // reads up to 15 floats past: slack
          __m512 v[16];
          load_transposed16(row, begin + f0, v);
          for (int q = 0; q < 16; ++q) _mm512_store_ps(columns + (f0 + q) * 16, v[q]);
        }
        for (int64_t c = interleaved ? 0 : plane; c < (interleaved ? channels : plane + 1); ++c) {
          const float* tap = columns + (interleaved ? c : 0) * 16;
          __m512 acc[16];
          for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
          const float* w = x_weights + x0;
          for (int64_t k = 0; k < kx; ++k, w += x_pad, tap += step * 16) {
            for (int l = 0; l < 16; ++l) {
              acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(w[l]), _mm512_load_ps(tap + at[l]), acc[l]);
            }
          }
          transpose16(acc);  // acc[r]: the 16 pixels of row i0 + r
          const __m512 scale = _mm512_set1_ps(j.affine[c].scale);
          const __m512 bias = _mm512_set1_ps(j.affine[c].bias);
          for (int64_t r = 0; r < rows; ++r) {
            const __m512 v = _mm512_fmadd_ps(acc[r], scale, bias);
            OutT* out = out_base + c * osc + (i0 + r) * osh + x0 * osw;
            if constexpr (std::is_same_v<OutT, float>) {
              if (n == 16 && osw == 1) {
                _mm512_storeu_ps(out, v);
                continue;
              }
            }
            _mm512_store_ps(lanes, v);
            store(out, osw, lanes, n);
          }
        }
      }
    }
  }
}
#endif

template <int K, typename OutT>
void horizontal_pass(const BlockJob& j) {
#ifdef TF_CPU_AVX512
  return horizontal_rows16<K, OutT>(j);
#elif defined(TF_CPU_AVX2)
  if (j.interleaved && (j.channels == 3 || j.channels == 4)) {
    return horizontal_pixels<K, OutT>(j);
  }
#endif
  horizontal<K, OutT>(j);
}

template <int K>
void horizontal_any(const BlockJob& j) {
  switch (j.out_type) {
    case OutType::kFloat:
      return horizontal_pass<K, float>(j);
    case OutType::kHalf:
      return horizontal_pass<K, c10::Half>(j);
    case OutType::kBFloat16:
      return horizontal_pass<K, c10::BFloat16>(j);
  }
}

inline void run_block(const BlockJob& j) {
  switch (j.ky) {
    case 1:
      vertical<1>(j);
      break;
    case 2:
      vertical<2>(j);
      break;
    case 3:
      vertical<3>(j);
      break;
    case 4:
      vertical<4>(j);
      break;
    case 5:
      vertical<5>(j);
      break;
    case 6:
      vertical<6>(j);
      break;
    default:
      vertical<0>(j);
      break;
  }
  switch (j.kx) {
    case 1:
      return horizontal_any<1>(j);
    case 2:
      return horizontal_any<2>(j);
    case 3:
      return horizontal_any<3>(j);
    case 4:
      return horizontal_any<4>(j);
    case 5:
      return horizontal_any<5>(j);
    case 6:
      return horizontal_any<6>(j);
    default:
      return horizontal_any<0>(j);
  }
}

}  // namespace torchfeed::cfn::cpu::TF_CPU_ISA

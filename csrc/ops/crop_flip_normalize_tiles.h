// The host's choice of the one-pass kernel's tile shape for a batch (ops/crop_flip_normalize.h:
// TilePlan), shared by the CUDA launcher and its CPU emulation. No torch includes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/crop_flip_normalize.h"

namespace torchfeed::cfn {

// The largest tile whose tables and intermediate fit in `smem_budget` bytes, for the most
// extreme scale of the batch; false when none does (then the two-pass kernel runs). The span
// bound: the taps of `cols` consecutive outputs start at most ceil(cols * scale) + 1 apart, and
// the last one reaches max_kx further.
inline bool plan_tiles(const double* grid, int64_t batch, const LaunchShape& p, int64_t smem_budget,
                       TilePlan* plan) {
  double sy = 0.0, sx = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const double* g = grid + b * kGeomPerImage;
    sy = std::max(sy, static_cast<double>(plan_axis(load_axis(g)).scale));
    sx = std::max(sx, static_cast<double>(plan_axis(load_axis(g + kGeomFields)).scale));
  }
  static constexpr int64_t kShapes[][2] = {{16, 32}, {8, 32}, {8, 16}, {4, 16}, {4, 8},
                                           {2, 8},   {1, 8},  {1, 4},  {1, 2},  {1, 1}};
  for (const auto& shape : kShapes) {
    TilePlan t;
    t.rows = shape[0];
    t.cols = shape[1];
    t.max_ky = taps_bound(sy, p.mode, p.antialias);
    t.max_kx = taps_bound(sx, p.mode, p.antialias);
    t.span = static_cast<int64_t>(std::ceil(static_cast<double>(t.cols) * sx)) + t.max_kx + 2;
    const bool grid_fits = (p.out_h + t.rows - 1) / t.rows <= 65535 && p.batch <= 65535 &&
                           (p.out_w + t.cols - 1) / t.cols <= 2147483647;
    if (grid_fits && tile_layout(t, p.channels).bytes <= smem_budget) {
      *plan = t;
      return true;
    }
  }
  return false;
}

}  // namespace torchfeed::cfn

// CPU launcher of the fused pad-and-mask op: one output allocation, one pass over the real
// elements (copied row block by row block), pads and mask written around them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "common/element_bits.h"
#include "ops/pad.h"
#include "ops/pad_args.h"

namespace torchfeed {
namespace {

// Writes `count` copies of the element whose bytes are at `pattern`.
void fill_elements(char* dst, int64_t count, const char* pattern, int64_t element_size) {
  if (count <= 0) return;
  const bool uniform_bytes =
      std::all_of(pattern, pattern + element_size, [&](char c) { return c == pattern[0]; });
  if (uniform_bytes) {  // 0, -1, false/true, ...: memset is the fastest fill there is
    std::memset(dst, pattern[0], static_cast<size_t>(count * element_size));
    return;
  }
  dispatch_element_bits(element_size, "pad", [&](auto tag) {
    using T = decltype(tag);
    std::fill_n(reinterpret_cast<T*>(dst), count, load_bits<T>(pattern));
  });
}

struct RowLayout {
  int64_t length;
  int64_t max_length;
  bool left_pad;
  bool truncate_left;
  int64_t row_bytes;  // bytes of one element row ([*feat])
  int64_t element_size;
};

// Pads B sequences; seq(b) returns {pointer to the first row, number of rows} of sequence b,
// rows contiguous.
template <typename SeqFn>
void pad_rows(int64_t batch, SeqFn seq, const RowLayout& layout, const char* pad_bytes,
              pad::Outputs& out) {
  char* padded = static_cast<char*>(out.padded.data_ptr());
  bool* mask = out.mask.data_ptr<bool>();
  int64_t* lengths = out.lengths.data_ptr<int64_t>();
  const int64_t L = layout.length;
  const int64_t out_row_bytes = L * layout.row_bytes;
  const int64_t elements_per_row = layout.row_bytes / std::max<int64_t>(layout.element_size, 1);
  // ~64 KiB of output per task: small batches stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(out_row_bytes, 1));

  at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const auto [src, n] = seq(b);
      const pad::Window w =
          pad::window(n, L, layout.max_length, layout.left_pad, layout.truncate_left);
      char* row = padded + b * out_row_bytes;
      const int64_t tail = L - w.out_start - w.kept;
      fill_elements(row, w.out_start * elements_per_row, pad_bytes, layout.element_size);
      if (w.kept > 0) {
        std::memcpy(row + w.out_start * layout.row_bytes, src + w.src_skip * layout.row_bytes,
                    static_cast<size_t>(w.kept * layout.row_bytes));
      }
      fill_elements(row + (w.out_start + w.kept) * layout.row_bytes, tail * elements_per_row,
                    pad_bytes, layout.element_size);
      bool* m = mask + b * L;
      std::memset(m, 0, static_cast<size_t>(w.out_start));
      std::memset(m + w.out_start, 1, static_cast<size_t>(w.kept));
      std::memset(m + w.out_start + w.kept, 0, static_cast<size_t>(tail));
      lengths[b] = w.kept;
    }
  });
}

RowLayout make_layout(const at::Tensor& like, int64_t length, int64_t max_length, bool left_pad,
                      bool truncate_left) {
  const int64_t element_size = static_cast<int64_t>(like.element_size());
  return RowLayout{
      length,      max_length, left_pad, truncate_left, pad::row_numel(like) * element_size,
      element_size};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pad_packed_cpu(
    const at::Tensor& values,   // [N, *feat]
    const at::Tensor& offsets,  // [B+1] int64
    int64_t length, const at::Scalar& pad_value, bool left_pad, int64_t max_length,
    bool truncate_left) {
  constexpr const char* op = "pad_packed";
  pad::check_packed(op, values, offsets);
  pad::check_options(op, length, max_length);
  const at::Tensor offs = offsets.contiguous();
  const int64_t* o = offs.data_ptr<int64_t>();
  pad::check_offsets_values(op, o, offs.size(0), values.size(0));

  const at::Tensor v = values.contiguous();
  const int64_t batch = offs.size(0) - 1;
  pad::Outputs out = pad::allocate(v, batch, length);
  const at::Tensor pad_el = pad::pad_element(op, pad_value, v.scalar_type());
  const RowLayout layout = make_layout(v, length, max_length, left_pad, truncate_left);
  const char* base = static_cast<const char*>(v.data_ptr());
  pad_rows(
      batch,
      [&](int64_t b) {
        return std::pair<const char*, int64_t>(base + o[b] * layout.row_bytes, o[b + 1] - o[b]);
      },
      layout, static_cast<const char*>(pad_el.data_ptr()), out);
  return {out.padded, out.mask, out.lengths};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pad_list_cpu(
    at::TensorList sequences,  // B x [n_i, *feat]
    int64_t length, const at::Scalar& pad_value, bool left_pad, int64_t max_length,
    bool truncate_left, int64_t multiple) {
  constexpr const char* op = "pad_list";
  pad::check_sequences(op, sequences);
  length = pad::resolve_length(op, sequences, length, max_length, multiple);
  pad::check_options(op, length, max_length);
  // Contiguous sequences are read in place; only a non-contiguous one is copied first.
  std::vector<at::Tensor> seqs;
  seqs.reserve(sequences.size());
  for (const at::Tensor& s : sequences) seqs.push_back(s.contiguous());

  const int64_t batch = static_cast<int64_t>(seqs.size());
  pad::Outputs out = pad::allocate(seqs[0], batch, length);
  const at::Tensor pad_el = pad::pad_element(op, pad_value, seqs[0].scalar_type());
  const RowLayout layout = make_layout(seqs[0], length, max_length, left_pad, truncate_left);
  pad_rows(
      batch,
      [&](int64_t b) {
        return std::pair<const char*, int64_t>(static_cast<const char*>(seqs[b].data_ptr()),
                                               seqs[b].size(0));
      },
      layout, static_cast<const char*>(pad_el.data_ptr()), out);
  return {out.padded, out.mask, out.lengths};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, CPU, m) {
  m.impl("pad_packed", &pad_packed_cpu);
  m.impl("pad_list", &pad_list_cpu);
}

}  // namespace torchfeed

// Autograd of the pad ops. Padding is a copy, so the gradient of each input element is the
// gradient at the output position it was copied to (ops/pad.h's Window), and pads and dropped
// elements get none. In C++ rather than torch.library.register_autograd so that a call that
// needs no gradient pays no Python layer.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "ops/pad.h"

namespace torchfeed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

int64_t concrete(const c10::SymInt& n) { return n.guard_int(__FILE__, __LINE__); }

void save_window(AutogradContext* ctx, const at::Tensor& padded, bool left_pad, int64_t max_length,
                 bool truncate_left) {
  ctx->saved_data["length"] = concrete(padded.sym_size(1));
  ctx->saved_data["max_length"] = max_length;
  ctx->saved_data["left_pad"] = left_pad;
  ctx->saved_data["truncate_left"] = truncate_left;
}

pad::Window window_of(AutogradContext* ctx, int64_t n) {
  return pad::window(n, ctx->saved_data["length"].toInt(), ctx->saved_data["max_length"].toInt(),
                     ctx->saved_data["left_pad"].toBool(),
                     ctx->saved_data["truncate_left"].toBool());
}

// dst[src_skip : src_skip + kept] = grad[b, out_start : out_start + kept]
void gather_row(const at::Tensor& grad, int64_t b, const pad::Window& w, at::Tensor dst) {
  if (w.kept > 0) dst.narrow(0, w.src_skip, w.kept).copy_(grad[b].narrow(0, w.out_start, w.kept));
}

using ListSignature = Outputs(at::TensorList, c10::SymInt, const at::Scalar&, bool, int64_t, bool,
                              int64_t);
using PackedSignature = Outputs(const at::Tensor&, const at::Tensor&, c10::SymInt,
                                const at::Scalar&, bool, int64_t, bool);

const c10::TypedOperatorHandle<ListSignature>& pad_list_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchfeed::pad_list", "")
                             .typed<ListSignature>();
  return op;
}

const c10::TypedOperatorHandle<PackedSignature>& pad_packed_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchfeed::pad_packed", "")
                             .typed<PackedSignature>();
  return op;
}

bool any_requires_grad(at::TensorList tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.requires_grad()) return true;
  }
  return false;
}

class PadList : public torch::autograd::Function<PadList> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList sequences,
                               const c10::SymInt& length, const at::Scalar& pad_value,
                               bool left_pad, int64_t max_length, bool truncate_left,
                               int64_t multiple) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [padded, mask, lengths] = pad_list_op().call(sequences, length, pad_value, left_pad,
                                                      max_length, truncate_left, multiple);
    ctx->mark_non_differentiable({mask, lengths});
    std::vector<int64_t> ns;
    ns.reserve(sequences.size());
    for (const at::Tensor& s : sequences) ns.push_back(concrete(s.sym_size(0)));
    ctx->saved_data["lengths"] = ns;
    save_window(ctx, padded, left_pad, max_length, truncate_left);
    return {padded, mask, lengths};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad = grads[0];
    const std::vector<int64_t> ns = ctx->saved_data["lengths"].toIntVector();
    variable_list out(ns.size() + 6);  // + length, pad_value, left_pad, max_length, ...: none
    if (!grad.defined()) return out;
    for (size_t b = 0; b < ns.size(); ++b) {
      std::vector<c10::SymInt> shape{c10::SymInt(ns[b])};
      for (const c10::SymInt& d : grad.sym_sizes().slice(2)) shape.push_back(d);
      out[b] = grad.new_zeros_symint(shape);
      gather_row(grad, static_cast<int64_t>(b), window_of(ctx, ns[b]), out[b]);
    }
    return out;
  }
};

class PadPacked : public torch::autograd::Function<PadPacked> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& values,
                               const at::Tensor& offsets, const c10::SymInt& length,
                               const at::Scalar& pad_value, bool left_pad, int64_t max_length,
                               bool truncate_left) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [padded, mask, lengths] = pad_packed_op().call(values, offsets, length, pad_value,
                                                        left_pad, max_length, truncate_left);
    ctx->mark_non_differentiable({mask, lengths});
    ctx->save_for_backward({offsets});
    ctx->saved_data["total"] = concrete(values.sym_size(0));
    save_window(ctx, padded, left_pad, max_length, truncate_left);
    return {padded, mask, lengths};
  }

  // Without reading the offsets on the host (no device sync; traceable): each value element
  // finds its sequence by a search over the offsets, then its output position by the window.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad = grads[0];  // [B, L, *feat]
    variable_list out(7);               // values, then offsets and the five options: no gradient
    if (!grad.defined()) return out;
    const at::Tensor offsets = ctx->get_saved_variables()[0];
    const int64_t total = ctx->saved_data["total"].toInt();
    const int64_t length = ctx->saved_data["length"].toInt();
    const int64_t max_length = ctx->saved_data["max_length"].toInt();
    std::vector<c10::SymInt> shape{c10::SymInt(total)};
    for (const c10::SymInt& d : grad.sym_sizes().slice(2)) shape.push_back(d);
    if (length == 0 || total == 0) {
      out[0] = grad.new_zeros_symint(shape);
      return out;
    }
    const at::Tensor index = at::arange(total, offsets.options());
    const at::Tensor row = at::searchsorted(offsets.slice(0, 1), index, false, /*right=*/true);
    const at::Tensor start = offsets.index_select(0, row);
    const at::Tensor n = offsets.index_select(0, row + 1) - start;
    at::Tensor kept = n.clamp_max(max_length >= 0 ? std::min(max_length, length) : length);
    const at::Tensor skip =
        ctx->saved_data["truncate_left"].toBool() ? n - kept : at::zeros_like(n);
    const at::Tensor first =
        ctx->saved_data["left_pad"].toBool() ? length - kept : at::zeros_like(n);
    const at::Tensor r = index - start - skip;  // position among the kept elements
    const at::Tensor valid = r.ge(0).logical_and(r.lt(kept));
    const at::Tensor position = (row * length + first + r).clamp(0, grad.size(0) * length - 1);
    const at::Tensor picked = grad.flatten(0, 1).index_select(0, position);
    std::vector<int64_t> mask_shape(static_cast<size_t>(grad.dim() - 1), 1);
    mask_shape[0] = total;
    out[0] = at::where(valid.view(mask_shape), picked, at::zeros({}, picked.options()));
    return out;
  }
};

// A call that records no graph (grad mode off, or no input requiring grad) goes straight to the
// backend kernel: no autograd node, no saved state.
template <typename Function, typename Signature, typename... Args>
Outputs call(bool needs_grad, const c10::TypedOperatorHandle<Signature>& op, const Args&... args) {
  if (!needs_grad || !at::GradMode::is_enabled()) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(args...);
  }
  variable_list out = Function::apply(args...);
  return {out[0], out[1], out[2]};
}

Outputs pad_list_autograd(at::TensorList sequences, c10::SymInt length, const at::Scalar& pad_value,
                          bool left_pad, int64_t max_length, bool truncate_left, int64_t multiple) {
  return call<PadList>(any_requires_grad(sequences), pad_list_op(), sequences, length, pad_value,
                       left_pad, max_length, truncate_left, multiple);
}

Outputs pad_packed_autograd(const at::Tensor& values, const at::Tensor& offsets, c10::SymInt length,
                            const at::Scalar& pad_value, bool left_pad, int64_t max_length,
                            bool truncate_left) {
  return call<PadPacked>(values.requires_grad(), pad_packed_op(), values, offsets, length,
                         pad_value, left_pad, max_length, truncate_left);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchfeed, Autograd, m) {
  m.impl("pad_list", &pad_list_autograd);
  m.impl("pad_packed", &pad_packed_autograd);
}

}  // namespace torchfeed

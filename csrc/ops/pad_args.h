// Host-side argument checks and output allocation of the pad ops, shared by the CPU and CUDA
// backends so both reject the same inputs with the same words.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/py_repr.h"

namespace torchfeed::pad {

struct Outputs {
  at::Tensor padded;   // [B, length, *feat], dtype of the values
  at::Tensor mask;     // [B, length] bool, true on real elements
  at::Tensor lengths;  // [B] int64, kept lengths
};

inline void check_options(const char* op, int64_t length, int64_t max_length) {
  TORCH_CHECK_VALUE(length >= 0, op, ": length must be >= 0, got ", length);
  TORCH_CHECK_VALUE(max_length == -1 || max_length >= 1, op,
                    ": max_length must be >= 1 (or -1 for no limit), got ", max_length);
}

inline void check_element_type(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(!t.is_quantized(), op, ": ", name, " must not be quantized, got ",
                   py_dtype(t.scalar_type()));
}

// values: [N, *feat]; offsets: [B+1] int64 on the same device.
inline void check_packed(const char* op, const at::Tensor& values, const at::Tensor& offsets) {
  TORCH_CHECK_VALUE(values.dim() >= 1, op,
                    ": values must have at least one dimension ([N, *feat]), got a 0-d tensor");
  check_element_type(op, "values", values);
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kLong, op, ": offsets must be int64, got ",
                   py_dtype(offsets.scalar_type()));
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.size(0) >= 1, op,
                    ": offsets must be 1-D with B+1 >= 1 entries, got shape ", offsets.sizes());
  TORCH_CHECK_VALUE(offsets.device() == values.device(), op,
                    ": offsets must be on the device of values (", values.device(), "), got ",
                    offsets.device());
}

// Offsets read on the host (CPU backend, or host copies): start at 0, never decrease, end at N.
inline void check_offsets_values(const char* op, const int64_t* offsets, int64_t count,
                                 int64_t total) {
  TORCH_CHECK_VALUE(offsets[0] == 0, op, ": offsets[0] must be 0, got ", offsets[0]);
  for (int64_t i = 1; i < count; ++i) {
    TORCH_CHECK_VALUE(offsets[i] >= offsets[i - 1], op,
                      ": offsets must be non-decreasing, got offsets[", i - 1, "]=", offsets[i - 1],
                      " > offsets[", i, "]=", offsets[i]);
  }
  TORCH_CHECK_VALUE(offsets[count - 1] == total, op,
                    ": offsets[-1] must equal values.shape[0]=", total, ", got ",
                    offsets[count - 1]);
}

// sequences: B tensors [n_i, *feat] of one dtype, one device, equal trailing dims.
inline void check_sequences(const char* op, at::TensorList seqs) {
  TORCH_CHECK_VALUE(!seqs.empty(), op, ": sequences must hold at least one tensor, got none");
  const at::Tensor& first = seqs[0];
  check_element_type(op, "sequences[0]", first);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const at::Tensor& s = seqs[i];
    TORCH_CHECK_VALUE(s.dim() >= 1, op, ": sequences[", i,
                      "] must have at least one dimension ([n, *feat]), got a 0-d tensor");
    TORCH_CHECK_TYPE(s.scalar_type() == first.scalar_type(), op, ": sequences[", i, "] has dtype ",
                     py_dtype(s.scalar_type()), " but sequences[0] has ",
                     py_dtype(first.scalar_type()), " (all sequences must share one dtype)");
    TORCH_CHECK_VALUE(s.device() == first.device(), op, ": sequences[", i, "] is on ", s.device(),
                      " but sequences[0] is on ", first.device(),
                      " (all sequences must share one device)");
    TORCH_CHECK_VALUE(s.sizes().slice(1) == first.sizes().slice(1), op, ": sequences[", i,
                      "] has trailing dims ", s.sizes().slice(1), " but sequences[0] has ",
                      first.sizes().slice(1), " (only dim 0 may differ)");
  }
}

inline Outputs allocate(const at::Tensor& like, int64_t batch, int64_t length) {
  std::vector<int64_t> shape{batch, length};
  const auto feat = like.sizes().slice(1);
  shape.insert(shape.end(), feat.begin(), feat.end());
  return Outputs{at::empty(shape, like.options()),
                 at::empty({batch, length}, like.options().dtype(at::kBool)),
                 at::empty({batch}, like.options().dtype(at::kLong))};
}

// The pad value as one element of `dtype`, in a 0-d CPU tensor whose bytes the kernels copy.
// Refused unless the dtype holds it exactly (nothing is rounded, wrapped or overflowed to inf
// silently): an integer dtype takes integers in its range (floats with no fraction too), bool
// takes 0 and 1, a floating dtype takes any finite value in its range and inf or nan when asked
// for, a complex dtype anything.
inline at::Tensor pad_element(const char* op, const at::Scalar& pad_value, at::ScalarType dtype) {
  const std::string what = std::string(op) + ": pad_value=" + py_scalar(pad_value);
  const std::string type = py_dtype(dtype);
  if (!at::isComplexType(dtype)) {
    TORCH_CHECK_VALUE(!pad_value.isComplex(), what, " is complex but the values are ", type);
  }
  if (at::isFloatingType(dtype)) {
    const double v = pad_value.toDouble();
    double limit = std::numeric_limits<double>::max();
    if (dtype == at::kFloat) limit = std::numeric_limits<float>::max();
    if (dtype == at::kHalf) limit = static_cast<double>(std::numeric_limits<at::Half>::max());
    if (dtype == at::kBFloat16) {
      limit = static_cast<double>(std::numeric_limits<at::BFloat16>::max());
    }
    TORCH_CHECK_VALUE(!std::isfinite(v) || (v >= -limit && v <= limit), what, " overflows ", type,
                      " (finite values in [", py_float(-limit), ", ", py_float(limit),
                      "]; inf and nan are allowed when asked for)");
  } else if (at::isIntegralType(dtype, /*includeBool=*/true)) {
    // Exact integer bounds of the dtype, as long doubles (which hold every int64 and uint64).
    long double lo = 0, hi = 1;  // bool
    switch (dtype) {
      case at::kByte:
        hi = std::numeric_limits<uint8_t>::max();
        break;
      case at::kUInt16:
        hi = std::numeric_limits<uint16_t>::max();
        break;
      case at::kUInt32:
        hi = std::numeric_limits<uint32_t>::max();
        break;
      case at::kUInt64:
        hi = std::numeric_limits<uint64_t>::max();
        break;
      case at::kChar:
        lo = -128, hi = 127;
        break;
      case at::kShort:
        lo = std::numeric_limits<int16_t>::min(), hi = std::numeric_limits<int16_t>::max();
        break;
      case at::kInt:
        lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
        break;
      case at::kLong:
        lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
        break;
      default:
        break;
    }
    long double v = 0;
    bool integral = true;
    if (pad_value.isFloatingPoint()) {
      const double d = pad_value.toDouble();
      integral = std::isfinite(d) && d == std::floor(d);
      v = d;
    } else if (pad_value.isUnsigned()) {
      v = static_cast<long double>(pad_value.toUInt64());
    } else if (!pad_value.isComplex()) {
      v = static_cast<long double>(pad_value.toLong());
    }
    const std::string range =
        dtype == at::kBool ? "0 and 1 (False and True)"
                           : "integers in [" + std::to_string(static_cast<long long>(lo)) + ", " +
                                 std::to_string(static_cast<unsigned long long>(hi)) + "]";
    TORCH_CHECK_VALUE(integral && v >= lo && v <= hi, what, " is not representable in ", type, " (",
                      range, ")");
  }
  at::Tensor element = at::empty({}, at::TensorOptions().dtype(dtype));
  element.fill_(pad_value);
  return element;
}

// pad_list's `length`: as given (>= 0), or -1 for the longest kept length (after `max_length`)
// rounded up to `multiple`. Call after check_sequences (every sequence has a dim 0).
inline int64_t resolve_length(const char* op, at::TensorList seqs, int64_t length,
                              int64_t max_length, int64_t multiple) {
  TORCH_CHECK_VALUE(multiple >= 1, op, ": multiple must be >= 1, got ", multiple);
  TORCH_CHECK_VALUE(length >= -1, op,
                    ": length must be >= 0 (or -1: the longest kept length), got ", length);
  if (length >= 0) {
    TORCH_CHECK_VALUE(multiple == 1, op, ": multiple=", multiple,
                      " applies to length=-1 only (got length=", length, ")");
    return length;
  }
  int64_t longest = 0;
  for (const at::Tensor& s : seqs) longest = std::max(longest, s.size(0));
  if (max_length >= 0) longest = std::min(longest, max_length);
  const int64_t rest = longest % multiple;
  if (rest != 0) {
    TORCH_CHECK_VALUE(longest <= std::numeric_limits<int64_t>::max() - (multiple - rest), op,
                      ": the longest length ", longest, " rounded up to multiple=", multiple,
                      " overflows int64");
    longest += multiple - rest;
  }
  return longest;
}

// Elements per row of the values: the product of the trailing dims (works when N == 0).
inline int64_t row_numel(const at::Tensor& like) {
  int64_t n = 1;
  for (int64_t d : like.sizes().slice(1)) n *= d;
  return n;
}

}  // namespace torchfeed::pad

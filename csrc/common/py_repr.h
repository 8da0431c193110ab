// Values as Python prints them (1.5, 1000000.0, nan, True, torch.int64), so that a message from
// the C++ checks reads like the Python API's own.
#pragma once

#include <ATen/ATen.h>

#include <charconv>
#include <cmath>
#include <string>

namespace torchfeed {

inline std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Python's repr: the shortest digits that read back, positional for 1e-4 <= |v| < 1e16
  char buf[512];
  const double a = std::fabs(v);
  const bool positional = a == 0.0 || (a >= 1e-4 && a < 1e16);
  const auto r =
      std::to_chars(buf, buf + sizeof(buf), v,
                    positional ? std::chars_format::fixed : std::chars_format::scientific);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

inline std::string py_scalar(const at::Scalar& v) {
  if (v.isBoolean()) return v.toBool() ? "True" : "False";
  if (v.isFloatingPoint()) return py_float(v.toDouble());
  if (v.isComplex()) {
    const c10::complex<double> z = v.toComplexDouble();
    return "(" + py_float(z.real()) + (z.imag() < 0 ? "-" : "+") + py_float(std::abs(z.imag())) +
           "j)";
  }
  if (v.isUnsigned()) return std::to_string(v.toUInt64());
  return std::to_string(v.toLong());
}

inline std::string py_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool:
      return "torch.bool";
    case at::kByte:
      return "torch.uint8";
    case at::kChar:
      return "torch.int8";
    case at::kShort:
      return "torch.int16";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kUInt16:
      return "torch.uint16";
    case at::kUInt32:
      return "torch.uint32";
    case at::kUInt64:
      return "torch.uint64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kComplexHalf:
      return "torch.complex32";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

}  // namespace torchfeed

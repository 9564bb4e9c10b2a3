// Inference helpers the shape op family's schema files share (shape.cc, generators.cc).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/checked.h"
#include "ops/schema.h"
#include "ops/value_range.h"

namespace kiln::ops::shape_util {

using Dims = std::vector<ir::Dim>;

inline Status attr_error(const InferContext& ctx, const Status& s) {
  return ctx.error(s.code(), s.message());
}

inline ir::Dim product(const Dims& dims, size_t begin, size_t end) {
  ir::Dim p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p = p * dims[i];
  return p;
}

// The shape as integers when every dim is a constant.
inline std::optional<Shape> const_shape(const Dims& dims) {
  Shape out;
  for (const ir::Dim& d : dims) {
    if (!d.is_const() || d.value() < 0) return std::nullopt;
    out.push_back(d.value());
  }
  return out;
}

// Whether an output of this dtype and shape may carry a symbolic value.
inline bool can_carry(DType dtype, const Dims& shape) {
  // Float values are exact integers (ops/elementwise.cc); moving them keeps them exact.
  if (!is_integer(dtype) && dtype != DType::kBool && exact_integer_limit(dtype) == 0) return false;
  auto s = const_shape(shape);
  if (!s) return false;
  auto n = checked_numel(*s);
  return n && *n <= kMaxSymbolicElements;
}

// Proves a <= b for every assignment of the (non-negative) symbols.
inline bool provably_le(const ir::Dim& a, const ir::Dim& b) {
  ir::Dim d = b - a;
  if (d.is_const()) return d.value() >= 0;
  return d.bounds({}).lo >= 0;
}

inline ir::Dim sym_max(const ir::Dim& a, const ir::Dim& b) {
  if (provably_le(b, a)) return a;
  if (provably_le(a, b)) return b;
  return ir::Dim::max(a, b);
}

inline std::string label(const InferContext& ctx, int i) {
  return "input " + std::to_string(i) + " ('" + ctx.input(i).name + "')";
}

}  // namespace kiln::ops::shape_util

// The mask analysis of causal_mask.h: a value's facts come from its constant data or from its
// producer's rule applied to its inputs' facts, each value visited once.
#include "builder/causal_mask.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "builder/graph_match.h"

namespace kiln::builder {
namespace {

using ir::Dim;
using Dims = std::vector<Dim>;

struct Facts {
  enum Kind { kUnknown, kNonzero, kCausal, kUpper, kIndex } kind = kUnknown;
  int axis =
      0;  // kIndex: the value is its coordinate along this axis, counted from the end (-1: last)
};

bool nonzero_at(const Tensor& t, int64_t i) {
  return is_float(t.dtype()) ? t.float_at(i) != 0.0 : t.int_at(i) != 0;
}

Facts of_constant(const Tensor& t) {
  const int64_t numel = t.numel();
  bool all = numel > 0;
  for (int64_t i = 0; all && i < numel; ++i) all = nonzero_at(t, i);
  if (all) return {Facts::kNonzero};
  const Shape& s = t.shape();
  const size_t r = s.size();
  // [1, .., 1, n, n]: causal or its complement.
  if (r >= 2 && s[r - 1] == s[r - 2] && s[r - 1] >= 2 && numel == s[r - 1] * s[r - 1]) {
    const int64_t n = s[r - 1];
    bool causal = true, upper = true;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const bool on = nonzero_at(t, i * n + j);
        causal = causal && on == (j <= i);
        upper = upper && on == (j > i);
      }
    }
    if (causal) return {Facts::kCausal};
    if (upper) return {Facts::kUpper};
  }
  // One axis of extent n >= 2, the others 1, holding 0, 1, .., n - 1.
  if (!is_float(t.dtype()) && t.dtype() != DType::kBool) {
    int axis = -1;
    for (size_t k = 0; k < r; ++k) {
      if (s[k] == 1) continue;
      if (axis >= 0) return {};
      axis = int(k);
    }
    if (axis < 0 || numel < 2) return {};
    for (int64_t i = 0; i < numel; ++i) {
      if (t.int_at(i) != i) return {};
    }
    return {Facts::kIndex, axis - int(r)};
  }
  return {};
}

std::optional<int64_t> int_scalar(const ir::Graph& g, int v) {
  if (v < 0) return std::nullopt;
  const ir::Value& val = g.values[size_t(v)];
  if (val.constant && val.constant->numel() == 1 && !is_float(val.constant->dtype()))
    return val.constant->int_at(0);
  if (val.sym_value && val.sym_value->size() == 1 && (*val.sym_value)[0].is_const())
    return (*val.sym_value)[0].value();
  return std::nullopt;
}

// The axis of `out` (counted from the end) that carries axis `a` of `in` through a view that keeps
// the elements' order (Reshape, Flatten, Squeeze, Unsqueeze): the one of equal extent with an
// equal product of the dims after it; nullopt where none is.
std::optional<int> carried_axis(const Dims& in, const Dims& out, int a) {
  const int p = int(in.size()) + a;
  if (p < 0) return std::nullopt;
  Dim after(1);
  for (size_t k = size_t(p) + 1; k < in.size(); ++k) after = after * in[k];
  Dim acc(1);
  for (int q = int(out.size()) - 1; q >= 0; --q) {
    if (out[size_t(q)] == in[size_t(p)] && acc == after) return q - int(out.size());
    acc = acc * out[size_t(q)];
  }
  return std::nullopt;
}

// Whether `out` (a broadcast of `in`, aligned from the end) keeps in's extent at axis a (from the
// end).
bool same_extent(const Dims& in, const Dims& out, int a) {
  const int p = int(in.size()) + a, q = int(out.size()) + a;
  return p >= 0 && q >= 0 && in[size_t(p)] == out[size_t(q)];
}

class Analysis {
 public:
  explicit Analysis(const ir::Graph& g) : g_(g) {}

  Facts of(int v, int depth) {
    if (v < 0 || depth > 48) return {};
    if (auto it = memo_.find(v); it != memo_.end()) return it->second;
    Facts f = compute(v, depth);
    memo_[v] = f;
    return f;
  }

 private:
  const Dims* shape(int v) const {
    if (v < 0) return nullptr;
    const auto& s = g_.values[size_t(v)].shape;
    return s ? &*s : nullptr;
  }

  // Facts of x carried through a view or broadcast to y.
  Facts through(const Facts& f, int x, int y, bool view) {
    if (f.kind == Facts::kNonzero || f.kind == Facts::kUnknown) return f;
    const Dims *xs = shape(x), *ys = shape(y);
    if (!xs || !ys) return {};
    auto keeps = [&](int a) -> std::optional<int> {
      if (view) return carried_axis(*xs, *ys, a);
      return same_extent(*xs, *ys, a) ? std::optional<int>(a) : std::nullopt;
    };
    if (f.kind == Facts::kIndex) {
      auto a = keeps(f.axis);
      return a ? Facts{Facts::kIndex, *a} : Facts{};
    }
    return keeps(-1) == -1 && keeps(-2) == -2 ? f : Facts{};  // causal or its complement
  }

  // A comparison cmp(a, b) of index values: which triangle of [.., i, j] it marks.
  Facts compare(const std::string& op, int a, int b, int depth) {
    const Facts fa = of(a, depth + 1), fb = of(b, depth + 1);
    if (fa.kind != Facts::kIndex || fb.kind != Facts::kIndex) return {};
    // Orient so that lhs is j (axis -1) and rhs i (axis -2).
    std::string o = op;
    if (fa.axis == -2 && fb.axis == -1) {
      o = op == "Less"          ? "Greater"
          : op == "Greater"     ? "Less"
          : op == "LessOrEqual" ? "GreaterOrEqual"
                                : "LessOrEqual";
    } else if (!(fa.axis == -1 && fb.axis == -2)) {
      return {};
    }
    if (o == "LessOrEqual") return {Facts::kCausal};  // j <= i
    if (o == "Greater") return {Facts::kUpper};       // j > i
    return {};
  }

  Facts compute(int v, int depth) {
    const ir::Value& val = g_.values[size_t(v)];
    if (val.constant) return of_constant(*val.constant);
    if (val.producer < 0) return {};
    const ir::Node& n = g_.nodes[size_t(val.producer)];
    if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty() || n.inputs[0] < 0)
      return {};
    const std::string& t = n.op_type;
    const int x = n.inputs[0];
    if (t == "Identity" || t == "Reshape" || t == "Flatten" || t == "Squeeze" || t == "Unsqueeze") {
      return through(of(x, depth + 1), x, v, true);
    }
    if (t == "Expand") return through(of(x, depth + 1), x, v, false);
    if (t == "Cast") {
      const Facts f = of(x, depth + 1);
      const DType from = g_.values[size_t(x)].dtype, to = val.dtype;
      // Float to integer can round a nonzero to 0; bool to float keeps 0 and 1; an index stays one
      // as an integer or float (exactly, to 2^24).
      if (f.kind == Facts::kIndex) return to == DType::kBool ? Facts{} : f;
      if (is_float(from) && !is_float(to) && to != DType::kBool) return {};
      return f;
    }
    if (t == "ConstantOfShape") {
      auto value = n.attrs.get_tensor("value");
      if (!value.ok()) return {};  // the default fill is float 0
      return value->numel() == 1 && nonzero_at(*value, 0) ? Facts{Facts::kNonzero} : Facts{};
    }
    if (t == "Gather" || t == "GatherND" || t == "GatherElements") {
      // Elements picked from data that is nonzero everywhere are nonzero, whatever the indices.
      return of(x, depth + 1).kind == Facts::kNonzero ? Facts{Facts::kNonzero} : Facts{};
    }
    if (t == "Range" && n.inputs.size() == 3) {
      return int_scalar(g_, n.inputs[0]) == 0 && int_scalar(g_, n.inputs[2]) == 1
                 ? Facts{Facts::kIndex, -1}
                 : Facts{};
    }
    if (t == "Not") {
      const Facts f = through(of(x, depth + 1), x, v, false);
      return f.kind == Facts::kCausal  ? Facts{Facts::kUpper}
             : f.kind == Facts::kUpper ? Facts{Facts::kCausal}
                                       : Facts{};
    }
    if (t == "And" && n.inputs.size() == 2 && n.inputs[1] >= 0) {
      const int y = n.inputs[1];
      const Facts fx = through(of(x, depth + 1), x, v, false),
                  fy = through(of(y, depth + 1), y, v, false);
      if (fx.kind == Facts::kNonzero) return fy;
      if (fy.kind == Facts::kNonzero) return fx;
      return fx.kind == fy.kind && fx.kind != Facts::kIndex ? fx : Facts{};
    }
    if ((t == "LessOrEqual" || t == "GreaterOrEqual" || t == "Less" || t == "Greater") &&
        n.inputs.size() == 2) {
      return compare(t, x, n.inputs[1], depth);
    }
    if (t == "Trilu") {
      // Trilu of ones: the lower triangle with its diagonal (upper = 0, k = 0) is causal, the upper
      // one above it (upper = 1, k = 1) its complement.
      const Dims* s = shape(v);
      if (of(x, depth + 1).kind != Facts::kNonzero || !s || s->size() < 2 ||
          (*s)[s->size() - 1] != (*s)[s->size() - 2]) {
        return {};
      }
      auto upper = n.attrs.get_int("upper", 1);
      const std::optional<int64_t> k =
          n.inputs.size() > 1 && n.inputs[1] >= 0 ? int_scalar(g_, n.inputs[1]) : 0;
      if (!upper.ok() || !k) return {};
      if (*upper == 0 && *k == 0) return {Facts::kCausal};
      if (*upper == 1 && *k == 1) return {Facts::kUpper};
      return {};
    }
    return {};
  }

  const ir::Graph& g_;
  std::unordered_map<int, Facts> memo_;
};

}  // namespace

MaskKind mask_kind(const ir::Graph& g, int v) {
  const Facts f = Analysis(g).of(v, 0);
  switch (f.kind) {
    case Facts::kNonzero:
      return MaskKind::kAllTrue;
    case Facts::kCausal:
      return MaskKind::kCausal;
    case Facts::kUpper:
      return MaskKind::kStrictlyUpper;
    default:
      return MaskKind::kUnknown;
  }
}

}  // namespace kiln::builder

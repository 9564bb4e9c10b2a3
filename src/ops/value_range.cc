// Value ranges of small tensors computed at run time: interval arithmetic along their producers.
#include "ops/value_range.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;
using Elems = std::vector<ElementRange>;
using Shape64 = std::vector<int64_t>;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The shape of a small tensor of constant shape; nullopt otherwise.
std::optional<Shape64> small_shape(const ir::Value& v) {
  if (!v.shape) return std::nullopt;
  Shape64 s;
  int64_t n = 1;
  for (const Dim& d : *v.shape) {
    if (!d.is_const() || d.value() < 0 || d.value() > kMaxSymbolicElements) return std::nullopt;
    s.push_back(d.value());
    n *= d.value();
    if (n > kMaxSymbolicElements) return std::nullopt;
  }
  return s;
}

int64_t numel(const Shape64& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

double as_double(int64_t x) {
  if (x >= ir::Interval::kInf) return kInfinity;
  if (x <= -ir::Interval::kInf) return -kInfinity;
  return double(x);
}

ElementRange of_dim(const Dim& d, const ir::SymbolRanges* ranges) {
  static const ir::SymbolRanges kNone;
  const ir::Interval b =
      d.is_const() ? ir::Interval{d.value(), d.value()} : d.bounds(ranges ? *ranges : kNone);
  return ElementRange{d, as_double(b.lo), as_double(b.hi)};
}

ElementRange unknown() { return ElementRange{}; }

// A NaN bound (inf - inf, 0 * inf) is no bound.
ElementRange make(double lo, double hi) {
  if (std::isnan(lo)) lo = -kInfinity;
  if (std::isnan(hi)) hi = kInfinity;
  return ElementRange{std::nullopt, lo, hi};
}

// The relative rounding error of one operation in `dt` (a unit in the last place, twice the
// round-to-nearest bound, so the double arithmetic computing the bound is covered too).
double rounding(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return 0x1p-23;
    case DType::kFloat64:
      return 0x1p-51;
    case DType::kFloat16:
      return 0x1p-10;
    case DType::kBFloat16:
      return 0x1p-7;
    default:
      return 0;
  }
}

// Widens an inexact float result by its rounding; an integer result keeps its bounds. A tiny
// absolute term covers results that round to subnormals.
void round_out(ElementRange& e, DType dt) {
  const double r = rounding(dt);
  if (r == 0 || e.exact) return;
  e.lo -= std::fabs(e.lo) * r + 1e-30;
  e.hi += std::fabs(e.hi) * r + 1e-30;
}

// Keeps `exact` only where a float of `dt` holds the element exactly (an integer dtype always
// does, as shape math assumes: it wraps nothing).
void check_exact(ElementRange& e, DType dt) {
  if (!e.exact || !is_float(dt)) return;
  const double limit = double(exact_integer_limit(dt));
  if (!(e.lo >= -limit && e.hi <= limit)) e.exact.reset();
}

double trunc_int(double x) { return std::isinf(x) ? x : std::trunc(x); }

class Walker {
 public:
  Walker(const ir::Graph& g, const ir::SymbolRanges* ranges) : g_(g), ranges_(ranges) {}

  std::optional<Elems> walk(int v) {
    if (v < 0 || size_t(v) >= g_.values.size()) return std::nullopt;
    if (auto it = memo_.find(v); it != memo_.end()) return it->second;
    const ir::Value& val = g_.values[size_t(v)];
    auto shape = small_shape(val);
    if (!shape) return std::nullopt;
    std::optional<Elems> out;
    if (auto known = value_elements(val); known && int64_t(known->size()) == numel(*shape)) {
      out.emplace();
      for (const Dim& d : *known) out->push_back(of_dim(d, ranges_));
    } else if (val.constant && val.constant->numel() == numel(*shape) &&
               is_float(val.constant->dtype())) {
      out.emplace();
      for (int64_t k = 0; k < val.constant->numel(); ++k) {
        const double x = val.constant->float_at(k);
        out->push_back(std::isnan(x) ? unknown() : make(x, x));
      }
    } else if (val.producer >= 0 && depth_ < kMaxDepth) {
      ++depth_;
      out = node(g_.nodes[size_t(val.producer)], v, *shape);
      --depth_;
    }
    if (!out || int64_t(out->size()) != numel(*shape))
      out = Elems(size_t(numel(*shape)), unknown());
    memo_[v] = out;
    return out;
  }

 private:
  static constexpr int kMaxDepth = 256;

  struct Operand {
    Elems e;
    Shape64 s;
  };
  std::optional<Operand> operand(const ir::Node& n, size_t i) {
    if (i >= n.inputs.size() || n.inputs[i] < 0) return std::nullopt;
    auto s = small_shape(g_.values[size_t(n.inputs[i])]);
    auto e = walk(n.inputs[i]);
    if (!s || !e) return std::nullopt;
    return Operand{std::move(*e), std::move(*s)};
  }
  // The constant integers of input i (indices, axes), or nullopt.
  std::optional<std::vector<int64_t>> ints(const ir::Node& n, size_t i) {
    if (i >= n.inputs.size() || n.inputs[i] < 0) return std::nullopt;
    auto v = value_elements(g_.values[size_t(n.inputs[i])]);
    if (!v) return std::nullopt;
    std::vector<int64_t> out;
    for (const Dim& d : *v) {
      if (!d.is_const()) return std::nullopt;
      out.push_back(d.value());
    }
    return out;
  }

  // Elementwise over the inputs, broadcast (numpy rules) to `out`.
  std::optional<Elems> broadcast(
      const ir::Node& n, const Shape64& out,
      const std::function<ElementRange(const std::vector<const ElementRange*>&)>& fn) {
    std::vector<Operand> ins;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      auto op = operand(n, i);
      if (!op || op->s.size() > out.size()) return std::nullopt;
      ins.push_back(std::move(*op));
    }
    Elems result;
    const int64_t total = numel(out);
    std::vector<const ElementRange*> args(ins.size());
    for (int64_t e = 0; e < total; ++e) {
      for (size_t i = 0; i < ins.size(); ++i) {
        const Shape64& s = ins[i].s;
        int64_t rem = e, off = 0, stride = 1;
        for (size_t d = out.size(); d-- > 0;) {
          const int64_t idx = rem % out[d];
          rem /= out[d];
          const size_t k = d + s.size() - out.size();
          if (d + s.size() < out.size()) continue;
          if (s[k] != 1) off += idx * stride;
          stride *= s[k];
        }
        if (off >= int64_t(ins[i].e.size())) return std::nullopt;
        args[i] = &ins[i].e[size_t(off)];
      }
      result.push_back(fn(args));
    }
    return result;
  }

  std::optional<Elems> node(const ir::Node& n, int v, const Shape64& shape) {
    const OpKind op = find_op(n.domain, n.op_type);
    const DType dt = g_.values[size_t(v)].dtype;
    const bool is_int = is_integer(dt);
    switch (op) {
      case OpKind::kIdentity:
      case OpKind::kUnsqueeze:
      case OpKind::kSqueeze:
      case OpKind::kReshape:
      case OpKind::kFlatten: {
        auto in = operand(n, 0);
        if (!in || numel(in->s) != numel(shape)) return std::nullopt;
        return in->e;
      }
      case OpKind::kCast: {
        auto in = operand(n, 0);
        if (!in) return std::nullopt;
        for (ElementRange& e : in->e) {
          if (dt == DType::kBool) {
            e = make(0, 1);
          } else if (is_integer(dt)) {
            e.lo = trunc_int(e.lo), e.hi = trunc_int(e.hi);  // truncation is monotone
          } else {
            check_exact(e, dt);
            round_out(e, dt);
          }
        }
        return in->e;
      }
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul:
      case OpKind::kDiv:
      case OpKind::kMin:
      case OpKind::kMax:
        return broadcast(n, shape, [&](const std::vector<const ElementRange*>& a) {
          return arith(op, dt, is_int, a);
        });
      case OpKind::kReciprocal:
      case OpKind::kNeg:
      case OpKind::kAbs:
      case OpKind::kFloor:
      case OpKind::kCeil:
      case OpKind::kRound:
        return broadcast(n, shape, [&](const std::vector<const ElementRange*>& a) {
          return unary(op, dt, *a[0]);
        });
      case OpKind::kConcat:
        return concat(n, shape);
      case OpKind::kGather:
        return gather(n, shape);
      case OpKind::kSlice:
        return slice(n, shape);
      case OpKind::kReduceMin:
      case OpKind::kReduceMax: {
        // One output element: the extreme of every input element, whatever the axes say.
        auto in = operand(n, 0);
        if (!in || numel(shape) != 1 || in->e.empty()) return std::nullopt;
        const bool is_max = op == OpKind::kReduceMax;
        ElementRange r = in->e[0];
        for (size_t k = 1; k < in->e.size(); ++k)
          r = arith(is_max ? OpKind::kMax : OpKind::kMin, dt, is_int, {&r, &in->e[k]});
        return Elems{r};
      }
      default:
        return std::nullopt;
    }
  }

  static ElementRange arith(OpKind op, DType dt, bool is_int,
                            const std::vector<const ElementRange*>& a) {
    if (op == OpKind::kMin || op == OpKind::kMax) {
      const bool is_max = op == OpKind::kMax;
      ElementRange r = *a[0];
      for (size_t k = 1; k < a.size(); ++k) {
        const ElementRange& b = *a[k];
        ElementRange m = is_max ? make(std::max(r.lo, b.lo), std::max(r.hi, b.hi))
                                : make(std::min(r.lo, b.lo), std::min(r.hi, b.hi));
        if (r.exact && b.exact)
          m.exact = is_max ? Dim::max(*r.exact, *b.exact) : Dim::min(*r.exact, *b.exact);
        r = m;
      }
      return r;  // picks one of its inputs: nothing rounds
    }
    const ElementRange &x = *a[0], &y = *a[1];
    ElementRange r;
    switch (op) {
      case OpKind::kAdd:
        r = make(x.lo + y.lo, x.hi + y.hi);
        if (x.exact && y.exact) r.exact = *x.exact + *y.exact;
        break;
      case OpKind::kSub:
        r = make(x.lo - y.hi, x.hi - y.lo);
        if (x.exact && y.exact) r.exact = *x.exact - *y.exact;
        break;
      case OpKind::kMul: {
        const double p[4] = {x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi};
        if (std::any_of(std::begin(p), std::end(p), [](double q) { return std::isnan(q); }))
          return unknown();
        r = make(*std::min_element(std::begin(p), std::end(p)),
                 *std::max_element(std::begin(p), std::end(p)));
        if (x.exact && y.exact) r.exact = *x.exact * *y.exact;
        break;
      }
      case OpKind::kDiv: {
        if (!(y.lo > 0 || y.hi < 0)) return unknown();  // the divisor may be 0
        const double q[4] = {x.lo / y.lo, x.lo / y.hi, x.hi / y.lo, x.hi / y.hi};
        if (std::any_of(std::begin(q), std::end(q), [](double v) { return std::isnan(v); }))
          return unknown();
        r = make(*std::min_element(std::begin(q), std::end(q)),
                 *std::max_element(std::begin(q), std::end(q)));
        if (is_int) r.lo = trunc_int(r.lo), r.hi = trunc_int(r.hi);  // integer Div truncates
        break;
      }
      default:
        return unknown();
    }
    check_exact(r, dt);
    round_out(r, dt);
    return r;
  }

  static ElementRange unary(OpKind op, DType dt, const ElementRange& x) {
    ElementRange r;
    switch (op) {
      case OpKind::kReciprocal: {
        if (!(x.lo > 0 || x.hi < 0)) return unknown();
        r = make(1 / x.hi, 1 / x.lo);
        round_out(r, dt);
        return r;
      }
      case OpKind::kNeg:
        r = make(-x.hi, -x.lo);
        if (x.exact) r.exact = -*x.exact;
        return r;
      case OpKind::kAbs:
        if (x.lo >= 0) return x;
        if (x.hi <= 0) return unary(OpKind::kNeg, dt, x);
        return make(0, std::max(-x.lo, x.hi));
      case OpKind::kFloor:
        r = make(std::floor(x.lo), std::floor(x.hi));
        break;
      case OpKind::kCeil:
        r = make(std::ceil(x.lo), std::ceil(x.hi));
        break;
      case OpKind::kRound:
        r = make(std::nearbyint(x.lo), std::nearbyint(x.hi));
        break;  // monotone
      default:
        return unknown();
    }
    r.exact = x.exact;  // an integer stays itself
    return r;
  }

  std::optional<Elems> concat(const ir::Node& n, const Shape64& shape) {
    auto axis_attr = n.attrs.get_int("axis", 0);
    if (!axis_attr.ok()) return std::nullopt;
    const int64_t rank = int64_t(shape.size());
    const int64_t axis = *axis_attr < 0 ? *axis_attr + rank : *axis_attr;
    if (axis < 0 || axis >= rank) return std::nullopt;
    std::vector<Operand> ins;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      auto op = operand(n, i);
      if (!op || int64_t(op->s.size()) != rank) return std::nullopt;
      ins.push_back(std::move(*op));
    }
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[size_t(d)];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[size_t(d)];
    Elems out;
    for (int64_t o = 0; o < outer; ++o) {
      for (const Operand& in : ins) {
        const int64_t chunk = in.s[size_t(axis)] * inner;
        for (int64_t k = 0; k < chunk; ++k) out.push_back(in.e[size_t(o * chunk + k)]);
      }
    }
    return out;
  }

  std::optional<Elems> gather(const ir::Node& n, const Shape64& shape) {
    auto data = operand(n, 0);
    auto idx = ints(n, 1);
    auto axis_attr = n.attrs.get_int("axis", 0);
    if (!data || !idx || !axis_attr.ok()) return std::nullopt;
    const int64_t rank = int64_t(data->s.size());
    const int64_t axis = *axis_attr < 0 ? *axis_attr + rank : *axis_attr;
    if (axis < 0 || axis >= rank) return std::nullopt;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data->s[size_t(d)];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= data->s[size_t(d)];
    const int64_t len = data->s[size_t(axis)];
    Elems out;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i : *idx) {
        if (i < 0) i += len;
        if (i < 0 || i >= len) return std::nullopt;
        for (int64_t k = 0; k < inner; ++k)
          out.push_back(data->e[size_t((o * len + i) * inner + k)]);
      }
    }
    if (int64_t(out.size()) != numel(shape)) return std::nullopt;
    return out;
  }

  // Slice (opset 10 on: starts, ends, axes, steps as inputs) with constant parameters.
  std::optional<Elems> slice(const ir::Node& n, const Shape64& shape) {
    auto data = operand(n, 0);
    auto starts = ints(n, 1), ends = ints(n, 2);
    if (!data || !starts || !ends || starts->size() != ends->size()) return std::nullopt;
    const int64_t rank = int64_t(data->s.size());
    std::vector<int64_t> axes, steps(starts->size(), 1);
    if (n.inputs.size() > 3 && n.inputs[3] >= 0) {
      auto a = ints(n, 3);
      if (!a) return std::nullopt;
      axes = *a;
    } else {
      for (size_t k = 0; k < starts->size(); ++k) axes.push_back(int64_t(k));
    }
    if (n.inputs.size() > 4 && n.inputs[4] >= 0) {
      auto s = ints(n, 4);
      if (!s) return std::nullopt;
      steps = *s;
    }
    if (axes.size() != starts->size() || steps.size() != starts->size()) return std::nullopt;
    // Per axis: first index, step and count, clamped as ONNX clamps them.
    std::vector<int64_t> first(size_t(rank), 0), step(size_t(rank), 1), count(data->s);
    for (size_t k = 0; k < axes.size(); ++k) {
      const int64_t ax = axes[k] < 0 ? axes[k] + rank : axes[k];
      if (ax < 0 || ax >= rank || steps[k] == 0) return std::nullopt;
      const int64_t len = data->s[size_t(ax)], st = steps[k];
      auto clamp = [&](int64_t x, int64_t lo, int64_t hi) {
        if (x < 0) x = std::max<int64_t>(x, -len) + len;  // INT64_MIN/MAX ends stay in range
        return std::clamp(x, lo, hi);
      };
      int64_t b, e;
      if (st > 0) {
        b = clamp((*starts)[k], 0, len), e = clamp((*ends)[k], 0, len);
        count[size_t(ax)] = e > b ? (e - b + st - 1) / st : 0;
      } else {
        b = clamp((*starts)[k], -1, len - 1), e = clamp((*ends)[k], -1, len - 1);
        if ((*ends)[k] < -len) e = -1;
        count[size_t(ax)] = b > e ? (b - e - st - 1) / -st : 0;
      }
      first[size_t(ax)] = b, step[size_t(ax)] = st;
    }
    if (count != shape) return std::nullopt;
    Elems out;
    const int64_t total = numel(count);
    for (int64_t e = 0; e < total; ++e) {
      int64_t rem = e, off = 0, stride = 1;
      for (int64_t d = rank; d-- > 0;) {
        const int64_t i = rem % count[size_t(d)];
        rem /= count[size_t(d)];
        off += (first[size_t(d)] + i * step[size_t(d)]) * stride;
        stride *= data->s[size_t(d)];
      }
      out.push_back(data->e[size_t(off)]);
    }
    return out;
  }

  const ir::Graph& g_;
  const ir::SymbolRanges* ranges_;
  std::map<int, std::optional<Elems>> memo_;
  int depth_ = 0;
};

}  // namespace

std::optional<std::vector<ElementRange>> value_range(const ir::Graph& g, int v,
                                                     const ir::SymbolRanges* ranges) {
  return Walker(g, ranges).walk(v);
}

}  // namespace kiln::ops

// CPU reference kernels of the sequence-model ops (LinearAttention recurrences,
// CausalConvWithState, FlexAttention with its mod graphs run by a small evaluator), computed in
// double and stored in the outputs' dtypes, following the onnx 1.22 reference implementations.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

bool has_in(const KernelArgs& a, int i) { return int(a.in.size()) > i && present(a.in[i]); }

// LinearAttention: per batch and KV head a [d_k, d_v] state S evolves over time t:
//   gated:  S *= exp(decay_t);  delta: v_t = beta_t * (v_t - S^T k_t);  S += k_t v_t^T
// and each query head h reads o_t = scale * q_t^T S of KV head h / (q_heads / kv_heads).
Status linear_attention_kernel(const KernelArgs& a) {
  const TensorView& q = a.in[0];
  const TensorView& k = a.in[1];
  const TensorView& v = a.in[2];
  KILN_ASSIGN_OR_RETURN(int64_t hq, a.attrs.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t hkv, a.attrs.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(float scale_attr, a.attrs.get_float("scale", 0.0f));
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3 || hq <= 0 || hkv <= 0 || hq % hkv != 0 ||
      q.shape[2] % hq != 0 || v.shape[2] % hkv != 0) {
    return invalid_argument("LinearAttention: query " + shape_to_string(q.shape) + ", value " +
                            shape_to_string(v.shape) + " do not split into q_num_heads " +
                            std::to_string(hq) + " / kv_num_heads " + std::to_string(hkv));
  }
  int64_t B = q.shape[0], T = q.shape[1], dk = q.shape[2] / hq, dv = v.shape[2] / hkv;
  int64_t group = hq / hkv;
  if (k.shape[0] != B || k.shape[1] != T || k.shape[2] != hkv * dk || v.shape[0] != B ||
      v.shape[1] != T) {
    return invalid_argument("LinearAttention: key " + shape_to_string(k.shape) + " or value " +
                            shape_to_string(v.shape) + " does not match query " +
                            shape_to_string(q.shape));
  }
  bool gated = has_in(a, 4), delta = has_in(a, 5);
  int64_t decay_last = 0, beta_last = 0;
  if (gated) {
    const TensorView& g = a.in[4];
    decay_last = g.rank() == 3 ? g.shape[2] : -1;
    if (g.rank() != 3 || g.shape[0] != B || g.shape[1] != T ||
        (decay_last != hkv && decay_last != hkv * dk)) {
      return invalid_argument("LinearAttention: decay of shape " + shape_to_string(g.shape) +
                              " must be [B, T, kv_num_heads] or [B, T, kv_num_heads*d_k]");
    }
  }
  if (delta) {
    const TensorView& be = a.in[5];
    beta_last = be.rank() == 3 ? be.shape[2] : -1;
    if (be.rank() != 3 || be.shape[0] != B || be.shape[1] != T ||
        (beta_last != hkv && beta_last != 1)) {
      return invalid_argument("LinearAttention: beta of shape " + shape_to_string(be.shape) +
                              " must be [B, T, kv_num_heads] or [B, T, 1]");
    }
  }
  size_t state_size = size_t(B * hkv * dk * dv);
  std::vector<double> state(state_size, 0.0);
  if (has_in(a, 3)) {
    const TensorView& p = a.in[3];
    if (p.rank() != 4 || p.shape[0] != B || p.shape[1] != hkv || p.shape[2] != dk ||
        p.shape[3] != dv) {
      return invalid_argument("LinearAttention: past_state of shape " + shape_to_string(p.shape) +
                              " is not [B, kv_num_heads, d_k, d_v]");
    }
    state = to_f64(p);
  }
  double scale = scale_attr == 0.0f ? 1.0 / std::sqrt(double(dk)) : double(scale_attr);
  std::vector<double> kt(static_cast<size_t>(dk)), vt(static_cast<size_t>(dv));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      int64_t row = b * T + t;
      for (int64_t h = 0; h < hkv; ++h) {
        double* s = &state[size_t((b * hkv + h) * dk * dv)];
        for (int64_t d = 0; d < dk; ++d) kt[size_t(d)] = load_f64(k, (row * hkv + h) * dk + d);
        for (int64_t m = 0; m < dv; ++m) vt[size_t(m)] = load_f64(v, (row * hkv + h) * dv + m);
        if (gated) {
          for (int64_t d = 0; d < dk; ++d) {
            int64_t gi = decay_last == hkv ? row * hkv + h : (row * hkv + h) * dk + d;
            double f = std::exp(load_f64(a.in[4], gi));
            for (int64_t m = 0; m < dv; ++m) s[d * dv + m] *= f;
          }
        }
        if (delta) {
          double beta = load_f64(a.in[5], row * beta_last + (beta_last == 1 ? 0 : h));
          for (int64_t m = 0; m < dv; ++m) {
            double r = 0;
            for (int64_t d = 0; d < dk; ++d) r += s[d * dv + m] * kt[size_t(d)];
            vt[size_t(m)] = beta * (vt[size_t(m)] - r);
          }
        }
        for (int64_t d = 0; d < dk; ++d) {
          for (int64_t m = 0; m < dv; ++m) s[d * dv + m] += kt[size_t(d)] * vt[size_t(m)];
        }
        for (int64_t g = 0; g < group; ++g) {
          int64_t qh = h * group + g;
          for (int64_t m = 0; m < dv; ++m) {
            double o = 0;
            for (int64_t d = 0; d < dk; ++d) {
              o += load_f64(q, (row * hq + qh) * dk + d) * s[d * dv + m];
            }
            store_f64(a.out[0], (row * hq + qh) * dv + m, scale * o);
          }
        }
      }
    }
  }
  if (a.out.size() > 1 && present(a.out[1])) {
    for (size_t e = 0; e < state_size; ++e) store_f64(a.out[1], int64_t(e), state[e]);
  }
  return ok_status();
}

// CausalConvWithState: y[b,c,t] = bias[c] + sum_j w[c,0,j] * padded[b,c,t+j], padded being the
// past state (zeros when absent) followed by the input; present = padded's last k-1 positions.
Status causal_conv_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& w = a.in[1];
  KILN_ASSIGN_OR_RETURN(std::string act, a.attrs.get_string("activation", "none"));
  if (act != "none" && act != "silu" && act != "swish") {
    return invalid_argument("CausalConvWithState: activation '" + act +
                            "' is not one of none, silu, swish");
  }
  if (x.rank() != 3 || w.rank() != 3 || w.shape[0] != x.shape[1] || w.shape[1] != 1 ||
      w.shape[2] < 1) {
    return invalid_argument("CausalConvWithState: input " + shape_to_string(x.shape) +
                            " and weight " + shape_to_string(w.shape) +
                            " are not [B, C, L] and [C, 1, k]");
  }
  int64_t B = x.shape[0], C = x.shape[1], L = x.shape[2], K = w.shape[2], P = K - 1;
  bool has_bias = has_in(a, 2), has_past = has_in(a, 3);
  if (has_bias && a.in[2].numel() != C) {
    return invalid_argument("CausalConvWithState: bias of shape " + shape_to_string(a.in[2].shape) +
                            " does not match " + std::to_string(C) + " channels");
  }
  if (has_past) {
    const TensorView& p = a.in[3];
    if (p.rank() != 3 || p.shape[0] != B || p.shape[1] != C || p.shape[2] != P) {
      return invalid_argument("CausalConvWithState: past_state of shape " +
                              shape_to_string(p.shape) + " is not [B, C, k-1]");
    }
  }
  bool silu = act != "none";
  std::vector<double> padded(size_t(P + L));
  for (int64_t bc = 0; bc < B * C; ++bc) {
    int64_t c = bc % C;
    for (int64_t i = 0; i < P; ++i)
      padded[size_t(i)] = has_past ? load_f64(a.in[3], bc * P + i) : 0;
    for (int64_t i = 0; i < L; ++i) padded[size_t(P + i)] = load_f64(x, bc * L + i);
    for (int64_t t = 0; t < L; ++t) {
      double y = has_bias ? load_f64(a.in[2], c) : 0.0;
      for (int64_t j = 0; j < K; ++j) y += load_f64(w, c * K + j) * padded[size_t(t + j)];
      if (silu) y = y / (1.0 + std::exp(-y));
      store_f64(a.out[0], bc * L + t, y);
    }
    if (a.out.size() > 1 && present(a.out[1])) {
      for (int64_t i = 0; i < P; ++i) store_f64(a.out[1], bc * P + i, padded[size_t(L + i)]);
    }
  }
  return ok_status();
}

// A small evaluator for FlexAttention's score_mod / prob_mod graphs: elementwise math, masks
// and the index arithmetic (Shape, Gather, Range, Reshape) that builds positions. Values are
// held as doubles (integers stay exact); an op outside this set is an error naming it.
struct Arr {
  std::vector<int64_t> shape;
  std::vector<double> data;
  bool integer = false;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Numpy broadcasting of any number of arrays through fn(values of one output element).
template <typename Fn>
StatusOr<Arr> broadcast_map(const std::vector<const Arr*>& in, Fn fn) {
  size_t rank = 0;
  for (const Arr* a : in) rank = std::max(rank, a->shape.size());
  std::vector<int64_t> out_shape(rank, 1);
  for (const Arr* a : in) {
    for (size_t i = 0; i < a->shape.size(); ++i) {
      int64_t& o = out_shape[rank - a->shape.size() + i];
      int64_t d = a->shape[i];
      if (d != 1 && o != 1 && d != o)
        return invalid_argument("FlexAttention mod: shapes do not broadcast");
      if (d != 1) o = d;
    }
  }
  Arr out;
  out.shape = out_shape;
  out.data.resize(size_t(numel_of(out_shape)));
  std::vector<double> vals(in.size());
  std::vector<int64_t> idx(rank, 0);
  for (size_t e = 0; e < out.data.size(); ++e) {
    for (size_t k = 0; k < in.size(); ++k) {
      const Arr& a = *in[k];
      int64_t off = 0;
      size_t lead = rank - a.shape.size();
      for (size_t i = 0; i < a.shape.size(); ++i) {
        off = off * a.shape[i] + (a.shape[i] == 1 ? 0 : idx[lead + i]);
      }
      vals[k] = a.data[size_t(off)];
    }
    out.data[e] = fn(vals);
    for (size_t i = rank; i-- > 0;) {
      if (++idx[i] < out_shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

Arr from_tensor(const Tensor& t) {
  Arr a;
  a.shape.assign(t.shape().begin(), t.shape().end());
  a.integer = !is_float(t.dtype());
  a.data.resize(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    a.data[size_t(i)] = a.integer ? double(t.int_at(i)) : t.float_at(i);
  }
  return a;
}

StatusOr<Arr> eval_mod_node(const ir::Node& n, const std::vector<const Arr*>& in) {
  const std::string& op = n.op_type;
  auto need = [&](size_t k) -> Status {
    if (in.size() < k)
      return invalid_argument("FlexAttention mod: " + n.describe() + " lacks inputs");
    return ok_status();
  };
  auto binary = [&](auto f, bool to_int) -> StatusOr<Arr> {
    KILN_RETURN_IF_ERROR(need(2));
    KILN_ASSIGN_OR_RETURN(
        Arr r, broadcast_map(in, [&](const std::vector<double>& v) { return f(v[0], v[1]); }));
    r.integer = to_int || (in[0]->integer && in[1]->integer);
    return r;
  };
  auto unary = [&](auto f) -> StatusOr<Arr> {
    KILN_RETURN_IF_ERROR(need(1));
    Arr r = *in[0];
    for (double& x : r.data) x = f(x);
    return r;
  };
  if (op == "Add") return binary([](double a, double b) { return a + b; }, false);
  if (op == "Sub") return binary([](double a, double b) { return a - b; }, false);
  if (op == "Mul") return binary([](double a, double b) { return a * b; }, false);
  if (op == "Div") {
    bool ints = in.size() == 2 && in[0]->integer && in[1]->integer;
    return binary([ints](double a, double b) { return ints ? std::trunc(a / b) : a / b; }, false);
  }
  if (op == "Pow") return binary([](double a, double b) { return std::pow(a, b); }, false);
  if (op == "Max") return binary([](double a, double b) { return std::max(a, b); }, false);
  if (op == "Min") return binary([](double a, double b) { return std::min(a, b); }, false);
  if (op == "Greater") return binary([](double a, double b) { return double(a > b); }, true);
  if (op == "GreaterOrEqual")
    return binary([](double a, double b) { return double(a >= b); }, true);
  if (op == "Less") return binary([](double a, double b) { return double(a < b); }, true);
  if (op == "LessOrEqual") return binary([](double a, double b) { return double(a <= b); }, true);
  if (op == "Equal") return binary([](double a, double b) { return double(a == b); }, true);
  if (op == "Tanh") return unary([](double x) { return std::tanh(x); });
  if (op == "Exp") return unary([](double x) { return std::exp(x); });
  if (op == "Neg") return unary([](double x) { return -x; });
  if (op == "Abs") return unary([](double x) { return std::abs(x); });
  if (op == "Sigmoid") return unary([](double x) { return 1.0 / (1.0 + std::exp(-x)); });
  if (op == "Identity") return unary([](double x) { return x; });
  if (op == "Cast") {
    KILN_ASSIGN_OR_RETURN(int64_t to, n.attrs.get_int("to", std::nullopt));
    bool to_float = to == 1 || to == 10 || to == 11 || to == 16;  // ONNX float, f16, f64, bf16
    KILN_ASSIGN_OR_RETURN(Arr r,
                          unary([to_float](double x) { return to_float ? x : std::trunc(x); }));
    r.integer = !to_float;
    return r;
  }
  if (op == "Where") {
    KILN_RETURN_IF_ERROR(need(3));
    KILN_ASSIGN_OR_RETURN(Arr r, broadcast_map(in, [](const std::vector<double>& v) {
                            return v[0] != 0 ? v[1] : v[2];
                          }));
    r.integer = in[1]->integer && in[2]->integer;
    return r;
  }
  if (op == "Shape") {
    KILN_RETURN_IF_ERROR(need(1));
    KILN_ASSIGN_OR_RETURN(int64_t start, n.attrs.get_int("start", 0));
    int64_t rank = int64_t(in[0]->shape.size());
    int64_t end = rank;
    if (n.attrs.has("end")) {
      KILN_ASSIGN_OR_RETURN(end, n.attrs.get_int("end", std::nullopt));
    }
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    Arr r;
    r.integer = true;
    for (int64_t i = start; i < end; ++i) r.data.push_back(double(in[0]->shape[size_t(i)]));
    r.shape = {int64_t(r.data.size())};
    return r;
  }
  if (op == "Gather") {
    KILN_RETURN_IF_ERROR(need(2));
    KILN_ASSIGN_OR_RETURN(int64_t axis, n.attrs.get_int("axis", 0));
    if (in[0]->shape.size() != 1 || (axis != 0 && axis != -1)) {
      return invalid_argument("FlexAttention mod: " + n.describe() + " gathers only from 1-D data");
    }
    Arr r = *in[1];
    r.integer = in[0]->integer;
    int64_t len = in[0]->shape[0];
    for (double& x : r.data) {
      int64_t i = int64_t(x) < 0 ? int64_t(x) + len : int64_t(x);
      if (i < 0 || i >= len)
        return invalid_argument("FlexAttention mod: Gather index out of range");
      x = in[0]->data[size_t(i)];
    }
    return r;
  }
  if (op == "Range") {
    KILN_RETURN_IF_ERROR(need(3));
    double start = in[0]->data.at(0), limit = in[1]->data.at(0), delta = in[2]->data.at(0);
    if (delta == 0) return invalid_argument("FlexAttention mod: Range delta is 0");
    int64_t count = std::max<int64_t>(0, int64_t(std::ceil((limit - start) / delta)));
    Arr r;
    r.integer = in[0]->integer;
    r.shape = {count};
    for (int64_t i = 0; i < count; ++i) r.data.push_back(start + double(i) * delta);
    return r;
  }
  if (op == "Reshape") {
    KILN_RETURN_IF_ERROR(need(2));
    Arr r = *in[0];
    std::vector<int64_t> shape;
    int64_t infer_at = -1, known = 1;
    for (size_t i = 0; i < in[1]->data.size(); ++i) {
      int64_t d = int64_t(in[1]->data[i]);
      if (d == 0 && i < in[0]->shape.size()) d = in[0]->shape[i];
      if (d == -1)
        infer_at = int64_t(i);
      else
        known *= d;
      shape.push_back(d);
    }
    int64_t total = int64_t(r.data.size());
    if (infer_at >= 0 && known > 0) shape[size_t(infer_at)] = total / known;
    if (numel_of(shape) != total) return invalid_argument("FlexAttention mod: bad Reshape");
    r.shape = shape;
    return r;
  }
  return invalid_argument("FlexAttention mod: op " + op + " (" + n.describe() +
                          ") is not supported in a score_mod / prob_mod graph");
}

// Runs a one-input one-output mod graph on `x` (shape [B, H, L, S]) in place.
Status apply_mod(const ir::Graph& g, const std::vector<int64_t>& shape, std::vector<double>* x) {
  if (g.inputs.size() != 1 || g.outputs.size() != 1) {
    return invalid_argument("FlexAttention: a mod graph must have one input and one output");
  }
  std::vector<std::optional<Arr>> vals(g.values.size());
  for (size_t i = 0; i < g.values.size(); ++i) {
    if (g.values[i].constant) vals[i] = from_tensor(*g.values[i].constant);
  }
  vals[size_t(g.inputs[0])] = Arr{shape, std::move(*x), false};
  for (const ir::Node& n : g.nodes) {
    std::vector<const Arr*> in;
    for (int v : n.inputs) {
      if (v < 0 || !vals[size_t(v)]) {
        return invalid_argument("FlexAttention mod: " + n.describe() + " has an undefined input");
      }
      in.push_back(&*vals[size_t(v)]);
    }
    Arr r;
    if (n.op_type == "Constant") {
      KILN_ASSIGN_OR_RETURN(Tensor t, n.attrs.get_tensor("value"));
      r = from_tensor(t);
    } else {
      KILN_ASSIGN_OR_RETURN(r, eval_mod_node(n, in));
    }
    if (n.outputs.empty() || n.outputs[0] < 0) continue;
    vals[size_t(n.outputs[0])] = std::move(r);
  }
  auto& out = vals[size_t(g.outputs[0])];
  if (!out || out->data.size() != size_t(numel_of(shape))) {
    return invalid_argument("FlexAttention: a mod graph's output does not match the scores' shape");
  }
  // A broadcastable but smaller output would be wrong here; require the exact shape.
  if (out->shape != shape) {
    KILN_ASSIGN_OR_RETURN(
        Arr b, broadcast_map({&*out}, [](const std::vector<double>& v) { return v[0]; }));
    *out = std::move(b);
  }
  *x = std::move(out->data);
  return ok_status();
}

// FlexAttention: softmax(score_mod(scale * Q K^T)) -> prob_mod -> @ V, K/V heads shared by
// groups of Q heads.
Status flex_attention_kernel(const KernelArgs& a) {
  const TensorView& q = a.in[0];
  const TensorView& k = a.in[1];
  const TensorView& v = a.in[2];
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4 || k.shape[0] != q.shape[0] ||
      v.shape[0] != q.shape[0] || k.shape[3] != q.shape[3] || v.shape[1] != k.shape[1] ||
      v.shape[2] != k.shape[2] || k.shape[1] <= 0 || q.shape[1] % k.shape[1] != 0) {
    return invalid_argument("FlexAttention: Q " + shape_to_string(q.shape) + ", K " +
                            shape_to_string(k.shape) + ", V " + shape_to_string(v.shape) +
                            " are not [B, Hq, L, E], [B, Hkv, S, E], [B, Hkv, S, Ev]");
  }
  int64_t B = q.shape[0], hq = q.shape[1], L = q.shape[2], E = q.shape[3];
  int64_t hkv = k.shape[1], S = k.shape[2], Ev = v.shape[3], group = hq / hkv;
  double scale = 1.0 / std::sqrt(double(E));
  if (a.attrs.has("scale")) {
    KILN_ASSIGN_OR_RETURN(float s, a.attrs.get_float("scale", std::nullopt));
    scale = s;
  }
  const ir::Attribute* score_mod = a.attrs.find("score_mod");
  const ir::Attribute* prob_mod = a.attrs.find("prob_mod");
  std::vector<int64_t> shape = {B, hq, L, S};
  std::vector<double> p(size_t(numel_of(shape)));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      int64_t kh = b * hkv + h / group;
      for (int64_t l = 0; l < L; ++l) {
        int64_t qrow = ((b * hq + h) * L + l) * E;
        for (int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < E; ++e) {
            dot += load_f64(q, qrow + e) * load_f64(k, (kh * S + s) * E + e);
          }
          p[size_t(((b * hq + h) * L + l) * S + s)] = dot * scale;
        }
      }
    }
  }
  if (score_mod && score_mod->g) KILN_RETURN_IF_ERROR(apply_mod(*score_mod->g, shape, &p));
  for (int64_t row = 0; row < B * hq * L; ++row) {
    double* r = &p[size_t(row * S)];
    double mx = -INFINITY, sum = 0;
    for (int64_t s = 0; s < S; ++s) mx = std::max(mx, r[s]);
    for (int64_t s = 0; s < S; ++s) sum += r[s] = std::exp(r[s] - mx);
    for (int64_t s = 0; s < S; ++s) r[s] /= sum;
  }
  if (prob_mod && prob_mod->g) KILN_RETURN_IF_ERROR(apply_mod(*prob_mod->g, shape, &p));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      int64_t kh = b * hkv + h / group;
      for (int64_t l = 0; l < L; ++l) {
        const double* r = &p[size_t(((b * hq + h) * L + l) * S)];
        for (int64_t m = 0; m < Ev; ++m) {
          double o = 0;
          for (int64_t s = 0; s < S; ++s) o += r[s] * load_f64(v, (kh * S + s) * Ev + m);
          store_f64(a.out[0], ((b * hq + h) * L + l) * Ev + m, o);
        }
      }
    }
  }
  return ok_status();
}

}  // namespace

void register_sequence_model_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kLinearAttention, &linear_attention_kernel);
  r.add(ops::OpKind::kCausalConvWithState, &causal_conv_kernel);
  r.add(ops::OpKind::kFlexAttention, &flex_attention_kernel);
}

}  // namespace kiln::backends::cpu

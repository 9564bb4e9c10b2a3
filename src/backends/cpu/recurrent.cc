// CPU reference kernels of the recurrent ops RNN, GRU and LSTM: one loop over directions, batch
// rows and time steps, computed in double and stored in the outputs' dtype. Per batch row, steps
// past its sequence_lens are not run: Y is zero there and Y_h / Y_c hold the last step run (a
// reverse direction runs from step len-1 down to 0).
#include "ops/recurrent.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;
using ops::RecurrentAttrs;

bool has_in(std::span<const TensorView> in, size_t i) { return in.size() > i && present(in[i]); }
bool has_out(std::span<const TensorView> out, size_t i) {
  return out.size() > i && present(out[i]);
}

bool shape_is(const TensorView& v, const std::vector<int64_t>& dims) {
  return v.rank() == int(dims.size()) && std::equal(dims.begin(), dims.end(), v.shape.begin());
}

class RecurrentKernel final : public Kernel {
 public:
  RecurrentKernel(OpKind op, std::string node, RecurrentAttrs attrs)
      : op_(op), node_(std::move(node)), a_(std::move(attrs)) {}
  std::string name() const override { return "cpu." + std::string(ops::op_name(op_)); }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override;

 private:
  // One step of one direction for one batch row: x [I] and the state h [H] (c [H] for LSTM) in,
  // the new state out (in place). W, R point at this direction's [G*H, I] and [G*H, H] blocks,
  // wb / rb at its biases [G*H] each, p at its peepholes [3H] (nullptr when absent).
  void step(int d, const double* x, const double* w, const double* r, const double* wb,
            const double* rb, const double* p, double* h, double* c);
  double clip(double v) const {
    if (!a_.clip) return v;
    return v > *a_.clip ? *a_.clip : v < -*a_.clip ? -*a_.clip : v;
  }

  OpKind op_;
  std::string node_;
  RecurrentAttrs a_;
  int64_t input_size_ = 0, hidden_ = 0;
  // Per-step scratch: X*W^T + Wb and H*R^T + Rb for every gate row, and GRU's r (.) H.
  std::vector<double> xw_, hr_, rh_, gate_;
};

void RecurrentKernel::step(int d, const double* x, const double* w, const double* r,
                           const double* wb, const double* rb, const double* p, double* h,
                           double* c) {
  const int64_t I = input_size_, H = hidden_, GH = a_.gates * H;
  for (int64_t j = 0; j < GH; ++j) {
    double s = wb[j], t = rb[j];
    for (int64_t i = 0; i < I; ++i) s += w[j * I + i] * x[i];
    for (int64_t k = 0; k < H; ++k) t += r[j * H + k] * h[k];
    xw_[size_t(j)] = s;
    hr_[size_t(j)] = t;
  }
  const ops::RnnActivation& f = a_.activation(d, 0);
  if (op_ == OpKind::kRNN) {
    for (int64_t k = 0; k < H; ++k) h[k] = f(clip(xw_[size_t(k)] + hr_[size_t(k)]));
    return;
  }
  const ops::RnnActivation& g = a_.activation(d, 1);
  if (op_ == OpKind::kGRU) {
    // Gate blocks z, r, h. gate_ holds z, rh_ holds r.
    for (int64_t k = 0; k < H; ++k) {
      gate_[size_t(k)] = f(clip(xw_[size_t(k)] + hr_[size_t(k)]));
      rh_[size_t(k)] = f(clip(xw_[size_t(H + k)] + hr_[size_t(H + k)]));
    }
    std::vector<double>& cand = xw_;  // the candidate overwrites block h of xw_
    if (a_.linear_before_reset) {
      for (int64_t k = 0; k < H; ++k) {
        cand[size_t(2 * H + k)] =
            g(clip(xw_[size_t(2 * H + k)] + rh_[size_t(k)] * hr_[size_t(2 * H + k)]));
      }
    } else {
      // (r (.) H) * Rh^T + Rbh: hr_'s block h used H, so it is recomputed from r (.) H.
      const double* rh_rows = r + 2 * H * H;
      for (int64_t k = 0; k < H; ++k) {
        double t = rb[2 * H + k];
        for (int64_t m = 0; m < H; ++m) t += rh_rows[k * H + m] * (rh_[size_t(m)] * h[m]);
        cand[size_t(2 * H + k)] = g(clip(xw_[size_t(2 * H + k)] + t));
      }
    }
    for (int64_t k = 0; k < H; ++k) {
      double z = gate_[size_t(k)];
      h[k] = (1 - z) * cand[size_t(2 * H + k)] + z * h[k];
    }
    return;
  }
  // LSTM: gate blocks i, o, f, c; peepholes i, o, f.
  const ops::RnnActivation& hact = a_.activation(d, 2);
  for (int64_t k = 0; k < H; ++k) {
    double pi = p ? p[k] : 0, po = p ? p[H + k] : 0, pf = p ? p[2 * H + k] : 0;
    double ig = f(clip(xw_[size_t(k)] + hr_[size_t(k)] + pi * c[k]));
    double fg = a_.input_forget
                    ? 1 - ig
                    : f(clip(xw_[size_t(2 * H + k)] + hr_[size_t(2 * H + k)] + pf * c[k]));
    double cg = g(clip(xw_[size_t(3 * H + k)] + hr_[size_t(3 * H + k)]));
    double cn = fg * c[k] + ig * cg;
    double og = f(clip(xw_[size_t(H + k)] + hr_[size_t(H + k)] + po * cn));
    c[k] = cn;
    h[k] = og * hact(cn);
  }
}

Status RecurrentKernel::execute(std::span<const TensorView> in, std::span<const TensorView> out) {
  const bool lstm = op_ == OpKind::kLSTM;
  const TensorView& X = in[0];
  const TensorView& W = in[1];
  const TensorView& R = in[2];
  auto bad = [&](const std::string& what) { return invalid_argument(node_ + ": " + what); };
  if (X.rank() != 3 || W.rank() != 3 || R.rank() != 3) {
    return bad("X, W and R must be 3-D, got " + shape_to_string(X.shape) + ", " +
               shape_to_string(W.shape) + ", " + shape_to_string(R.shape));
  }
  const int64_t S = a_.layout == 0 ? X.shape[0] : X.shape[1];
  const int64_t N = a_.layout == 0 ? X.shape[1] : X.shape[0];
  const int64_t I = X.shape[2], H = R.shape[2], ND = a_.num_directions, G = a_.gates;
  if (a_.hidden_size && *a_.hidden_size != H) {
    return bad("R " + shape_to_string(R.shape) + " does not match hidden_size " +
               std::to_string(*a_.hidden_size));
  }
  if (!shape_is(W, {ND, G * H, I}) || !shape_is(R, {ND, G * H, H})) {
    return bad("W " + shape_to_string(W.shape) + " or R " + shape_to_string(R.shape) +
               " is not [num_directions, gates*hidden_size, input_size or hidden_size]");
  }
  std::vector<int64_t> state =
      a_.layout == 0 ? std::vector<int64_t>{ND, N, H} : std::vector<int64_t>{N, ND, H};
  if (has_in(in, 3) && !shape_is(in[3], {ND, 2 * G * H})) {
    return bad("B " + shape_to_string(in[3].shape) + " is not [num_directions, 2*gates*hidden]");
  }
  if (has_in(in, 4) && !shape_is(in[4], {N})) {
    return bad("sequence_lens " + shape_to_string(in[4].shape) + " is not [batch_size]");
  }
  for (size_t i : {size_t(5), size_t(6)}) {
    if (has_in(in, i) && (lstm || i == 5) && !shape_is(in[i], state)) {
      return bad(std::string(i == 5 ? "initial_h " : "initial_c ") + shape_to_string(in[i].shape) +
                 " is not " + shape_to_string(state));
    }
  }
  if (lstm && has_in(in, 7) && !shape_is(in[7], {ND, 3 * H})) {
    return bad("P " + shape_to_string(in[7].shape) + " is not [num_directions, 3*hidden_size]");
  }
  std::vector<int64_t> y_shape =
      a_.layout == 0 ? std::vector<int64_t>{S, ND, N, H} : std::vector<int64_t>{N, S, ND, H};
  if (has_out(out, 0) && !shape_is(out[0], y_shape)) {
    return bad("Y " + shape_to_string(out[0].shape) + " is not " + shape_to_string(y_shape));
  }
  for (size_t o = 1; o < out.size(); ++o) {
    if (has_out(out, o) && !shape_is(out[o], state)) {
      return bad("output " + std::to_string(o) + " " + shape_to_string(out[o].shape) + " is not " +
                 shape_to_string(state));
    }
  }
  std::vector<int64_t> lens(size_t(N), S);
  if (has_in(in, 4)) {
    if (!read_indices(in[4], &lens)) return bad("sequence_lens must be int32");
    for (int64_t b = 0; b < N; ++b) {
      if (lens[size_t(b)] < 0 || lens[size_t(b)] > S) {
        return bad("sequence_lens[" + std::to_string(b) + "] = " + std::to_string(lens[size_t(b)]) +
                   " is outside [0, " + std::to_string(S) + "]");
      }
    }
  }

  input_size_ = I;
  hidden_ = H;
  xw_.assign(size_t(G * H), 0);
  hr_.assign(size_t(G * H), 0);
  rh_.assign(size_t(H), 0);
  gate_.assign(size_t(H), 0);
  const std::vector<double> w = to_f64(W), r = to_f64(R);
  const std::vector<double> bias =
      has_in(in, 3) ? to_f64(in[3]) : std::vector<double>(size_t(ND * 2 * G * H), 0.0);
  const std::vector<double> peep = lstm && has_in(in, 7) ? to_f64(in[7]) : std::vector<double>();
  auto x_at = [&](int64_t t, int64_t b) { return a_.layout == 0 ? t * N + b : b * S + t; };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return a_.layout == 0 ? (t * ND + d) * N + b : (b * S + t) * ND + d;
  };
  auto state_at = [&](int64_t d, int64_t b) { return a_.layout == 0 ? d * N + b : b * ND + d; };

  std::vector<double> x(static_cast<size_t>(I)), h(static_cast<size_t>(H)),
      c(static_cast<size_t>(H));
  for (int64_t d = 0; d < ND; ++d) {
    const bool reverse = a_.reverse || d == 1;
    const double* wd = &w[size_t(d * G * H * I)];
    const double* rd = &r[size_t(d * G * H * H)];
    const double* wb = &bias[size_t(d * 2 * G * H)];
    const double* rb = wb + G * H;
    const double* pd = peep.empty() ? nullptr : &peep[size_t(d * 3 * H)];
    for (int64_t b = 0; b < N; ++b) {
      int64_t s0 = state_at(d, b) * H;
      for (int64_t k = 0; k < H; ++k) {
        h[size_t(k)] = has_in(in, 5) ? load_f64(in[5], s0 + k) : 0.0;
        c[size_t(k)] = lstm && has_in(in, 6) ? load_f64(in[6], s0 + k) : 0.0;
      }
      const int64_t len = lens[size_t(b)];
      for (int64_t n = 0; n < len; ++n) {
        int64_t t = reverse ? len - 1 - n : n;
        for (int64_t i = 0; i < I; ++i) x[size_t(i)] = load_f64(X, x_at(t, b) * I + i);
        step(int(d), x.data(), wd, rd, wb, rb, pd, h.data(), c.data());
        if (has_out(out, 0)) {
          for (int64_t k = 0; k < H; ++k) store_f64(out[0], y_at(t, d, b) * H + k, h[size_t(k)]);
        }
      }
      if (has_out(out, 0)) {
        for (int64_t t = len; t < S; ++t) {
          for (int64_t k = 0; k < H; ++k) store_f64(out[0], y_at(t, d, b) * H + k, 0.0);
        }
      }
      for (int64_t k = 0; k < H; ++k) {
        if (has_out(out, 1)) store_f64(out[1], s0 + k, h[size_t(k)]);
        if (lstm && has_out(out, 2)) store_f64(out[2], s0 + k, c[size_t(k)]);
      }
    }
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_recurrent(OpKind op, const KernelQuery& q) {
  auto attrs = ops::parse_recurrent_attrs(op, q.node);
  if (!attrs.ok()) {
    return Status(attrs.status().code(), q.node.describe() + ": " + attrs.status().message());
  }
  return std::unique_ptr<Kernel>(new RecurrentKernel(op, q.node.describe(), std::move(*attrs)));
}

}  // namespace

void register_recurrent_kernels(KernelRegistry& r) {
  r.add_factory(OpKind::kRNN, [](const KernelQuery& q) { return make_recurrent(OpKind::kRNN, q); });
  r.add_factory(OpKind::kGRU, [](const KernelQuery& q) { return make_recurrent(OpKind::kGRU, q); });
  r.add_factory(OpKind::kLSTM,
                [](const KernelQuery& q) { return make_recurrent(OpKind::kLSTM, q); });
}

}  // namespace kiln::backends::cpu

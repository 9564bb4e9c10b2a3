// CUDA kernels of the sequence-model ops: LinearAttention (linear, gated, delta and gated-delta
// recurrences, GQA, past/present state) and CausalConvWithState (depthwise causal convolution with
// a carried state, optional SiLU). In double, as the CPU reference (cpu/sequence_models.cc).
// LinearAttention gives each thread one value column of one head's [d_k, d_v] state, which it
// carries through time in the workspace: columns never interact, so no thread waits on another.
#include <cmath>
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 256;

Status require_float(const KernelQuery& q, DType t, const std::string& what) {
  if (!is_float(t) || dtype_size(t) < 2) {
    return unsupported(q.node.describe() + ": " + what + " of dtype " + std::string(dtype_name(t)));
  }
  return ok_status();
}

// ---- LinearAttention ----

struct LinearAttnArgs {
  int64_t b, t, hq, hkv, dk, dv;
  int64_t decay_last, beta_last;  // 0 when the input is absent
  double scale;
  const void *q, *k, *v, *past, *decay, *beta;
  void *y, *present;
  int q_dtype, k_dtype, v_dtype, past_dtype, decay_dtype, beta_dtype, y_dtype, present_dtype;
  double* state;  // [B, hkv, dk, dv] workspace
};

__global__ void linear_attention_kernel(LinearAttnArgs a, int64_t n) {
  KILN_GRID_LOOP(e, n) {
    const int64_t m = e % a.dv, h = (e / a.dv) % a.hkv, b = e / (a.dv * a.hkv);
    const int64_t base = (b * a.hkv + h) * a.dk * a.dv + m;  // s[d] is state[base + d * dv]
    double* s = a.state + base;
    for (int64_t d = 0; d < a.dk; ++d)
      s[d * a.dv] = a.past ? load_as<double>(a.past, a.past_dtype, base + d * a.dv) : 0.0;
    const int64_t group = a.hq / a.hkv;
    for (int64_t t = 0; t < a.t; ++t) {
      const int64_t row = b * a.t + t, kbase = (row * a.hkv + h) * a.dk;
      if (a.decay) {
        for (int64_t d = 0; d < a.dk; ++d) {
          int64_t gi = a.decay_last == a.hkv ? row * a.hkv + h : kbase + d;
          s[d * a.dv] *= exp(load_as<double>(a.decay, a.decay_dtype, gi));
        }
      }
      double vm = load_as<double>(a.v, a.v_dtype, (row * a.hkv + h) * a.dv + m);
      if (a.beta) {
        double beta =
            load_as<double>(a.beta, a.beta_dtype, row * a.beta_last + (a.beta_last == 1 ? 0 : h));
        double r = 0;
        for (int64_t d = 0; d < a.dk; ++d)
          r += s[d * a.dv] * load_as<double>(a.k, a.k_dtype, kbase + d);
        vm = beta * (vm - r);
      }
      for (int64_t d = 0; d < a.dk; ++d)
        s[d * a.dv] += load_as<double>(a.k, a.k_dtype, kbase + d) * vm;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t qh = h * group + g, qbase = (row * a.hq + qh) * a.dk;
        double o = 0;
        for (int64_t d = 0; d < a.dk; ++d)
          o += load_as<double>(a.q, a.q_dtype, qbase + d) * s[d * a.dv];
        store_as<double>(a.y, a.y_dtype, (row * a.hq + qh) * a.dv + m, a.scale * o);
      }
    }
    if (a.present) {
      for (int64_t d = 0; d < a.dk; ++d)
        store_as<double>(a.present, a.present_dtype, base + d * a.dv, s[d * a.dv]);
    }
  }
}

class LinearAttentionKernel final : public CudaKernel {
 public:
  LinearAttentionKernel(int64_t hq, int64_t hkv, float scale)
      : CudaKernel("cuda.LinearAttention"), hq_(hq), hkv_(hkv), scale_(scale) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &q = in[0], &k = in[1], &v = in[2];
    auto opt = [&](size_t i) -> const TensorView* {
      return in.size() > i && present(in[i]) ? &in[i] : nullptr;
    };
    const TensorView *past = opt(3), *decay = opt(4), *beta = opt(5);
    if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3 || q.shape[2] % hq_ != 0 ||
        v.shape[2] % hkv_ != 0) {
      return invalid_argument(name_ + ": query " + shape_to_string(q.shape) + ", value " +
                              shape_to_string(v.shape) + " do not split into the heads");
    }
    LinearAttnArgs a{};
    a.b = q.shape[0], a.t = q.shape[1], a.hq = hq_, a.hkv = hkv_, a.dk = q.shape[2] / hq_,
    a.dv = v.shape[2] / hkv_;
    if (k.shape[0] != a.b || k.shape[1] != a.t || k.shape[2] != a.hkv * a.dk || v.shape[0] != a.b ||
        v.shape[1] != a.t) {
      return invalid_argument(name_ + ": key or value does not match the query");
    }
    if (decay) {
      a.decay_last = decay->rank() == 3 ? decay->shape[2] : -1;
      if (decay->rank() != 3 || decay->shape[0] != a.b || decay->shape[1] != a.t ||
          (a.decay_last != a.hkv && a.decay_last != a.hkv * a.dk)) {
        return invalid_argument(name_ +
                                ": decay must be [B, T, kv_num_heads] or [B, T, kv_num_heads*d_k]");
      }
      a.decay = decay->data, a.decay_dtype = int(decay->dtype);
    }
    if (beta) {
      a.beta_last = beta->rank() == 3 ? beta->shape[2] : -1;
      if (beta->rank() != 3 || beta->shape[0] != a.b || beta->shape[1] != a.t ||
          (a.beta_last != a.hkv && a.beta_last != 1)) {
        return invalid_argument(name_ + ": beta must be [B, T, kv_num_heads] or [B, T, 1]");
      }
      a.beta = beta->data, a.beta_dtype = int(beta->dtype);
    }
    const int64_t state = a.b * a.hkv * a.dk * a.dv;
    if (past) {
      if (past->numel() != state || past->rank() != 4)
        return invalid_argument(name_ + ": past_state has the wrong shape");
      a.past = past->data, a.past_dtype = int(past->dtype);
    }
    a.scale = scale_ == 0.f ? 1.0 / std::sqrt(double(a.dk)) : double(scale_);
    a.q = q.data, a.k = k.data, a.v = v.data;
    a.q_dtype = int(q.dtype), a.k_dtype = int(k.dtype), a.v_dtype = int(v.dtype);
    a.y = out[0].data, a.y_dtype = int(out[0].dtype);
    if (out.size() > 1 && present(out[1]))
      a.present = out[1].data, a.present_dtype = int(out[1].dtype);
    KILN_RETURN_IF_ERROR(check_workspace(workspace_piece(size_t(state) * sizeof(double)), name_));
    a.state = static_cast<double*>(workspace_);
    const int64_t n = a.b * a.hkv * a.dv;
    if (n == 0 || a.dk == 0) return ok_status();
    linear_attention_kernel<<<grid_for(n, 64), 64, 0, stream_>>>(a, n);
    return launch_status("linear_attention_kernel");
  }

 private:
  int64_t hq_, hkv_;
  float scale_;
};

StatusOr<std::unique_ptr<Kernel>> make_linear_attention(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(int64_t hq, q.node.attrs.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t hkv, q.node.attrs.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(float scale, q.node.attrs.get_float("scale", 0.0f));
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0) {
    return unsupported(q.node.describe() +
                       ": q_num_heads must be a positive multiple of kv_num_heads");
  }
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    if (q.inputs[i])
      KILN_RETURN_IF_ERROR(require_float(q, q.inputs[i]->dtype, "input " + std::to_string(i)));
  }
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    if (q.outputs[i])
      KILN_RETURN_IF_ERROR(require_float(q, q.outputs[i]->dtype, "output " + std::to_string(i)));
  }
  if (q.inputs.size() < 3 || !q.inputs[0] || !q.inputs[0]->shape || !q.inputs[2] ||
      !q.inputs[2]->shape || q.inputs[0]->shape->size() != 3 || q.inputs[2]->shape->size() != 3) {
    return unsupported(q.node.describe() + ": query and value must be 3-D");
  }
  return std::unique_ptr<Kernel>(new LinearAttentionKernel(hq, hkv, scale));
}

// The state, [B, kv_heads, d_k, d_v] doubles: B * (kv_heads * d_v) * (hidden_q / q_heads).
ir::Dim linear_attention_workspace(const KernelQuery& q) {
  auto hq = q.node.attrs.get_int("q_num_heads", 0);
  if (!hq.ok() || *hq <= 0 || q.inputs.size() < 3 || !q.inputs[0] || !q.inputs[0]->shape ||
      !q.inputs[2] || !q.inputs[2]->shape || q.inputs[0]->shape->size() != 3 ||
      q.inputs[2]->shape->size() != 3) {
    return 0;
  }
  const auto &qs = *q.inputs[0]->shape, &vs = *q.inputs[2]->shape;
  ir::Dim bytes =
      qs[0] * vs[2] * ir::Dim::floor_div(qs[2], ir::Dim(*hq)) * ir::Dim(int64_t(sizeof(double)));
  const int64_t align = int64_t(kWorkspaceAlign);
  return ir::Dim::ceil_div(bytes, align) * align;
}

// ---- CausalConvWithState ----

struct CausalConvArgs {
  int64_t c, l, k;  // channels, length, kernel size (state length k - 1)
  const void *x, *w, *bias, *past;
  void *y, *present;
  int x_dtype, w_dtype, bias_dtype, past_dtype, y_dtype, present_dtype;
  int silu;
};

// padded(b, c, i): the past state (zeros when absent) for i < k - 1, then the input.
__device__ __forceinline__ double padded_at(const CausalConvArgs& a, int64_t bc, int64_t i) {
  const int64_t p = a.k - 1;
  if (i < p) return a.past ? load_as<double>(a.past, a.past_dtype, bc * p + i) : 0.0;
  return load_as<double>(a.x, a.x_dtype, bc * a.l + i - p);
}

__global__ void causal_conv_kernel(CausalConvArgs a, int64_t n) {
  KILN_GRID_LOOP(e, n) {
    const int64_t t = e % a.l, bc = e / a.l, c = bc % a.c;
    double y = a.bias ? load_as<double>(a.bias, a.bias_dtype, c) : 0.0;
    for (int64_t j = 0; j < a.k; ++j)
      y += load_as<double>(a.w, a.w_dtype, c * a.k + j) * padded_at(a, bc, t + j);
    if (a.silu) y = y / (1.0 + exp(-y));
    store_as<double>(a.y, a.y_dtype, e, y);
  }
}

// present = padded's last k - 1 positions.
__global__ void causal_conv_state_kernel(CausalConvArgs a, int64_t n) {
  KILN_GRID_LOOP(e, n) {
    const int64_t p = a.k - 1, i = e % p, bc = e / p;
    store_as<double>(a.present, a.present_dtype, e, padded_at(a, bc, a.l + i));
  }
}

class CausalConvKernel final : public CudaKernel {
 public:
  explicit CausalConvKernel(bool silu) : CudaKernel("cuda.CausalConvWithState"), silu_(silu) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &w = in[1];
    if (x.rank() != 3 || w.rank() != 3 || w.shape[0] != x.shape[1] || w.shape[1] != 1 ||
        w.shape[2] < 1) {
      return invalid_argument(name_ + ": input " + shape_to_string(x.shape) + " and weight " +
                              shape_to_string(w.shape) + " are not [B, C, L] and [C, 1, k]");
    }
    CausalConvArgs a{};
    const int64_t b = x.shape[0];
    a.c = x.shape[1], a.l = x.shape[2], a.k = w.shape[2];
    a.x = x.data, a.x_dtype = int(x.dtype), a.w = w.data, a.w_dtype = int(w.dtype);
    if (in.size() > 2 && present(in[2])) {
      if (in[2].numel() != a.c)
        return invalid_argument(name_ + ": bias does not match the channels");
      a.bias = in[2].data, a.bias_dtype = int(in[2].dtype);
    }
    if (in.size() > 3 && present(in[3])) {
      const TensorView& p = in[3];
      if (p.rank() != 3 || p.shape[0] != b || p.shape[1] != a.c || p.shape[2] != a.k - 1) {
        return invalid_argument(name_ + ": past_state of shape " + shape_to_string(p.shape) +
                                " is not [B, C, k-1]");
      }
      a.past = p.data, a.past_dtype = int(p.dtype);
    }
    a.y = out[0].data, a.y_dtype = int(out[0].dtype);
    a.silu = silu_;
    const int64_t n = b * a.c * a.l;
    if (n > 0) {
      causal_conv_kernel<<<grid_for(n), kBlock, 0, stream_>>>(a, n);
      KILN_RETURN_IF_ERROR(launch_status("causal_conv_kernel"));
    }
    if (out.size() > 1 && present(out[1]) && a.k > 1) {
      a.present = out[1].data, a.present_dtype = int(out[1].dtype);
      const int64_t m = b * a.c * (a.k - 1);
      if (m > 0) {
        causal_conv_state_kernel<<<grid_for(m), kBlock, 0, stream_>>>(a, m);
        return launch_status("causal_conv_state_kernel");
      }
    }
    return ok_status();
  }

 private:
  bool silu_;
};

StatusOr<std::unique_ptr<Kernel>> make_causal_conv(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::string act, q.node.attrs.get_string("activation", "none"));
  if (act != "none" && act != "silu" && act != "swish") {
    return unsupported(q.node.describe() + ": activation '" + act + "'");
  }
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    if (q.inputs[i])
      KILN_RETURN_IF_ERROR(require_float(q, q.inputs[i]->dtype, "input " + std::to_string(i)));
  }
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    if (q.outputs[i])
      KILN_RETURN_IF_ERROR(require_float(q, q.outputs[i]->dtype, "output " + std::to_string(i)));
  }
  return std::unique_ptr<Kernel>(new CausalConvKernel(act != "none"));
}

}  // namespace

void register_sequence_models(Registry& r) {
  r.add(OpKind::kLinearAttention, &make_linear_attention,
        {.workspace = &linear_attention_workspace});
  r.add(OpKind::kCausalConvWithState, &make_causal_conv);
}

}  // namespace kiln::backends::cuda

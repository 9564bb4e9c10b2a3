// CPU reference kernels of the attention op family: Attention (opsets 23-25, following the ONNX
// 1.23 reference's order of scale, softcap, mask, causal, window and padding) and RotaryEmbedding.
// Computed in double and stored in the input's float dtype; float32 Attention without past,
// softcap, windows, padding lengths or extra outputs runs attention_f32's GEMM kernel instead.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/attention_f32.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/numeric.h"

namespace kiln::backends::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A [B, heads, seq, head] tensor read from a 3-D [B, seq, heads*head] or 4-D view.
struct Heads4 {
  int64_t b = 0, h = 0, s = 0, d = 0;
  std::vector<double> data;  // [b, h, s, d]
  double at(int64_t bi, int64_t hi, int64_t si, int64_t di) const {
    return data[size_t(((bi * h + hi) * s + si) * d + di)];
  }
};

Status read_heads(const TensorView& v, int64_t num_heads, const char* what, Heads4* out) {
  if (v.rank() == 4) {
    *out = Heads4{v.shape[0], v.shape[1], v.shape[2], v.shape[3], to_f64(v)};
    return ok_status();
  }
  if (v.rank() != 3 || num_heads <= 0 || v.shape[2] % num_heads != 0) {
    return invalid_argument(std::string("Attention: ") + what + " of shape " +
                            shape_to_string(v.shape) + " does not split into " +
                            std::to_string(num_heads) + " heads");
  }
  int64_t b = v.shape[0], s = v.shape[1], h = num_heads, d = v.shape[2] / num_heads;
  *out = Heads4{b, h, s, d, std::vector<double>(size_t(v.numel()))};
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t si = 0; si < s; ++si) {
      for (int64_t hi = 0; hi < h; ++hi) {
        for (int64_t di = 0; di < d; ++di) {
          out->data[size_t(((bi * h + hi) * s + si) * d + di)] =
              load_f64(v, ((bi * s + si) * h + hi) * d + di);
        }
      }
    }
  }
  return ok_status();
}

// Concatenates a past [B, h, P, d] before the new keys/values along the sequence.
Status with_past(const KernelArgs& a, int past_index, Heads4* x) {
  if (int(a.in.size()) <= past_index || !present(a.in[past_index])) return ok_status();
  const TensorView& p = a.in[past_index];
  if (p.rank() != 4 || p.shape[0] != x->b || p.shape[1] != x->h || p.shape[3] != x->d) {
    return invalid_argument("Attention: past of shape " + shape_to_string(p.shape) +
                            " does not match the new keys/values");
  }
  int64_t ps = p.shape[2], ts = ps + x->s;
  std::vector<double> out(size_t(x->b * x->h * ts * x->d));
  for (int64_t bh = 0; bh < x->b * x->h; ++bh) {
    for (int64_t si = 0; si < ts; ++si) {
      for (int64_t di = 0; di < x->d; ++di) {
        out[size_t((bh * ts + si) * x->d + di)] =
            si < ps ? load_f64(p, (bh * ps + si) * x->d + di)
                    : x->data[size_t((bh * x->s + si - ps) * x->d + di)];
      }
    }
  }
  x->s = ts;
  x->data = std::move(out);
  return ok_status();
}

void write_heads(const TensorView& out, const Heads4& x) {
  for (int64_t e = 0; e < int64_t(x.data.size()); ++e) store_f64(out, e, x.data[size_t(e)]);
}

// Q, K or V (3-D [B, S, heads * head] split by num_heads, or 4-D [B, heads, S, head]) as strided
// heads of float32, with its sizes; false where it is neither.
bool heads_f32(const TensorView& v, int64_t num_heads, HeadsF32* out, int64_t dims[4]) {
  if (v.dtype != DType::kFloat32) return false;
  const float* p = v.as<const float>();
  if (v.rank() == 4) {
    dims[0] = v.shape[0], dims[1] = v.shape[1], dims[2] = v.shape[2], dims[3] = v.shape[3];
    *out = HeadsF32{p, dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3]};
    return true;
  }
  if (v.rank() != 3 || num_heads <= 0 || v.shape[2] % num_heads != 0) return false;
  dims[0] = v.shape[0], dims[1] = num_heads, dims[2] = v.shape[1], dims[3] = v.shape[2] / num_heads;
  *out = HeadsF32{p, dims[2] * v.shape[2], dims[3], v.shape[2]};
  return true;
}

// attention_f32 where it computes what the reference would (float32, no past, softcap, window,
// padding lengths or outputs past Y, consistent shapes, a float32 or bool mask that broadcasts);
// false leaves the node to the reference, which also reports what is wrong.
bool attention_fast(const KernelArgs& a, int64_t qh, int64_t kvh, int64_t causal, float softcap,
                    int64_t left, int64_t right) {
  auto given = [&](size_t i) { return a.in.size() > i && present(a.in[i]); };
  if (given(4) || given(5) || given(6) || softcap > 0 || left >= 0 || right >= 0) return false;
  for (size_t i = 1; i < a.out.size(); ++i) {
    if (present(a.out[i])) return false;
  }
  AttentionF32 f;
  int64_t q[4], k[4], v[4];
  if (!heads_f32(a.in[0], qh, &f.q, q) || !heads_f32(a.in[1], kvh, &f.k, k) ||
      !heads_f32(a.in[2], kvh, &f.v, v)) {
    return false;
  }
  if (k[3] != q[3] || v[2] != k[2] || v[1] != k[1] || k[1] == 0 || q[1] % k[1] != 0 ||
      k[0] != q[0] || v[0] != q[0]) {
    return false;
  }
  const TensorView& y = a.out[0];
  if (y.dtype != DType::kFloat32 || y.numel() != q[0] * q[1] * q[2] * v[3]) return false;
  f.batch = q[0], f.hq = q[1], f.hk = k[1], f.s = q[2], f.l = k[2], f.d = q[3], f.dv = v[3];
  f.y = y.as<float>();
  if (a.in[0].rank() == 3) {  // Y is [B, S, hq * dv]
    f.ysb = f.s * f.hq * f.dv, f.ysh = f.dv, f.yss = f.hq * f.dv;
  } else {
    f.ysb = f.hq * f.s * f.dv, f.ysh = f.s * f.dv, f.yss = f.dv;
  }
  const StatusOr<double> scale = attention_scale(a.attrs, f.d);
  if (!scale.ok()) return false;
  f.scale = float(*scale);
  f.causal = causal != 0;
  if (given(3) && !set_attention_mask(a.in[3], &f)) return false;
  attention_f32(f);
  return true;
}

Status attention_kernel(const KernelArgs& a) {
  KILN_ASSIGN_OR_RETURN(int64_t qh_attr, a.attrs.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t kvh_attr, a.attrs.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t causal, a.attrs.get_int("is_causal", 0));
  KILN_ASSIGN_OR_RETURN(int64_t mode, a.attrs.get_int("qk_matmul_output_mode", 0));
  KILN_ASSIGN_OR_RETURN(float softcap, a.attrs.get_float("softcap", 0.f));
  KILN_ASSIGN_OR_RETURN(int64_t left, a.attrs.get_int("left_window_size", -1));
  KILN_ASSIGN_OR_RETURN(int64_t right, a.attrs.get_int("right_window_size", -1));
  if (attention_fast(a, qh_attr, kvh_attr, causal, softcap, left, right)) return ok_status();
  Heads4 q, k, v;
  KILN_RETURN_IF_ERROR(read_heads(a.in[0], qh_attr, "Q", &q));
  KILN_RETURN_IF_ERROR(read_heads(a.in[1], kvh_attr, "K", &k));
  KILN_RETURN_IF_ERROR(read_heads(a.in[2], kvh_attr, "V", &v));
  int64_t past = a.in.size() > 4 && present(a.in[4]) ? a.in[4].shape[2] : 0;
  KILN_RETURN_IF_ERROR(with_past(a, 4, &k));
  KILN_RETURN_IF_ERROR(with_past(a, 5, &v));
  if (k.d != q.d || v.s != k.s || v.h != k.h || k.h == 0 || q.h % k.h != 0 || k.b != q.b ||
      v.b != q.b) {
    return invalid_argument("Attention: Q, K and V shapes are inconsistent");
  }
  KILN_ASSIGN_OR_RETURN(double scale, attention_scale(a.attrs, q.d));
  const int64_t S = q.s, L = k.s, group = q.h / k.h;
  // The additive mask, broadcast from its own shape onto [B, Hq, S, L]; a bool mask keeps True.
  const TensorView* mask = a.in.size() > 3 && present(a.in[3]) ? &a.in[3] : nullptr;
  int64_t mshape[4] = {1, 1, 1, 1};
  if (mask) {
    const int64_t want[4] = {q.b, q.h, S, L};
    KILN_RETURN_IF_ERROR(attention_mask_shape(*mask, want, mshape));
  }
  std::vector<int64_t> nonpad;
  if (a.in.size() > 6 && present(a.in[6])) {
    if (!read_indices(a.in[6], &nonpad) || int64_t(nonpad.size()) != q.b) {
      return invalid_argument("Attention: nonpad_kv_seqlen must hold one int per batch");
    }
  }
  const TensorView& y = a.out[0];
  const TensorView* qk_out = a.out.size() > 3 && present(a.out[3]) ? &a.out[3] : nullptr;
  std::vector<double> yv(size_t(q.b * q.h * S * v.d), 0.0);
  std::vector<double> row(static_cast<size_t>(L)), raw(row), biased(row);
  const double sq = std::sqrt(scale);
  for (int64_t b = 0; b < q.b; ++b) {
    // Causal and window masks align bottom-right: query i sits at absolute position i + offset,
    // offset being the keys before the query block (the past cache, or for an external cache
    // without past, nonpad_kv_seqlen[b] - S). Not clamped: a negative offset masks whole rows.
    const int64_t offset = past == 0 && !nonpad.empty() ? nonpad[size_t(b)] - S : past;
    for (int64_t h = 0; h < q.h; ++h) {
      int64_t kh = h / group;
      for (int64_t i = 0; i < S; ++i) {
        bool masked = L > 0;
        for (int64_t j = 0; j < L; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < q.d; ++d)
            dot += (q.at(b, h, i, d) * sq) * (k.at(b, kh, j, d) * sq);
          if (softcap > 0) dot = std::tanh(dot / softcap) * softcap;
          raw[j] = dot;
          double bias = 0;
          if (mask) {
            if (j >= mshape[3]) {
              bias = kNegInf;  // the reference pads a short mask with False / -inf
            } else {
              int64_t mi =
                  (((mshape[0] == 1 ? 0 : b) * mshape[1] + (mshape[1] == 1 ? 0 : h)) * mshape[2] +
                   (mshape[2] == 1 ? 0 : i)) *
                      mshape[3] +
                  j;
              double m = load_f64(*mask, mi);
              bias = mask->dtype == DType::kBool ? (m != 0 ? 0.0 : kNegInf) : m;
            }
          }
          const int64_t diff = i + offset - j;  // how far key j lies before the query
          if (causal && diff < 0) bias += kNegInf;
          if ((left >= 0 && diff > left) || (right >= 0 && -diff > right)) bias += kNegInf;
          if (!nonpad.empty() && j >= nonpad[b]) bias += kNegInf;
          masked = masked && bias == kNegInf;
          biased[j] = dot + bias;
        }
        // A row whose every key is masked (decided on the bias, not on the logits) attends
        // nothing: its probabilities and output are 0, not NaN (onnx 1.23's errata to 23/24).
        double mx = kNegInf;
        for (int64_t j = 0; j < L; ++j) mx = std::max(mx, biased[j]);
        if (mx == kNegInf) mx = 0;
        double sum = 0;
        for (int64_t j = 0; j < L; ++j) {
          row[j] = std::exp(biased[j] - mx);
          sum += row[j];
        }
        for (int64_t j = 0; j < L; ++j) row[j] = masked ? 0.0 : row[j] / (sum == 0 ? 1.0 : sum);
        double* yp = yv.data() + ((b * q.h + h) * S + i) * v.d;
        for (int64_t j = 0; j < L; ++j) {
          for (int64_t d = 0; d < v.d; ++d) yp[d] += row[j] * v.at(b, kh, j, d);
        }
        if (qk_out) {
          const std::vector<double>& src = mode == 3 ? row : mode == 2 ? biased : raw;
          int64_t base = ((b * q.h + h) * S + i) * L;
          for (int64_t j = 0; j < L; ++j) store_f64(*qk_out, base + j, src[j]);
        }
      }
    }
  }
  if (y.numel() != int64_t(yv.size())) return invalid_argument("Attention: Y has the wrong size");
  if (a.in[0].rank() == 3) {
    // [B, H, S, Dv] -> [B, S, H*Dv]
    for (int64_t b = 0; b < q.b; ++b) {
      for (int64_t h = 0; h < q.h; ++h) {
        for (int64_t i = 0; i < S; ++i) {
          for (int64_t d = 0; d < v.d; ++d) {
            store_f64(y, ((b * S + i) * q.h + h) * v.d + d,
                      yv[size_t(((b * q.h + h) * S + i) * v.d + d)]);
          }
        }
      }
    }
  } else {
    for (int64_t e = 0; e < y.numel(); ++e) store_f64(y, e, yv[size_t(e)]);
  }
  if (a.out.size() > 1 && present(a.out[1])) write_heads(a.out[1], k);
  if (a.out.size() > 2 && present(a.out[2])) write_heads(a.out[2], v);
  return ok_status();
}

// RotaryEmbedding: X as [B, S, heads, head] (4-D inputs are [B, heads, S, head]); the first
// rotary_embedding_dim values of each head rotate by the cached cos/sin of their position.
Status rotary_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& cosv = a.in[1];
  const TensorView& sinv = a.in[2];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t interleaved, a.attrs.get_int("interleaved", 0));
  KILN_ASSIGN_OR_RETURN(int64_t num_heads, a.attrs.get_int("num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t rot, a.attrs.get_int("rotary_embedding_dim", 0));
  int64_t B, S, H, D;
  bool four_d = x.rank() == 4;
  if (four_d) {
    B = x.shape[0], H = x.shape[1], S = x.shape[2], D = x.shape[3];
  } else if (x.rank() == 3 && num_heads > 0 && x.shape[2] % num_heads == 0) {
    B = x.shape[0], S = x.shape[1], H = num_heads, D = x.shape[2] / num_heads;
  } else {
    return invalid_argument("RotaryEmbedding: input of shape " + shape_to_string(x.shape) +
                            " with num_heads " + std::to_string(num_heads));
  }
  if (rot == 0) rot = D;
  if (rot > D || rot % 2 != 0) return invalid_argument("RotaryEmbedding: bad rotary_embedding_dim");
  int64_t half = rot / 2;
  bool has_pos = a.in.size() > 3 && present(a.in[3]);
  std::vector<int64_t> pos;
  if (has_pos && (!read_indices(a.in[3], &pos) || int64_t(pos.size()) != B * S)) {
    return invalid_argument("RotaryEmbedding: position_ids must be [batch, sequence]");
  }
  if (cosv.shape.empty() || cosv.shape.back() != half || sinv.numel() != cosv.numel()) {
    return invalid_argument("RotaryEmbedding: the caches' last dim must be rotary_embedding_dim/2");
  }
  int64_t rows = cosv.numel() / half;
  // Without position_ids the caches are [B, S, dim/2], or [1, S, dim/2] for every batch row (the
  // ONNX reference broadcasts them so).
  const bool per_batch = rows == B * S;
  if (!has_pos && !per_batch && rows != S) {
    return invalid_argument(
        "RotaryEmbedding: without position_ids the caches must be [B, S, dim/2] or [1, S, dim/2]");
  }
  // The offset of head h of (batch b, position s); its D elements follow it.
  auto head = [&](int64_t b, int64_t s, int64_t h) {
    return four_d ? ((b * H + h) * S + s) * D : ((b * S + s) * H + h) * D;
  };
  // One walk for every dtype: element e of x, the caches and y through load(e) and store(e, v),
  // the arithmetic in double. float32 reads and writes through typed pointers (load_f64 and
  // store_f64 dispatch on the dtype per element), so the same bits.
  auto rotate = [&](auto load_x, auto load_c, auto load_s, auto store) -> Status {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) {
        int64_t r = has_pos ? pos[size_t(b * S + s)] : per_batch ? b * S + s : s;
        if (r < 0 || r >= rows) {
          return invalid_argument("RotaryEmbedding: position id " + std::to_string(r) +
                                  " is outside the cache of " + std::to_string(rows) + " rows");
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = head(b, s, h);
          for (int64_t j = 0; j < half; ++j) {
            const int64_t i1 = base + (interleaved ? 2 * j : j);
            const int64_t i2 = base + (interleaved ? 2 * j + 1 : j + half);
            const double x1 = load_x(i1), x2 = load_x(i2);
            const double c = load_c(r * half + j), sn = load_s(r * half + j);
            store(i1, c * x1 - sn * x2);
            store(i2, sn * x1 + c * x2);
          }
          for (int64_t d = rot; d < D; ++d) store(base + d, load_x(base + d));
        }
      }
    }
    return ok_status();
  };
  if (x.dtype == DType::kFloat32 && cosv.dtype == DType::kFloat32 &&
      sinv.dtype == DType::kFloat32 && y.dtype == DType::kFloat32) {
    const float *xf = x.as<const float>(), *cf = cosv.as<const float>(),
                *sf = sinv.as<const float>();
    float* yf = y.as<float>();
    return rotate(
        [xf](int64_t e) { return double(xf[e]); }, [cf](int64_t e) { return double(cf[e]); },
        [sf](int64_t e) { return double(sf[e]); }, [yf](int64_t e, double v) { yf[e] = float(v); });
  }
  return rotate([&](int64_t e) { return load_f64(x, e); },
                [&](int64_t e) { return load_f64(cosv, e); },
                [&](int64_t e) { return load_f64(sinv, e); },
                [&](int64_t e, double v) { store_f64(y, e, v); });
}

}  // namespace

void register_attention_kernels(KernelRegistry& r) {
  r.add(ops::OpKind::kAttention, &attention_kernel);
  r.add(ops::OpKind::kRotaryEmbedding, &rotary_kernel);
}

}  // namespace kiln::backends::cpu

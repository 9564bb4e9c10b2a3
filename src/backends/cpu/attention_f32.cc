#include "backends/cpu/attention_f32.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cpu/vector_math.h"

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kRowBlock = 64;  // query rows a task takes: 64 x keys floats of scores
// Below this many multiply-adds in all, the blocks run on the calling thread.
constexpr int64_t kParallelWork = int64_t(1) << 18;

// Scale is applied by the first GEMM; here the mask and is_causal go onto row r (query i) of the
// block's scores, keys [0, n). Returns whether any key is open (its bias is not -inf): a row with
// none attends nothing.
bool mask_row(const AttentionF32& a, int64_t b, int64_t h, int64_t i, float* row, int64_t n) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Keys past the query (is_causal) or past a short mask are masked; the rest may be open.
  int64_t open_end = a.causal ? std::min(n, i + 1) : n;
  if (a.mask_f || a.mask_b) open_end = std::min(open_end, a.m[3]);
  for (int64_t j = open_end; j < n; ++j) row[j] = neg_inf;
  if (!a.mask_f && !a.mask_b) return open_end > 0;
  const int64_t base =
      (((a.m[0] == 1 ? 0 : b) * a.m[1] + (a.m[1] == 1 ? 0 : h)) * a.m[2] + (a.m[2] == 1 ? 0 : i)) *
      a.m[3];
  bool open = false;
  if (a.mask_f) {
    const float* m = a.mask_f + base;
    for (int64_t j = 0; j < open_end; ++j) {
      row[j] += m[j];
      open = open || m[j] != neg_inf;
    }
  } else {
    const uint8_t* m = a.mask_b + base;
    for (int64_t j = 0; j < open_end; ++j) {
      if (m[j] == 0) row[j] = neg_inf;
      open = open || m[j] != 0;
    }
  }
  return open;
}

void run_block(const AttentionF32& a, int64_t task) {
  const int64_t blocks = (a.s + kRowBlock - 1) / kRowBlock;
  const int64_t bh = task / blocks, b = bh / a.hq, h = bh % a.hq, kh = h / (a.hq / a.hk);
  const int64_t i0 = (task % blocks) * kRowBlock, rows = std::min(kRowBlock, a.s - i0);
  // The keys any row of the block sees: under is_causal, up to its last row.
  const int64_t n = a.causal ? std::min(a.l, i0 + rows) : a.l;
  float* y = a.y + b * a.ysb + h * a.ysh + i0 * a.yss;
  if (n == 0) {
    for (int64_t r = 0; r < rows; ++r) std::fill_n(y + r * a.yss, a.dv, 0.f);
    return;
  }
  static thread_local std::vector<float> scratch;
  if (scratch.size() < size_t(rows * n)) scratch.resize(size_t(rows * n));
  float* sc = scratch.data();
  const float* q = a.q.p + b * a.q.sb + h * a.q.sh + i0 * a.q.ss;
  const float* k = a.k.p + b * a.k.sb + kh * a.k.sh;
  const float* v = a.v.p + b * a.v.sb + kh * a.v.sh;
  sgemm(false, true, rows, n, a.d, a.scale, q, a.q.ss, k, a.k.ss, 0.f, sc, n);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = sc + r * n;
    if (mask_row(a, b, h, i0 + r, row, n)) {
      softmax_row_f32(row, row, n);
    } else {
      std::fill_n(row, n, 0.f);  // every key masked: the row's output is 0
    }
  }
  sgemm(false, false, rows, a.dv, n, 1.f, sc, n, v, a.v.ss, 0.f, y, a.yss);
}

void run_task(const void* ctx, int64_t task) {
  ScopedThreadLimit one(1);  // the block's GEMMs on this thread: the blocks fill the pool
  run_block(*static_cast<const AttentionF32*>(ctx), task);
}

}  // namespace

StatusOr<double> attention_scale(const ir::Attributes& attrs, int64_t d) {
  if (!attrs.has("scale")) return 1.0 / std::sqrt(double(d));
  KILN_ASSIGN_OR_RETURN(float s, attrs.get_float("scale", std::nullopt));
  return double(s);
}

Status attention_mask_shape(const TensorView& mask, const int64_t want[4], int64_t m[4]) {
  if (mask.rank() < 1 || mask.rank() > 4) {  // rank 1 (one row for all queries): opset 25
    return invalid_argument("Attention: attn_mask must have rank 1 to 4");
  }
  const int64_t pad = 4 - mask.rank();
  for (int d = 0; d < 4; ++d) {
    m[d] = d < pad ? 1 : mask.shape[size_t(d - pad)];
    if (d < 3 && m[d] != 1 && m[d] != want[d]) {
      return invalid_argument("Attention: attn_mask of shape " + shape_to_string(mask.shape) +
                              " does not broadcast to " +
                              shape_to_string(std::span<const int64_t>(want, 4)));
    }
  }
  if (m[3] > want[3]) return invalid_argument("Attention: attn_mask is longer than the keys");
  return ok_status();
}

bool set_attention_mask(const TensorView& m, AttentionF32* a) {
  if (m.dtype == DType::kFloat32) {
    a->mask_f = m.as<const float>();
  } else if (m.dtype == DType::kBool) {
    a->mask_b = m.as<const uint8_t>();
  } else {
    return false;
  }
  const int64_t want[4] = {a->batch, a->hq, a->s, a->l};
  return attention_mask_shape(m, want, a->m).ok();
}

void attention_f32(const AttentionF32& a) {
  if (a.batch <= 0 || a.hq <= 0 || a.s <= 0 || a.dv <= 0) return;
  const int64_t tasks = a.batch * a.hq * ((a.s + kRowBlock - 1) / kRowBlock);
  const int64_t work = a.batch * a.hq * a.s * a.l * (a.d + a.dv);
  if (work < kParallelWork || tasks == 1 || thread_limit() == 1) {
    for (int64_t t = 0; t < tasks; ++t) run_block(a, t);
    return;
  }
  parallel_for(tasks, &run_task, &a);
}

}  // namespace kiln::backends::cpu

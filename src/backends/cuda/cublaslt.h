// cuBLASLt pieces shared by the GEMM kernels (gemm.cc: MatMul, Gemm) and the channels-last 1x1
// convolution that runs as a GEMM (conv_gemm.cc): one problem's descriptors, the recorded algorithm
// (tactic text) and the kernel-side runner that falls back to the heuristic for other shapes.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

#define KILN_LT_CHECK(expr, what)                                      \
  do {                                                                 \
    cublasStatus_t kiln_s_ = (expr);                                   \
    if (kiln_s_ != CUBLAS_STATUS_SUCCESS) {                            \
      return internal_error(std::string(what) + ": cuBLASLt status " + \
                            std::to_string(int(kiln_s_)));             \
    }                                                                  \
  } while (0)

inline int alignment_of(const void* p, int64_t batch_stride_bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(batch_stride_bytes) | 256;
  return int(a & (~a + 1));
}

// One GEMM problem in cuBLAS terms (column-major): D[m x n] = alpha * op(A) op(B) + beta * C.
struct Problem {
  bool trans_a = false, trans_b = false;  // of the cuBLAS operands
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool bias = false;
  bool relu = false;  // max(0, .) after the bias and beta*C, in the epilogue
  bool gelu = false;  // cuBLASLt's GELU (the tanh form) there instead
  int align_a = 256, align_b = 256, align_c = 256;
  bool operator==(const Problem&) const = default;
};

// A recorded cuBLASLt algorithm: the plan's tactic text ("algo=21 tile=18 stages=27 splitk=1
// reduction=0 swizzle=0 custom=0 inner=0 cluster=0"), or "heuristic" for cuBLASLt's first
// heuristic answer for each shape the kernel meets.
// " rows=N" (optional) records the rows (cuBLAS n times the batch) it was chosen for: a problem of
// under a quarter of them, or of more than twice as many, takes cuBLASLt's heuristic answer for
// its own shape instead. A tile chosen for batch 64 leaves most of the GPU idle at batch 1
// (BERT-base's 128 x 768 x 768 projections: 11.7 us on the algorithm chosen for 8192 rows); one
// chosen for a profile's opt sequence 128 is slow at 384 (BERT-base, batch 8: the GEMMs took
// 1.61 ms a run against 1.25 ms on the answer for 3072 rows, the spanning engine 1.28x the one
// built for 8x384).
struct AlgoConfig {
  int32_t id = 0, splitk = 1;
  uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0;
  uint16_t inner = 0, cluster = 0;
  int64_t rows = 0;  // 0: not recorded (engines built before it was)
  // Whether a problem of `rows` rows runs this configuration (else the per-shape heuristic).
  bool serves(int64_t problem_rows) const {
    return rows == 0 || (problem_rows * 4 >= rows && problem_rows <= rows * 2);
  }
};
constexpr const char* kHeuristicTactic = "heuristic";

inline std::string to_tactic(const cublasLtMatmulAlgo_t& algo) {
  AlgoConfig c;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof(c.id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof(c.tile),
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages,
                                       sizeof(c.stages), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splitk,
                                       sizeof(c.splitk), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.reduction,
                                       sizeof(c.reduction), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle,
                                       sizeof(c.swizzle), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom,
                                       sizeof(c.custom), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner,
                                       sizeof(c.inner), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster,
                                       sizeof(c.cluster), &w);
  return "algo=" + std::to_string(c.id) + " tile=" + std::to_string(c.tile) +
         " stages=" + std::to_string(c.stages) + " splitk=" + std::to_string(c.splitk) +
         " reduction=" + std::to_string(c.reduction) + " swizzle=" + std::to_string(c.swizzle) +
         " custom=" + std::to_string(c.custom) + " inner=" + std::to_string(c.inner) +
         " cluster=" + std::to_string(c.cluster);
}

// nullopt for "heuristic"; kInvalidArgument for text that is neither.
inline StatusOr<std::optional<AlgoConfig>> parse_lt_tactic(const std::string& t) {
  if (t.empty() || t == kHeuristicTactic) return std::optional<AlgoConfig>();
  AlgoConfig c;
  std::map<std::string, int64_t> kv;
  size_t i = 0;
  while (i < t.size()) {
    size_t end = t.find(' ', i);
    if (end == std::string::npos) end = t.size();
    std::string item = t.substr(i, end - i);
    size_t eq = item.find('=');
    char* stop = nullptr;
    if (eq == std::string::npos)
      return invalid_argument("cuBLASLt tactic '" + t + "': '" + item + "' is not key=value");
    long long v = std::strtoll(item.c_str() + eq + 1, &stop, 10);
    // Every field is an int32 or uint32 in cuBLASLt (SPLITK_NUM is -1 for "chosen at run time").
    if (*stop || eq + 1 == item.size() || v < INT32_MIN || v > UINT32_MAX) {
      return invalid_argument("cuBLASLt tactic '" + t + "': bad value in '" + item + "'");
    }
    kv[item.substr(0, eq)] = v;
    i = end + 1;
  }
  for (const char* key :
       {"algo", "tile", "stages", "splitk", "reduction", "swizzle", "custom", "inner", "cluster"}) {
    if (!kv.count(key)) return invalid_argument("cuBLASLt tactic '" + t + "' has no " + key);
  }
  if (kv.size() != 9 + kv.count("rows"))
    return invalid_argument("cuBLASLt tactic '" + t + "' has unknown keys");
  if (kv.count("rows") && kv["rows"] < 0)
    return invalid_argument("cuBLASLt tactic '" + t + "': rows is out of range");
  for (const char* key : {"tile", "stages", "reduction", "swizzle", "custom", "inner", "cluster"}) {
    const int64_t limit =
        std::string(key) == "inner" || std::string(key) == "cluster" ? UINT16_MAX : UINT32_MAX;
    if (kv[key] < 0 || kv[key] > limit)
      return invalid_argument("cuBLASLt tactic '" + t + "': " + key + " is out of range");
  }
  if (kv["algo"] > INT32_MAX || kv["splitk"] > INT32_MAX)
    return invalid_argument("cuBLASLt tactic '" + t + "' is out of range");
  c.id = int32_t(kv["algo"]), c.tile = uint32_t(kv["tile"]), c.stages = uint32_t(kv["stages"]);
  c.splitk = int32_t(kv["splitk"]), c.reduction = uint32_t(kv["reduction"]),
  c.swizzle = uint32_t(kv["swizzle"]);
  c.custom = uint32_t(kv["custom"]), c.inner = uint16_t(kv["inner"]),
  c.cluster = uint16_t(kv["cluster"]);
  c.rows = kv.count("rows") ? kv["rows"] : 0;
  return std::optional<AlgoConfig>(c);
}

// What a GEMM stores and computes in: the node's tensors (data), and in cuBLASLt's terms A and B
// (ab), C and D (cd), alpha and beta (scale), the accumulation (compute), and the element sizes of
// ab and cd.
struct GemmTypes {
  DType data = DType::kFloat32;
  cudaDataType ab = CUDA_R_32F, cd = CUDA_R_32F, scale = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  size_t ab_size = 4, cd_size = 4;
};

inline bool gemm_dtype_ok(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 ||
         t == DType::kFloat64;
}

// The types of a node whose tensors are `data`: float32 in the plan's math mode (FP16/BF16 copies
// of A and B, FP32 output), float16/bfloat16 natively with FP32 accumulation, float64 in FP64.
inline GemmTypes gemm_types(DType data, MathMode mode) {
  switch (data) {
    case DType::kFloat16:
      return {data, CUDA_R_16F, CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 2, 2};
    case DType::kBFloat16:
      return {data, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, 2, 2};
    case DType::kFloat64:
      return {data, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, 8, 8};
    default:
      break;
  }
  GemmTypes t;
  if (mode == MathMode::kFp16 || mode == MathMode::kBf16) {
    t.ab = mode == MathMode::kFp16 ? CUDA_R_16F : CUDA_R_16BF;
    t.ab_size = 2;
  }
  if (mode == MathMode::kTf32) t.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  return t;
}

// The descriptors of one problem.
class LtDesc {
 public:
  ~LtDesc() { release(); }
  Status describe(const Problem& p, const GemmTypes& types) {
    release();
    KILN_LT_CHECK(cublasLtMatmulDescCreate(&desc, types.compute, types.scale),
                  "creating the matmul descriptor");
    cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "transa");
    KILN_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "transb");
    if (p.bias || p.relu || p.gelu) {
      cublasLtEpilogue_t epi = p.bias ? (p.gelu   ? CUBLASLT_EPILOGUE_GELU_BIAS
                                         : p.relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                  : CUBLASLT_EPILOGUE_BIAS)
                                      : (p.gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_RELU);
      KILN_LT_CHECK(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
          "epilogue");
    }
    // Stored shapes (column-major): op(A) is m x k, op(B) is k x n.
    KILN_RETURN_IF_ERROR(layout(&la, types.ab, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda,
                                p.batch, p.stride_a));
    KILN_RETURN_IF_ERROR(layout(&lb, types.ab, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb,
                                p.batch, p.stride_b));
    KILN_RETURN_IF_ERROR(layout(&lc, types.cd, p.m, p.n, p.ldc, p.batch, p.stride_c));
    return ok_status();
  }
  // Up to `max` algorithms cuBLASLt's heuristic ranks for the problem, best first.
  StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> heuristic(const Problem& p,
                                                                   cublasLtHandle_t lt,
                                                                   uint64_t workspace,
                                                                   int max) const {
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), "creating a preference");
    uint32_t aa = uint32_t(p.align_a), ab = uint32_t(p.align_b), ac = uint32_t(p.align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                         sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                         sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac,
                                         sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac,
                                         sizeof(ac));
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max));
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, max, results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      return unsupported("cuBLASLt has no algorithm for a " + std::to_string(p.m) + "x" +
                         std::to_string(p.n) + "x" + std::to_string(p.k) + " GEMM (batch " +
                         std::to_string(p.batch) + ", status " + std::to_string(int(st)) + ")");
    }
    results.resize(size_t(found));
    return results;
  }

  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;

 private:
  void release() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    desc = nullptr, la = lb = lc = nullptr;
  }
  static Status layout(cublasLtMatrixLayout_t* l, cudaDataType t, int64_t rows, int64_t cols,
                       int64_t ld, int batch, int64_t stride) {
    KILN_LT_CHECK(cublasLtMatrixLayoutCreate(l, t, uint64_t(rows), uint64_t(cols), ld),
                  "creating a layout");
    if (batch > 1) {
      int32_t bc = batch;
      KILN_LT_CHECK(
          cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)),
          "batch");
      KILN_LT_CHECK(cublasLtMatrixLayoutSetAttribute(
                        *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
                    "batch stride");
    }
    return ok_status();
  }
};

// The per-stream library workspace the algorithms may use (StreamResources::workspace_bytes).
constexpr uint64_t kLibraryWorkspace = uint64_t(32) << 20;

// Runs GEMMs with the plan's algorithm: the recorded one wherever cuBLASLt accepts it for the
// problem at hand (cublasLtMatmulAlgoCheck), else, for a shape where it cannot run (another
// alignment, a split that no longer divides), the heuristic's first answer for that shape. A
// float16, bfloat16 or float64 problem cuBLASLt has no algorithm for runs on gemm_fallback.cu's
// kernel: the builder accepted the node on its dtype, so it must run.
class LtGemm {
 public:
  LtGemm(GemmTypes types, std::optional<AlgoConfig> recorded)
      : types_(types), recorded_(recorded) {}

  // D = alpha*op(A)op(B) + beta*C, plus bias[m] (in D's type) when given, then the problem's ReLU.
  // C is D unless `c` gives another matrix of D's layout. alpha and beta are passed in the scale
  // type.
  Status run(const Problem& p, const void* a, const void* b, void* d, const void* bias,
             double alpha, double beta, StreamResources* res, const void* c = nullptr) {
    if (!(p == key_) || !ready_) KILN_RETURN_IF_ERROR(plan(p, res));
    if (fallback_) {
      if (c && c != d)
        return unsupported("cuBLASLt has no algorithm for the GEMM with a separate C");
      return gemm_fallback(types_.data, p.trans_a, p.trans_b, p.m, p.n, p.k, alpha, a, p.lda,
                           p.stride_a, b, p.ldb, p.stride_b, beta, d, p.ldc, p.stride_c, p.batch,
                           res->stream);
    }
    const float alpha_f = float(alpha), beta_f = float(beta);
    const void* pa = types_.scale == CUDA_R_64F ? static_cast<const void*>(&alpha) : &alpha_f;
    const void* pb = types_.scale == CUDA_R_64F ? static_cast<const void*>(&beta) : &beta_f;
    if (p.bias) {
      KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(lt_.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)),
                    "setting the bias pointer");
    }
    KILN_LT_CHECK(
        cublasLtMatmul(res->lt, lt_.desc, pa, a, lt_.la, b, lt_.lb, pb, c ? c : d, lt_.lc, d,
                       lt_.lc, &algo_, res->workspace, res->workspace_bytes, res->stream),
        "cublasLtMatmul");
    return ok_status();
  }

 private:
  Status plan(const Problem& p, StreamResources* res) {
    ready_ = false;
    fallback_ = false;
    KILN_RETURN_IF_ERROR(lt_.describe(p, types_));
    if (recorded_ && recorded_->serves(p.n * p.batch) && recorded_algo(res)) {
      key_ = p;
      ready_ = true;
      return ok_status();
    }
    auto results = lt_.heuristic(p, res->lt, res->workspace_bytes, 1);
    if (!results.ok() && types_.data != DType::kFloat32 && !p.bias && !p.relu && !p.gelu) {
      fallback_ = true;
    } else {
      KILN_RETURN_IF_ERROR(results.status());
      algo_ = (*results)[0].algo;
    }
    key_ = p;
    ready_ = true;
    return ok_status();
  }

  bool recorded_algo(StreamResources* res) {
    if (cublasLtMatmulAlgoInit(res->lt, types_.compute, types_.scale, types_.ab, types_.ab,
                               types_.cd, types_.cd, recorded_->id,
                               &algo_) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    const AlgoConfig& c = *recorded_;
    bool ok = cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile,
                                                   sizeof(c.tile)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                   &c.stages, sizeof(c.stages)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                   &c.splitk, sizeof(c.splitk)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                   &c.reduction, sizeof(c.reduction)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                   &c.swizzle, sizeof(c.swizzle)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                                                   &c.custom, sizeof(c.custom)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID,
                                                   &c.inner, sizeof(c.inner)) == 0 &&
              cublasLtMatmulAlgoConfigSetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                   &c.cluster, sizeof(c.cluster)) == 0;
    if (!ok) return false;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(res->lt, lt_.desc, lt_.la, lt_.lb, lt_.lc, lt_.lc, &algo_,
                                &check) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    return check.workspaceSize <= res->workspace_bytes;
  }

  GemmTypes types_;
  std::optional<AlgoConfig> recorded_;
  LtDesc lt_;
  cublasLtMatmulAlgo_t algo_{};
  Problem key_;
  bool ready_ = false;
  bool fallback_ = false;
};

// The tactics of a GEMM problem at the opt shapes: the heuristic's ranked algorithms, then
// "heuristic" (per-shape choice). Only "heuristic" when there is no GPU or no answer.
inline std::vector<std::string> rank_tactics(const std::optional<Problem>& p,
                                             const GemmTypes& types) {
  std::vector<std::string> out;
  if (p) {
    static cublasLtHandle_t handle = [] {
      cublasLtHandle_t h = nullptr;
      return cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS ? h : nullptr;
    }();
    LtDesc d;
    if (handle && d.describe(*p, types).ok()) {
      auto results = d.heuristic(*p, handle, kLibraryWorkspace, 8);
      if (results.ok()) {
        for (const auto& r : *results) {
          std::string t = to_tactic(r.algo) +
                          " rows=" + std::to_string(std::min<int64_t>(p->n * p->batch, UINT32_MAX));
          if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(std::move(t));
        }
      }
    }
  }
  out.push_back(kHeuristicTactic);
  return out;
}

}  // namespace kiln::backends::cuda

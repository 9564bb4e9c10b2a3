// CUDA kernels of the loss op family: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
// (log-softmax over dim 1, optional log_prob output), with class weights, ignore_index and the
// none/sum/mean reductions. Computed in double as the CPU reference (cpu/loss.cc); a reduced loss
// keeps per-element losses and weights in the workspace and one block sums them in order-free
// double. A target outside [0, C) that is not ignored, which the reference refuses, gives NaN.
#include <cmath>
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kBlock = 128;

enum class Reduction { kNone, kSum, kMean };

struct LossArgs {
  int64_t n, c, d;
  const void* x;
  int x_dtype;
  const void* target;
  int target_dtype;
  const void* weight;  // nullptr: every class weighs 1
  int has_ignore;
  int64_t ignore;
  void* log_prob;  // SoftmaxCrossEntropyLoss's second output, or nullptr
  void* out;
  int out_dtype;
  int reduction;  // Reduction
  double* loss;   // [n * d] workspace, for sum and mean
  double* w;      // [n * d] workspace
};

// Records element i's loss given its log-probability (or input) at the target, `picked`.
__device__ void finish_element(const LossArgs& a, int64_t i, int64_t t, double picked) {
  double loss, w;
  if (a.has_ignore && t == a.ignore) {
    loss = 0, w = 0;
  } else if (t < 0 || t >= a.c) {
    loss = NAN, w = NAN;
  } else {
    w = a.weight ? load_as<double>(a.weight, a.x_dtype, t) : 1.0;
    loss = -picked * w;
  }
  if (Reduction(a.reduction) == Reduction::kNone) {
    store_as<double>(a.out, a.out_dtype, i, loss);
  } else {
    a.loss[i] = loss;
    a.w[i] = w;
  }
}

__device__ __forceinline__ int64_t target_of(const LossArgs& a, int64_t i) {
  return load_as<int64_t>(a.target, a.target_dtype, i);
}

// NegativeLogLikelihoodLoss: one thread per (sample, position).
__global__ void nll_kernel(LossArgs a, int64_t rows) {
  KILN_GRID_LOOP(i, rows) {
    int64_t b = i / a.d, e = i % a.d, t = target_of(a, i);
    double picked =
        t >= 0 && t < a.c ? load_as<double>(a.x, a.x_dtype, (b * a.c + t) * a.d + e) : 0.0;
    finish_element(a, i, t, picked);
  }
}

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

// SoftmaxCrossEntropyLoss: one block per (sample, position) row of C classes `d` apart.
__global__ void sce_kernel(LossArgs a) {
  __shared__ double sh[32];
  const int64_t i = blockIdx.x, b = i / a.d, e = i % a.d;
  const int64_t base = b * a.c * a.d + e;
  double mx = -INFINITY;
  for (int64_t k = threadIdx.x; k < a.c; k += blockDim.x)
    mx = fmax(mx, load_as<double>(a.x, a.x_dtype, base + k * a.d));
  mx = block_reduce<double>(mx, MaxOp(), sh, -INFINITY);
  double s = 0;
  for (int64_t k = threadIdx.x; k < a.c; k += blockDim.x)
    s += exp(load_as<double>(a.x, a.x_dtype, base + k * a.d) - mx);
  const double lse = mx + log(block_reduce(s, SumOp(), sh, 0.0));
  if (a.log_prob) {
    for (int64_t k = threadIdx.x; k < a.c; k += blockDim.x) {
      int64_t at = base + k * a.d;
      store_as<double>(a.log_prob, a.x_dtype, at, load_as<double>(a.x, a.x_dtype, at) - lse);
    }
  }
  if (threadIdx.x == 0) {
    int64_t t = target_of(a, i);
    double picked = t >= 0 && t < a.c ? load_as<double>(a.x, a.x_dtype, base + t * a.d) - lse : 0.0;
    finish_element(a, i, t, picked);
  }
}

// The reduced loss: sum, or the mean over the weights (count when unweighted).
__global__ void reduce_loss_kernel(LossArgs a, int64_t rows, int weighted) {
  __shared__ double sh[32];
  double s = 0, ws = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) s += a.loss[i], ws += a.w[i];
  s = block_reduce(s, SumOp(), sh, 0.0);
  ws = block_reduce(ws, SumOp(), sh, 0.0);
  if (threadIdx.x == 0) {
    double r = s;
    if (Reduction(a.reduction) == Reduction::kMean) r = weighted ? s / ws : s / double(rows);
    store_as<double>(a.out, a.out_dtype, 0, r);
  }
}

class LossKernel final : public CudaKernel {
 public:
  LossKernel(bool sce, Reduction reduction, bool has_ignore, int64_t ignore)
      : CudaKernel(sce ? "cuda.SoftmaxCrossEntropyLoss" : "cuda.NegativeLogLikelihoodLoss"),
        sce_(sce),
        reduction_(reduction),
        has_ignore_(has_ignore),
        ignore_(ignore) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &target = in[1];
    const bool has_weight = in.size() > 2 && present(in[2]);
    if (x.rank() < 2 || target.rank() + 1 != x.rank()) {
      return invalid_argument(name_ + ": input must be (N, C, d...) and target (N, d...)");
    }
    LossArgs a{};
    a.n = x.shape[0], a.c = x.shape[1], a.d = 1;
    for (int k = 2; k < x.rank(); ++k) a.d *= x.shape[k];
    const int64_t rows = a.n * a.d;
    if (target.numel() != rows) return invalid_argument(name_ + ": target shape mismatch");
    if (has_weight && in[2].numel() != a.c) return invalid_argument(name_ + ": weight length != C");
    a.x = x.data, a.x_dtype = int(x.dtype);
    a.target = target.data, a.target_dtype = int(target.dtype);
    a.weight = has_weight ? in[2].data : nullptr;
    a.has_ignore = has_ignore_, a.ignore = ignore_;
    a.log_prob = sce_ && out.size() > 1 && present(out[1]) ? out[1].data : nullptr;
    a.out = out[0].data, a.out_dtype = int(out[0].dtype);
    a.reduction = int(reduction_);
    if (reduction_ == Reduction::kNone) {
      if (out[0].numel() != rows) return invalid_argument(name_ + ": output shape mismatch");
    } else {
      const size_t piece = workspace_piece(size_t(rows) * sizeof(double));
      KILN_RETURN_IF_ERROR(check_workspace(2 * piece, name_));
      a.loss = static_cast<double*>(workspace_);
      a.w = reinterpret_cast<double*>(static_cast<char*>(workspace_) + piece);
    }
    if (rows > 0) {
      if (sce_) {
        if (rows > INT32_MAX) return unsupported(name_ + ": too many rows");
        sce_kernel<<<unsigned(rows), kBlock, 0, stream_>>>(a);
      } else {
        nll_kernel<<<grid_for(rows), 256, 0, stream_>>>(a, rows);
      }
      KILN_RETURN_IF_ERROR(launch_status(sce_ ? "sce_kernel" : "nll_kernel"));
    }
    if (reduction_ != Reduction::kNone) {
      reduce_loss_kernel<<<1, 256, 0, stream_>>>(a, rows, int(has_weight || has_ignore_));
      return launch_status("reduce_loss_kernel");
    }
    return ok_status();
  }

 private:
  bool sce_;
  Reduction reduction_;
  bool has_ignore_;
  int64_t ignore_;
};

StatusOr<Reduction> reduction_of(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::string r, q.node.attrs.get_string("reduction", "mean"));
  if (r == "none") return Reduction::kNone;
  if (r == "sum") return Reduction::kSum;
  if (r == "mean") return Reduction::kMean;
  return unsupported(q.node.describe() + ": reduction '" + r + "'");
}

StatusOr<std::unique_ptr<Kernel>> make_loss(const KernelQuery& q) {
  const bool sce = ops::find_op(q.node.domain, q.node.op_type) == OpKind::kSoftmaxCrossEntropyLoss;
  KILN_ASSIGN_OR_RETURN(Reduction reduction, reduction_of(q));
  KILN_ASSIGN_OR_RETURN(int64_t ignore, q.node.attrs.get_int("ignore_index", 0));
  DType t = q.input_dtype(0);
  if (!is_float(t) || dtype_size(t) < 2) {
    return unsupported(q.node.describe() +
                       ": the CUDA loss takes float32, float64, float16 or bfloat16, not " +
                       std::string(dtype_name(t)));
  }
  DType tt = q.input_dtype(1);
  if (tt != DType::kInt32 && tt != DType::kInt64) {
    return unsupported(q.node.describe() + ": target must be int32 or int64");
  }
  if (q.input_dtype(2) != DType::kUndefined && q.input_dtype(2) != t) {
    return unsupported(q.node.describe() + ": weight must have the input's dtype");
  }
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    if (q.output_dtype(i) != DType::kUndefined && q.output_dtype(i) != t) {
      return unsupported(q.node.describe() + ": output " + std::to_string(i) +
                         " differs in dtype from the input");
    }
  }
  return std::unique_ptr<Kernel>(
      new LossKernel(sce, reduction, q.node.attrs.has("ignore_index"), ignore));
}

// Per-element losses and weights in double, for the sum and mean reductions.
ir::Dim loss_workspace(const KernelQuery& q) {
  auto r = reduction_of(q);
  if (!r.ok() || *r == Reduction::kNone || q.inputs.size() < 2) return 0;
  return workspace_piece(q.inputs[1], sizeof(double)) * 2;
}

}  // namespace

void register_loss(Registry& r) {
  r.add(OpKind::kNegativeLogLikelihoodLoss, &make_loss, {.workspace = &loss_workspace});
  r.add(OpKind::kSoftmaxCrossEntropyLoss, &make_loss, {.workspace = &loss_workspace});
}

}  // namespace kiln::backends::cuda

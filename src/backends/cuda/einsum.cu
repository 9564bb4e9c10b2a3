// Einsum on CUDA: one thread per output element runs the summed labels' loop, as the CPU
// reference does (cpu/spatial.cc), over up to four operands and twelve labels. Float32, float64,
// float16 and bfloat16, accumulated in double like the reference. The per-label strides of each
// operand are computed on the host for each new shape set and passed by value, so a launch needs
// no memory of its own.
#include <algorithm>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/typed.cuh"
#include "ops/spatial.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;
constexpr int kMaxOperands = 4;
constexpr int kMaxLoops = 12;

struct EinsumArgs {
  int nops, nout, nloop;
  int64_t size[kMaxLoops];  // extent of each loop label: the output's, then the summed
  int64_t step[kMaxOperands][kMaxLoops];  // how far each label advances each operand
  const void* in[kMaxOperands];
};

template <typename T>
__global__ void einsum_kernel(EinsumArgs a, T* y, int64_t n) {
  using N = DNum<T>;
  KILN_GRID_LOOP(o, n) {
    int64_t base[kMaxOperands] = {0, 0, 0, 0};
    int64_t rem = o;
    for (int k = a.nout - 1; k >= 0; --k) {
      int64_t c = rem % a.size[k];
      rem /= a.size[k];
      for (int i = 0; i < a.nops; ++i) base[i] += c * a.step[i][k];
    }
    int64_t inner = 1;
    for (int k = a.nout; k < a.nloop; ++k) inner *= a.size[k];
    double acc = 0;
    for (int64_t s = 0; s < inner; ++s) {
      int64_t r = s;
      double p = 1;
      int64_t off[kMaxOperands];
      for (int i = 0; i < a.nops; ++i) off[i] = base[i];
      for (int k = a.nloop - 1; k >= a.nout; --k) {
        int64_t c = r % a.size[k];
        r /= a.size[k];
        for (int i = 0; i < a.nops; ++i) off[i] += c * a.step[i][k];
      }
      for (int i = 0; i < a.nops; ++i) p *= double(N::load(static_cast<const T*>(a.in[i])[off[i]]));
      acc += p;
    }
    y[o] = N::store(typename N::C(acc));
  }
}

class EinsumKernel final : public CudaKernel {
 public:
  explicit EinsumKernel(std::string equation)
      : CudaKernel("cuda.Einsum"), equation_(std::move(equation)) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView& y = out[0];
    Shape key;
    for (const TensorView& v : in) {
      key.push_back(v.rank());
      key.insert(key.end(), v.shape.begin(), v.shape.end());
    }
    if (key != key_) KILN_RETURN_IF_ERROR(plan(in, y));
    for (size_t i = 0; i < in.size(); ++i) args_.in[i] = in[i].data;
    int64_t n = y.numel();
    if (n == 0) return ok_status();
    bool known = visit_dtype<kTFloats>(y.dtype, [&](auto tag) {
      using T = decltype(tag);
      einsum_kernel<T><<<grid_for(n), 256, 0, stream_>>>(args_, static_cast<T*>(y.data), n);
    });
    if (!known) return unsupported(name_ + ": dtype " + std::string(dtype_name(y.dtype)));
    return launch_status("einsum_kernel");
  }

 private:
  Status plan(std::span<const TensorView> in, const TensorView& y) {
    std::vector<int> ranks;
    for (const TensorView& v : in) ranks.push_back(v.rank());
    KILN_ASSIGN_OR_RETURN(ops::EinsumSpec spec, ops::parse_einsum(equation_, ranks));
    const int nl = spec.num_labels();
    std::vector<int64_t> size(size_t(nl), -1);
    for (size_t i = 0; i < in.size(); ++i) {
      for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
        int l = spec.inputs[i][d];
        int64_t v = in[i].shape[d];
        int64_t& s = size[size_t(l)];
        const bool ellipsis = l >= ops::kEinsumEllipsisLabel;
        if (s < 0 || (ellipsis && s == 1)) {
          s = v;
        } else if (v != s && !(ellipsis && v == 1)) {
          return invalid_argument("Einsum: input " + std::to_string(i) + " dim " +
                                  std::to_string(d) + " (" + std::to_string(v) +
                                  ") does not match its label's size " + std::to_string(s));
        }
      }
    }
    std::vector<int> order = spec.output;
    for (int l = 0; l < nl; ++l) {
      if (size[size_t(l)] >= 0 && std::find(order.begin(), order.end(), l) == order.end())
        order.push_back(l);
    }
    if (int(spec.output.size()) != y.rank()) return invalid_argument("Einsum: output rank differs");
    for (size_t k = 0; k < spec.output.size(); ++k) {
      if (size[size_t(spec.output[k])] < 0) size[size_t(spec.output[k])] = 1;
      if (y.shape[k] != size[size_t(spec.output[k])])
        return invalid_argument("Einsum: output dim differs");
    }
    if (order.size() > size_t(kMaxLoops)) {
      return unsupported(name_ + ": " + std::to_string(order.size()) +
                         " labels; the CUDA kernel loops over at most " +
                         std::to_string(kMaxLoops));
    }
    EinsumArgs a{};
    a.nops = int(in.size()), a.nout = int(spec.output.size()), a.nloop = int(order.size());
    for (size_t k = 0; k < order.size(); ++k) a.size[k] = size[size_t(order[k])];
    for (size_t i = 0; i < in.size(); ++i) {
      std::vector<int64_t> st = row_major_strides(in[i].shape);
      for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
        if (in[i].shape[d] == 1 && size[size_t(spec.inputs[i][d])] != 1) continue;  // broadcast
        size_t k = size_t(std::find(order.begin(), order.end(), spec.inputs[i][d]) - order.begin());
        a.step[i][k] += st[d];
      }
    }
    args_ = a;
    key_.clear();
    for (const TensorView& v : in) {
      key_.push_back(v.rank());
      key_.insert(key_.end(), v.shape.begin(), v.shape.end());
    }
    return ok_status();
  }

  std::string equation_;
  Shape key_;
  EinsumArgs args_{};
};

StatusOr<std::unique_ptr<Kernel>> make_einsum(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::string eq, q.node.attrs.get_string("equation", std::nullopt));
  if (q.inputs.empty() || q.inputs.size() > size_t(kMaxOperands)) {
    return unsupported(q.node.describe() + ": the CUDA Einsum takes 1 to " +
                       std::to_string(kMaxOperands) + " operands, not " +
                       std::to_string(q.inputs.size()));
  }
  const DType t = q.output_dtype(0);
  if (t != DType::kFloat32 && t != DType::kFloat64 && t != DType::kFloat16 &&
      t != DType::kBFloat16) {
    return unsupported(q.node.describe() +
                       ": the CUDA Einsum takes float32, float64, float16 or bfloat16, not " +
                       std::string(dtype_name(t)));
  }
  std::vector<int> ranks;
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    if (!q.inputs[i] || !q.inputs[i]->shape)
      return invalid_argument(q.node.describe() + ": an operand has no shape");
    if (q.input_dtype(i) != t) return unsupported(q.node.describe() + ": operands of mixed dtypes");
    ranks.push_back(int(q.inputs[i]->shape->size()));
  }
  KILN_ASSIGN_OR_RETURN(ops::EinsumSpec spec, ops::parse_einsum(eq, ranks));
  if (spec.num_labels() > 0) {
    std::vector<int> used;
    for (const auto& op : spec.inputs) used.insert(used.end(), op.begin(), op.end());
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    if (used.size() > size_t(kMaxLoops)) {
      return unsupported(q.node.describe() + ": " + std::to_string(used.size()) +
                         " labels; the CUDA kernel loops over at most " +
                         std::to_string(kMaxLoops));
    }
  }
  return std::unique_ptr<Kernel>(new EinsumKernel(eq));
}

}  // namespace

void register_einsum(Registry& r) { r.add(OpKind::kEinsum, &make_einsum); }

}  // namespace kiln::backends::cuda

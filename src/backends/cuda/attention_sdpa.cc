// ONNX Attention on cuDNN's fused flash attention (the cuDNN frontend's SDPA graph) for float16 and
// bfloat16 Q, K and V: one kernel reads Q, K and V once and never writes the [S, L] scores, where
// the unfused graph writes and reads them in each of two GEMMs, the scale, the mask, the softmax
// and its NaN guard (fuse_attention makes the node from those). Q, K and V are read in place with
// strides, 4-D [B, heads, S, D] or 3-D [B, S, heads*D] (the heads split and merged without
// transposes), and Y is written the same way. Grouped-query heads, an additive mask of Q's type
// broadcasting onto [B, heads, S, L] (cuDNN's bias input, broadcast dims of size 1) and is_causal
// (aligned top left, as ONNX's without a past) run inside the kernel; the scores and softmax are
// float, P is rounded to the input type for the product with V, as in every flash kernel.
//
// The node is accepted at build time for what is known then (dtypes, no past or extra outputs, no
// softcap or windows, constant head sizes cuDNN takes). A plan is built per shape the kernel meets
// (a few milliseconds; at most kMaxPlans kept); for a shape cuDNN refuses at run time, and for a
// mask shorter than the keys, the kernel runs attention.cu's reference kernel instead, so an
// accepted node never fails for cuDNN's reasons.

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cudnn_fe.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidBias = 5;
// Plans a kernel keeps, one per shape it met; the oldest goes first.
constexpr size_t kMaxPlans = 16;
// The head sizes cuDNN's flash attention takes (multiples of 8 up to 256, on sm_80 and later).
constexpr int64_t kMaxHead = 256;

// One problem in cuDNN's [B, heads, seq, head] dims, with the strides of kiln's tensors.
struct Problem {
  int64_t b = 0, hq = 0, hk = 0, s = 0, l = 0, d = 0, dv = 0;
  bool three_d = false;
  bool mask = false;
  int64_t m[4] = {1, 1, 1, 1};  // the mask's dims, broadcast to rank 4

  std::vector<int64_t> strides(int64_t heads, int64_t seq, int64_t head) const {
    if (three_d) return {seq * heads * head, head, heads * head, 1};
    return {heads * seq * head, seq * head, head, 1};
  }
  std::vector<int64_t> key() const {
    return {b, hq, hk, s, l, d, dv, int64_t(three_d), int64_t(mask), m[0], m[1], m[2], m[3]};
  }
};

// The SDPA graph of one problem, with its plan built (cuDNN's heuristic choice).
StatusOr<std::shared_ptr<fe::graph::Graph>> sdpa_plan(const Problem& p, DType t, float scale,
                                                      bool causal, cudnnHandle_t handle,
                                                      const std::string& who) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(t == DType::kFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  using TA = fe::graph::Tensor_attributes;
  auto q = graph->tensor(TA().set_name("Q")
                             .set_uid(kUidQ)
                             .set_dim({p.b, p.hq, p.s, p.d})
                             .set_stride(p.strides(p.hq, p.s, p.d)));
  auto k = graph->tensor(TA().set_name("K")
                             .set_uid(kUidK)
                             .set_dim({p.b, p.hk, p.l, p.d})
                             .set_stride(p.strides(p.hk, p.l, p.d)));
  auto v = graph->tensor(TA().set_name("V")
                             .set_uid(kUidV)
                             .set_dim({p.b, p.hk, p.l, p.dv})
                             .set_stride(p.strides(p.hk, p.l, p.dv)));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention")
                     .set_generate_stats(false)
                     .set_attn_scale(scale);
  if (causal) options.set_causal_mask(true);
  if (p.mask) {
    // Contiguous in the mask's own dims; a dim of size 1 broadcasts.
    const std::vector<int64_t> dim = {p.m[0], p.m[1], p.m[2], p.m[3]};
    const std::vector<int64_t> stride = {p.m[1] * p.m[2] * p.m[3], p.m[2] * p.m[3], p.m[3], 1};
    options.set_bias(
        graph->tensor(TA().set_name("bias").set_uid(kUidBias).set_dim(dim).set_stride(stride)));
  }
  auto [o, stats] = graph->sdpa(q, k, v, options);
  (void)stats;
  o->set_output(true)
      .set_uid(kUidO)
      .set_dim({p.b, p.hq, p.s, p.dv})
      .set_stride(p.strides(p.hq, p.s, p.dv));
  KILN_RETURN_IF_ERROR(fe_status(graph->validate(), who + ": validating the attention graph"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->build_operation_graph(handle), who + ": building the operation graph"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->create_execution_plans({fe::HeurMode_t::A}), who + ": cuDNN's heuristics"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->check_support(handle), who + ": no cuDNN engine takes the attention"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
                who + ": building a cuDNN plan"));
  return graph;
}

class SdpaKernel final : public CudaKernel {
 public:
  SdpaKernel(DType t, int64_t q_heads, int64_t kv_heads, float scale, bool causal,
             std::unique_ptr<Kernel> fallback)
      : CudaKernel("cuda.Attention(cudnn flash attention," + std::string(dtype_name(t)) + ")"),
        t_(t),
        q_heads_(q_heads),
        kv_heads_(kv_heads),
        scale_(scale),
        causal_(causal),
        fallback_(std::move(fallback)) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &q = in[0], &k = in[1], &v = in[2], &y = out[0];
    const TensorView* mask = in.size() > 3 && present(in[3]) ? &in[3] : nullptr;
    Problem p;
    p.three_d = q.rank() == 3;
    if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4)) {
      return invalid_argument(name_ + ": Q, K and V must all be 3-D or all 4-D");
    }
    p.b = q.shape[0];
    if (p.three_d) {
      p.hq = q_heads_, p.hk = kv_heads_, p.s = q.shape[1], p.l = k.shape[1];
      if (p.hq <= 0 || p.hk <= 0 || q.shape[2] % p.hq || k.shape[2] % p.hk || v.shape[2] % p.hk) {
        return invalid_argument(name_ + ": hidden sizes do not split into the heads");
      }
      p.d = q.shape[2] / p.hq, p.dv = v.shape[2] / p.hk;
      if (k.shape[2] / p.hk != p.d || v.shape[1] != p.l)
        return invalid_argument(name_ + ": K or V mismatches Q");
    } else {
      p.hq = q.shape[1], p.hk = k.shape[1], p.s = q.shape[2], p.l = k.shape[2], p.d = q.shape[3],
      p.dv = v.shape[3];
      if (k.shape[3] != p.d || v.shape[1] != p.hk || v.shape[2] != p.l) {
        return invalid_argument(name_ + ": K or V mismatches Q");
      }
    }
    if (k.shape[0] != p.b || v.shape[0] != p.b || p.hk == 0 || p.hq % p.hk != 0) {
      return invalid_argument(name_ + ": Q heads must be a multiple of KV heads, and one batch");
    }
    if (y.numel() != p.b * p.hq * p.s * p.dv)
      return invalid_argument(name_ + ": Y has the wrong size");
    if (y.numel() == 0) return ok_status();
    if (mask) {
      KILN_RETURN_IF_ERROR(attention_mask_dims(*mask, p.b, p.hq, p.s, p.m, name_));
      p.mask = true;
    }
    // No keys, or a mask shorter than the keys (padded with -inf): the reference kernel.
    const bool plain = p.l > 0 && (!mask || p.m[3] == p.l);
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    std::shared_ptr<fe::graph::Graph> plan;
    if (plain) {
      const std::vector<int64_t> key = p.key();
      auto it = plans_.find(key);
      if (it == plans_.end()) {
        auto built = sdpa_plan(p, t_, scale_, causal_, res->dnn, name_);
        int64_t ws = 0;
        std::shared_ptr<fe::graph::Graph> g;
        if (built.ok() && (*built)->get_workspace_size(ws).is_good() &&
            ws <= int64_t(res->workspace_bytes)) {
          g = *built;
        }
        if (plans_.size() >= kMaxPlans) {
          plans_.erase(order_.front());
          order_.erase(order_.begin());
        }
        it = plans_.emplace(key, g).first;  // nullptr: cuDNN refused this shape
        order_.push_back(key);
      }
      plan = it->second;
    }
    if (!plan) {
      fallback_->set_stream(stream_);
      return fallback_->execute(in, out);
    }
    std::unordered_map<int64_t, void*> pack = {{kUidQ, const_cast<void*>(q.data)},
                                               {kUidK, const_cast<void*>(k.data)},
                                               {kUidV, const_cast<void*>(v.data)},
                                               {kUidO, y.data}};
    if (mask) pack[kUidBias] = const_cast<void*>(mask->data);
    fe::error_t e = plan->execute(res->dnn, pack, res->workspace);
    if (!e.is_good()) return internal_error(name_ + ": cuDNN graph execute: " + e.err_msg);
    return ok_status();
  }

 private:
  DType t_;
  int64_t q_heads_, kv_heads_;
  float scale_;
  bool causal_;
  std::unique_ptr<Kernel> fallback_;
  std::map<std::vector<int64_t>, std::shared_ptr<fe::graph::Graph>> plans_;
  std::vector<std::vector<int64_t>> order_;
};

StatusOr<std::unique_ptr<Kernel>> make_sdpa(const KernelQuery& q) {
  const std::string who = q.node.describe() + ": cuda.cudnn_sdpa.Attention";
  const auto& at = q.node.attrs;
  const DType t = q.input_dtype(0);
  if (!is_half(t))
    return unsupported(who + " takes float16 or bfloat16, not " + std::string(dtype_name(t)));
  for (size_t i : {1, 2, 3}) {
    if (q.input_dtype(i) != DType::kUndefined && q.input_dtype(i) != t) {
      return unsupported(who + " takes Q, K, V and an additive attn_mask of one dtype; input " +
                         std::to_string(i) + " is " + std::string(dtype_name(q.input_dtype(i))));
    }
  }
  for (size_t i = 4; i < q.inputs.size(); ++i) {
    if (q.inputs[i]) return unsupported(who + " runs no past key/value or nonpad_kv_seqlen");
  }
  for (size_t i = 1; i < q.outputs.size(); ++i) {
    if (q.outputs[i]) return unsupported(who + " writes no present key/value or qk_matmul_output");
  }
  if (q.output_dtype(0) != t) return unsupported(who + ": Y differs in dtype from Q");
  KILN_ASSIGN_OR_RETURN(int64_t q_heads, at.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t kv_heads, at.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t causal, at.get_int("is_causal", 0));
  KILN_ASSIGN_OR_RETURN(float softcap, at.get_float("softcap", 0.f));
  KILN_ASSIGN_OR_RETURN(int64_t left, at.get_int("left_window_size", -1));
  KILN_ASSIGN_OR_RETURN(int64_t right, at.get_int("right_window_size", -1));
  if (softcap != 0.f || left != -1 || right != -1)
    return unsupported(who + " runs no softcap or sliding window");
  const ir::Value* qv = q.inputs.empty() ? nullptr : q.inputs[0];
  if (!qv || !qv->shape || (qv->shape->size() != 3 && qv->shape->size() != 4)) {
    return unsupported(who + " takes 3-D or 4-D Q");
  }
  const bool four = qv->shape->size() == 4;
  auto d = attention_head_size(q, 0, four ? 0 : q_heads),
       dv = attention_head_size(q, 2, four ? 0 : kv_heads);
  if (!d || !dv) return unsupported(who + " needs constant head sizes");
  for (int64_t h : {*d, *dv}) {
    if (h <= 0 || h > kMaxHead || h % 8 != 0) {
      return unsupported(who + ": head size " + std::to_string(h) +
                         " is not a multiple of 8 up to " + std::to_string(kMaxHead));
    }
  }
  float scale = 1.f / std::sqrt(float(*d));
  if (at.has("scale")) {
    KILN_ASSIGN_OR_RETURN(scale, at.get_float("scale", std::nullopt));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> fallback, make_attention_kernel(q));
  return std::unique_ptr<Kernel>(
      new SdpaKernel(t, q_heads, kv_heads, scale, causal != 0, std::move(fallback)));
}

}  // namespace

void register_attention_sdpa(Registry& r) {
  r.add(OpKind::kAttention, &make_sdpa, {.library = "cudnn_sdpa"});
}

}  // namespace kiln::backends::cuda

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
// (at most kMaxPlans kept): outside CUDA graph capture the fastest of cuDNN's first configurations,
// timed on the shape's own buffers (GPT-2's causal heads at batch 32 took 24.5 us a layer on its
// second configuration, 30 us on the heuristic's first), under capture (or where no timing
// succeeds) the first that builds. For a shape cuDNN refuses at run time, and for a mask shorter
// than the keys, the kernel runs attention.cu's reference kernel instead, so an accepted node
// never fails for cuDNN's reasons. Keys that fit one tile run attention_short.cu's kernel. Longer
// keys with head sizes up to 64 have its tiled kernel too: timed beside cuDNN's plans (it runs
// where it takes under kMargin of the fastest plan's time), and run where cuDNN refuses the shape.

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
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

// One problem in cuDNN's [B, heads, seq, head] dims, with the element strides of kiln's tensors
// in those dims (Q, K, V, O).
struct Problem {
  int64_t b = 0, hq = 0, hk = 0, s = 0, l = 0, d = 0, dv = 0;
  int64_t st[4][4] = {};
  bool mask = false;
  int64_t m[4] = {1, 1, 1, 1};  // the mask's dims, broadcast to rank 4

  // The strides of ONNX Attention's 3-D [B, seq, heads*head] or 4-D [B, heads, seq, head] form.
  void set_onnx(int i, bool three_d, int64_t heads, int64_t seq, int64_t head) {
    const int64_t s3[4] = {seq * heads * head, head, heads * head, 1},
                  s4[4] = {heads * seq * head, seq * head, head, 1};
    for (int k = 0; k < 4; ++k) st[i][k] = three_d ? s3[k] : s4[k];
  }
  void set_packed(int i, const PackedDims& p) {
    st[i][0] = p.st[0], st[i][1] = p.st[1], st[i][2] = p.st[2], st[i][3] = 1;
  }
  std::vector<int64_t> stride(int i) const { return {st[i][0], st[i][1], st[i][2], st[i][3]}; }
  std::vector<int64_t> key() const {
    std::vector<int64_t> k = {b, hq, hk, s, l, d, dv, int64_t(mask), m[0], m[1], m[2], m[3]};
    for (const auto& x : st) k.insert(k.end(), std::begin(x), std::end(x));
    return k;
  }
};

// Plans timed for a shape first met outside CUDA graph capture, in cuDNN's heuristic order.
constexpr int64_t kTimedPlans = 8;
// Runs timed per plan, after one untimed. With three, run-to-run noise of a ~25 us kernel left some
// of GPT-2's layers (b32, s256) on a plan 25-40% slower than the fastest; with ten, every layer
// took the fastest (cuDNN's eng2 knob 7) in two runs of 12 layers on an H200.
constexpr int kTimedRuns = 10;

// The tiled kernel replaces cuDNN's fastest plan only below this fraction of its time: the two
// are timed in one process's first run, and at batch 1 a ~5 us kernel's timing noise must not
// pick the one that is slower on average.
constexpr float kMargin = 0.9f;

// One problem's SDPA graph and the index of the plan that runs it, or attention_short.cu's tiled
// kernel in its place.
struct SdpaPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t index = 0;
  float ms = -1.f;     // the plan's time over kTimedRuns runs; negative where it was not timed
  bool tiled = false;  // tiled_attention runs the problem
};

// Which kernel runs the shapes both take: KILN_CUDA_ATTENTION=tiled or =cudnn (for tests and
// benchmarks), else the faster of the two as timed per shape.
enum class Choice { kTimed, kTiled, kCudnn };
Choice attention_choice() {
  const char* v = std::getenv("KILN_CUDA_ATTENTION");
  if (v && std::strcmp(v, "tiled") == 0) return Choice::kTiled;
  if (v && std::strcmp(v, "cudnn") == 0) return Choice::kCudnn;
  return Choice::kTimed;
}

// The time of kTimedRuns calls of `run` on `stream` after one untimed call, into *ms; false where
// a call or the events fail (the stream is not capturing: the caller checks).
bool time_runs(const std::function<bool()>& run, cudaStream_t stream, float* ms) {
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
  ok = ok && run() && cudaEventRecord(start, stream) == cudaSuccess;
  for (int r = 0; r < kTimedRuns && ok; ++r) ok = run();
  ok = ok && cudaEventRecord(stop, stream) == cudaSuccess &&
       cudaEventSynchronize(stop) == cudaSuccess &&
       cudaEventElapsedTime(ms, start, stop) == cudaSuccess;
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  cudaGetLastError();
  return ok;
}

// The SDPA graph of one problem with its plan: cuDNN's heuristic choice (the first configuration
// that builds and fits the workspace) or, given the problem's buffers (`pack`, on `stream`, not
// capturing), the fastest of the first kTimedPlans that build, each run once and then timed over
// kTimedRuns runs, as cudnn.benchmark does for PyTorch's convolutions. Y is written by every timed
// run and again by the run that follows; Q, K and V are only read.
StatusOr<SdpaPlan> sdpa_plan(const Problem& p, DType t, float scale, bool causal,
                             cudnnHandle_t handle, size_t workspace_bytes, void* workspace,
                             std::unordered_map<int64_t, void*>* pack, cudaStream_t stream,
                             const std::string& who) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(t == DType::kFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  using TA = fe::graph::Tensor_attributes;
  auto q = graph->tensor(
      TA().set_name("Q").set_uid(kUidQ).set_dim({p.b, p.hq, p.s, p.d}).set_stride(p.stride(0)));
  auto k = graph->tensor(
      TA().set_name("K").set_uid(kUidK).set_dim({p.b, p.hk, p.l, p.d}).set_stride(p.stride(1)));
  auto v = graph->tensor(
      TA().set_name("V").set_uid(kUidV).set_dim({p.b, p.hk, p.l, p.dv}).set_stride(p.stride(2)));
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
  o->set_output(true).set_uid(kUidO).set_dim({p.b, p.hq, p.s, p.dv}).set_stride(p.stride(3));
  KILN_RETURN_IF_ERROR(fe_status(graph->validate(), who + ": validating the attention graph"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->build_operation_graph(handle), who + ": building the operation graph"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->create_execution_plans({fe::HeurMode_t::A}), who + ": cuDNN's heuristics"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->check_support(handle), who + ": no cuDNN engine takes the attention"));
  SdpaPlan best{graph, -1};
  int64_t first = -1;  // the first that builds: the plan where no timing succeeds
  const int64_t count = graph->get_execution_plan_count();
  for (int64_t i = 0, built = 0; i < count && built < (pack ? kTimedPlans : 1); ++i) {
    int64_t need = 0;
    if (!graph->build_plan_at_index(i).is_good() ||
        !graph->get_workspace_size_plan_at_index(i, need).is_good() ||
        need > int64_t(workspace_bytes)) {
      continue;
    }
    ++built;
    if (first < 0) first = i;
    if (!pack) break;
    auto run = [&] { return graph->execute_plan_at_index(handle, *pack, workspace, i).is_good(); };
    float ms = 0;
    if (time_runs(run, stream, &ms) && (best.index < 0 || ms < best.ms))
      best.index = i, best.ms = ms;
  }
  if (first < 0) return internal_error(who + ": no cuDNN plan for the attention builds");
  if (best.index < 0) best.index = first;
  return best;
}

class SdpaKernel final : public CudaKernel {
 public:
  SdpaKernel(DType t, int64_t q_heads, int64_t kv_heads, float scale, bool causal,
             std::unique_ptr<Kernel> fallback, std::optional<PackedLayout> packed = std::nullopt)
      : CudaKernel(std::string(packed ? "cuda.PackedAttention" : "cuda.Attention") +
                   "(cudnn flash attention," + std::string(dtype_name(t)) + ")"),
        t_(t),
        q_heads_(q_heads),
        kv_heads_(kv_heads),
        scale_(scale),
        causal_(causal),
        fallback_(std::move(fallback)),
        packed_(packed) {
    // attention_short.cu's tensor-core kernels: sm_80 and later.
    short_ok_ = current_sm() >= 80;
  }

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &q = in[0], &k = in[1], &v = in[2], &y = out[0];
    const TensorView* mask = in.size() > 3 && present(in[3]) ? &in[3] : nullptr;
    Problem p;
    const void* ptr[3] = {q.data, k.data, v.data};
    if (packed_) {
      KILN_RETURN_IF_ERROR(packed_problem(q, k, v, y, &p, ptr));
    } else {
      KILN_RETURN_IF_ERROR(onnx_problem(q, k, v, y, &p));
    }
    if (y.numel() == 0) return ok_status();
    if (mask) {
      KILN_RETURN_IF_ERROR(attention_mask_dims(*mask, p.b, p.hq, p.s, p.m, name_));
      p.mask = true;
    }
    // No keys, a mask shorter than the keys (padded with -inf), or operands cuDNN cannot load
    // (16-byte aligned starts and strides): the reference kernel.
    bool plain = p.l > 0 && (!mask || p.m[3] == p.l);
    const int64_t es = int64_t(dtype_size(t_));
    for (int i = 0; i < 3; ++i) {
      if (reinterpret_cast<uintptr_t>(ptr[i]) % 16 != 0) plain = false;
      for (int a = 0; a < 3; ++a) plain = plain && (p.st[i][a] * es) % 16 == 0;
    }
    ShortAttnArgs sa;
    bool tiled = false;  // tiled_attention could run it
    if (plain && short_ok_) {
      sa.b = p.b, sa.hq = p.hq, sa.hk = p.hk, sa.s = p.s, sa.l = p.l, sa.d = p.d, sa.dv = p.dv;
      for (int i = 0; i < 4; ++i) {
        for (int x = 0; x < 3; ++x) sa.st[i][x] = p.st[i][x];
      }
      sa.q = ptr[0], sa.k = ptr[1], sa.v = ptr[2], sa.y = y.data;
      if (mask) {
        sa.mask = mask->data;
        for (int x = 0; x < 4; ++x) sa.m[x] = p.m[x];
      }
      sa.scale = scale_, sa.causal = causal_;
      if (short_attention_takes(sa, t_, size_t(es))) return short_attention(t_, sa, stream_);
      tiled = choice_ != Choice::kCudnn && tiled_attention_takes(sa, t_, size_t(es));
    }
    KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
    std::unordered_map<int64_t, void*> pack = {{kUidQ, const_cast<void*>(ptr[0])},
                                               {kUidK, const_cast<void*>(ptr[1])},
                                               {kUidV, const_cast<void*>(ptr[2])},
                                               {kUidO, y.data}};
    if (mask) pack[kUidBias] = const_cast<void*>(mask->data);
    SdpaPlan plan;
    if (plain) {
      const std::vector<int64_t> key = p.key();
      auto it = plans_.find(key);
      if (it == plans_.end()) {
        // Timed only outside capture (a captured stream cannot wait on its events).
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        const bool timed = cudaStreamIsCapturing(stream_, &capture) == cudaSuccess &&
                           capture == cudaStreamCaptureStatusNone;
        cudaGetLastError();
        SdpaPlan chosen;  // an empty graph: cuDNN refused this shape
        if (!tiled || choice_ != Choice::kTiled) {
          auto built = sdpa_plan(p, t_, scale_, causal_, res->dnn, res->workspace_bytes,
                                 res->workspace, timed ? &pack : nullptr, stream_, name_);
          if (built.ok()) chosen = *built;
        }
        if (tiled) {
          // Ours where forced, where cuDNN refused (rather than the reference kernel) or where
          // it timed under kMargin of cuDNN's fastest plan.
          float ms = 0;
          auto run = [&] { return tiled_attention(t_, sa, stream_).ok(); };
          chosen.tiled =
              choice_ == Choice::kTiled || !chosen.graph ||
              (timed && chosen.ms >= 0 && time_runs(run, stream_, &ms) && ms < chosen.ms * kMargin);
        }
        if (plans_.size() >= kMaxPlans) {
          plans_.erase(order_.front());
          order_.erase(order_.begin());
        }
        it = plans_.emplace(key, chosen).first;
        order_.push_back(key);
      }
      plan = it->second;
    }
    if (plan.tiled && tiled) return tiled_attention(t_, sa, stream_);
    if (!plan.graph) {
      fallback_->set_stream(stream_);
      return fallback_->execute(in, out);
    }
    fe::error_t e = plan.graph->execute_plan_at_index(res->dnn, pack, res->workspace, plan.index);
    if (!e.is_good()) return internal_error(name_ + ": cuDNN graph execute: " + e.err_msg);
    return ok_status();
  }

 private:
  // ONNX Attention: Q, K, V and Y all 3-D ([B, seq, heads*head]) or all 4-D.
  Status onnx_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& y, Problem* out) {
    Problem& p = *out;
    const bool three_d = q.rank() == 3;
    if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4)) {
      return invalid_argument(name_ + ": Q, K and V must all be 3-D or all 4-D");
    }
    p.b = q.shape[0];
    if (three_d) {
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
    p.set_onnx(0, three_d, p.hq, p.s, p.d);
    p.set_onnx(1, three_d, p.hk, p.l, p.d);
    p.set_onnx(2, three_d, p.hk, p.l, p.dv);
    p.set_onnx(3, three_d, p.hq, p.s, p.dv);
    return ok_status();
  }

  // kiln::PackedAttention: the heads read in place from the layout's tensors, from their offsets.
  Status packed_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& y, Problem* out, const void* ptr[3]) {
    const PackedLayout& l = *packed_;
    Problem& p = *out;
    if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3 || y.rank() < 2) {
      return invalid_argument(name_ + ": Q, K and V must be 3-D");
    }
    const PackedDims pq = packed_dims(l, q.shape, q.shape[2], l.d),
                     pk = packed_dims(l, k.shape, k.shape[2], l.d),
                     pv = packed_dims(l, v.shape, v.shape[2], l.dv),
                     py = packed_dims(l, y.shape, l.q_heads * l.dv, l.dv);
    p.b = pq.batch, p.s = pq.seq, p.l = pk.seq, p.hq = l.q_heads, p.hk = l.kv_heads, p.d = l.d,
    p.dv = l.dv;
    if (pk.batch != p.b || pv.batch != p.b || pv.seq != p.l || py.batch != p.b || py.seq != p.s ||
        y.numel() != p.b * p.s * p.hq * p.dv) {
      return invalid_argument(name_ + ": Q, K, V and Y disagree on batch or sequence");
    }
    p.set_packed(0, pq), p.set_packed(1, pk), p.set_packed(2, pv), p.set_packed(3, py);
    const int64_t es = int64_t(dtype_size(t_));
    for (int i = 0; i < 3; ++i) ptr[i] = static_cast<const char*>(ptr[i]) + l.offset[i] * es;
    return ok_status();
  }

  DType t_;
  int64_t q_heads_, kv_heads_;
  float scale_;
  bool causal_;
  std::unique_ptr<Kernel> fallback_;
  std::optional<PackedLayout> packed_;
  bool short_ok_ = false;
  Choice choice_ = attention_choice();
  std::map<std::vector<int64_t>, SdpaPlan> plans_;
  std::vector<std::vector<int64_t>> order_;
};

// The checks both nodes share: float16 or bfloat16 throughout, head sizes cuDNN takes.
Status sdpa_types_and_heads(const KernelQuery& q, const std::string& who, DType t, int64_t d,
                            int64_t dv) {
  if (!is_half(t))
    return unsupported(who + " takes float16 or bfloat16, not " + std::string(dtype_name(t)));
  for (size_t i : {1, 2, 3}) {
    if (q.input_dtype(i) != DType::kUndefined && q.input_dtype(i) != t) {
      return unsupported(who + " takes Q, K, V and an additive attn_mask of one dtype; input " +
                         std::to_string(i) + " is " + std::string(dtype_name(q.input_dtype(i))));
    }
  }
  if (q.output_dtype(0) != t) return unsupported(who + ": Y differs in dtype from Q");
  for (int64_t h : {d, dv}) {
    if (h <= 0 || h > kMaxHead || h % 8 != 0) {
      return unsupported(who + ": head size " + std::to_string(h) +
                         " is not a multiple of 8 up to " + std::to_string(kMaxHead));
    }
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_packed_sdpa(const KernelQuery& q) {
  const std::string who = q.node.describe() + ": cuda.cudnn_sdpa.PackedAttention";
  KILN_ASSIGN_OR_RETURN(PackedLayout l, packed_layout(q.node));
  KILN_RETURN_IF_ERROR(sdpa_types_and_heads(q, who, q.input_dtype(0), l.d, l.dv));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> fallback, make_packed_attention_kernel(q));
  return std::unique_ptr<Kernel>(new SdpaKernel(q.input_dtype(0), l.q_heads, l.kv_heads, l.scale,
                                                l.causal, std::move(fallback), l));
}

StatusOr<std::unique_ptr<Kernel>> make_sdpa(const KernelQuery& q) {
  const std::string who = q.node.describe() + ": cuda.cudnn_sdpa.Attention";
  const auto& at = q.node.attrs;
  const DType t = q.input_dtype(0);
  for (size_t i = 4; i < q.inputs.size(); ++i) {
    if (q.inputs[i]) return unsupported(who + " runs no past key/value or nonpad_kv_seqlen");
  }
  for (size_t i = 1; i < q.outputs.size(); ++i) {
    if (q.outputs[i]) return unsupported(who + " writes no present key/value or qk_matmul_output");
  }
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
  KILN_RETURN_IF_ERROR(sdpa_types_and_heads(q, who, t, *d, *dv));
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
  r.add(OpKind::kPackedAttention, &make_packed_sdpa, {.library = "cudnn_sdpa"});
}

}  // namespace kiln::backends::cuda

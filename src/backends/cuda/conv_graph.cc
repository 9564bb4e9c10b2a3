// kiln::FusedConv channels last on float16/bfloat16 tensors through cuDNN's graph API (the cuDNN
// frontend's conv_fprop): every engine cuDNN 9 has for the problem, where the legacy
// cudnnConvolutionForward reaches only some (ResNet-50's 4-channel stem at batch 64 on an H100: 1.0
// ms on the engine the legacy API ran, 121 us on the one PyTorch's cuDNN path picks). The builder
// times the engine configurations cuDNN's heuristics offer at the opt shapes and records the
// fastest as "engine=<id> knobs=<type>:<value>,..."; the kernel replays it for each shape it meets
// (cuDNN's heuristic choice where the engine refuses that shape: a fixed rule, not a new choice).
// Engines that compile kernels at run time are left out, so a new batch size costs a plan build
// (milliseconds), never a compilation. Bias, residual and activation run in one conv_epilogue
// pass after the convolution.
#include <cudnn_frontend.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>

#include "backends/cuda/conv_attrs.h"

namespace kiln::backends::cuda {
namespace {

namespace fe = cudnn_frontend;
using ops::OpKind;

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// The per-stream library workspace an engine may use (StreamResources::workspace_bytes).
constexpr int64_t kLibraryWorkspace = int64_t(32) << 20;
// Plans a kernel keeps, one per shape it met (a profile's batch sizes); the oldest goes first.
constexpr size_t kMaxPlans = 16;

bool is_half(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// One convolution problem in cuDNN's NCHW-ordered dims (the strides say channels last).
struct Geometry {
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, p = 0, q = 0;
  std::array<int64_t, 2> pre{0, 0}, post{0, 0}, stride{1, 1}, dilation{1, 1};
};

// The pads of each spatial axis (explicit, or what auto_pad gives for these sizes), checked against
// the output size the plan holds.
StatusOr<Geometry> geometry(const ConvAttrs& c, std::span<const int64_t> x, std::span<const int64_t> w,
                            std::span<const int64_t> y, const std::string& who) {
  if (x.size() != 4 || w.size() != 4 || y.size() != 4) return invalid_argument(who + ": X, W and Y must be rank 4");
  Geometry g;
  g.n = x[0], g.h = x[1], g.w = x[2], g.c = x[3];
  g.k = w[0], g.r = w[1], g.s = w[2];
  g.p = y[1], g.q = y[2];
  if (w[3] != g.c || y[0] != g.n || y[3] != g.k) {
    return invalid_argument(who + ": X " + shape_to_string(x) + ", W " + shape_to_string(w) + " and Y " +
                            shape_to_string(y) + " are no channels-last convolution");
  }
  const int64_t in[2] = {g.h, g.w}, kernel[2] = {g.r, g.s}, out[2] = {g.p, g.q};
  for (int i = 0; i < 2; ++i) {
    const int64_t st = c.strides.size() == 2 ? c.strides[size_t(i)] : 1;
    const int64_t d = c.dilations.size() == 2 ? c.dilations[size_t(i)] : 1;
    int64_t pb = 0, pe = 0;
    if (c.auto_pad == "SAME_UPPER" || c.auto_pad == "SAME_LOWER") {
      const int64_t total = std::max<int64_t>(0, ((in[i] + st - 1) / st - 1) * st + d * (kernel[i] - 1) + 1 - in[i]);
      pb = c.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (c.auto_pad == "NOTSET" && c.pads.size() == 4) {
      pb = c.pads[size_t(i)], pe = c.pads[size_t(i) + 2];
    }
    if (st < 1 || d < 1 || pb < 0 || pe < 0) return invalid_argument(who + ": bad stride, dilation or pad");
    const int64_t expect = (in[i] + pb + pe - d * (kernel[i] - 1) - 1) / st + 1;
    if (expect != out[i]) {
      return invalid_argument(who + ": the convolution gives " + std::to_string(expect) + " along spatial axis " +
                              std::to_string(i) + ", the plan " + std::to_string(out[i]));
    }
    g.pre[size_t(i)] = pb, g.post[size_t(i)] = pe, g.stride[size_t(i)] = st, g.dilation[size_t(i)] = d;
  }
  return g;
}

// The recorded engine configuration; no engine: cuDNN's heuristic choice for each shape.
struct GraphTactic {
  std::optional<int64_t> engine;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
};

std::string to_tactic(int64_t engine, const std::unordered_map<fe::KnobType_t, int64_t>& knobs) {
  // Knob order fixed, so rebuilds write the same text. A backend knob the frontend has no name for
  // comes back as NOT_SET, which create_execution_plan refuses: left out, the engine takes its
  // default for it.
  std::map<int64_t, int64_t> sorted;
  for (const auto& [type, value] : knobs) {
    if (type != fe::KnobType_t::NOT_SET) sorted[int64_t(type)] = value;
  }
  std::string t = "engine=" + std::to_string(engine) + " knobs=";
  bool first = true;
  for (const auto& [type, value] : sorted) {
    t += (first ? "" : ",") + std::to_string(type) + ":" + std::to_string(value);
    first = false;
  }
  return t;
}

// An optional '-' and 1 to 17 digits (no exception, no overflow on a tampered engine file).
StatusOr<int64_t> parse_int(const std::string& s, const std::string& t) {
  const size_t digits = s.size() - (!s.empty() && s[0] == '-');
  if (digits == 0 || digits > 17 || s.find_first_not_of("0123456789", s.size() - digits) != std::string::npos) {
    return invalid_argument("cuDNN graph tactic '" + t + "': '" + s + "' is no integer");
  }
  return std::stoll(s);
}

StatusOr<GraphTactic> parse_tactic(const std::string& t) {
  GraphTactic out;
  if (t.empty() || t == "heuristic") return out;
  const std::string bad = "cuDNN graph tactic '" + t + "' is not engine=<id> knobs=[<type>:<value>,...] or heuristic";
  if (t.rfind("engine=", 0) != 0) return invalid_argument(bad);
  const size_t sp = t.find(" knobs=");
  if (sp == std::string::npos) return invalid_argument(bad);
  KILN_ASSIGN_OR_RETURN(int64_t engine, parse_int(t.substr(7, sp - 7), t));
  if (engine < 0) return invalid_argument(bad);
  out.engine = engine;
  std::string list = t.substr(sp + 7);
  size_t at = 0;
  while (at < list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(at, end - at);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) return invalid_argument(bad);
    KILN_ASSIGN_OR_RETURN(int64_t type, parse_int(item.substr(0, colon), t));
    KILN_ASSIGN_OR_RETURN(int64_t value, parse_int(item.substr(colon + 1), t));
    if (type <= 0 || type > 1000 || out.knobs.count(fe::KnobType_t(type))) return invalid_argument(bad);
    out.knobs[fe::KnobType_t(type)] = value;
    at = end + 1;
  }
  return out;
}

Status fe_status(const fe::error_t& e, const std::string& what) {
  if (e.is_good()) return ok_status();
  return unsupported(what + ": cuDNN frontend: " + e.err_msg);
}

// The operation graph of one problem, built as far as choosing engines.
StatusOr<std::shared_ptr<fe::graph::Graph>> operation_graph(const Geometry& g, DType t, cudnnHandle_t handle,
                                                            const std::string& who) {
  auto graph = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = t == DType::kFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
  graph->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto x = graph->tensor(fe::graph::Tensor_attributes()
                             .set_name("X")
                             .set_uid(kUidX)
                             .set_dim({g.n, g.c, g.h, g.w})
                             .set_stride({g.h * g.w * g.c, 1, g.w * g.c, g.c}));
  auto w = graph->tensor(fe::graph::Tensor_attributes()
                             .set_name("W")
                             .set_uid(kUidW)
                             .set_dim({g.k, g.c, g.r, g.s})
                             .set_stride({g.r * g.s * g.c, 1, g.s * g.c, g.c}));
  auto options = fe::graph::Conv_fprop_attributes()
                     .set_pre_padding({g.pre[0], g.pre[1]})
                     .set_post_padding({g.post[0], g.post[1]})
                     .set_stride({g.stride[0], g.stride[1]})
                     .set_dilation({g.dilation[0], g.dilation[1]});
  auto y = graph->conv_fprop(x, w, options);
  y->set_output(true).set_uid(kUidY).set_data_type(io).set_dim({g.n, g.k, g.p, g.q}).set_stride(
      {g.p * g.q * g.k, 1, g.q * g.k, g.k});
  KILN_RETURN_IF_ERROR(fe_status(graph->validate(), who + ": validating the convolution graph"));
  KILN_RETURN_IF_ERROR(fe_status(graph->build_operation_graph(handle), who + ": building the operation graph"));
  return graph;
}

// The plan for one shape: the recorded engine where it takes the shape, else cuDNN's heuristic
// choice; either within the library workspace.
StatusOr<std::shared_ptr<fe::graph::Graph>> planned_graph(const Geometry& g, DType t, const GraphTactic& tactic,
                                                          cudnnHandle_t handle, const std::string& who) {
  if (tactic.engine) {
    auto graph = operation_graph(g, t, handle, who);
    if (graph.ok() && (*graph)->create_execution_plan(*tactic.engine, tactic.knobs).is_good() &&
        (*graph)->check_support(handle).is_good() && (*graph)->build_plans(handle).is_good()) {
      int64_t ws = 0;
      if ((*graph)->get_workspace_size(ws).is_good() && ws <= kLibraryWorkspace) return graph;
    }
  }
  KILN_ASSIGN_OR_RETURN(auto graph, operation_graph(g, t, handle, who));
  KILN_RETURN_IF_ERROR(fe_status(graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                                 who + ": cuDNN's heuristics"));
  graph->deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  KILN_RETURN_IF_ERROR(fe_status(graph->check_support(handle), who + ": no cuDNN engine takes the convolution"));
  KILN_RETURN_IF_ERROR(fe_status(graph->build_plans(handle), who + ": building a cuDNN plan"));
  int64_t ws = 0;
  KILN_RETURN_IF_ERROR(fe_status(graph->get_workspace_size(ws), who + ": the plan's workspace"));
  if (ws > kLibraryWorkspace) {
    return unsupported(who + ": cuDNN's plan needs " + std::to_string(ws) + " bytes of workspace, over the " +
                       std::to_string(kLibraryWorkspace) + " a stream has");
  }
  return graph;
}

class GraphConvKernel final : public CudaKernel {
 public:
  GraphConvKernel(DType t, ConvAttrs attrs, GraphTactic tactic)
      : CudaKernel("cuda.FusedConv(cudnn graph,NHWC," + std::string(dtype_name(t)) + " tensors)"),
        t_(t),
        attrs_(std::move(attrs)),
        tactic_(std::move(tactic)) {}

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    const TensorView &x = in[0], &w = in[1], &y = out[0];
    KILN_ASSIGN_OR_RETURN(Geometry g, geometry(attrs_, x.shape, w.shape, y.shape, name_));
    KILN_RETURN_IF_ERROR(check_fused_operands(name_, in, y, t_, g.k));
    const bool has_bias = in.size() > 2 && present(in[2]);
    const bool has_z = in.size() > 3 && present(in[3]);
    if (y.numel() == 0) return ok_status();
    if (x.numel() == 0 || w.numel() == 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), stream_), name_ + ": zero Y");
    } else {
      KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
      Shape key(x.shape.begin(), x.shape.end());
      key.insert(key.end(), w.shape.begin(), w.shape.end());
      auto it = plans_.find(key);
      if (it == plans_.end()) {
        KILN_ASSIGN_OR_RETURN(auto graph, planned_graph(g, t_, tactic_, res->dnn, name_));
        if (plans_.size() >= kMaxPlans) {
          plans_.erase(order_.front());
          order_.erase(order_.begin());
        }
        it = plans_.emplace(key, std::move(graph)).first;
        order_.push_back(key);
      }
      std::unordered_map<int64_t, void*> pack = {
          {kUidX, const_cast<void*>(x.data)}, {kUidW, const_cast<void*>(w.data)}, {kUidY, y.data}};
      fe::error_t e = it->second->execute(res->dnn, pack, res->workspace);
      if (!e.is_good()) return internal_error(name_ + ": cuDNN graph execute: " + e.err_msg);
    }
    if (!has_bias && !has_z && attrs_.act == ConvActivation::kNone) return ok_status();
    return conv_epilogue(t_, y.data, has_bias ? in[2].data : nullptr, has_z ? in[3].data : nullptr, y.numel(),
                         g.k, 1, attrs_.act, attrs_.p0, attrs_.p1, stream_);
  }

 private:
  DType t_;
  ConvAttrs attrs_;
  GraphTactic tactic_;
  std::map<Shape, std::shared_ptr<fe::graph::Graph>> plans_;
  std::vector<Shape> order_;
};

Status check_graph_conv(const KernelQuery& q, const ConvAttrs& c) {
  const std::string who = q.node.describe() + ": cuda.cudnn_graph.FusedConv";
  if (q.node.op_type != "FusedConv" || !c.nhwc) return unsupported(who + " runs channels-last FusedConv only");
  const DType t = q.input_dtype(0);
  if (!is_half(t)) return unsupported(who + " takes float16 or bfloat16 tensors, not " + std::string(dtype_name(t)));
  for (size_t i = 1; i < q.inputs.size(); ++i) {
    if (q.inputs[i] && q.inputs[i]->dtype != t) return unsupported(who + " takes one dtype for X, W, B and Z");
  }
  if (q.output_dtype(0) != t) return unsupported(who + " takes one dtype; Y differs from X");
  // Grouped and depthwise convolutions stay on the legacy API, whose depthwise engines are fast.
  if (c.group != 1) return unsupported(who + " runs ungrouped convolutions");
  if (c.auto_pad != "NOTSET" && c.auto_pad != "VALID" && c.auto_pad != "SAME_UPPER" && c.auto_pad != "SAME_LOWER") {
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + c.auto_pad + "'");
  }
  if ((!c.strides.empty() && c.strides.size() != 2) || (!c.dilations.empty() && c.dilations.size() != 2) ||
      (!c.pads.empty() && c.pads.size() != 4)) {
    return unsupported(who + " runs 2-D convolutions");
  }
  const ir::Value* x = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  if (!x || !x->shape || x->shape->size() != 4 || !w || !w->shape || w->shape->size() != 4) {
    return unsupported(who + " runs 2-D convolutions (rank-4 X and W)");
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Kernel>> make_graph_conv(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(ConvAttrs c, conv_attrs(q));
  KILN_RETURN_IF_ERROR(check_graph_conv(q, c));
  KILN_ASSIGN_OR_RETURN(GraphTactic tactic, parse_tactic(q.tactic));
  return std::unique_ptr<Kernel>(new GraphConvKernel(q.input_dtype(0), std::move(c), std::move(tactic)));
}

// The engine configurations cuDNN's heuristics offer at the opt shapes (no run-time compiled ones,
// none over the library workspace), fastest first: each plan run once, then timed over five runs on
// zero-filled operands (at optimization level 0 the heuristics' order, nothing run); "heuristic"
// last, and alone where there is no GPU or no answer.
std::vector<std::string> graph_conv_tactics(const KernelQuery& q) {
  std::vector<std::string> out;
  auto finish = [&] {
    out.push_back("heuristic");
    return out;
  };
  const ir::Value* xv = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* wv = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  const ir::Value* yv = q.outputs.empty() ? nullptr : q.outputs[0];
  auto x = q.opt_shape(xv), w = q.opt_shape(wv), y = q.opt_shape(yv);
  auto attrs = conv_attrs(q);
  if (!x || !w || !y || !attrs.ok() || shape_numel(*x) == 0 || shape_numel(*w) == 0 || shape_numel(*y) == 0) {
    return finish();
  }
  auto geo = geometry(*attrs, *x, *w, *y, q.node.describe());
  if (!geo.ok()) return finish();
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    return cudnnCreate(&h) == CUDNN_STATUS_SUCCESS ? h : nullptr;
  }();
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess ? s : nullptr;
  }();
  if (!handle || !stream || cudnnSetStream(handle, stream) != CUDNN_STATUS_SUCCESS) return finish();
  const DType t = q.input_dtype(0);
  auto graph = operation_graph(*geo, t, handle, q.node.describe());
  if (!graph.ok()) return finish();
  auto& gr = **graph;
  if (!gr.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}).is_good()) return finish();
  gr.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  if (!gr.check_support(handle).is_good()) return finish();
  (void)gr.build_plans(handle, fe::BuildPlanPolicy_t::ALL);  // plans that fail to build are skipped below
  const int64_t count = gr.get_execution_plan_count();
  std::vector<std::pair<double, std::string>> timed;
  std::vector<std::string> order;
  TimingBuffers buffers;
  const size_t es = dtype_size(t);
  void* px = buffers.alloc(size_t(shape_numel(*x)) * es);
  void* pw = buffers.alloc(size_t(shape_numel(*w)) * es);
  void* py = buffers.alloc(size_t(shape_numel(*y)) * es);
  void* ws = buffers.alloc(size_t(kLibraryWorkspace));
  const bool measure = q.optimization_level > 0 && px && pw && py && ws;
  std::unordered_map<int64_t, void*> pack = {{kUidX, px}, {kUidW, pw}, {kUidY, py}};
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int64_t i = 0; i < count; ++i) {
    int64_t need = 0, engine = 0;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    if (!gr.get_workspace_size_plan_at_index(i, need).is_good() || need > kLibraryWorkspace ||
        !gr.get_engine_and_knobs_at_index(i, engine, knobs).is_good()) {
      continue;
    }
    const std::string tactic = to_tactic(engine, knobs);
    if (!measure) {
      order.push_back(tactic);
      continue;
    }
    if (!gr.execute_plan_at_index(handle, pack, ws, i).is_good() || cudaStreamSynchronize(stream) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int k = 0; k < 5 && ok; ++k) ok = gr.execute_plan_at_index(handle, pack, ws, i).is_good();
    cudaEventRecord(stop, stream);
    float ms = 0;
    if (ok && cudaEventSynchronize(stop) == cudaSuccess && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess) {
      timed.emplace_back(double(ms) / 5, tactic);
    }
    cudaGetLastError();
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::stable_sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ms, tactic] : timed) order.push_back(tactic);
  for (const auto& tactic : order) {
    if (std::find(out.begin(), out.end(), tactic) == out.end()) out.push_back(tactic);
  }
  return finish();
}

}  // namespace

// Registered after the 1x1 GEMM and before the legacy cuDNN convolution (register_kernels' order).
void register_conv_graph(Registry& r) {
  r.add(OpKind::kFusedConv, &make_graph_conv, {.library = "cudnn_graph", .tactics = &graph_conv_tactics});
}

}  // namespace kiln::backends::cuda

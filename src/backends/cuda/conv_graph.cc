// kiln::FusedConv channels last on float16/bfloat16 tensors through cuDNN's graph API (the cuDNN
// frontend's conv_fprop): every engine cuDNN 9 has for the problem, where the legacy
// cudnnConvolutionForward reaches only some (ResNet-50's 4-channel stem at batch 64 on an H100: 1.0
// ms on the engine the legacy API ran, 121 us on the one PyTorch's cuDNN path picks). The builder
// times the engine configurations cuDNN's heuristics offer at the opt shapes and records the
// fastest as "engine=<id> knobs=<type>:<value>,..."; where the profile's min batch is smaller, also
// the fastest at the min shapes, for batches under the geometric mean of the two (" | below=N
// <config>": at batch 1 a configuration tiled for batch 64 leaves most of the GPU idle). The kernel
// replays the recorded configuration for each shape it meets (cuDNN's heuristic choice where the
// engine refuses that shape: a fixed rule, not a new choice).
// Bias, residual and activation join the graph as pointwise nodes on the float accumulator where an
// engine takes them ("fused engine=..."), so Y is rounded to its type once, as the legacy API's
// fused call and the cuBLASLt epilogue do; otherwise they run in one conv_epilogue pass after the
// convolution, which rounds the convolution's result first. The builder times both forms (the
// unfused one with its epilogue pass) and keeps the faster.
// cuDNN's precompiled engines fuse little beyond ReLU; its runtime-fusion engines generate and
// compile (NVRTC) a kernel for the graph, SiLU or GELU included. At optimization level 3 and up,
// where cudnn_runtime_fusion() (jit.h) allows, the fused form's timing also takes the first
// kJitPlans of those in the heuristics' order ("fused jit engine=..."). EfficientNetV2-S on an H200
// (FP16, batch 32): 5.84 -> 5.03 ms, its build 4 -> 135 s (timing 4 jit plans instead of 12: 5.26
// ms, 85 s). The kernel compiles such a plan for each shape it first meets (EfficientNetV2-S's
// first run at a new batch: about 3 s), as the builder did. cuDNN's dynamic-shape mode, which
// would compile once for every shape, offered slower kernels (sm80 ones where static shapes got
// sm90 ones: 5.76 ms at a budget of 3). Unfused forms and precompiled engines never compile.
// Depthwise convolutions (group = C = K) run here too, W as [C, R, S, 1]: conv_depthwise.cu's
// kernels come first in the registry and both report their timed tactics, so the builder takes the
// faster (select_kernels). EfficientNetV2-S FP16 at batch 32 on an H200: its 30 depthwise layers
// 1,502 -> 989 us a run on the runtime-fusion engine with the SiLU fused, the engine 5.02 -> 4.52
// ms (.gpu_models/runE3.sh, runE4.sh). The legacy API's depthwise choice (implicit_precomp_gemm)
// took 1,438 us there and lost at batch 1 (1.82 ms against 1.26). Other grouped convolutions stay
// on the legacy API.

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "backends/cuda/conv_attrs.h"
#include "backends/cuda/cudnn_fe.h"
#include "backends/cuda/jit.h"

namespace kiln::backends::cuda {
namespace {

using ops::OpKind;

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidB = 4, kUidZ = 5;
// The per-stream library workspace an engine may use (StreamResources::workspace_bytes).
constexpr int64_t kLibraryWorkspace = int64_t(32) << 20;
// Plans a kernel keeps, one per shape it met (a profile's batch sizes); the oldest goes first.
constexpr size_t kMaxPlans = 16;
// Engine configurations the builder times per graph at optimization level 3 (cuDNN's heuristic
// order decides which); level 4 and up times all, levels 1 and 2 the first four.
constexpr int64_t kTimedPlans = 16;
// Run-time compiled (runtime-fusion) configurations timed per fused graph, beside those: each is
// a compilation (about 30-50 ms on the H200 host). None below optimization level 3.
constexpr int64_t kJitPlans = 12, kJitPlansLevel4 = 32;

// One convolution problem in cuDNN's NCHW-ordered dims (the strides say channels last).
struct Geometry {
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, p = 0, q = 0;
  int64_t cg = 0;  // input channels a group (W's last axis): c / groups
  std::array<int64_t, 2> pre{0, 0}, post{0, 0}, stride{1, 1}, dilation{1, 1};
};

// What the graph computes after the convolution: nothing (the kernel runs conv_epilogue after it),
// or bias, residual and activation as pointwise nodes in float.
struct Fusion {
  bool on = false, bias = false, z = false;
  ConvActivation act = ConvActivation::kNone;
  float p0 = 0.f, p1 = 0.f;
};

// The pads of each spatial axis (explicit, or what auto_pad gives for these sizes), checked against
// the output size the plan holds.
StatusOr<Geometry> geometry(const ConvAttrs& c, std::span<const int64_t> x,
                            std::span<const int64_t> w, std::span<const int64_t> y,
                            const std::string& who) {
  if (x.size() != 4 || w.size() != 4 || y.size() != 4)
    return invalid_argument(who + ": X, W and Y must be rank 4");
  Geometry g;
  g.n = x[0], g.h = x[1], g.w = x[2], g.c = x[3];
  g.k = w[0], g.r = w[1], g.s = w[2], g.cg = w[3];
  g.p = y[1], g.q = y[2];
  if (g.cg < 1 || g.c % g.cg != 0 || g.k % (g.c / g.cg) != 0 || y[0] != g.n || y[3] != g.k) {
    return invalid_argument(who + ": X " + shape_to_string(x) + ", W " + shape_to_string(w) +
                            " and Y " + shape_to_string(y) + " are no channels-last convolution");
  }
  const int64_t in[2] = {g.h, g.w}, kernel[2] = {g.r, g.s}, out[2] = {g.p, g.q};
  for (int i = 0; i < 2; ++i) {
    const int64_t st = c.strides.size() == 2 ? c.strides[size_t(i)] : 1;
    const int64_t d = c.dilations.size() == 2 ? c.dilations[size_t(i)] : 1;
    int64_t pb = 0, pe = 0;
    if (c.auto_pad == "SAME_UPPER" || c.auto_pad == "SAME_LOWER") {
      const int64_t total =
          std::max<int64_t>(0, ((in[i] + st - 1) / st - 1) * st + d * (kernel[i] - 1) + 1 - in[i]);
      pb = c.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (c.auto_pad == "NOTSET" && c.pads.size() == 4) {
      pb = c.pads[size_t(i)], pe = c.pads[size_t(i) + 2];
    }
    if (st < 1 || d < 1 || pb < 0 || pe < 0)
      return invalid_argument(who + ": bad stride, dilation or pad");
    const int64_t expect = (in[i] + pb + pe - d * (kernel[i] - 1) - 1) / st + 1;
    if (expect != out[i]) {
      return invalid_argument(who + ": the convolution gives " + std::to_string(expect) +
                              " along spatial axis " + std::to_string(i) + ", the plan " +
                              std::to_string(out[i]));
    }
    g.pre[size_t(i)] = pb, g.post[size_t(i)] = pe, g.stride[size_t(i)] = st,
    g.dilation[size_t(i)] = d;
  }
  return g;
}

// One engine configuration: cuDNN's heuristic choice for each shape where no engine is given;
// fused: bias, residual and activation inside the graph; jit: a runtime-fusion engine (its kernel
// compiled at run time for each shape).
struct GraphConfig {
  bool fused = false;
  bool jit = false;
  std::optional<int64_t> engine;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
};

// The recorded tactic: `main`, and `small` for batches under `below` (timed at the profile's min
// shapes, where a configuration chosen for the opt batch can leave most of the GPU idle).
struct GraphTactic {
  GraphConfig main;
  int64_t below = 0;
  GraphConfig small;
};

std::string to_config(bool fused, bool jit, int64_t engine,
                      const std::unordered_map<fe::KnobType_t, int64_t>& knobs) {
  // Knob order fixed, so rebuilds write the same text. A backend knob the frontend has no name for
  // comes back as NOT_SET, which create_execution_plan refuses: left out, the engine takes its
  // default for it.
  std::map<int64_t, int64_t> sorted;
  for (const auto& [type, value] : knobs) {
    if (type != fe::KnobType_t::NOT_SET) sorted[int64_t(type)] = value;
  }
  std::string t = fused ? "fused " : "";
  if (jit) t += "jit ";
  t += "engine=";
  t += std::to_string(engine);
  t += " knobs=";
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
  if (digits == 0 || digits > 17 ||
      s.find_first_not_of("0123456789", s.size() - digits) != std::string::npos) {
    return invalid_argument("cuDNN graph tactic '" + t + "': '" + s + "' is no integer");
  }
  return std::stoll(s);
}

// "[fused [jit ]]engine=<id> knobs=[<type>:<value>,...]" or "[fused ]heuristic"; `whole` is the
// tactic the text came from, for the message.
StatusOr<GraphConfig> parse_config(const std::string& text, const std::string& whole) {
  GraphConfig out;
  out.fused = text.rfind("fused ", 0) == 0;
  std::string t = out.fused ? text.substr(6) : text;
  out.jit = out.fused && t.rfind("jit ", 0) == 0;
  if (out.jit) t = t.substr(4);
  const std::string bad =
      "cuDNN graph tactic '" + whole +
      "' is not [fused [jit ]]engine=<id> knobs=[<type>:<value>,...] or [fused ]heuristic, "
      "optionally followed by ' | below=<batch> ' and another of those";
  if (t == "heuristic") {
    if (out.jit) return invalid_argument(bad);
    return out;
  }
  if (t.rfind("engine=", 0) != 0) return invalid_argument(bad);
  const size_t sp = t.find(" knobs=");
  if (sp == std::string::npos) return invalid_argument(bad);
  KILN_ASSIGN_OR_RETURN(int64_t engine, parse_int(t.substr(7, sp - 7), whole));
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
    KILN_ASSIGN_OR_RETURN(int64_t type, parse_int(item.substr(0, colon), whole));
    KILN_ASSIGN_OR_RETURN(int64_t value, parse_int(item.substr(colon + 1), whole));
    if (type <= 0 || type > 1000 || out.knobs.count(fe::KnobType_t(type)))
      return invalid_argument(bad);
    out.knobs[fe::KnobType_t(type)] = value;
    at = end + 1;
  }
  return out;
}

constexpr const char* kBelow = " | below=";

StatusOr<GraphTactic> parse_tactic(const std::string& t) {
  GraphTactic out;
  if (t.empty()) return out;
  const size_t bar = t.find(kBelow);
  KILN_ASSIGN_OR_RETURN(out.main, parse_config(t.substr(0, bar), t));
  if (bar == std::string::npos) return out;
  const std::string rest = t.substr(bar + std::string(kBelow).size());
  const size_t sp = rest.find(' ');
  if (sp == std::string::npos)
    return invalid_argument("cuDNN graph tactic '" + t + "': nothing after 'below=N'");
  KILN_ASSIGN_OR_RETURN(out.below, parse_int(rest.substr(0, sp), t));
  if (out.below < 1)
    return invalid_argument("cuDNN graph tactic '" + t + "': 'below=' takes a batch of 1 or more");
  KILN_ASSIGN_OR_RETURN(out.small, parse_config(rest.substr(sp + 1), t));
  return out;
}

// The operation graph of one problem, built as far as choosing engines.
StatusOr<std::shared_ptr<fe::graph::Graph>> operation_graph(const Geometry& g, DType t,
                                                            const Fusion& f, cudnnHandle_t handle,
                                                            const std::string& who) {
  auto graph = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = t == DType::kFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
  graph->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> y_dim = {g.n, g.k, g.p, g.q},
                             y_stride = {g.p * g.q * g.k, 1, g.q * g.k, g.k};
  auto x = graph->tensor(fe::graph::Tensor_attributes()
                             .set_name("X")
                             .set_uid(kUidX)
                             .set_dim({g.n, g.c, g.h, g.w})
                             .set_stride({g.h * g.w * g.c, 1, g.w * g.c, g.c}));
  auto w = graph->tensor(fe::graph::Tensor_attributes()
                             .set_name("W")
                             .set_uid(kUidW)
                             .set_dim({g.k, g.cg, g.r, g.s})
                             .set_stride({g.r * g.s * g.cg, 1, g.s * g.cg, g.cg}));
  auto options = fe::graph::Conv_fprop_attributes()
                     .set_pre_padding({g.pre[0], g.pre[1]})
                     .set_post_padding({g.post[0], g.post[1]})
                     .set_stride({g.stride[0], g.stride[1]})
                     .set_dilation({g.dilation[0], g.dilation[1]});
  auto y = graph->conv_fprop(x, w, options);
  if (f.on) {
    // act(conv + B + Z), each step in float on the accumulator, as conv_epilogue computes it.
    using PW = fe::graph::Pointwise_attributes;
    if (f.bias) {
      auto b = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("B")
                                 .set_uid(kUidB)
                                 .set_dim({1, g.k, 1, 1})
                                 .set_stride({g.k, 1, g.k, g.k}));
      y = graph->pointwise(y, b, PW().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
    }
    if (f.z) {
      auto z = graph->tensor(
          fe::graph::Tensor_attributes().set_name("Z").set_uid(kUidZ).set_dim(y_dim).set_stride(
              y_stride));
      y = graph->pointwise(y, z, PW().set_name("residual").set_mode(fe::PointwiseMode_t::ADD));
    }
    switch (f.act) {
      case ConvActivation::kRelu:
        y = graph->pointwise(y, PW().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
        break;
      case ConvActivation::kClip:  // below the lower clip: lower + 0 * (y - lower)
        y = graph->pointwise(y, PW().set_name("clip")
                                    .set_mode(fe::PointwiseMode_t::RELU_FWD)
                                    .set_relu_lower_clip(f.p0)
                                    .set_relu_upper_clip(f.p1));
        break;
      case ConvActivation::kLeakyRelu:  // below 0: 0 + alpha * (y - 0)
        y = graph->pointwise(y, PW().set_name("leaky_relu")
                                    .set_mode(fe::PointwiseMode_t::RELU_FWD)
                                    .set_relu_lower_clip(0.f)
                                    .set_relu_lower_clip_slope(f.p0));
        break;
      case ConvActivation::kSigmoid:
        y = graph->pointwise(y,
                             PW().set_name("sigmoid").set_mode(fe::PointwiseMode_t::SIGMOID_FWD));
        break;
      case ConvActivation::kSilu:
        y = graph->pointwise(
            y, PW().set_name("silu").set_mode(fe::PointwiseMode_t::SWISH_FWD).set_swish_beta(1.f));
        break;
      case ConvActivation::kGelu:  // 0.5 y (1 + erf(y / sqrt 2))
        y = graph->pointwise(y, PW().set_name("gelu").set_mode(fe::PointwiseMode_t::GELU_FWD));
        break;
      case ConvActivation::kGeluTanh:
        y = graph->pointwise(
            y, PW().set_name("gelu_tanh").set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_FWD));
        break;
      case ConvActivation::kNone:
        break;
      default:
        return internal_error(who + ": activation not fusable into a cuDNN graph");
    }
  }
  y->set_output(true).set_uid(kUidY).set_data_type(io).set_dim(y_dim).set_stride(y_stride);
  KILN_RETURN_IF_ERROR(fe_status(graph->validate(), who + ": validating the convolution graph"));
  KILN_RETURN_IF_ERROR(
      fe_status(graph->build_operation_graph(handle), who + ": building the operation graph"));
  return graph;
}

// cuDNN's heuristics' engine configurations for a graph, run-time compiled ones left out unless
// `jit`, checked.
Status choose_engines(fe::graph::Graph& graph, cudnnHandle_t handle, const std::string& who,
                      bool jit = false) {
  KILN_RETURN_IF_ERROR(
      fe_status(graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                who + ": cuDNN's heuristics"));
  if (!jit) graph.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  return fe_status(graph.check_support(handle), who + ": no cuDNN engine takes the convolution");
}

// Whether the heuristics' configuration `i` compiles its kernel at run time.
bool compiles_at_run_time(const fe::graph::Graph& graph, int64_t i) {
  std::vector<fe::BehaviorNote_t> notes;
  if (!graph.get_behavior_notes_for_plan_at_index(i, notes).is_good()) return false;
  return std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) !=
         notes.end();
}

// The heuristics' first configuration that builds.
Status heuristic_plan(fe::graph::Graph& graph, cudnnHandle_t handle, const std::string& who) {
  KILN_RETURN_IF_ERROR(choose_engines(graph, handle, who));
  return fe_status(graph.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
                   who + ": building a cuDNN plan");
}

// One shape's plan, and whether its graph computes the epilogue.
struct GraphPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  bool fused = false;
};

// The plan for one shape: the recorded engine where it takes the shape, else cuDNN's heuristic
// choice for the recorded form (fused or not), else its choice unfused; each within the library
// workspace.
StatusOr<GraphPlan> planned_graph(const Geometry& g, DType t, const Fusion& fusion,
                                  const GraphConfig& tactic, cudnnHandle_t handle,
                                  const std::string& who) {
  const Fusion none;
  auto within = [](fe::graph::Graph& gr) {
    int64_t ws = 0;
    return gr.get_workspace_size(ws).is_good() && ws <= kLibraryWorkspace;
  };
  const Fusion& form = tactic.fused ? fusion : none;
  // A jit engine where KILN_CUDA_JIT=0 turned compiling off: the precompiled heuristic choice.
  if (tactic.engine && (!tactic.jit || cudnn_runtime_fusion())) {
    auto graph = operation_graph(g, t, form, handle, who);
    if (graph.ok() && (*graph)->create_execution_plan(*tactic.engine, tactic.knobs).is_good() &&
        (*graph)->check_support(handle).is_good() && (*graph)->build_plans(handle).is_good() &&
        within(**graph)) {
      return GraphPlan{*graph, tactic.fused};
    }
  }
  if (tactic.fused) {
    auto graph = operation_graph(g, t, form, handle, who);
    if (graph.ok() && heuristic_plan(**graph, handle, who).ok() && within(**graph)) {
      return GraphPlan{*graph, true};
    }
  }
  KILN_ASSIGN_OR_RETURN(auto graph, operation_graph(g, t, none, handle, who));
  KILN_RETURN_IF_ERROR(heuristic_plan(*graph, handle, who));
  int64_t ws = 0;
  KILN_RETURN_IF_ERROR(fe_status(graph->get_workspace_size(ws), who + ": the plan's workspace"));
  if (ws > kLibraryWorkspace) {
    return unsupported(who + ": cuDNN's plan needs " + std::to_string(ws) +
                       " bytes of workspace, over the " + std::to_string(kLibraryWorkspace) +
                       " a stream has");
  }
  return GraphPlan{graph, false};
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
    bool fused = false;
    if (x.numel() == 0 || w.numel() == 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), stream_), name_ + ": zero Y");
    } else {
      KILN_ASSIGN_OR_RETURN(StreamResources * res, resources());
      Shape key(x.shape.begin(), x.shape.end());
      key.insert(key.end(), w.shape.begin(), w.shape.end());
      auto it = plans_.find(key);
      if (it == plans_.end()) {
        const Fusion fusion{.on = true,
                            .bias = has_bias,
                            .z = has_z,
                            .act = attrs_.act,
                            .p0 = attrs_.p0,
                            .p1 = attrs_.p1};
        const GraphConfig& config = g.n < tactic_.below ? tactic_.small : tactic_.main;
        KILN_ASSIGN_OR_RETURN(GraphPlan plan,
                              planned_graph(g, t_, fusion, config, res->dnn, name_));
        if (plans_.size() >= kMaxPlans) {
          plans_.erase(order_.front());
          order_.erase(order_.begin());
        }
        it = plans_.emplace(key, std::move(plan)).first;
        order_.push_back(key);
      }
      fused = it->second.fused;
      std::unordered_map<int64_t, void*> pack = {
          {kUidX, const_cast<void*>(x.data)}, {kUidW, const_cast<void*>(w.data)}, {kUidY, y.data}};
      if (fused && has_bias) pack[kUidB] = const_cast<void*>(in[2].data);
      if (fused && has_z) pack[kUidZ] = const_cast<void*>(in[3].data);
      fe::error_t e = it->second.graph->execute(res->dnn, pack, res->workspace);
      if (!e.is_good()) return internal_error(name_ + ": cuDNN graph execute: " + e.err_msg);
    }
    if (fused || (!has_bias && !has_z && attrs_.act == ConvActivation::kNone)) return ok_status();
    return conv_epilogue(t_, y.data, has_bias ? in[2].data : nullptr, has_z ? in[3].data : nullptr,
                         y.numel(), g.k, 1, attrs_.act, attrs_.p0, attrs_.p1, stream_);
  }

 private:
  DType t_;
  ConvAttrs attrs_;
  GraphTactic tactic_;
  std::map<Shape, GraphPlan> plans_;
  std::vector<Shape> order_;
};

// Whether X [N, H, W, C] and W [K, R, S, C/group] are a depthwise convolution's: C = K = group.
bool depthwise_shapes(const KernelQuery& q, int64_t group) {
  const ir::Value* x = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* w = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  if (!x || !x->shape || x->shape->size() != 4 || !w || !w->shape || w->shape->size() != 4)
    return false;
  const ir::Dim& c = (*x->shape)[3];
  const ir::Dim& k = (*w->shape)[0];
  const ir::Dim& per_group = (*w->shape)[3];
  return c.is_const() && k.is_const() && per_group.is_const() && c.value() == group &&
         k.value() == group && per_group.value() == 1;
}

Status check_graph_conv(const KernelQuery& q, const ConvAttrs& c) {
  const std::string who = q.node.describe() + ": cuda.cudnn_graph.FusedConv";
  if (q.node.op_type != "FusedConv" || !c.nhwc)
    return unsupported(who + " runs channels-last FusedConv only");
  const DType t = q.input_dtype(0);
  if (!is_half(t))
    return unsupported(who + " takes float16 or bfloat16 tensors, not " +
                       std::string(dtype_name(t)));
  for (size_t i = 1; i < q.inputs.size(); ++i) {
    if (q.inputs[i] && q.inputs[i]->dtype != t)
      return unsupported(who + " takes one dtype for X, W, B and Z");
  }
  if (q.output_dtype(0) != t) return unsupported(who + " takes one dtype; Y differs from X");
  // Of the grouped convolutions, depthwise ones (one filter per channel): conv_depthwise.cu's
  // kernels run them too and the builder times both (select_kernels). Other grouped convolutions
  // stay on the legacy API.
  if (c.group != 1 && !depthwise_shapes(q, c.group)) {
    return unsupported(who + " runs ungrouped and depthwise convolutions");
  }
  if (c.auto_pad != "NOTSET" && c.auto_pad != "VALID" && c.auto_pad != "SAME_UPPER" &&
      c.auto_pad != "SAME_LOWER") {
    return invalid_argument(q.node.describe() + ": unknown auto_pad '" + c.auto_pad + "'");
  }
  if ((!c.strides.empty() && c.strides.size() != 2) ||
      (!c.dilations.empty() && c.dilations.size() != 2) ||
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
  KILN_RETURN_IF_ERROR(check_no_input_activation(q, c, "cuDNN's graph FusedConv"));
  KILN_RETURN_IF_ERROR(check_graph_conv(q, c));
  KILN_ASSIGN_OR_RETURN(GraphTactic tactic, parse_tactic(q.tactic));
  if ((tactic.main.fused || (tactic.below > 0 && tactic.small.fused)) &&
      !cudnn_pointwise_computes(c.act)) {
    return invalid_argument(q.node.describe() + ": cuDNN graph tactic '" + q.tactic +
                            "' fuses an activation cuDNN's pointwise nodes do not compute");
  }
  return std::unique_ptr<Kernel>(
      new GraphConvKernel(q.input_dtype(0), std::move(c), std::move(tactic)));
}

// The engine configurations cuDNN's heuristics offer for one problem (no run-time compiled ones,
// none over the library workspace), for the convolution alone and, where the node has a bias,
// residual or activation cuDNN can compute, for the fused graph; fastest first. Each plan runs
// once, then is timed over five runs on zero-filled operands; an unfused plan's time includes the
// conv_epilogue pass it needs. Unmeasured (optimization level 0, or no memory for the operands):
// the fused graph's heuristic order, then the unfused one's. At most `budget` plans per graph run.
// Each with its milliseconds a run (negative where unmeasured).
std::vector<std::pair<std::string, double>> rank_configs(const Geometry& g, DType t,
                                                         const ConvAttrs& attrs, bool has_bias,
                                                         bool has_z, int level,
                                                         cudnnHandle_t handle, cudaStream_t stream,
                                                         const std::string& who) {
  const bool has_epilogue = has_bias || has_z || attrs.act != ConvActivation::kNone;
  const int64_t x_numel = g.n * g.h * g.w * g.c, w_numel = g.k * g.r * g.s * g.cg,
                y_numel = g.n * g.p * g.q * g.k;
  TimingBuffers buffers;
  const size_t es = dtype_size(t);
  void* px = buffers.alloc(size_t(x_numel) * es);
  void* pw = buffers.alloc(size_t(w_numel) * es);
  void* py = buffers.alloc(size_t(y_numel) * es);
  void* pb = buffers.alloc(size_t(g.k) * es);
  void* pz = has_z ? buffers.alloc(size_t(y_numel) * es) : py;
  void* ws = buffers.alloc(size_t(kLibraryWorkspace));
  const bool measure = level > 0 && px && pw && py && pb && pz && ws;
  const int64_t budget = level >= 4   ? std::numeric_limits<int64_t>::max()
                         : level >= 3 ? kTimedPlans
                                      : 4;
  const int64_t jit_budget = !cudnn_runtime_fusion() ? 0
                             : level >= 4            ? kJitPlansLevel4
                             : level >= 3            ? kJitPlans
                                                     : 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  // Milliseconds of five runs of `work`, averaged; negative where it failed.
  auto time5 = [&](const std::function<bool()>& work) -> double {
    if (!work() || cudaStreamSynchronize(stream) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int k = 0; k < 5 && ok; ++k) ok = work();
    cudaEventRecord(stop, stream);
    float ms = 0;
    const bool timed = ok && cudaEventSynchronize(stop) == cudaSuccess &&
                       cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    cudaGetLastError();
    return timed ? double(ms) / 5 : -1;
  };
  // The unfused form's epilogue pass, timed once on the same buffers.
  double epilogue_ms = 0;
  if (measure && has_epilogue) {
    epilogue_ms = time5([&] {
      return conv_epilogue(t, py, has_bias ? pb : nullptr, has_z ? pz : nullptr, y_numel, g.k, 1,
                           attrs.act, attrs.p0, attrs.p1, stream)
          .ok();
    });
  }
  std::vector<std::pair<double, std::string>> timed;
  std::vector<std::pair<std::string, double>> order;
  // One form's configurations: precompiled ones, or (jit) the run-time compiled ones.
  auto try_form = [&](bool fused, bool jit) {
    const Fusion fusion{.on = fused,
                        .bias = has_bias,
                        .z = has_z,
                        .act = attrs.act,
                        .p0 = attrs.p0,
                        .p1 = attrs.p1};
    auto graph = operation_graph(g, t, fusion, handle, who);
    if (!graph.ok()) return;
    auto& gr = **graph;
    if (!choose_engines(gr, handle, who, jit).ok()) return;
    std::unordered_map<int64_t, void*> pack = {{kUidX, px}, {kUidW, pw}, {kUidY, py}};
    if (fused && has_bias) pack[kUidB] = pb;
    if (fused && has_z) pack[kUidZ] = pz;
    const int64_t count = gr.get_execution_plan_count();
    int64_t tried = 0;
    for (int64_t i = 0; i < count && tried < (jit ? jit_budget : budget); ++i) {
      // Plans are built one at a time (a plan that fails to build is skipped), so a run-time
      // compiled engine past the budget is never compiled.
      if (compiles_at_run_time(gr, i) != jit) continue;
      int64_t need = 0, engine = 0;
      std::unordered_map<fe::KnobType_t, int64_t> knobs;
      if (!gr.get_engine_and_knobs_at_index(i, engine, knobs).is_good()) continue;
      const std::string config = to_config(fused, jit, engine, knobs);
      if (measure) ++tried;
      if (!gr.build_plan_at_index(i).is_good() ||
          !gr.get_workspace_size_plan_at_index(i, need).is_good() || need > kLibraryWorkspace) {
        continue;
      }
      if (!measure) {
        order.emplace_back(config, -1.0);
        continue;
      }
      const double ms =
          time5([&] { return gr.execute_plan_at_index(handle, pack, ws, i).is_good(); });
      if (ms >= 0) timed.emplace_back(ms + (fused ? 0 : epilogue_ms), config);
    }
  };
  if (has_epilogue && cudnn_pointwise_computes(attrs.act)) {
    try_form(true, false);
    if (measure && jit_budget > 0) try_form(true, true);
  }
  try_form(false, false);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::stable_sort(timed.begin(), timed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ms, config] : timed) order.emplace_back(config, ms);
  std::vector<std::pair<std::string, double>> out;
  for (const auto& entry : order) {
    if (std::none_of(out.begin(), out.end(), [&](const auto& o) { return o.first == entry.first; }))
      out.push_back(entry);
  }
  return out;
}

// rank_configs at the opt shapes, each with " | below=N <config>" where the profile's min batch is
// smaller (N the geometric mean of the min and opt batches, the config the fastest at the min
// shapes), with its times: the config's at the opt shapes, the below config's at the min shapes.
// Empty where there is no GPU or no answer.
std::vector<TimedTactic> graph_conv_ranked(const KernelQuery& q) {
  const ir::Value* xv = q.inputs.empty() ? nullptr : q.inputs[0];
  const ir::Value* wv = q.inputs.size() > 1 ? q.inputs[1] : nullptr;
  const ir::Value* yv = q.outputs.empty() ? nullptr : q.outputs[0];
  auto attrs = conv_attrs(q);
  const std::string who = q.node.describe();
  auto geometry_at = [&](bool opt) -> std::optional<Geometry> {
    auto x = opt ? q.opt_shape(xv) : q.min_shape(xv), w = opt ? q.opt_shape(wv) : q.min_shape(wv),
         y = opt ? q.opt_shape(yv) : q.min_shape(yv);
    if (!x || !w || !y || !attrs.ok() || shape_numel(*x) == 0 || shape_numel(*w) == 0 ||
        shape_numel(*y) == 0) {
      return std::nullopt;
    }
    auto g = geometry(*attrs, *x, *w, *y, who);
    return g.ok() ? std::optional<Geometry>(*g) : std::nullopt;
  };
  std::vector<TimedTactic> out;
  auto opt = geometry_at(true);
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    return cudnnCreate(&h) == CUDNN_STATUS_SUCCESS ? h : nullptr;
  }();
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess ? s : nullptr;
  }();
  if (!opt || !handle || !stream || cudnnSetStream(handle, stream) != CUDNN_STATUS_SUCCESS)
    return out;
  const DType t = q.input_dtype(0);
  const bool has_bias = q.inputs.size() > 2 && q.inputs[2];
  const bool has_z = q.inputs.size() > 3 && q.inputs[3];
  for (auto& [config, ms] :
       rank_configs(*opt, t, *attrs, has_bias, has_z, q.optimization_level, handle, stream, who)) {
    out.push_back({std::move(config), ms, -1.0});
  }
  auto min = geometry_at(false);
  if (!out.empty() && min && min->n < opt->n && q.optimization_level > 0) {
    auto small =
        rank_configs(*min, t, *attrs, has_bias, has_z, q.optimization_level, handle, stream, who);
    if (!small.empty()) {
      const auto below = int64_t(std::ceil(std::sqrt(double(min->n) * double(opt->n))));
      for (TimedTactic& tt : out) {
        tt.tactic += kBelow + std::to_string(below) + " " + small.front().first;
        tt.min_ms = small.front().second;
      }
    }
  }
  return out;
}

// The measured part of graph_conv_ranked (KernelImpl::timed_tactics).
std::vector<TimedTactic> graph_conv_timed_tactics(const KernelQuery& q) {
  std::vector<TimedTactic> out = graph_conv_ranked(q);
  if (out.empty() || out.front().opt_ms < 0) return {};
  return out;
}

// graph_conv_ranked's tactics, then "heuristic" (alone where there is no GPU or no answer).
std::vector<std::string> graph_conv_tactics(const KernelQuery& q) {
  std::vector<std::string> out;
  for (TimedTactic& tt : graph_conv_ranked(q)) out.push_back(std::move(tt.tactic));
  out.push_back("heuristic");
  return out;
}

}  // namespace

// Registered after the 1x1 GEMM and before the legacy cuDNN convolution (register_kernels' order).
void register_conv_graph(Registry& r) {
  r.add(OpKind::kFusedConv, &make_graph_conv,
        {.library = "cudnn_graph",
         .tactics = &graph_conv_tactics,
         .timed_tactics = &graph_conv_timed_tactics});
}

}  // namespace kiln::backends::cuda

// The build pipeline: the passes in the order they run. Read top to bottom.
#include <algorithm>
#include <set>
#include <string>

#include "builder/build_state.h"
#include "builder/builder.h"

namespace kiln::builder {

StatusOr<plan::Plan> build_plan(const ir::Graph& graph, uint64_t model_hash,
                                const BuilderConfig& config, const backends::Backend& backend) {
  BuildState s{graph, config, backend};
  // The devices a pass serves: the CPU runs the model's own ops on its reference kernels, so the
  // fusions whose point is fewer and faster kernels serve CUDA alone (ORT registers each
  // transformer with the execution providers it serves in the same way).
  enum Serves : unsigned { kCpu = 1, kCuda = 2, kAll = 3 };
  struct Pass {
    const char* name;
    Status (*run)(BuildState&);
    unsigned serves;
  };
  static constexpr Pass kPasses[] = {
      {"check_supported", check_supported, kAll},  // every unsupported node, listed at once
      {"expand_sequence_inputs", expand_sequence_inputs,
       kAll},                                  // sequence inputs -> their elements
      {"bind_profiles", bind_profiles, kAll},  // input dims -> symbols with ranges
      // Types, symbolic shapes and folding, with the lowering each node needs first (known Ifs to
      // their branch, Loops and Scans unrolled or run-time loops, sequences to tensors, opset 6
      // forms upgraded): one walk in topological order, see infer_shapes.cc for why.
      {"infer_shapes", infer_shapes, kAll},
      {"merge_duplicates", merge_duplicates, kAll},  // the same computation runs once
      {"canonicalize", canonicalize, kAll},          // one form for what exporters spell apart
      {"fold_batch_norm", fold_batch_norm, kAll},    // Conv + BatchNormalization -> Conv
      {"patchify_conv", patchify_conv, kAll},        // patch-embedding Conv -> GEMM
      {"fuse_conv_activation", fuse_conv_activation, kAll},  // Conv [+ residual] [+ activation]
      {"fuse_norm", fuse_norm, kAll},                        // LayerNorm/RMSNorm written out -> op
      {"fuse_rotary", fuse_rotary, kAll},        // x*cos + rotate_half(x)*sin -> RotaryEmbedding
      {"fuse_attention", fuse_attention, kAll},  // CPU, CUDA FP16/BF16: attention -> Attention
      {"fuse_bias_softmax", fuse_bias_softmax, kAll},  // Softmax(x + mask) -> one pass
      {"unflatten_gemm", unflatten_gemm, kCuda},       // Gemm on x.view(-1, K) -> MatMul
      {"fuse_matmul_bias", fuse_matmul_bias, kAll},    // MatMul [+ bias] + activation
      {"pack_attention", pack_attention, kAll},       // its views read in place (as fuse_attention)
      {"gather_views", gather_views, kCuda},          // copying view chains -> one Gather
      {"assign_precision", assign_precision, kCuda},  // --fp16/--bf16: reduced activations
      {"assign_layout", assign_layout, kAll},         // conv stacks in NHWC (CUDA: FP16/BF16 ones)
      {"fuse_relayout", fuse_relayout, kCuda},  // Cast + Transpose + Pad of an input -> one pass
      // sink_conv_activation (a FusedConv's activation -> the depthwise FusedConv it feeds, applied
      // as that loads X) is not run: the depthwise tile kernel it needs measured slower than the
      // epilogue pass it saves (see the pass's file).
      // fuse_squeeze_excite (pool + two 1x1 convs -> kiln::SqueezeExcite) is not run: measured
      // slower than the pool and cuBLASLt GEMMs it replaces (see the pass's file).
      {"fuse_elementwise", fuse_elementwise, kAll},  // elementwise chains -> one kernel
      {"settle_guards", settle_guards, kAll},  // nodes on edges out of an If's branch run in it
      {"check_loops", check_loops, kAll},      // run-time loops intact, sized by shapes
      {"eliminate_dead_nodes", eliminate_dead_nodes, kAll},  // keep only what must run
      {"check_profiles", check_profiles, kAll},  // prove every constraint on every profile
      {"select_kernels", select_kernels, kAll},  // a kernel (tactic) per node
      {"plan_memory", plan_memory, kAll},        // arena slots as formulas
  };
  const std::vector<std::string>& dump = config.ir_dump_passes();
  for (const std::string& name : dump) {
    bool known = false;
    for (const Pass& pass : kPasses) known = known || name == pass.name;
    if (!known) {
      std::string names;
      for (const Pass& pass : kPasses) names += std::string(names.empty() ? "" : ", ") + pass.name;
      return invalid_argument("no build pass is named '" + name +
                              "' (the passes, in order: " + names + ")");
    }
  }
  // A graph made through the API may leave producers unset; the passes read them.
  ir::set_producers(&s.graph);
  const unsigned device = backend.device() == Device::kCUDA ? kCuda : kCpu;
  bool laid_out = false;  // from infer_shapes on, the graph is tensors in topological order
  for (const Pass& pass : kPasses) {
    if (!(pass.serves & device)) continue;
    Status st = pass.run(s);
    if (!st.ok()) return st;
    laid_out = laid_out || pass.run == infer_shapes;
    // From there every pass leaves a graph that verifies: the next one (and the plan) rely on it.
    // The check is linear in the graph, far below what any pass costs.
    if (Status v = laid_out ? ir::verify(s.graph) : ok_status(); !v.ok()) {
      return internal_error(std::string("the graph after pass ") + pass.name +
                            " is invalid: " + v.message());
    }
    if (config.ir_dump() &&
        (dump.empty() || std::find(dump.begin(), dump.end(), pass.name) != dump.end())) {
      config.ir_dump()(pass.name, ir::to_text(s.graph));
    }
  }
  s.plan.device = backend.device();
  s.plan.builder_flags = config.flags();
  s.plan.model_hash = model_hash;
  s.plan.profiles = s.profiles;
  // The data-dependent dims the engine still has (dead nodes may have taken some away).
  std::set<std::string> used;
  for (const ir::Value& v : s.plan.graph.values) {
    if (v.shape) {
      for (const ir::Dim& d : *v.shape) d.collect_symbols(&used);
    }
  }
  for (const ir::DataDependentDim& dd : s.data_dependent) {
    if (used.count(dd.symbol)) {
      s.plan.data_dependent.push_back(dd);
    } else {
      for (plan::Profile& p : s.plan.profiles) p.symbols.erase(dd.symbol);
    }
  }
  return std::move(s.plan);
}

}  // namespace kiln::builder

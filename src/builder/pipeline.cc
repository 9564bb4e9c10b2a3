// The build pipeline: the passes in the order they run. Read top to bottom.
#include "builder/build_state.h"
#include "builder/builder.h"

#include <set>
#include <string>

namespace kiln::builder {

StatusOr<plan::Plan> build_plan(const ir::Graph& graph, uint64_t model_hash, const BuilderConfig& config,
                                const backends::Backend& backend) {
  BuildState s{graph, config, backend};
  struct Pass {
    const char* name;
    Status (*run)(BuildState&);
  };
  static constexpr Pass kPasses[] = {
      {"check_supported", check_supported},            // every unsupported node, listed at once
      {"expand_sequence_inputs", expand_sequence_inputs},  // sequence inputs -> their elements
      {"bind_profiles", bind_profiles},                // input dims -> symbols with ranges
      {"infer_shapes", infer_shapes},                  // types, symbolic shapes, folding
      {"merge_duplicates", merge_duplicates},          // the same computation runs once
      {"fold_batch_norm", fold_batch_norm},            // Conv + BatchNormalization -> Conv
      {"patchify_conv", patchify_conv},                // CUDA: patch-embedding Conv -> GEMM
      {"fuse_conv_activation", fuse_conv_activation},  // Conv [+ residual] [+ activation]
      {"fuse_gelu", fuse_gelu},                        // CUDA: tanh GELU written out -> Gelu
      {"fuse_norm", fuse_norm},                        // CUDA: LayerNorm/RMSNorm written out -> op
      {"unflatten_gemm", unflatten_gemm},              // CUDA: Gemm on x.view(-1, K) -> MatMul
      {"fuse_matmul_bias", fuse_matmul_bias},          // CUDA: MatMul [+ bias] + activation
      {"fuse_attention", fuse_attention},              // CUDA, FP16/BF16: attention -> Attention
      {"pack_attention", pack_attention},              // CUDA, FP16/BF16: its views read in place
      {"assign_precision", assign_precision},          // --fp16/--bf16: reduced activations
      {"assign_layout", assign_layout},                // CUDA: FP16/BF16 conv stacks in NHWC
      // fuse_squeeze_excite (pool + two 1x1 convs -> kiln::SqueezeExcite) is not run: measured
      // slower than the pool and cuBLASLt GEMMs it replaces (see the pass's file).
      {"fuse_elementwise", fuse_elementwise},          // CUDA: elementwise chains -> one kernel
      {"settle_guards", settle_guards},                // nodes on edges out of an If's branch run in it
      {"check_loops", check_loops},                    // run-time loops intact, sized by shapes
      {"eliminate_dead_nodes", eliminate_dead_nodes},  // keep only what must run
      {"check_profiles", check_profiles},              // prove every constraint on every profile
      {"select_kernels", select_kernels},              // a kernel (tactic) per node
      {"plan_memory", plan_memory},                    // arena slots as formulas
  };
  for (const Pass& pass : kPasses) {
    Status st = pass.run(s);
    if (!st.ok()) return st;
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

// The CUDA pipeline's transformer fusions on real exports: the shared ViT through torch's dynamo
// exporter (vit_tiny) and through the TorchScript exporter (vit_tiny_legacy) each get one
// Attention per encoder block, whichever exporter wrote them. The passes run with a backend that
// supports every fused node, so the test needs no GPU: the CUDA kernels' answers are checked
// elsewhere (the op harness, scripts/gpu.sh). KILN_FUSION_MODELS=PATH[:INPUT:DIMxDIM...],...
// also prints the op histogram after the fusions for any model (a developer's check), and with
// KILN_FUSION_DUMP=DIR writes each model's IR after them to DIR/MODEL.ir; KILN_FUSION_ALL=1 runs
// assign_precision (float16), assign_layout and fuse_elementwise too, as a CUDA build does (the IR
// a GPU engine runs, read on a machine without one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "backends/backend.h"
#include "builder/build_state.h"
#include "frontend/onnx/parse.h"
#include "ir/rewrite.h"
#include "model_util.h"

namespace kiln::testing {
namespace {

// Op type -> count of the nodes that run after the front passes and the CUDA fusions (as
// pipeline.cc orders them).
StatusOr<std::map<std::string, int>> fused_ops(const std::string& path, const std::string& input,
                                               Shape shape) {
  KILN_ASSIGN_OR_RETURN(auto network, onnx::parse_file(path));
  BuilderConfig config;
  config.set_flag(BuilderFlag::kFP16);
  OptimizationProfile p;
  KILN_RETURN_IF_ERROR(p.set_dimensions(input, shape, shape, shape));
  config.add_profile(p);
  KILN_ASSIGN_OR_RETURN(const backends::Backend* cpu, backends::get_backend(Device::kCPU));
  builder::BuildState s{network.graph, config, *cpu};
  using StatePass = Status (*)(builder::BuildState&);
  using GraphPass = Status (*)(ir::Graph*, const builder::SupportsFn&);
  for (StatePass pass : std::initializer_list<StatePass>{
           builder::check_supported, builder::expand_sequence_inputs, builder::bind_profiles,
           builder::infer_shapes, builder::merge_duplicates, builder::canonicalize,
           builder::fold_batch_norm}) {
    KILN_RETURN_IF_ERROR(pass(s));
  }
  builder::SupportsFn yes = [](const ir::Node&, const std::vector<const ir::Value*>&,
                               const std::vector<const ir::Value*>&) { return true; };
  for (GraphPass pass : std::initializer_list<GraphPass>{
           builder::patchify_conv, builder::fuse_conv_activation, builder::fuse_norm,
           builder::fuse_rotary, builder::fuse_attention, builder::unflatten_gemm,
           builder::fuse_matmul_bias, builder::pack_attention, builder::gather_views}) {
    KILN_RETURN_IF_ERROR(pass(&s.graph, yes));
  }
  if (std::getenv("KILN_FUSION_ALL")) {
    KILN_RETURN_IF_ERROR(builder::assign_precision(&s.graph, DType::kFloat16, yes));
    KILN_RETURN_IF_ERROR(builder::assign_layout(&s.graph, yes, builder::LayoutOptions{}));
    KILN_RETURN_IF_ERROR(builder::fuse_elementwise(&s.graph, yes));
  }
  ir::remove_dead_nodes(&s.graph);
  if (const char* dump = std::getenv("KILN_FUSION_DUMP")) {
    std::ofstream(std::string(dump) + "/" + std::filesystem::path(path).stem().string() + ".ir")
        << ir::to_text(s.graph);
  }
  // The nodes that run: not those whose outputs the build knows (shape arithmetic it folded,
  // which eliminate_dead_nodes drops).
  std::map<std::string, int> ops;
  for (const ir::Node& n : s.graph.nodes) {
    bool folded = !n.outputs.empty();
    for (int o : n.outputs) {
      folded = folded && o >= 0 &&
               (s.graph.values[size_t(o)].constant || s.graph.values[size_t(o)].sym_value);
    }
    if (!folded) ++ops[(n.domain.empty() ? "" : n.domain + "::") + n.op_type];
  }
  return ops;
}

TEST(FusionModels, BothExportsOfViTGetOneAttentionPerBlock) {
  const std::string dir = models_dir();
  if (dir.empty())
    GTEST_SKIP() << "the shared models are absent (KILN_MODELS_DIR or ../shared/models)";
  std::map<std::string, std::map<std::string, int>> by_model;
  for (auto [model, input] : {std::pair{"vit_tiny", "x"}, std::pair{"vit_tiny_legacy", "input"}}) {
    auto ops = fused_ops(dir + "/" + model + "/model.onnx", input, {2, 3, 224, 224});
    ASSERT_TRUE(ops.ok()) << model << ": " << ops.status().to_string();
    by_model[model] = *ops;
    const int attention = (*ops)["Attention"] + (*ops)["kiln::PackedAttention"];
    EXPECT_EQ(attention, 4) << model << ": 4 encoder blocks";
    EXPECT_EQ((*ops)["Softmax"], 0) << model;
    EXPECT_EQ((*ops)["Erf"], 0) << model << ": GELU is one op (in the MLP's epilogue)";
  }
  // The same network: node counts within 10% of each other.
  auto total = [](const std::map<std::string, int>& ops) {
    int n = 0;
    for (const auto& [op, count] : ops) n += count;
    return n;
  };
  const int a = total(by_model["vit_tiny"]), b = total(by_model["vit_tiny_legacy"]);
  EXPECT_LE(std::abs(a - b), std::max(a, b) / 10) << "dynamo " << a << " nodes, TorchScript " << b;
}

TEST(FusionModels, HistogramOfNamedModels) {
  const char* env = std::getenv("KILN_FUSION_MODELS");
  if (!env) GTEST_SKIP() << "KILN_FUSION_MODELS names no model (a developer's check)";
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');) {
    std::stringstream parts(item);
    std::string path, input = "input_ids", dims = "2x128";
    std::getline(parts, path, ':');
    std::getline(parts, input, ':');
    std::getline(parts, dims, ':');
    Shape shape;
    std::stringstream ds(dims);
    for (std::string d; std::getline(ds, d, 'x');) shape.push_back(std::stoll(d));
    auto ops = fused_ops(path, input, shape);
    ASSERT_TRUE(ops.ok()) << path << ": " << ops.status().to_string();
    int total = 0;
    std::string line;
    for (const auto& [op, count] : *ops) {
      total += count;
      line += " " + op + "=" + std::to_string(count);
    }
    std::printf("[ fusion ] %s: %d nodes:%s\n", path.c_str(), total, line.c_str());
  }
}

}  // namespace
}  // namespace kiln::testing

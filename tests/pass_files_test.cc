// The builder's passes on IR files (tests/passes/*.ir), IREE's habit: each file names the passes
// it runs, holds the graph in, and says what the graph out must and must not contain.
//
//   # comment                  anywhere before the graph
//   RUN: canonicalize,fuse_attention [unsupported]   the passes, in order; "unsupported": the
//                              backend supports no node a pass would make (the graph must come out
//                              as it went in, but for canonical forms of what it already had)
//   CHECK: text                appears in the printed graph out, after the previous CHECK's match
//   CHECK-NOT: text            appears nowhere in it
//   graph ... { ... }          the IR text the passes run on
//
// Where every graph input has a static shape and a float, bool or integer type, both graphs also
// run node by node on the CPU reference kernels with seeded inputs and their outputs must agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "ir/rewrite.h"
#include "ir/text.h"
#include "model_util.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

using GraphPass = Status (*)(ir::Graph*, const builder::SupportsFn&);

const std::map<std::string, GraphPass>& passes() {
  static const std::map<std::string, GraphPass> kPasses = {
      {"canonicalize", builder::canonicalize},
      {"fold_batch_norm", builder::fold_batch_norm},
      {"fuse_attention", builder::fuse_attention},
      {"fuse_bias_softmax", builder::fuse_bias_softmax},
      {"fuse_relayout", builder::fuse_relayout},
      {"pack_attention", builder::pack_attention},
      {"fuse_matmul_bias", builder::fuse_matmul_bias},
      {"fuse_norm", builder::fuse_norm},
      {"fuse_rotary", builder::fuse_rotary},
      {"fuse_elementwise", builder::fuse_elementwise},
      {"fuse_conv_activation", builder::fuse_conv_activation},
      {"fuse_squeeze_excite", builder::fuse_squeeze_excite},
      {"sink_conv_activation", builder::sink_conv_activation},
      {"unflatten_gemm", builder::unflatten_gemm},
      {"patchify_conv", builder::patchify_conv},
      {"gather_views", builder::gather_views},
  };
  return kPasses;
}

struct PassFile {
  std::vector<std::string> run;
  bool unsupported = false;
  std::vector<std::string> checks, check_nots;
  std::string graph;
};

PassFile read_pass_file(const fs::path& path) {
  std::ifstream in(path);
  PassFile f;
  std::string line;
  bool in_graph = false;
  while (std::getline(in, line)) {
    if (in_graph || line.rfind("graph ", 0) == 0) {
      in_graph = true;
      f.graph += line + "\n";
      continue;
    }
    auto after = [&](const char* prefix) -> std::optional<std::string> {
      if (line.rfind(prefix, 0) != 0) return std::nullopt;
      std::string rest = line.substr(std::strlen(prefix));
      rest.erase(0, rest.find_first_not_of(' '));
      return rest;
    };
    if (auto r = after("RUN:")) {
      std::istringstream words(*r);
      std::string list, flag;
      words >> list;
      while (words >> flag) f.unsupported = f.unsupported || flag == "unsupported";
      std::istringstream names(list);
      for (std::string name; std::getline(names, name, ',');) f.run.push_back(name);
    } else if (auto c = after("CHECK-NOT:")) {
      f.check_nots.push_back(*c);
    } else if (auto c2 = after("CHECK:")) {
      f.checks.push_back(*c2);
    }
  }
  return f;
}

std::optional<Shape> static_shape(const ir::Value& v) {
  if (!v.shape) return std::nullopt;
  Shape s;
  for (const ir::Dim& d : *v.shape) {
    if (!d.is_const()) return std::nullopt;
    s.push_back(d.value());
  }
  return s;
}

// Seeded inputs: floats uniform, integers small, bools mostly true (every row keeps an element).
std::optional<std::map<std::string, Tensor>> make_inputs(const ir::Graph& g) {
  std::map<std::string, Tensor> in;
  uint64_t seed = 11;
  for (int i : g.inputs) {
    const ir::Value& v = g.values[size_t(i)];
    auto shape = static_shape(v);
    if (!shape) return std::nullopt;
    if (v.dtype == DType::kFloat32) {
      in[v.name] = random_f32(*shape, seed++);
    } else if (v.dtype == DType::kBool || is_integer(v.dtype)) {
      auto t = Tensor::zeros(v.dtype, *shape);
      if (!t.ok()) return std::nullopt;
      for (int64_t k = 0; k < t->numel(); ++k)
        t->set_int_at(k, v.dtype == DType::kBool ? k % 4 != 3 : k % 5);
      in[v.name] = std::move(*t);
    } else {
      return std::nullopt;
    }
  }
  return in;
}

// Every node of `g` on the reference kernels; the graph outputs by name.
StatusOr<std::map<std::string, Tensor>> evaluate(const ir::Graph& g,
                                                 const std::map<std::string, Tensor>& inputs) {
  std::map<int, Tensor> v;
  for (const auto& [name, t] : inputs) v[g.find_value(name)] = t;
  for (size_t k = 0; k < g.values.size(); ++k) {
    if (g.values[k].constant) v[int(k)] = *g.values[k].constant;
  }
  for (const ir::Node& n : g.nodes) {
    std::vector<Tensor> in;
    for (int i : n.inputs) in.push_back(i >= 0 ? v.at(i) : Tensor());
    std::vector<std::pair<DType, Shape>> types;
    for (int o : n.outputs) {
      auto s = static_shape(g.values[size_t(o)]);
      if (!s) return invalid_argument(n.describe() + ": output shape not static");
      types.emplace_back(g.values[size_t(o)].dtype, *s);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> r, run_cpu_kernel(n, in, types));
    for (size_t i = 0; i < n.outputs.size(); ++i) v[n.outputs[i]] = r[i];
  }
  std::map<std::string, Tensor> out;
  for (int o : g.outputs) out[g.values[size_t(o)].name] = v.at(o);
  return out;
}

class PassFiles : public ::testing::TestWithParam<std::string> {};

TEST_P(PassFiles, OutputHasWhatTheFileChecks) {
  const fs::path path = fs::path(KILN_SOURCE_DIR) / "tests" / "passes" / GetParam();
  const PassFile f = read_pass_file(path);
  ASSERT_FALSE(f.run.empty()) << path << ": no RUN line";
  ASSERT_FALSE(f.checks.empty() && f.check_nots.empty()) << path << ": nothing checked";
  auto parsed = ir::parse_text(f.graph, {});
  ASSERT_TRUE(parsed.ok()) << path << ": " << parsed.status().to_string();
  ir::Graph g = *parsed;
  const bool answer = !f.unsupported;
  builder::SupportsFn supports = [answer](const ir::Node& n, const std::vector<const ir::Value*>&,
                                          const std::vector<const ir::Value*>&) {
    // "unsupported" refuses what fusions make (kiln's ops, Attention) but keeps the ONNX ops the
    // canonical forms use.
    return answer || (n.domain.empty() && n.op_type != "Attention");
  };
  for (const std::string& name : f.run) {
    auto it = passes().find(name);
    ASSERT_NE(it, passes().end()) << path << ": unknown pass " << name;
    Status st = it->second(&g, supports);
    ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
    Status v = ir::verify(g);
    ASSERT_TRUE(v.ok()) << "after " << name << ": " << v.to_string();
  }
  ir::compact(&g);
  const std::string text = ir::to_text(g);
  size_t at = 0;
  for (const std::string& c : f.checks) {
    const size_t found = text.find(c, at);
    ASSERT_NE(found, std::string::npos) << "CHECK: " << c << "\nnot found (in order) in:\n" << text;
    at = found + c.size();
  }
  for (const std::string& c : f.check_nots) {
    EXPECT_EQ(text.find(c), std::string::npos) << "CHECK-NOT: " << c << "\nfound in:\n" << text;
  }
  // The same values, where the graph can run on the reference kernels.
  auto inputs = make_inputs(*parsed);
  if (!inputs) return;
  auto want = evaluate(*parsed, *inputs);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  auto got = evaluate(g, *inputs);
  ASSERT_TRUE(got.ok()) << got.status().to_string() << "\n" << text;
  for (const auto& [name, w] : *want) {
    ASSERT_TRUE(got->count(name)) << name;
    ErrorStats e = error_stats(got->at(name), w);
    EXPECT_LE(e.max_abs, 1e-5 * std::max(1.0, e.ref_max_abs)) << GetParam() << ": output " << name;
  }
}

std::vector<std::string> pass_files() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(KILN_SOURCE_DIR) / "tests" / "passes")) {
    if (e.path().extension() == ".ir") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(All, PassFiles, ::testing::ValuesIn(pass_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param.substr(0, info.param.size() - 3);
                           for (char& c : n)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

}  // namespace
}  // namespace kiln::testing

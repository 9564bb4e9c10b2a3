// The op-test harness: shape inference of one node, kernel cases run on the CPU reference and on a
// one-node engine per device present, and the per-device record of which ops ran a case.
#include "op_harness.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "backends/kernel_registry.h"
#include "kiln.h"
#include "model_util.h"
#include "plan/plan.h"
#include "typed_values.h"

namespace kiln::testing {
namespace {

ir::Attribute make_attr(ir::AttrType type) {
  ir::Attribute a;
  a.type = type;
  return a;
}

CoverageMap& mutable_coverage() {
  static CoverageMap* m = new CoverageMap;  // leaked: read by an environment's TearDown
  return *m;
}

// One line, for messages and the coverage file.
std::string one_line(std::string s) {
  std::string out;
  bool space = false;
  for (char ch : s) {
    if (ch == '\n' || ch == '\t' || ch == ' ') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += ch;
  }
  return out;
}

std::vector<ir::Dim> dims_of(const Shape& s) { return std::vector<ir::Dim>(s.begin(), s.end()); }

// A graph holding just the node over the given inputs, inferred; inputs[i] == nullopt is omitted.
struct OneNode {
  ir::Graph g;
  Inferred inferred;
};
std::unique_ptr<OneNode> infer_one(const OpNode& op, const std::vector<NodeInput>& inputs,
                                   int num_outputs) {
  auto one = std::make_unique<OneNode>();
  ir::Graph& g = one->g;
  ir::Node node = op.node;
  node.inputs.clear();
  node.outputs.clear();
  for (const NodeInput& in : inputs) {
    if (in.dtype == DType::kUndefined && !in.constant) {
      node.inputs.push_back(-1);
      continue;
    }
    int v = g.add_value("in" + std::to_string(g.values.size()));
    g.values[v].dtype = in.dtype;
    g.values[v].shape = in.shape;
    g.values[v].constant = in.constant;
    g.values[v].sym_value = in.value;
    node.inputs.push_back(v);
  }
  for (int i = 0; i < num_outputs; ++i)
    node.outputs.push_back(g.add_value("out" + std::to_string(i)));
  g.nodes.push_back(std::move(node));
  const ops::OpSchema* schema = ops::find_schema(g.nodes[0]);
  if (!schema) {
    one->inferred.status =
        not_found(g.nodes[0].describe() + ": kiln has no schema for " + op.node.op_type);
    return one;
  }
  ops::InferContext ctx(g, g.nodes[0], 0, &one->inferred.constraints);
  ctx.set_data_dependent(&one->inferred.data_dependent, true);
  one->inferred.status = schema->infer(ctx);
  one->inferred.outputs = ctx.outputs();
  return one;
}

BuilderConfig config_for(BuildPrecision p) {
  BuilderConfig c;  // TF32 on by default, as in TensorRT
  if (p != BuildPrecision::kTf32) c.clear_flag(BuilderFlag::kTF32);
  if (p == BuildPrecision::kFp16) c.set_flag(BuilderFlag::kFP16);
  if (p == BuildPrecision::kBf16) c.set_flag(BuilderFlag::kBF16);
  return c;
}

// Whether tests can run on `device`, said once per process when they cannot.
bool device_present(Device device) {
  static std::map<Device, bool> known;
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  Status why = device_available(device);
  if (!why.ok()) {
    std::printf("[ skipped ] %s: every kernel case: %s\n", std::string(device_name(device)).c_str(),
                one_line(why.message()).c_str());
    std::fflush(stdout);
  }
  return known[device] = why.ok();
}

// Builds the one-node engine for `c` on `device`, runs it and compares its outputs with the
// reference. A build the device refuses (kUnsupported) is a skip; anything else that goes wrong
// is a gtest failure. Either way `cov` records it.
void run_on_device(const KernelCase& c, const std::string& label, Device device,
                   const std::vector<Tensor>& reference, DeviceCoverage& cov) {
  const std::string dev(device_name(device));
  auto fail = [&](const std::string& why) {
    ++cov.failed;
    if (cov.why_not.empty()) cov.why_not = one_line(why);
    ADD_FAILURE() << dev << ": " << label << ": " << why;
  };
  Network net;
  ir::Graph& g = net.graph;
  ir::Node n = c.node.node;
  g.opsets[n.domain] = n.opset;
  n.inputs.clear();
  n.outputs.clear();
  BuilderConfig config = config_for(c.precision);
  OptimizationProfile profile;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const CaseInput& in = c.inputs[i];
    if (in.kind == CaseInput::Kind::kOmitted) {
      n.inputs.push_back(-1);
      continue;
    }
    const Tensor& t = in.tensor;
    if (in.kind == CaseInput::Kind::kShapeOf) {
      // src: float32 [s<i>_d0, ...] with each dim ranging around its value, so nothing folds.
      std::string src_name = "s" + std::to_string(i);
      int src = g.add_value(src_name);
      std::vector<ir::Dim> dims;
      Shape value, lo, hi;
      for (int64_t k = 0; k < t.numel(); ++k) {
        dims.push_back(ir::Dim::symbol(src_name + "_d" + std::to_string(k)));
        value.push_back(t.int_at(k));
        lo.push_back(std::min<int64_t>(t.int_at(k), 1));
        hi.push_back(t.int_at(k) + 3);
      }
      g.values[src].dtype = DType::kFloat32;
      g.values[src].shape = dims;
      g.inputs.push_back(src);
      Status st = profile.set_dimensions(src_name, lo, value, hi);
      if (!st.ok()) return fail("profile for " + src_name + ": " + st.to_string());
      feeds[src_name] = Tensor::zeros(DType::kFloat32, value).value();
      int v = g.add_value("shape" + std::to_string(i));
      ir::Node shape;
      shape.name = "shape_of_" + std::to_string(i);
      shape.op_type = "Shape";
      shape.opset = 15;
      shape.inputs = {src};
      shape.outputs = {v};
      g.opsets.emplace("", 15);
      g.nodes.push_back(std::move(shape));
      n.inputs.push_back(v);
      continue;
    }
    std::string name = (in.kind == CaseInput::Kind::kInitializer ? "c" : "x") + std::to_string(i);
    int v = g.add_value(name);
    g.values[v].dtype = t.dtype();
    g.values[v].shape = dims_of(t.shape());
    if (in.kind == CaseInput::Kind::kInitializer) {
      g.values[v].constant = t;
    } else {
      g.inputs.push_back(v);
      Status st = profile.set_dimensions(name, t.shape(), t.shape(), t.shape());
      if (!st.ok()) return fail("profile for " + name + ": " + st.to_string());
      feeds[name] = t;
    }
    n.inputs.push_back(v);
  }
  for (int o = 0; o < c.num_outputs; ++o) {
    int v = g.add_value("y" + std::to_string(o));
    n.outputs.push_back(v);
    g.outputs.push_back(v);
  }
  g.nodes.push_back(n);
  config.add_profile(profile);

  auto engine = Builder(device).build(net, config);
  if (!engine.ok()) {
    if (engine.status().code() == StatusCode::kUnsupported && !c.expect_support) {
      ++cov.skipped;
      std::string why = one_line(engine.status().message());
      // The build names the node; so does the label.
      for (const std::string& prefix :
           {std::string("1 node(s) have no kernel on the ") + dev + " backend: ",
            n.describe() + ": "}) {
        if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
      }
      if (cov.why_not.empty()) cov.why_not = why;
      std::printf("[ skipped ] %s: %s: %s\n", dev.c_str(), label.c_str(), why.c_str());
      std::fflush(stdout);
      return;
    }
    return fail("build: " + engine.status().to_string());
  }
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return fail("execution context: " + ctx.status().to_string());
  auto out = (*ctx)->run(feeds);
  if (!out.ok()) return fail("run: " + out.status().to_string());

  // What ran the node, and what it computed in.
  const plan::Plan& plan = engine->plan();
  std::string impl;
  NodePrecision precision;
  for (size_t k = 0; k < plan.graph.nodes.size(); ++k) {
    if (plan.graph.nodes[k].name == n.name && k < plan.nodes.size()) {
      impl = plan.nodes[k].impl;
      precision = plan.nodes[k].precision;
      // A node on float16/bfloat16 tensors (the precision pass retyped it) computes in their type.
      const auto& outs = plan.graph.nodes[k].outputs;
      if (precision.compute == DType::kUndefined && !outs.empty() && outs[0] >= 0) {
        DType t = plan.graph.values[size_t(outs[0])].dtype;
        if (t == DType::kFloat16 || t == DType::kBFloat16) precision.compute = t;
      }
    }
  }
  bool ok = true;
  for (int o = 0; o < c.num_outputs; ++o) {
    const std::string name = "y" + std::to_string(o);
    auto it = out->find(name);
    if (it == out->end()) return fail("the engine has no output " + name);
    Tolerance tol = op_tolerance(reference[o].dtype(), precision);
    auto close = all_close(it->second, reference[o], tol.atol, tol.rtol);
    if (!close) {
      ok = false;
      fail("output " + std::to_string(o) + " against the CPU reference (" +
           (impl.empty() ? "no kernel" : impl) + ", " + tol.name +
           " tolerance): " + close.message());
    }
  }
  if (!ok) return;
  // Each tactic of c.tactics_of forced in turn, on that implementation also where the builder
  // weighed one of c.tactics_over faster (select_kernels).
  const bool forcible = !impl.empty() && (impl == c.tactics_of ||
                                          std::find(c.tactics_over.begin(), c.tactics_over.end(),
                                                    impl) != c.tactics_over.end());
  bool forced_ran = false;
  for (const std::string& tactic : c.tactics) {
    if (!forcible) break;
    plan::Plan forced = plan;
    for (size_t k = 0; k < forced.graph.nodes.size() && k < forced.nodes.size(); ++k) {
      if (forced.graph.nodes[k].name == n.name) {
        forced.nodes[k].impl = c.tactics_of;
        forced.nodes[k].tactic = tactic;
      }
    }
    auto fe = Engine::from_plan(std::move(forced));
    auto fctx = fe.ok() ? fe->create_execution_context()
                        : StatusOr<std::unique_ptr<ExecutionContext>>(fe.status());
    if (!fctx.ok()) return fail("tactic '" + tactic + "': " + fctx.status().to_string());
    auto fout = (*fctx)->run(feeds);
    if (!fout.ok()) return fail("tactic '" + tactic + "': run: " + fout.status().to_string());
    for (int o = 0; o < c.num_outputs; ++o) {
      auto it = fout->find("y" + std::to_string(o));
      if (it == fout->end()) return fail("tactic '" + tactic + "': no output");
      Tolerance tol = op_tolerance(reference[o].dtype(), precision);
      auto close = all_close(it->second, reference[o], tol.atol, tol.rtol);
      if (!close)
        fail("tactic '" + tactic + "': output " + std::to_string(o) + ": " + close.message());
    }
    forced_ran = true;
  }
  if (impl.empty() || impl == plan::kAliasImpl) {
    ++cov.without_kernel;
  } else {
    ++cov.with_kernel;
    cov.impls.insert(impl);
    if (forced_ran) cov.impls.insert(c.tactics_of);
  }
}

}  // namespace

// ---- nodes ----

OpNode op(std::string op_type, int opset, std::string domain) {
  OpNode n;
  n.node.name = "n0";
  n.node.op_type = std::move(op_type);
  n.node.opset = opset;
  n.node.domain = std::move(domain);
  return n;
}
OpNode& OpNode::i(const std::string& name, int64_t v) {
  ir::Attribute a = make_attr(ir::AttrType::kInt);
  a.i = v;
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::f(const std::string& name, float v) {
  ir::Attribute a = make_attr(ir::AttrType::kFloat);
  a.f = v;
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::s(const std::string& name, std::string v) {
  ir::Attribute a = make_attr(ir::AttrType::kString);
  a.s = std::move(v);
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::ints(const std::string& name, std::vector<int64_t> v) {
  ir::Attribute a = make_attr(ir::AttrType::kInts);
  a.ints = std::move(v);
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::floats(const std::string& name, std::vector<float> v) {
  ir::Attribute a = make_attr(ir::AttrType::kFloats);
  a.floats = std::move(v);
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::tensor(const std::string& name, Tensor v) {
  ir::Attribute a = make_attr(ir::AttrType::kTensor);
  a.t = std::move(v);
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::graph(const std::string& name, std::shared_ptr<ir::Graph> g) {
  ir::Attribute a = make_attr(ir::AttrType::kGraph);
  a.g = std::move(g);
  node.attrs.set(name, std::move(a));
  return *this;
}
OpNode& OpNode::named(std::string name) {
  node.name = std::move(name);
  return *this;
}

// ---- shape inference ----

NodeInput typed(DType dtype, std::vector<ir::Dim> shape) {
  return {dtype, std::move(shape), {}, {}};
}
NodeInput with_value(DType dtype, std::vector<ir::Dim> shape, std::vector<ir::Dim> value) {
  return {dtype, std::move(shape), {}, std::move(value)};
}
NodeInput constant(Tensor t) {
  NodeInput in{t.dtype(), dims_of(t.shape()), {}, {}};
  in.constant = std::move(t);
  return in;
}
NodeInput const_ints(std::vector<int64_t> v) { return constant(make_i64({int64_t(v.size())}, v)); }
NodeInput const_scalar(int64_t v) { return constant(make_i64({}, {v})); }

std::string Inferred::value(size_t i) const {
  const auto& v = outputs.at(i).value;
  return v ? ir::dims_to_string(*v) : "unknown";
}

Inferred infer_node(const OpNode& node, const std::vector<NodeInput>& inputs, int num_outputs) {
  return std::move(infer_one(node, inputs, num_outputs)->inferred);
}

// ---- kernel cases ----

CaseInput initializer(Tensor t) {
  CaseInput in(std::move(t));
  if (in.kind == CaseInput::Kind::kRuntime) in.kind = CaseInput::Kind::kInitializer;
  return in;
}
CaseInput shape_of(Shape dims) {
  CaseInput in(make_i64({int64_t(dims.size())}, dims));
  in.kind = CaseInput::Kind::kShapeOf;
  return in;
}

const char* build_precision_name(BuildPrecision p) {
  switch (p) {
    case BuildPrecision::kFp32:
      return "strict fp32";
    case BuildPrecision::kTf32:
      return "tf32";
    case BuildPrecision::kFp16:
      return "fp16";
    case BuildPrecision::kBf16:
      return "bf16";
  }
  return "";
}

StatusOr<std::vector<Tensor>> run_case(const KernelCase& c) {
  std::string label = c.node.node.describe();
  if (!c.label.empty()) label += " [" + c.label + "]";
  if (c.precision != BuildPrecision::kFp32)
    label += std::string(" at ") + build_precision_name(c.precision);

  // Output types and shapes: inferred as the engine sees the inputs (run-time data unknown); when
  // that needs the data (a data-dependent shape), inferred again with every input's data known.
  auto infer_as = [&](bool all_known) {
    std::vector<NodeInput> ins;
    for (const CaseInput& in : c.inputs) {
      if (in.kind == CaseInput::Kind::kOmitted) {
        ins.push_back(kOmitted);
      } else if (in.kind == CaseInput::Kind::kRuntime && !all_known) {
        ins.push_back(typed(in.tensor.dtype(), dims_of(in.tensor.shape())));
      } else {
        ins.push_back(constant(in.tensor));
      }
    }
    return infer_one(c.node, ins, c.num_outputs);
  };
  auto one = infer_as(false);
  if (!one->inferred.ok()) {
    auto known = infer_as(true);
    if (known->inferred.ok()) one = std::move(known);
  }
  if (!one->inferred.ok()) return one->inferred.status;
  ir::Graph& g = one->g;
  const ir::Node& node = g.nodes[0];
  std::vector<Tensor> outputs;
  // A data-dependent dim is allocated at its bound (the inputs' shapes are known here, so it is a
  // number); the kernel reports the exact size below.
  ir::SymbolValues bounds;
  for (const ir::DataDependentDim& d : one->inferred.data_dependent) {
    if (auto b = d.bound.eval(bounds)) bounds[d.symbol] = *b;
  }
  std::vector<char> sized_by_data;
  for (int o = 0; o < c.num_outputs; ++o) {
    const auto& inferred = one->inferred.outputs.at(size_t(o));
    Shape shape;
    bool by_data = false;
    for (const ir::Dim& d : inferred.shape) {
      if (!d.is_const() && d.eval(bounds)) {
        by_data = true;
        shape.push_back(*d.eval(bounds));
        continue;
      }
      if (!d.is_const()) {
        return internal_error(label + ": output " + std::to_string(o) + " has the symbolic shape " +
                              ir::dims_to_string(inferred.shape));
      }
      shape.push_back(d.value());
    }
    ir::Value& v = g.values[node.outputs[o]];
    v.dtype = inferred.dtype;
    v.shape = inferred.shape;
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(inferred.dtype, shape));
    outputs.push_back(std::move(t));
    sized_by_data.push_back(by_data);
  }

  // The CPU reference.
  backends::KernelQuery q{node, {}, {}};
  std::vector<TensorView> in_views, out_views;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    int v = node.inputs[i];
    q.inputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    in_views.push_back(v >= 0 ? c.inputs[i].tensor.view() : TensorView{});
  }
  for (int v : node.outputs) q.outputs.push_back(&g.values[v]);
  for (const Tensor& t : outputs) out_views.push_back(t.view());
  auto kernel = backends::create_reference_kernel(q);
  if (!kernel.ok()) return kernel.status();
  KILN_RETURN_IF_ERROR((*kernel)->execute(in_views, out_views));
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!sized_by_data[o]) continue;
    KILN_ASSIGN_OR_RETURN(Shape exact, (*kernel)->data_dependent_shape(o));
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(outputs[o].dtype(), exact));
    if (t.nbytes() > outputs[o].nbytes())
      return internal_error(label + ": output " + std::to_string(o) + " exceeds its bound");
    if (t.nbytes()) std::memcpy(t.data(), outputs[o].data(), t.nbytes());
    outputs[o] = std::move(t);
  }

  ops::OpKind kind = ops::find_op(node.domain, node.op_type);
  OpCoverage& cov = mutable_coverage()[kind];
  ++cov.cases;
  for (size_t o = 0; o < c.expected.size() && o < outputs.size(); ++o) {
    Tolerance tol = op_tolerance(c.expected[o].dtype());
    EXPECT_TRUE(all_close(outputs[o], c.expected[o], tol.atol, tol.rtol))
        << "reference: " << label << ": output " << o << " against the expected values";
  }
  EXPECT_LE(c.expected.size(), outputs.size()) << label << ": more expected outputs than outputs";

  for (Device device : {Device::kCPU, Device::kCUDA}) {
    if (!device_present(device)) continue;
    run_on_device(c, label, device, outputs, cov.devices[device]);
  }
  return outputs;
}

StatusOr<std::vector<Tensor>> run_case(const OpNode& node, std::vector<CaseInput> inputs,
                                       int num_outputs) {
  KernelCase c;
  c.node = node;
  c.inputs = std::move(inputs);
  c.num_outputs = num_outputs;
  return run_case(c);
}

StatusOr<std::vector<Tensor>> run_reduced_case(const KernelCase& c, DType dt,
                                               std::set<size_t> keep_float32) {
  KernelCase half = c, wide = c;
  const std::string label =
      (c.label.empty() ? c.node.node.op_type : c.label) + " in " + std::string(dtype_name(dt));
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const CaseInput& in = c.inputs[i];
    if (keep_float32.count(i) || in.kind == CaseInput::Kind::kOmitted ||
        in.kind == CaseInput::Kind::kShapeOf || in.tensor.dtype() != DType::kFloat32) {
      continue;
    }
    half.inputs[i].tensor = as_dtype(in.tensor, dt);
    wide.inputs[i].tensor = as_dtype(half.inputs[i].tensor, DType::kFloat32);
  }
  wide.label = label + ", the float32 node";
  wide.expect_support = false;
  wide.expected.clear();
  half.label = label;
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> want, run_case(wide));
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> got, run_case(half));
  for (size_t o = 0; o < got.size() && o < want.size(); ++o) {
    bool rounded = want[o].dtype() == DType::kFloat32 && got[o].dtype() == dt;
    Tensor e = rounded ? as_dtype(want[o], dt) : want[o];
    Tolerance tol = op_tolerance(e.dtype());
    EXPECT_TRUE(all_close(got[o], e, tol.atol, tol.rtol))
        << "reference: " << c.node.node.describe() << " [" << label << "]: output " << o
        << " against the float32 node's" << (rounded ? ", rounded" : "");
  }
  return got;
}

// ---- coverage ----

const CoverageMap& recorded_coverage() { return mutable_coverage(); }

// Lines of tab-separated fields:
//   op <domain or .> <name> <cases>
//   device <domain or .> <name> <device> <with> <without> <skipped> <failed> <impls,...|->
//   <why_not>
std::string coverage_to_text(const CoverageMap& m) {
  std::ostringstream out;
  for (const auto& [kind, cov] : m) {
    std::string domain(ops::op_domain(kind));
    std::string key = (domain.empty() ? "." : domain) + "\t" + std::string(ops::op_name(kind));
    out << "op\t" << key << "\t" << cov.cases << "\n";
    for (const auto& [device, d] : cov.devices) {
      std::string impls;
      for (const auto& id : d.impls) impls += (impls.empty() ? "" : ",") + id;
      out << "device\t" << key << "\t" << int(device) << "\t" << d.with_kernel << "\t"
          << d.without_kernel << "\t" << d.skipped << "\t" << d.failed << "\t"
          << (impls.empty() ? "-" : impls) << "\t" << one_line(d.why_not) << "\n";
    }
  }
  return out.str();
}

StatusOr<CoverageMap> coverage_from_text(const std::string& text) {
  CoverageMap m;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::vector<std::string> f;
    size_t start = 0;
    for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1) {
      f.push_back(line.substr(start, tab - start));
    }
    f.push_back(line.substr(start));
    auto bad = [&] {
      return invalid_argument("coverage line " + std::to_string(line_no) + ": " + line);
    };
    if (f.size() < 4) return bad();
    ops::OpKind kind = ops::find_op(f[1] == "." ? "" : f[1], f[2]);
    if (kind == ops::OpKind::kUnknown) return bad();
    auto num = [](const std::string& s, int* v) {
      auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
      return r.ec == std::errc() && r.ptr == s.data() + s.size();
    };
    if (f[0] == "op") {
      int cases = 0;
      if (!num(f[3], &cases)) return bad();
      m[kind].cases += cases;
    } else if (f[0] == "device" && f.size() >= 10) {
      int device = 0, counts[4];
      if (!num(f[3], &device) || device < 0 || device > int(Device::kCUDA)) return bad();
      for (int k = 0; k < 4; ++k) {
        if (!num(f[4 + k], &counts[k])) return bad();
      }
      DeviceCoverage& d = m[kind].devices[Device(device)];
      d.with_kernel += counts[0];
      d.without_kernel += counts[1];
      d.skipped += counts[2];
      d.failed += counts[3];
      std::istringstream ids(f[8]);
      for (std::string id; std::getline(ids, id, ',');) {
        if (id != "-") d.impls.insert(id);
      }
      if (d.why_not.empty()) d.why_not = f[9];
    } else {
      return bad();
    }
  }
  return m;
}

}  // namespace kiln::testing

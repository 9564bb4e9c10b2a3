// Internal to the builder: what the build-time expansions share (control_flow.cc unrolls Loop and
// Scan and inlines If; sequences.cc lays out sequences and optionals). Each replaces node n of a
// graph that infer_shapes is walking with nodes it then infers in turn.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/rewrite.h"

namespace kiln::builder {

struct BodyCopy {
  std::vector<ir::Node> nodes;
  std::vector<int> outputs;  // the value of each body output
};

// The nodes of body `b`, renamed apart under `prefix`, for insertion at position n of g: body
// input i reads `bound[i]`; body output k is written to `targets[k]` (through an Identity where
// the body passes a value through), or stays where the body computes it for -1. Values the body
// reads from enclosing graphs by name resolve in g (a shape-value input through its carrier) and
// must be computed before position n. `what` names the body in errors ("body", "then_branch").
StatusOr<BodyCopy> copy_body(ir::Graph& g, size_t n, const ir::Graph& b,
                             const std::vector<int>& bound, const std::vector<int>& targets,
                             const std::string& prefix, const std::map<std::string, int>& carriers,
                             const std::string& what);

// Node n replaced by `nodes`, which run under n's conditions (an expansion inside an If's branch)
// before their own; producer fields refreshed from n on.
void splice(ir::Graph& g, size_t n, std::vector<ir::Node> nodes);

// An integer scalar the build knows: a constant, or a symbolic value that is a number.
std::optional<int64_t> known_scalar(const ir::Value& v);

// Node `node`'s graph attribute `name`, or nullptr.
const ir::Graph* graph_attr(const ir::Node& node, const char* name);

// Builds the small nodes an expansion needs, numbered under one prefix.
class Emitter {
 public:
  Emitter(ir::Graph& g, std::string prefix, std::vector<ir::Node>* nodes)
      : g_(g), prefix_(std::move(prefix)), nodes_(nodes) {}

  int constant_i64(const std::vector<int64_t>& values, bool scalar) {
    const int v = ir::add_unique_value(
        &g_, prefix_ + "/c", DType::kInt64,
        scalar ? std::vector<ir::Dim>{} : std::vector<ir::Dim>{int64_t(values.size())});
    g_.values[size_t(v)].constant = Tensor::from_vector(
        DType::kInt64, scalar ? Shape{} : Shape{int64_t(values.size())}, values);
    return v;
  }
  int constant_true() {
    const int v =
        ir::add_unique_value(&g_, prefix_ + "/true", DType::kBool, std::vector<ir::Dim>{});
    g_.values[size_t(v)].constant =
        Tensor::from_vector(DType::kBool, Shape{}, std::vector<uint8_t>{1});
    return v;
  }
  // One node; out < 0 makes a fresh output value. Returns the output.
  int node(const std::string& op, std::vector<int> inputs, int out, ir::Attributes attrs = {}) {
    if (out < 0) out = fresh(op);
    nodes(op, std::move(inputs), {out}, std::move(attrs));
    return out;
  }
  // One node of several outputs (ai.onnx opset 13, as every node here).
  void nodes(const std::string& op, std::vector<int> inputs, std::vector<int> outputs,
             ir::Attributes attrs = {}) {
    ir::Node nd;
    nd.name = ir::unique_node_name(g_, prefix_ + "/" + op);
    nd.op_type = op;
    nd.opset = 13;
    nd.inputs = std::move(inputs);
    nd.outputs = std::move(outputs);
    nd.attrs = std::move(attrs);
    nodes_->push_back(std::move(nd));
  }
  // A new value of no type yet, named under the prefix.
  int fresh(const std::string& what) {
    return ir::add_unique_value(&g_, prefix_ + "/" + what, DType::kUndefined, std::nullopt);
  }
  static ir::Attributes int_attr(const char* name, int64_t v) {
    ir::Attributes a;
    ir::Attribute at;
    at.type = ir::AttrType::kInt;
    at.i = v;
    a.set(name, at);
    return a;
  }
  // Element `index` of x along `axis`, the axis removed.
  int slice(int x, int64_t index, int64_t axis) {
    return node("Gather", {x, constant_i64({index}, true)}, -1, int_attr("axis", axis));
  }
  // The values stacked along a new axis `axis` (of the result's rank), into `out` (or fresh).
  int stack(const std::vector<int>& parts, int64_t axis, int out) {
    const int axes = constant_i64({axis}, false);
    if (parts.size() == 1) return node("Unsqueeze", {parts[0], axes}, out);
    std::vector<int> expanded;
    for (int p : parts) expanded.push_back(node("Unsqueeze", {p, axes}, -1));
    return node("Concat", expanded, out, int_attr("axis", axis));
  }

 private:
  ir::Graph& g_;
  std::string prefix_;
  std::vector<ir::Node>* nodes_;
};

}  // namespace kiln::builder

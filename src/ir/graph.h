// The IR: Graph, Node, Value, attributes. A value carries its dtype, symbolic shape, and optionally
// constant data or a symbolic value (the folded content of a small integer shape tensor).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/dim.h"

namespace kiln::ir {

struct Graph;

enum class AttrType {
  kFloat,
  kInt,
  kString,
  kTensor,
  kGraph,
  kFloats,
  kInts,
  kStrings,
  kTensors,
  kGraphs
};

struct Attribute {
  AttrType type = AttrType::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
};

class Attributes {
 public:
  void set(std::string name, Attribute a) { map_[std::move(name)] = std::move(a); }
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  const Attribute* find(const std::string& name) const;
  const std::map<std::string, Attribute>& all() const { return map_; }

  // Typed getters: a present attribute of the wrong type is an error naming it.
  StatusOr<int64_t> get_int(const std::string& name, std::optional<int64_t> fallback) const;
  StatusOr<float> get_float(const std::string& name, std::optional<float> fallback) const;
  StatusOr<std::string> get_string(const std::string& name,
                                   std::optional<std::string> fallback) const;
  StatusOr<std::vector<int64_t>> get_ints(const std::string& name,
                                          std::optional<std::vector<int64_t>> fallback) const;
  StatusOr<std::vector<float>> get_floats(const std::string& name,
                                          std::optional<std::vector<float>> fallback) const;
  StatusOr<Tensor> get_tensor(const std::string& name) const;

 private:
  std::map<std::string, Attribute> map_;
};

// What a value holds, as ONNX's TypeProto says: a tensor, a sequence of tensors, or an optional of
// either. Only the model's graphs carry the other kinds (dtype and shape are then the elements'):
// the build lays sequences and optionals out as tensors (builder/sequences.cc) before anything
// runs, so every value of a plan is a tensor.
enum class ValueKind : uint8_t { kTensor, kSequence, kOptionalTensor, kOptionalSequence };

struct Value {
  std::string name;
  ValueKind kind = ValueKind::kTensor;
  DType dtype = DType::kUndefined;
  std::optional<std::vector<Dim>> shape;      // nullopt: rank not known yet
  std::optional<Tensor> constant;             // initializer or folded constant
  std::optional<std::vector<Dim>> sym_value;  // elements of a small integer tensor, as dims
  int producer = -1;                          // index of the producing node, -1 for none
};

// A condition a node runs under: the run executes the node only when the bool scalar `cond` is
// `when` (a branch of an If whose condition only the run knows; builder/control_flow.cc).
struct Guard {
  int cond = -1;  // value index
  bool when = true;
  friend bool operator==(const Guard& a, const Guard& b) {
    return a.cond == b.cond && a.when == b.when;
  }
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;        // "" for ai.onnx
  int opset = 0;             // opset of `domain` the model imports
  std::vector<int> inputs;   // value indices; -1 marks an omitted optional input
  std::vector<int> outputs;  // value indices; -1 marks an omitted optional output
  Attributes attrs;
  // A node a builder pass made in place of others (ir::replace_nodes): how many nodes of each op
  // type of the model it stands for, counted through earlier fusions ({"MatMul": 2, "Softmax": 1}
  // for an attention). Empty for the model's own nodes and for nodes a pass inserted (a Cast).
  std::map<std::string, int64_t> replaced;
  // Conditions the node runs under, all of them (an If nested in a branch adds its own): empty
  // for a node every run executes. Each cond is defined before the node, as an input is.
  std::vector<Guard> guards;

  // "node 'conv_3' (Conv)", the prefix every error about a node carries.
  std::string describe() const;
};

struct Graph {
  std::string name;
  std::vector<Value> values;
  std::vector<Node> nodes;  // topologically ordered once verified
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::map<std::string, int> opsets;  // domain -> version

  int add_value(std::string name);
  // -1 when absent. Linear in the value count; the builder keeps its own maps where it matters.
  int find_value(const std::string& name) const;
  std::vector<std::vector<int>> consumers() const;  // value index -> consuming node indices
};

// Whether `node` makes one of the data-dependent dims `dd`: an output's shape names it and no
// input's does (its kernel reports that size; the nodes after it read it).
bool makes_data_dependent(const Graph& g, const Node& node,
                          const std::vector<DataDependentDim>& dd);

// Checks the invariants every pass keeps: index ranges, each value defined once (graph input,
// node output, or constant data), inputs defined before use, producer fields that match the nodes,
// and unique names among live values.
Status verify(const Graph& graph);
// Sets every value's producer from the nodes' outputs (-1 where no node writes it).
void set_producers(Graph* graph);
// Reorders nodes topologically; fails on a cycle or on an input no node or graph input defines.
Status sort_topologically(Graph* graph);
// The text form used by tests, bug reports and `kiln inspect`.
std::string to_text(const Graph& graph);
std::string type_to_string(const Value& v);

}  // namespace kiln::ir

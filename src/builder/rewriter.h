// The pattern rewriter the canonicalization and fusion passes are written on: patterns over
// dataflow (ops, commutative operands, alternatives, chains of scalar steps, constraints on
// constants and shapes), matched from a root node up through producers with use lists, and one
// driver that applies a rule set to a fixed point (tinygrad's PatternMatcher, onnxscript's
// rewriter: clean the graph up first, then match what it computes, not the order it was written
// in).
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "builder/build_state.h"
#include "core/status.h"
#include "ir/graph.h"

namespace kiln::builder::rw {

// Use lists of a graph: each value's readers (node indices, each node once, in node order) and
// whether it is a graph output. Built in one pass over the graph; the driver rebuilds it after an
// edit (node indices move when replace_nodes re-sorts).
class Uses {
 public:
  explicit Uses(const ir::Graph& g) { rebuild(g); }
  void rebuild(const ir::Graph& g);
  std::span<const int> readers(int v) const;
  bool is_output(int v) const { return v >= 0 && size_t(v) < output_.size() && output_[size_t(v)]; }
  // The one node reading v when exactly one does and v is no graph output; else -1.
  int sole_reader(int v) const;

 private:
  std::vector<std::vector<int>> readers_;
  std::vector<char> output_;
};

// What a match bound: values and nodes by name, the nodes it consumes (the rewrite replaces them),
// and the product of each chain of scalar steps by the chain's name.
struct Match {
  std::map<std::string, int, std::less<>> values;
  std::map<std::string, int, std::less<>> nodes;
  std::map<std::string, double, std::less<>> factors;
  std::vector<int> matched;  // root first
  std::vector<int> kept;     // matched, read elsewhere too, left in place by the rewrite

  int value(std::string_view name) const;      // -1 when unbound
  int node(std::string_view name) const;       // -1 when unbound
  double factor(std::string_view name) const;  // 1 when the chain had no step
};

// What predicates and rewrites see.
struct Context {
  ir::Graph* graph;
  const Uses* uses;
  const SupportsFn* supports;

  const ir::Value& value(int v) const { return graph->values[size_t(v)]; }
  const ir::Node& node(int n) const { return graph->nodes[size_t(n)]; }
  const std::vector<ir::Dim>* shape(int v) const;
  // The value's element as a double when it is a constant of one element.
  std::optional<double> scalar(int v) const;
};

struct PatNode;
// A pattern: one node of the pattern tree (shared, immutable once the rule set is made).
class Pat {
 public:
  Pat() = default;
  explicit Pat(std::shared_ptr<PatNode> p) : p_(std::move(p)) {}
  const PatNode* get() const { return p_.get(); }

  // Op patterns only:
  Pat as(std::string node_name) const;    // binds the node
  Pat out(std::string value_name) const;  // binds the output value matched
  Pat commutative() const;                // two inputs: either order (as given first)
  Pat keep() const;                       // may be read outside the match: left in place
  // A constraint checked once the inputs matched: the context, the bindings so far, the node.
  Pat when(std::function<bool(const Context&, const Match&, int node)> pred) const;
  // A constraint on the matched value (any pattern kind).
  Pat where(std::function<bool(const Context&, const Match&, int value)> pred) const;

 private:
  std::shared_ptr<PatNode> mutable_copy() const;
  std::shared_ptr<PatNode> p_;
};

// Any value, bound to `name` (when named and already bound: that same value).
Pat any(std::string name = "");
// An optional input: any value (bound to `name`), or the input omitted (bound to nothing).
Pat optional(std::string name = "");
// A constant value (initializer or folded); scalar: of one element.
Pat constant(std::string name = "");
Pat scalar(std::string name = "");
// A scalar constant equal to `v`.
Pat scalar_eq(double v);
// A value produced by an ONNX op `op_type` (domain "kiln::X" for kiln's ops) from these inputs
// (exactly that many; omitted optional inputs count). The op's output 0 unless `output` says.
Pat op(std::string op_type, std::vector<Pat> inputs, int output = 0);
// A node of op `op_type`, whatever its inputs (none of them matched): the root of a rule whose
// rewrite reads the node itself (a dataflow analysis from it, as pack_attention's view tracing).
Pat node_of(std::string op_type);
// The alternatives, tried in order (each candidate of the first before the second's; match_at takes
// the first candidate overall that passes its single-use check).
Pat either(std::vector<Pat> alternatives);
// Zero or more scalar steps above `inner` (Mul by a scalar constant, either order, or Div by one),
// their product recorded as the factor `name`.
Pat scaled(Pat inner, std::string name);

// A rule: a pattern rooted at an op and what to do with a match. The rewrite edits ctx.graph and
// returns whether it did; a rewrite that declines (the backend has no kernel, a shape does not
// fit) leaves the graph as it was and returns false.
struct Rule {
  std::string name;
  Pat pattern;
  std::function<StatusOr<bool>(Context& ctx, const Match& m)> rewrite;
};

// Matches `pattern` (rooted at an op pattern) at node n. The consumed nodes other than the root
// must be read only inside the match (else the match fails), unless marked keep().
std::optional<Match> match_at(const Context& ctx, const Pat& pattern, int n);

// Applies the rules until none applies; returns how many rewrites ran. Rules are tried per node in
// node order, in the order given; after a rewrite the use lists are rebuilt and the walk resumes.
// At the end nodes no one reads are removed.
StatusOr<int> apply(ir::Graph* g, std::span<const Rule> rules, const SupportsFn& supports);

// Replaces the match's consumed nodes (not the kept ones) by `fused` when the backend supports it
// (ir::replace_nodes); false and the graph as it was otherwise.
StatusOr<bool> replace(Context& ctx, const Match& m, ir::Node fused);

// replace() for a fused node that reads new nodes of its own (views, casts, constants' slices):
// `pre` goes in just before the last matched node (every value a pre node reads is defined by
// then: it is an input of the match or new), the matched nodes are replaced by `fused`, and the
// backend must support all of them; false and the graph as it was otherwise.
StatusOr<bool> replace_with(Context& ctx, std::vector<int> matched, std::vector<ir::Node> pre,
                            ir::Node fused);

// A new node of ONNX op `op_type` (domain "" unless given), named after `base` (made unique),
// of the opset the graph imports for its domain.
ir::Node make_node(const ir::Graph& g, std::string op_type, std::string_view base,
                   std::vector<int> inputs, std::vector<int> outputs, std::string domain = "");

}  // namespace kiln::builder::rw

// BuildState: what the passes of the pipeline share while an engine is built.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/kernel_registry.h"
#include "builder/config.h"
#include "ir/graph.h"
#include "ops/schema.h"
#include "plan/plan.h"

namespace kiln::builder {

// A sequence or optional value of the model, as the build lays it out (sequences.cc): the tensor
// values it holds, known at build time.
struct Composite {
  bool sequence = false;      // holds a sequence of tensors (else one tensor)
  bool present = true;        // false: an empty optional
  std::vector<int> elements;  // value indices: the sequence's elements, or the one tensor
};

struct BuildState {
  ir::Graph graph;
  const BuilderConfig& config;
  const backends::Backend& backend;
  std::vector<ops::Constraint> constraints;  // recorded by shape inference, proven per profile
  std::vector<plan::Profile> profiles;       // filled by bind_profiles; infer_shapes adds the
                                             // data-dependent symbols' ranges
  std::vector<ir::DataDependentDim> data_dependent;  // made by infer_shapes, in order
  // Shape-value inputs (bind_profiles): the value the model's nodes read in each one's place, by
  // input name (a branch inlined later reads the enclosing graph's values by name).
  std::map<std::string, int> shape_value_carriers;
  // The sequence and optional values laid out so far, by value index (expand_sequence_inputs and
  // infer_shapes); no node reads or writes them once infer_shapes is done.
  std::map<int, Composite> composites;
  // The Loop node each run-time loop's kiln::LoopBegin stands for, by the LoopBegin's name:
  // regrow_loop lays it out again once its body shows a carried dim that grows.
  std::map<std::string, ir::Node> run_time_loops;
  ir::SymbolValues opt_symbols;    // the first profile's opt point (bind_profiles)
  ir::SymbolValues min_symbols;    // and its min point
  std::vector<int> runtime_nodes;  // filled by eliminate_dead_nodes, in execution order
  std::vector<int> in_place;       // per plan node: KernelImpl::in_place_input (select_kernels)
  plan::Plan plan;                 // filled by the last passes
};

// The passes, in the order pipeline.cc runs them; each lives in the file named after it.
Status check_supported(BuildState& s);
Status expand_sequence_inputs(BuildState& s);
Status bind_profiles(BuildState& s);
Status infer_shapes(BuildState& s);
Status merge_duplicates(BuildState& s);
Status canonicalize(BuildState& s);
Status fold_batch_norm(BuildState& s);
Status patchify_conv(BuildState& s);
Status fuse_conv_activation(BuildState& s);
Status fuse_norm(BuildState& s);
Status fuse_rotary(BuildState& s);
Status fuse_squeeze_excite(BuildState& s);
Status unflatten_gemm(BuildState& s);
Status fuse_matmul_bias(BuildState& s);
Status fuse_attention(BuildState& s);
Status fuse_bias_softmax(BuildState& s);
Status fuse_relayout(BuildState& s);
Status pack_attention(BuildState& s);
Status gather_views(BuildState& s);
Status assign_precision(BuildState& s);
Status assign_layout(BuildState& s);
Status sink_conv_activation(BuildState& s);
Status fuse_elementwise(BuildState& s);
Status settle_guards(BuildState& s);
Status check_loops(BuildState& s);
Status eliminate_dead_nodes(BuildState& s);
Status check_profiles(BuildState& s);
Status select_kernels(BuildState& s);
Status plan_memory(BuildState& s);

// What is wrong with node's arity against its schema, one message each (none: nothing): too few
// or too many inputs or outputs, a required input omitted. check_supported lists them for the
// main graph; the expansions check the subgraph nodes they reach (sequences.cc).
std::vector<std::string> arity_problems(const ir::Node& node, const ops::OpSchema& schema);

// Whether an implementation supports `node` with these input and output values (typed as a pass
// would make them): the rewriting passes ask before they rewrite, so a backend without a fused or
// reduced kernel gets the graph as it was.
using SupportsFn =
    std::function<bool(const ir::Node& node, const std::vector<const ir::Value*>& inputs,
                       const std::vector<const ir::Value*>& outputs)>;
// The answer of the build's backend (any implementation of the node's op on its device).
SupportsFn backend_supports(const BuildState& s);
// The passes' cores, for tests with a given answer.
Status merge_duplicates(ir::Graph* g, const std::vector<ir::DataDependentDim>& data_dependent = {});
Status assign_precision(ir::Graph* g, DType reduced, const SupportsFn& supports);
Status fuse_conv_activation(ir::Graph* g, const SupportsFn& supports);
Status fuse_elementwise(ir::Graph* g, const SupportsFn& supports);
Status fuse_matmul_bias(ir::Graph* g, const SupportsFn& supports);
Status fuse_attention(ir::Graph* g, const SupportsFn& supports);
Status fuse_bias_softmax(ir::Graph* g, const SupportsFn& supports);
Status fuse_relayout(ir::Graph* g, const SupportsFn& supports);
Status canonicalize(ir::Graph* g, const SupportsFn& supports);
Status fold_batch_norm(ir::Graph* g, const SupportsFn& supports);
Status fuse_norm(ir::Graph* g, const SupportsFn& supports);
Status fuse_rotary(ir::Graph* g, const SupportsFn& supports);
Status fuse_squeeze_excite(ir::Graph* g, const SupportsFn& supports);
Status unflatten_gemm(ir::Graph* g, const SupportsFn& supports);
Status gather_views(ir::Graph* g, const SupportsFn& supports);
Status patchify_conv(ir::Graph* g, const SupportsFn& supports);
Status pack_attention(ir::Graph* g, const SupportsFn& supports);
// What assign_layout converts to NHWC: by default the float16/bfloat16 convolutions, whose cuDNN
// kernels are faster channels last; tests take float32 ones too, to check against the CPU
// reference.
// pad_channels: input channels no multiple of 8 are zero-padded up to one (cuDNN's tensor-core
// kernels need it); tests of the transposes' placement turn it off to keep their graphs small.
struct LayoutOptions {
  bool convert_float32 = false;
  bool pad_channels = true;
};
Status assign_layout(ir::Graph* g, const SupportsFn& supports, const LayoutOptions& options);
Status sink_conv_activation(ir::Graph* g, const SupportsFn& supports);

// An attribute as one line of canonical text: exact for numbers and strings, tensors and graphs by
// digest (the timing cache's keys and merge_duplicates compare nodes by it).
std::string attribute_text(const ir::Attribute& a);

// The timing cache's key for the node of `q` run by implementation `impl_id`: the canonical text
// of everything its tactic choice depends on, one "name=value" line each: the implementation, the
// op (domain, opset) and its attributes by name, each input's and output's dtype and shape at the
// opt point (q.opt_symbols) and whether it is constant, the precision (q.precision), the
// optimization level (q.optimization_level), and the device (Backend::device_identity).
std::string timing_cache_key(std::string_view impl_id, const backends::KernelQuery& q,
                             std::string_view device_identity);

// select_kernels' choice between implementations that each support the node of `q` (`rivals`, in
// the registry's order): where the first times its tactics (KernelImpl::timed_tactics), the index
// of the one to run and its fastest tactic. Of those that timed, the winner has the smallest
// opt_ms over the best opt_ms, plus min_ms over the best min_ms where each timed the min shapes
// too; the earlier wins a tie. nullopt where the first times nothing. q.precision is each rival's
// own (KernelImpl::precision) while it times.
std::optional<std::pair<size_t, std::string>> weigh_rivals(
    const std::vector<const backends::KernelImpl*>& rivals, backends::KernelQuery q);

// Control flow laid out at build time (control_flow.cc), for infer_shapes at node n: an If whose
// condition is known becomes its branch, a Loop with a known trip count and a condition its body
// keeps true, and a Scan of known length, are unrolled. true when node n was replaced (the
// expansion's nodes start at n); false when n is no such node, or an If on data (its schema
// refuses it); an error naming the node for a Loop or Scan kiln cannot lay out.
// A Loop the build cannot unroll runs at run time (kiln::LoopBegin .. kiln::LoopEnd); its
// original node is kept in `run_time_loops`.
StatusOr<bool> expand_control_flow(ir::Graph& g, size_t n,
                                   const std::map<std::string, int>& carriers,
                                   std::map<std::string, ir::Node>* run_time_loops);
// For infer_shapes at node n, a kiln::LoopEnd about to be inferred: where its body gives a carried
// value a dim that grows by a constant per iteration (next = v + c, as a list appended to), the
// loop is laid out again from its original Loop node with those dims growing (LoopBegin's `grow`:
// data-dependent dims sized for the longest run). The position of the Loop node to infer from
// again, or nullopt when nothing grows.
StatusOr<std::optional<size_t>> regrow_loop(BuildState& s, size_t n);

// Sequences and optionals laid out at build time (sequences.cc), for infer_shapes at node n: a
// sequence or optional op, or a node that passes such values on (Identity, kiln::SelectBranch),
// becomes the tensor nodes it stands for, its outputs recorded in s.composites. true when node n
// was replaced (the nodes, if any, start at n); false for a node of tensors only; an error naming
// the node for a position or length only the run knows, or a sequence read as a tensor.
StatusOr<bool> expand_sequence_op(BuildState& s, size_t n);
// Once every node is inferred: each graph output that is a sequence or optional becomes the tensor
// outputs of its elements ("y[0]", ...; an empty optional none), through Identity nodes appended
// to the graph. true when it appended nodes (infer_shapes infers them next).
StatusOr<bool> expand_sequence_outputs(BuildState& s);

// Runs the reference kernel of a node whose inputs are all constant, storing constant outputs.
Status fold_node(ir::Graph& graph, int node_index);

}  // namespace kiln::builder

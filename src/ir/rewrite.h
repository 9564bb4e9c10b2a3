// Graph-editing helpers the builder's passes rewrite the IR with.
//
// Index policy: value indices are stable under every helper here. A value that nothing produces
// or reads any more stays in Graph::values as an orphan (producer -1, no uses), is not printed,
// and is dropped by compact(), which renumbers; call it once at the end of a pass. Node indices
// are not stable: a helper that adds or removes nodes returns the index of the node it made. Each
// helper leaves the graph verified (ir::verify): nodes topologically ordered (re-sorted only when
// an edit broke the order), producer fields current; on error the graph is unchanged.
#pragma once

#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"

namespace kiln::ir {

// A new value whose name no value of `g` has: base, base_1, base_2, ...
int add_unique_value(Graph* g, std::string_view base, DType dtype,
                     std::optional<std::vector<Dim>> shape);
// A node name no node of `g` has, in the same way.
std::string unique_node_name(const Graph& g, std::string_view base);
// A symbol `taken` does not hold (base, base_, base__, ...), added to it.
std::string unique_symbol(std::string base, std::set<std::string>* taken);

// Replaces the nodes `matched` (a matched subgraph) by `replacement`. Its inputs must be defined
// outside the matched nodes; its outputs are values the matched nodes produced (so their
// consumers are untouched) or fresh values (add_unique_value), and must include every value the
// matched nodes produce that is read elsewhere (by another node or as a graph output). The other
// values they produced become orphans. An empty name is made unique from the op type; opset 0
// takes the graph's import of the domain. The replacement's `replaced` gains the matched nodes:
// each one's own `replaced` where it has one (a fused node fused again), else its op type once;
// a replacement made as a copy of a matched node clears it first, or that node counts twice.
// Returns the replacement's node index.
StatusOr<int> replace_nodes(Graph* g, std::span<const int> matched, Node replacement);
// What replace_nodes adds to a replacement's `replaced` for one matched node `from`; for a pass
// whose fused node also stands for nodes it leaves unread rather than matches.
void add_replaced(Node* into, const Node& from);

// Puts `node` on the edge from `value` to the nodes `consumers` (every node reading it when
// empty): `node` reads `value` and has one output, a fresh value, which those consumers read
// instead. Graph outputs keep reading `value` (their names are the engine's IO names). Returns
// the new node's index.
StatusOr<int> insert_on_edge(Graph* g, int value, Node node, std::span<const int> consumers = {});
// insert_on_edge with Cast(to): the new value is named "<value>_<dtype>".
StatusOr<int> insert_cast(Graph* g, int value, DType to, std::span<const int> consumers = {});
// A layout transform between a producer and selected consumers: Transpose(perm) on the edge, the
// new value "<value>_layout" of the permuted shape.
StatusOr<int> insert_layout_transform(Graph* g, int value, std::vector<int64_t> perm,
                                      std::span<const int> consumers = {});

// Every node input reading `from` reads `to` instead (an alias: `from` was a view or copy of
// `to`), graph outputs too when include_graph_outputs (which renames that graph output). The
// dtypes must agree. `from` keeps its producer: remove_dead_nodes() takes it when unread.
Status replace_all_uses(Graph* g, int from, int to, bool include_graph_outputs = false);

// Removes nodes whose outputs nothing reads, transitively; returns how many.
int remove_dead_nodes(Graph* g);

// Drops orphaned values (neither a graph input or output, nor read or produced by a node, nor
// named by a nested graph) and renumbers; returns old index -> new index (-1: dropped).
std::vector<int> compact(Graph* g);

}  // namespace kiln::ir

// Loop structure (plan/loops.h): pairing, nesting, and what each iteration reads again.
#include "plan/loops.h"

#include <algorithm>

#include "ops/loop_end.h"
#include "ops/schema.h"

namespace kiln::plan {
namespace {

std::vector<int> producers(const ir::Graph& g) {
  std::vector<int> producer(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    for (int v : g.nodes[n].outputs) {
      if (v >= 0 && size_t(v) < producer.size()) producer[size_t(v)] = int(n);
    }
  }
  return producer;
}

ops::OpKind kind_of(const ir::Node& n) { return ops::find_op(n.domain, n.op_type); }

}  // namespace

StatusOr<std::vector<LoopRegion>> find_loops(const ir::Graph& g) {
  const std::vector<int> producer = producers(g);
  std::vector<int> end_of(g.nodes.size(), -1);  // per LoopBegin: its LoopEnd
  std::vector<LoopRegion> loops;
  for (size_t e = 0; e < g.nodes.size(); ++e) {
    const ir::Node& end = g.nodes[e];
    if (kind_of(end) != ops::OpKind::kLoopEnd) continue;
    const auto layout = ops::LoopEndLayout::of(end.inputs.size(), end.outputs.size());
    if (!layout) {
      return invalid_model(end.describe() + ": a kiln::LoopEnd cannot take " +
                           std::to_string(end.inputs.size()) + " inputs for " +
                           std::to_string(end.outputs.size()) + " outputs");
    }
    const std::vector<int> tail(end.inputs.begin() + std::ptrdiff_t(layout->begin_outputs()),
                                end.inputs.end());
    const int b =
        tail[0] >= 0 && size_t(tail[0]) < producer.size() ? producer[size_t(tail[0])] : -1;
    if (b < 0 || b >= int(e) || kind_of(g.nodes[size_t(b)]) != ops::OpKind::kLoopBegin ||
        g.nodes[size_t(b)].outputs != tail) {
      return invalid_model(end.describe() + ": its last " + std::to_string(tail.size()) +
                           " inputs are not the outputs of one kiln::LoopBegin before it");
    }
    if (end_of[size_t(b)] >= 0) {
      return invalid_model(
          g.nodes[size_t(b)].describe() + " is closed by two kiln::LoopEnd nodes, " +
          g.nodes[size_t(end_of[size_t(b)])].describe() + " and " + end.describe());
    }
    end_of[size_t(b)] = int(e);
  }
  for (size_t b = 0; b < g.nodes.size(); ++b) {
    if (kind_of(g.nodes[b]) != ops::OpKind::kLoopBegin) continue;
    if (end_of[b] < 0) return invalid_model(g.nodes[b].describe() + " has no kiln::LoopEnd");
    loops.push_back({int(b), end_of[b], -1});
  }
  // Nesting: each loop lies wholly inside the innermost open one, or after it.
  std::vector<int> open;
  for (size_t r = 0; r < loops.size(); ++r) {
    while (!open.empty() && loops[size_t(open.back())].end < loops[r].begin) open.pop_back();
    if (!open.empty()) {
      const LoopRegion& outer = loops[size_t(open.back())];
      if (outer.end < loops[r].end) {
        return invalid_model(g.nodes[size_t(loops[r].begin)].describe() +
                             " begins inside the loop of " +
                             g.nodes[size_t(outer.begin)].describe() + " but ends after it");
      }
      loops[r].parent = open.back();
    }
    open.push_back(int(r));
  }
  // Values computed in a loop are read only inside it.
  std::vector<char> is_output(g.values.size(), 0);
  for (int v : g.outputs) {
    if (v >= 0 && size_t(v) < is_output.size()) is_output[size_t(v)] = 1;
  }
  for (const LoopRegion& r : loops) {
    for (int n = r.begin; n < r.end; ++n) {
      for (int v : g.nodes[size_t(n)].outputs) {
        if (v >= 0 && is_output[size_t(v)]) {
          return invalid_model("'" + g.values[size_t(v)].name + "', computed in the loop of " +
                               g.nodes[size_t(r.begin)].describe() + ", is a graph output");
        }
      }
    }
    auto outside = [&](size_t n) { return int(n) <= r.begin || int(n) > r.end; };
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      if (!outside(n)) continue;
      const ir::Node& node = g.nodes[n];
      std::vector<int> reads = node.inputs;
      for (const ir::Guard& gd : node.guards) reads.push_back(gd.cond);
      for (int v : reads) {
        const int p = v >= 0 && size_t(v) < producer.size() ? producer[size_t(v)] : -1;
        if (p >= r.begin && p < r.end) {
          return invalid_model(node.describe() + " reads '" + g.values[size_t(v)].name +
                               "', computed in the loop of " + g.nodes[size_t(r.begin)].describe() +
                               ", from outside that loop");
        }
      }
    }
  }
  return loops;
}

std::vector<int> loop_of_nodes(const ir::Graph& g, const std::vector<LoopRegion>& loops) {
  std::vector<int> of(g.nodes.size(), -1);
  for (size_t r = 0; r < loops.size(); ++r) {  // outer loops first: inner ones overwrite
    for (int n = loops[r].begin; n <= loops[r].end && size_t(n) < of.size(); ++n)
      of[size_t(n)] = int(r);
  }
  return of;
}

void extend_over_loops(const ir::Graph& g, const std::vector<LoopRegion>& loops,
                       const std::function<int(int)>& root, std::vector<int>* last) {
  const std::vector<int> producer = producers(g);
  for (const LoopRegion& r : loops) {
    for (int n = r.begin + 1; n <= r.end; ++n) {
      const ir::Node& node = g.nodes[size_t(n)];
      std::vector<int> reads = node.inputs;
      for (const ir::Guard& gd : node.guards) reads.push_back(gd.cond);
      for (int v : reads) {
        if (v < 0) continue;
        const int rv = root(v);
        if (producer[size_t(rv)] < r.begin)
          (*last)[size_t(rv)] = std::max((*last)[size_t(rv)], r.end);
      }
    }
  }
}

}  // namespace kiln::plan

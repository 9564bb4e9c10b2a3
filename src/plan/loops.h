// Loops that run at run time: a kiln::LoopBegin, the body's nodes, and the kiln::LoopEnd that
// takes LoopBegin's outputs last (ops/kiln_ops.cc). The execution context runs the nodes between
// the two again for each iteration, so memory planning and the plan verifier see one more reader
// of a value the body reads from outside: the LoopEnd, after which the next iteration reads it
// again. One structure check serves the builder and the verifier.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"

namespace kiln::plan {

// The implementation id of a node the execution context runs itself (kiln::LoopBegin and
// kiln::LoopEnd: copies and the jump back), beside kAliasImpl.
inline constexpr const char* kControlImpl = "control";

// A LoopEnd whose copies go through its workspace (a carried value's next value is a view of
// another's) keeps each carried value at this alignment there.
inline constexpr int64_t kLoopCopyAlign = 256;

struct LoopRegion {
  int begin = -1, end = -1;  // node indices of the kiln::LoopBegin and its kiln::LoopEnd
  int parent = -1;           // the region holding this one, or -1
};

// The loops of `g` in order of their LoopBegin, or kInvalidModel naming the node where:
// - a LoopEnd's last inputs are not exactly one LoopBegin's outputs (i, cond_in, carried values),
//   or a LoopBegin has no LoopEnd, or two LoopEnds close one;
// - loops overlap without one holding the other;
// - a value computed inside a loop (LoopBegin's outputs, the body's) is read after its LoopEnd,
//   by another loop's LoopBegin, or is a graph output: the run may not have computed it, or has
//   overwritten it since.
StatusOr<std::vector<LoopRegion>> find_loops(const ir::Graph& g);

// Per node: the innermost loop holding it (an index into `loops`), or -1. A LoopBegin and its
// LoopEnd belong to their own loop.
std::vector<int> loop_of_nodes(const ir::Graph& g, const std::vector<LoopRegion>& loops);

// `last[root(v)]`, the position of the last node reading value v's bytes, raised to a loop's
// LoopEnd for every value computed before its LoopBegin that a node of the loop reads: each
// iteration reads it again.
void extend_over_loops(const ir::Graph& g, const std::vector<LoopRegion>& loops,
                       const std::function<int(int)>& root, std::vector<int>* last);

}  // namespace kiln::plan

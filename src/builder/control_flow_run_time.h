// Internal to the builder: the run-time loops of control_flow_run_time.cc that control_flow.cc
// falls back to when it cannot unroll a Loop or Scan.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"

namespace kiln::builder {

// A Loop the build cannot unroll (its trip count or condition is data or changes with the input
// shapes, or it is too long): run at run time, `why` saying which where that fails too.
StatusOr<bool> loop_at_run_time(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers,
                                std::map<std::string, ir::Node>* run_time_loops, bool keeps,
                                const std::string& why);

// A Scan (opset 9 on) over a length only the run knows, or too long to unroll: a run-time loop
// over the first scan input's length whose body reads slice i of each scan input (Gather; from
// the end for a reverse direction), its scan outputs stacked by the LoopEnd along axis 0, then
// reversed (a Slice of step -1) and moved to their axes (a Transpose) as the attributes say.
StatusOr<bool> scan_at_run_time(ir::Graph& g, size_t n, const std::map<std::string, int>& carriers,
                                size_t n_state, const std::vector<int64_t>& in_axes,
                                const std::vector<int64_t>& in_dirs,
                                const std::vector<int64_t>& out_axes,
                                const std::vector<int64_t>& out_dirs, const std::string& why);

}  // namespace kiln::builder

// The builder: turns a parsed graph, a config and a device into a Plan (see plan/plan.h).
#pragma once

#include "backends/backend.h"
#include "builder/config.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace kiln::builder {

StatusOr<plan::Plan> build_plan(const ir::Graph& graph, uint64_t model_hash,
                                const BuilderConfig& config, const backends::Backend& backend);

// The tensor inputs an engine built from `graph` with `config` takes, in order (sequences.cc lays
// them out): a sequence input's elements "xs[0]", ... of its element type (none where the config
// gives no length, which the build refuses by name), an optional input unless built absent, the
// others as they are. For tools that name inputs before building (the CLI's shape flags).
std::vector<ir::Value> tensor_inputs(const ir::Graph& graph, const BuilderConfig& config);

}  // namespace kiln::builder

// The builder: turns a parsed graph, a config and a device into a Plan (see plan/plan.h).
#pragma once

#include "backends/backend.h"
#include "builder/config.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace kiln::builder {

StatusOr<plan::Plan> build_plan(const ir::Graph& graph, uint64_t model_hash, const BuilderConfig& config,
                                const backends::Backend& backend);

}  // namespace kiln::builder

// Text and JSON descriptions of an engine, shared by the build summary and kiln inspect: IO with
// symbolic shapes, profiles with symbol ranges, output shape formulas, layers, activation memory.
#pragma once

#include <string>

#include "json.h"
#include "kiln.h"
#include "plan/plan.h"  // Engine::plan(): profiles with symbol ranges, builder flags

namespace kiln::cli {

std::string describe_io(
    const Engine& engine);  // "inputs:\n  x  float32  [batch, 3, 224, 224]\n..."
std::string describe_profiles(
    const Engine& engine);  // "profiles:\n  0: x min ... (batch in [1, 32])\n"
// Layer count by op and by kernel; with `each`, one line per layer (index, node, op, kernel,
// precision).
std::string describe_layers(const Engine& engine, bool each);
// The formula and its value at min/opt/max of every profile.
std::string describe_memory(const Engine& engine);

void engine_json(JsonWriter& j, const Engine& engine);  // writes the members of one JSON object

}  // namespace kiln::cli

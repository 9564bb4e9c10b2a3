// kiln::Builder: builds the plan (pipeline.cc) and hands it to the runtime, which checks and
// prepares it as it does a loaded engine.
#include "builder/engine_builder.h"

#include "builder/build_state.h"
#include "builder/builder.h"
#include "plan/plan.h"

namespace kiln {

StatusOr<Engine> Builder::build(const Network& network, const BuilderConfig& config) const {
  KILN_ASSIGN_OR_RETURN(const backends::Backend* backend, backends::get_backend(device_));
  KILN_ASSIGN_OR_RETURN(plan::Plan plan,
                        builder::build_plan(network.graph, network.model_hash, config, *backend));
  return Engine::from_plan(std::move(plan));
}

Status Builder::check_supported(const Network& network) const {
  BuilderConfig config;
  builder::BuildState s{network.graph, config, backends::reference_backend()};
  return builder::check_supported(s);
}

}  // namespace kiln

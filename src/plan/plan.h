// Plan: the built result the runtime executes and the engine file stores. It holds the optimized
// graph (only the nodes that run, each value with its shape formula), the profiles, how every value
// is stored at run time, and the activation memory plan as formulas over the input symbols.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::plan {

// The engine file format kiln writes, and the oldest it still reads. 3: node records without
// `replaced`, which loads as empty; 3 and 4: no data-dependent dims in META, which loads as none;
// 3 to 5: no shape-value inputs in META, which loads as none; 3 to 6: node records without
// `guards` (every node runs), which loads as none.
inline constexpr uint32_t kFormatVersion = 7;
inline constexpr uint32_t kOldestReadableFormatVersion = 3;
inline constexpr const char* kKilnVersion = "0.1.0";

// Shapes of one input in one profile.
struct InputRange {
  std::string name;
  std::vector<int64_t> min, opt, max;
};

struct Profile {
  std::vector<InputRange> inputs;  // one per dynamic input, in engine input order
  ir::SymbolRanges symbols;        // the range of every input symbol this profile allows
  // One per integer shape-value input (OptimizationProfile::set_shape_values): min/opt/max per
  // element (an input with one fixed value of another dtype has none).
  std::vector<InputRange> values;
};

// An engine input whose values decide shapes (TensorRT's shape tensors): the run reads its values
// in host memory and binds each element's symbol (each profile ranges them), or checks it against
// the one value the engine was built for.
struct ShapeValueInput {
  std::string name;                  // the engine input
  std::vector<std::string> symbols;  // per element: the symbol it binds, or "" where fixed holds it
  Tensor fixed;  // the input's dtype and shape: the fixed elements' values, others 0
};

enum class Storage : uint8_t {
  kInput = 0,       // a caller's buffer
  kConstant = 1,    // weights, in the plan
  kSymbolic = 2,    // a small integer tensor evaluated from its formulas each time shapes change
  kActivation = 3,  // a slot of the activation arena
  kOutput = 4,      // written straight into the caller's output buffer
  kAlias = 5,  // a view (Reshape, Flatten, Squeeze, Unsqueeze, Identity): the bytes of `alias_of`
};

struct ValuePlan {
  Storage storage = Storage::kActivation;
  int slot = -1;      // arena slot for kActivation and kSymbolic
  int alias_of = -1;  // for kAlias: the value whose memory this one is (never itself an alias)
};

// What the builder chose for one node; the runtime instantiates it by `impl` and never re-selects.
struct NodePlan {
  std::string impl;    // the implementation's id in the backend's registry ("cpu.Conv",
                       // "cuda.cudnn.Conv"), or kAliasImpl for a view that runs nothing
  std::string tactic;  // the tactic's parameters as text ("algo=1"); empty when it has none
  NodePrecision precision;
  std::string layout;  // the layout the node computes in; empty: the ONNX layout (NCHW, row-major)
  // Scratch for the kernel: the formula the implementation declared (build time only; the slot's
  // size in slot_bytes is what the file stores) and its arena slot, -1 when it needs none.
  ir::Dim workspace = 0;
  int workspace_slot = -1;
};
inline constexpr const char* kAliasImpl = "alias";

// A backend-owned section of the engine file: bytes the backend wrote at build and reads at load
// (a timing cache, prepared kernels). `required`: a loader that does not know the tag refuses the
// file; otherwise it skips the section.
struct BackendSection {
  uint32_t tag = 0;  // four ASCII letters read as a little-endian u32
  bool required = false;
  std::vector<uint8_t> bytes;
};

struct Plan {
  // Header facts, checked on load.
  Device device = Device::kCPU;
  uint32_t builder_flags = 0;
  uint64_t model_hash = 0;  // FNV-1a 64 of the ONNX bytes
  std::string kiln_version = kKilnVersion;

  // graph.nodes are the nodes that run, in order; graph.inputs/outputs are the IO tensors.
  // Every value a node touches has a shape (formulas), and constants carry their data.
  ir::Graph graph;
  std::vector<ValuePlan> values;    // parallel to graph.values
  std::vector<NodePlan> nodes;      // parallel to graph.nodes: implementation, tactic, precision
  std::vector<ir::Dim> slot_bytes;  // size in bytes of each arena slot, as a formula
  std::vector<Profile> profiles;
  // Dims only tensor data decides (NonZero's count), in the order their nodes run: each is a
  // symbol of the graph's shapes that the runtime binds once its node has run, and each profile
  // gives it a range [0, hi]. The arena holds them at `bound` for the run's input shapes.
  std::vector<ir::DataDependentDim> data_dependent;
  std::vector<ShapeValueInput> shape_values;  // in engine input order
  std::vector<BackendSection> backend_sections;
};

// The hull of every profile's symbol ranges: a simplification true over it is true in each
// profile (the builder simplifies formulas over it, and the verifier compares with them so).
inline ir::SymbolRanges symbol_hull(const std::vector<Profile>& profiles) {
  ir::SymbolRanges hull;
  for (const auto& p : profiles) {
    for (const auto& [name, r] : p.symbols) {
      auto [it, inserted] = hull.emplace(name, r);
      if (!inserted) it->second = {std::min(it->second.lo, r.lo), std::max(it->second.hi, r.hi)};
    }
  }
  return hull;
}

}  // namespace kiln::plan

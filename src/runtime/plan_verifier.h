// The plan verifier's state and checks, shared by the three files that define them:
// verify_plan.cc (tables, IO, profiles, shape values, formulas), verify_memory.cc (values, arena
// slots, lifetimes, the arena bound), verify_nodes.cc (each node: guards, loops, inference,
// kernel).
#pragma once

#include <string>
#include <vector>

#include "ops/schema.h"
#include "plan/loops.h"
#include "runtime/engine_data.h"

namespace kiln::verifier {

// Above this many symbols the 2^k corners of a profile's box are too many; the verifier then
// takes the all-min and all-max corners and each single symbol flipped from them.
constexpr size_t kMaxFullCornerSymbols = 10;
// ONNX's highest opset is in the twenties; anything far above is an edited file, not a new model.
constexpr int kMaxPlausibleOpset = 1000;
constexpr int64_t kArenaAlign = 64;  // the runtime arena's slot alignment

// An "engine plan violates invariant" error naming the invariant and what broke it.
Status violation(const std::string& invariant, const std::string& details);
// "n=4, s=128": a point of a profile's symbol box, for messages.
std::string corner_str(const ir::SymbolValues& c);
// The points the verifier evaluates formulas at: the corners of every profile's symbol box.
std::vector<ir::SymbolValues> profile_corners(const plan::Plan& p);

class Verifier {
 public:
  explicit Verifier(const EngineData& data)
      : data_(data), p_(data.plan), g_(data.plan.graph), corners_(profile_corners(data.plan)) {}

  Status run() {
    KILN_RETURN_IF_ERROR(check_tables());
    KILN_RETURN_IF_ERROR(check_io());
    KILN_RETURN_IF_ERROR(check_profiles());
    KILN_RETURN_IF_ERROR(check_shape_values());
    KILN_RETURN_IF_ERROR(check_data_dependent());
    KILN_RETURN_IF_ERROR(check_values());
    KILN_RETURN_IF_ERROR(check_slots());
    KILN_RETURN_IF_ERROR(check_loops());
    KILN_RETURN_IF_ERROR(check_lifetimes());
    ws_total_.assign(corners_.size(), 0);
    for (size_t n = 0; n < g_.nodes.size(); ++n) KILN_RETURN_IF_ERROR(check_node(n));
    KILN_RETURN_IF_ERROR(check_arena_bound());
    KILN_RETURN_IF_ERROR(check_outputs_unguarded());
    return check_producers_write();
  }

 private:
  std::string vname(int v) const { return "value '" + g_.values[v].name + "'"; }

  // The value whose bytes v is: its root for an alias (check_values has checked alias_of).
  int root_of(int v) const {
    return p_.values[v].storage == plan::Storage::kAlias ? p_.values[v].alias_of : v;
  }

  StatusOr<int64_t> slot_bytes(int slot, const ir::SymbolValues& c) const {
    return eval(p_.slot_bytes[slot], c, "arena slot " + std::to_string(slot));
  }

  // verify_plan.cc
  StatusOr<int64_t> eval(const ir::Dim& d, const ir::SymbolValues& c,
                         const std::string& what) const;
  StatusOr<int64_t> value_bytes(int v, const ir::SymbolValues& c) const;
  Status check_tables();
  Status check_io();
  Status check_data_dependent() const;
  Status check_shape_values() const;
  Status check_profiles();

  // verify_memory.cc
  Status check_values();
  Status check_slots();
  Status check_lifetimes();
  void add_workspace(size_t corner, int64_t bytes);
  Status check_arena_bound() const;
  Status check_outputs_unguarded() const;
  Status check_producers_write() const;

  // verify_nodes.cc
  Status check_node(size_t n);
  Status check_loops();
  Status check_control(size_t n);
  Status check_guards(size_t n) const;
  Status check_select_inputs(size_t n) const;
  Status check_inference(size_t n, const ops::OpSchema& schema);
  Status check_kernel(size_t n);

  const EngineData& data_;
  const plan::Plan& p_;
  const ir::Graph& g_;
  const std::vector<ir::SymbolValues> corners_;
  std::vector<ir::DataDependentDim> data_dependent_ = p_.data_dependent;  // inference's copy
  ir::SymbolRanges hull_ = plan::symbol_hull(p_.profiles);  // as the builder simplified over
  std::vector<char> is_input_, is_output_, used_;
  std::vector<plan::LoopRegion> loops_;
  std::vector<int64_t> arena_total_;  // per corner: the slots' aligned bytes (check_slots)
  std::vector<int64_t> ws_total_;  // per corner: the workspaces check_node found the kernels need
};

}  // namespace kiln::verifier

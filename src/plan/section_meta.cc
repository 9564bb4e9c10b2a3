// Sections META (how each value is stored, arena slot sizes, profiles) and NODE (what the builder
// chose for each node) of the engine file, and the semantic checks save and load share.
#include <cstring>
#include <utility>

#include "core/checked.h"
#include "plan/sections.h"

namespace kiln::plan::detail {
namespace {

constexpr uint8_t kMaxStorage = uint8_t(Storage::kAlias);

const char* storage_name(Storage s) {
  switch (s) {
    case Storage::kInput:
      return "input";
    case Storage::kConstant:
      return "constant";
    case Storage::kSymbolic:
      return "symbolic";
    case Storage::kActivation:
      return "activation";
    case Storage::kOutput:
      return "output";
    case Storage::kAlias:
      return "alias";
  }
  return "unknown";
}

Status validate_values(const Plan& p, const std::string& prefix) {
  const int64_t nvalues = int64_t(p.values.size());
  const int64_t nslots = int64_t(p.slot_bytes.size());
  for (size_t i = 0; i < p.values.size(); ++i) {
    const ValuePlan& vp = p.values[i];
    const std::string what = prefix + "value '" + clip(p.graph.values[i].name) + "'";
    if (uint8_t(vp.storage) > kMaxStorage) {
      return invalid_argument(what + " has unknown storage " + std::to_string(int(vp.storage)));
    }
    if (vp.slot < -1 || vp.slot >= nslots) {
      return invalid_argument(what + " uses arena slot " + std::to_string(vp.slot) +
                              " but there are " + std::to_string(nslots) + " slots");
    }
    // kAlias iff alias_of names another value, and that value owns its bytes, so the runtime
    // resolves an alias in one step and a cycle cannot be expressed.
    const bool alias = vp.storage == Storage::kAlias;
    if (alias != (vp.alias_of >= 0)) {
      return invalid_argument(what + " has storage " + storage_name(vp.storage) + " and alias_of " +
                              std::to_string(vp.alias_of) +
                              "; an alias, and only an alias, names the value it views");
    }
    if (!alias) continue;
    if (vp.alias_of >= nvalues) {
      return invalid_argument(what + " aliases value " + std::to_string(vp.alias_of) +
                              " but there are " + std::to_string(nvalues) + " values");
    }
    if (size_t(vp.alias_of) == i) return invalid_argument(what + " aliases itself");
    if (p.values[size_t(vp.alias_of)].storage == Storage::kAlias) {
      return invalid_argument(what + " aliases value '" +
                              clip(p.graph.values[size_t(vp.alias_of)].name) +
                              "', which is itself an alias");
    }
  }
  return ok_status();
}

Status validate_nodes(const Plan& p, const std::string& prefix) {
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const NodePlan& np = p.nodes[i];
    const std::string what = prefix + "the plan of " + p.graph.nodes[i].describe();
    if (np.impl.empty()) return invalid_argument(what + " names no implementation");
    if (np.workspace_slot < -1 || np.workspace_slot >= int64_t(p.slot_bytes.size())) {
      return invalid_argument(what + " uses workspace slot " + std::to_string(np.workspace_slot) +
                              " but there are " + std::to_string(p.slot_bytes.size()) + " slots");
    }
    const uint8_t compute = uint8_t(np.precision.compute);
    if (compute != 0 && !known_dtype_code(compute)) {
      return invalid_argument(what + " computes in unknown dtype code " + std::to_string(compute));
    }
  }
  return ok_status();
}

Status validate_profiles(const Plan& p, const std::string& prefix) {
  for (size_t pi = 0; pi < p.profiles.size(); ++pi) {
    const std::string where = prefix + "profile " + std::to_string(pi) + ": ";
    for (const InputRange& in : p.profiles[pi].inputs) {
      if (in.min.size() != in.opt.size() || in.min.size() != in.max.size()) {
        return invalid_argument(where + "input '" + clip(in.name) +
                                "' has min/opt/max shapes of different ranks");
      }
      for (size_t d = 0; d < in.min.size(); ++d) {
        if (!(in.min[d] <= in.opt[d] && in.opt[d] <= in.max[d])) {
          return invalid_argument(where + "input '" + clip(in.name) + "' dimension " +
                                  std::to_string(d) + " does not satisfy min <= opt <= max");
        }
      }
    }
    for (const auto& [name, range] : p.profiles[pi].symbols) {
      if (range.lo > range.hi) {
        return invalid_argument(where + "symbol '" + clip(name) + "' has an empty range [" +
                                std::to_string(range.lo) + ", " + std::to_string(range.hi) + "]");
      }
    }
  }
  return ok_status();
}

// A profile's min/opt/max lists (its inputs' shapes, or its shape-value inputs' values).
void write_ranges(ByteWriter& w, const std::vector<InputRange>& ranges) {
  w.u64(ranges.size());
  for (const InputRange& in : ranges) {
    w.str(in.name);
    for (const auto* list : {&in.min, &in.opt, &in.max}) {
      w.u64(list->size());
      for (int64_t d : *list) w.i64(d);
    }
  }
}

StatusOr<std::vector<InputRange>> read_ranges(ByteReader& r, const char* what) {
  KILN_ASSIGN_OR_RETURN(size_t n, r.count(8 * 4, what));
  std::vector<InputRange> ranges(n);
  for (InputRange& in : ranges) {
    KILN_ASSIGN_OR_RETURN(in.name, r.str());
    for (auto* list : {&in.min, &in.opt, &in.max}) {
      KILN_ASSIGN_OR_RETURN(size_t len, r.count(8, what));
      list->resize(len);
      for (int64_t& d : *list) {
        KILN_ASSIGN_OR_RETURN(d, r.i64());
      }
    }
  }
  return ranges;
}

// A section must be read to its last byte: trailing bytes mean the writer and reader disagree.
Status expect_end(const ByteReader& r) {
  if (r.remaining() == 0) return ok_status();
  return r.corrupted(std::to_string(r.remaining()) + " unread bytes at its end");
}

}  // namespace

Status validate_plan(const Plan& p, const std::string& prefix) {
  if (p.device != Device::kCPU && p.device != Device::kCUDA) {
    return invalid_argument(prefix + "unknown device " + std::to_string(int(p.device)));
  }
  if (p.kiln_version.size() > kMaxVersionString) {
    return invalid_argument(prefix + "kiln version string is longer than " +
                            std::to_string(kMaxVersionString) + " bytes");
  }
  KILN_RETURN_IF_ERROR(validate_graph(p.graph, prefix, 0));
  auto parallel = [&](size_t have, size_t want, const char* table, const char* of) -> Status {
    if (have == want) return ok_status();
    return invalid_argument(prefix + "the plan has " + std::to_string(have) + " " + table +
                            " entries but the graph has " + std::to_string(want) + " " + of);
  };
  KILN_RETURN_IF_ERROR(parallel(p.values.size(), p.graph.values.size(), "value-plan", "values"));
  KILN_RETURN_IF_ERROR(parallel(p.nodes.size(), p.graph.nodes.size(), "node-plan", "nodes"));
  KILN_RETURN_IF_ERROR(validate_values(p, prefix));
  KILN_RETURN_IF_ERROR(validate_nodes(p, prefix));
  return validate_profiles(p, prefix);
}

Status write_meta(const Plan& p, ByteWriter& w, uint32_t version) {
  w.u64(p.values.size());
  for (const ValuePlan& vp : p.values) {
    w.u8(uint8_t(vp.storage));
    w.i32(vp.slot);
    w.i32(vp.alias_of);
  }
  KILN_RETURN_IF_ERROR(write_dims(w, p.slot_bytes, "an arena slot size"));
  w.u64(p.profiles.size());
  for (const Profile& prof : p.profiles) {
    write_ranges(w, prof.inputs);
    w.u64(prof.symbols.size());
    for (const auto& [name, range] : prof.symbols) {
      w.str(name);
      w.i64(range.lo);
      w.i64(range.hi);
    }
  }

  if (version < 5) {
    if (!p.data_dependent.empty())
      return invalid_argument("cannot save plan: format " + std::to_string(version) +
                              " has no data-dependent dims");
    return ok_status();
  }
  w.u64(p.data_dependent.size());
  for (const ir::DataDependentDim& d : p.data_dependent) {
    w.str(d.symbol);
    KILN_RETURN_IF_ERROR(
        write_dims(w, {d.bound}, "the bound of data-dependent dim '" + d.symbol + "'"));
    if (version >= 7) {
      KILN_RETURN_IF_ERROR(
          write_dims(w, {d.lower}, "the lower bound of data-dependent dim '" + d.symbol + "'"));
    } else if (d.lower != ir::Dim(0)) {
      return invalid_argument("cannot save plan: format " + std::to_string(version) +
                              " has no lower bounds of data-dependent dims");
    }
  }
  if (version < 6) {
    if (!p.shape_values.empty())
      return invalid_argument("cannot save plan: format " + std::to_string(version) +
                              " has no shape-value inputs");
    return ok_status();
  }
  for (const Profile& prof : p.profiles) write_ranges(w, prof.values);
  w.u64(p.shape_values.size());
  for (const ShapeValueInput& sv : p.shape_values) {
    w.str(sv.name);
    w.u64(sv.symbols.size());
    for (const std::string& sym : sv.symbols) w.str(sym);
    w.u8(uint8_t(sv.fixed.dtype()));
    w.u64(sv.fixed.shape().size());
    for (int64_t d : sv.fixed.shape()) w.i64(d);
    w.str(std::string(static_cast<const char*>(sv.fixed.data()), sv.fixed.nbytes()));
  }
  return ok_status();
}

Status read_meta(std::span<const uint8_t> bytes, Plan* p, uint32_t version) {
  ByteReader r(bytes, "section META");
  KILN_ASSIGN_OR_RETURN(size_t nvalues, r.count(1 + 4 + 4, "value plans"));
  p->values.resize(nvalues);
  for (ValuePlan& vp : p->values) {
    KILN_ASSIGN_OR_RETURN(uint8_t storage, r.u8());
    if (storage > kMaxStorage) {
      return r.corrupted("unknown value storage " + std::to_string(storage));
    }
    vp.storage = Storage(storage);
    KILN_ASSIGN_OR_RETURN(vp.slot, r.i32());
    KILN_ASSIGN_OR_RETURN(vp.alias_of, r.i32());
  }
  KILN_ASSIGN_OR_RETURN(p->slot_bytes, read_dims(r, "the arena slot sizes"));
  KILN_ASSIGN_OR_RETURN(size_t nprofiles, r.count(16, "profiles"));
  p->profiles.resize(nprofiles);
  for (Profile& prof : p->profiles) {
    KILN_ASSIGN_OR_RETURN(prof.inputs, read_ranges(r, "profile inputs"));
    KILN_ASSIGN_OR_RETURN(size_t nsymbols, r.count(8 * 3, "profile symbols"));
    for (size_t i = 0; i < nsymbols; ++i) {
      KILN_ASSIGN_OR_RETURN(std::string name, r.str());
      ir::Interval range;
      KILN_ASSIGN_OR_RETURN(range.lo, r.i64());
      KILN_ASSIGN_OR_RETURN(range.hi, r.i64());
      if (!prof.symbols.emplace(std::move(name), range).second) {
        return r.corrupted("a profile names a symbol twice");
      }
    }
  }
  if (version >= 5) {
    KILN_ASSIGN_OR_RETURN(size_t ndd, r.count(8 + 8, "data-dependent dims"));
    for (size_t i = 0; i < ndd; ++i) {
      ir::DataDependentDim d;
      KILN_ASSIGN_OR_RETURN(d.symbol, r.str());
      KILN_ASSIGN_OR_RETURN(auto bound, read_dims(r, "the bound of a data-dependent dim"));
      if (bound.size() != 1)
        return r.corrupted("data-dependent dim '" + clip(d.symbol) + "' has " +
                           std::to_string(bound.size()) + " bounds");
      d.bound = bound[0];
      if (version >= 7) {
        KILN_ASSIGN_OR_RETURN(auto lower, read_dims(r, "the lower bound of a data-dependent dim"));
        if (lower.size() != 1)
          return r.corrupted("data-dependent dim '" + clip(d.symbol) + "' has " +
                             std::to_string(lower.size()) + " lower bounds");
        d.lower = lower[0];
      }
      for (const auto& e : p->data_dependent) {
        if (e.symbol == d.symbol)
          return r.corrupted("data-dependent dim '" + clip(d.symbol) + "' is listed twice");
      }
      p->data_dependent.push_back(std::move(d));
    }
  }
  if (version >= 6) {
    for (Profile& prof : p->profiles) {
      KILN_ASSIGN_OR_RETURN(prof.values, read_ranges(r, "profile shape values"));
    }
    KILN_ASSIGN_OR_RETURN(size_t nsv, r.count(8 + 8 + 1 + 8 + 8, "shape-value inputs"));
    p->shape_values.resize(nsv);
    for (ShapeValueInput& sv : p->shape_values) {
      KILN_ASSIGN_OR_RETURN(sv.name, r.str());
      KILN_ASSIGN_OR_RETURN(size_t nsym, r.count(8, "shape-value symbols"));
      sv.symbols.resize(nsym);
      for (std::string& sym : sv.symbols) {
        KILN_ASSIGN_OR_RETURN(sym, r.str());
      }
      KILN_ASSIGN_OR_RETURN(uint8_t code, r.u8());
      if (!known_dtype_code(code) || dtype_size(DType(code)) == 0) {
        return r.corrupted("shape-value input '" + clip(sv.name) + "' has dtype code " +
                           std::to_string(code));
      }
      KILN_ASSIGN_OR_RETURN(size_t rank, r.count(8, "shape-value dims"));
      Shape shape(rank);
      for (int64_t& d : shape) {
        KILN_ASSIGN_OR_RETURN(d, r.i64());
        if (d < 0 || d > (int64_t(1) << 20))
          return r.corrupted("shape-value input '" + clip(sv.name) + "' has dim " +
                             std::to_string(d));
      }
      auto numel = checked_numel(shape);
      if (!numel || *numel > (int64_t(1) << 20))
        return r.corrupted("shape-value input '" + clip(sv.name) + "' is too large");
      KILN_ASSIGN_OR_RETURN(std::string bytes, r.str());
      KILN_ASSIGN_OR_RETURN(sv.fixed, Tensor::zeros(DType(code), shape));
      if (bytes.size() != sv.fixed.nbytes()) {
        return r.corrupted("shape-value input '" + clip(sv.name) + "' holds " +
                           std::to_string(bytes.size()) + " bytes for shape " +
                           shape_to_string(shape));
      }
      if (!bytes.empty()) std::memcpy(sv.fixed.data(), bytes.data(), bytes.size());
    }
  }
  return expect_end(r);
}

void write_nodes(const Plan& p, ByteWriter& w) {
  w.u64(p.nodes.size());
  for (const NodePlan& np : p.nodes) {
    w.str(np.impl);
    w.str(np.tactic);
    w.u8(uint8_t(np.precision.compute));
    w.u8(np.precision.tf32);
    w.str(np.layout);
    w.i64(np.workspace_slot);
  }
}

Status read_nodes(std::span<const uint8_t> bytes, Plan* p) {
  ByteReader r(bytes, "section NODE");
  KILN_ASSIGN_OR_RETURN(size_t nnodes, r.count(8 + 8 + 1 + 1 + 8 + 8, "node plans"));
  p->nodes.resize(nnodes);
  for (size_t i = 0; i < nnodes; ++i) {
    NodePlan& np = p->nodes[i];
    KILN_ASSIGN_OR_RETURN(np.impl, r.str());
    KILN_ASSIGN_OR_RETURN(np.tactic, r.str());
    KILN_ASSIGN_OR_RETURN(uint8_t compute, r.u8());
    if (compute != 0 && !known_dtype_code(compute)) {
      return r.corrupted("node plan " + std::to_string(i) + " computes in unknown dtype code " +
                         std::to_string(compute));
    }
    np.precision.compute = DType(compute);
    KILN_ASSIGN_OR_RETURN(np.precision.tf32, read_bool(r));
    KILN_ASSIGN_OR_RETURN(np.layout, r.str());
    KILN_ASSIGN_OR_RETURN(int64_t ws, r.i64());
    if (ws < -1 || ws > INT32_MAX) {
      return r.corrupted("node plan " + std::to_string(i) + " has workspace slot " +
                         std::to_string(ws));
    }
    np.workspace_slot = int(ws);
  }
  return expect_end(r);
}

}  // namespace kiln::plan::detail

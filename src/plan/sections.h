// Internal to the engine file: the writers and readers of its core sections (META and NODE in
// section_meta.cc, GRPH and WGTS in section_graph.cc), used by engine_file.cc, and the small rules
// they share. The format itself is documented in engine_file.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "plan/byte_io.h"
#include "plan/plan.h"

namespace kiln::plan::detail {

inline constexpr size_t kAlign = 64;
inline constexpr size_t kMaxVersionString = 256;
inline constexpr int kMaxGraphDepth = 16;

inline uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Names from a hostile file go into error messages; this keeps those messages short.
inline std::string clip(std::string_view s) {
  if (s.size() <= 64) return std::string(s);
  return std::string(s.substr(0, 64)) + "...";
}

inline bool known_dtype_code(uint8_t code) { return dtype_size(DType(code)) != 0; }

// A flag byte that must be 0 or 1.
StatusOr<bool> read_bool(ByteReader& r);

// Shape formulas (used by GRPH for values and by META for arena slot sizes).
Status write_dims(ByteWriter& w, const std::vector<ir::Dim>& dims, const std::string& owner);
StatusOr<std::vector<ir::Dim>> read_dims(ByteReader& r, const std::string& owner);

// GRPH and WGTS are written together: every tensor record in GRPH points into WGTS.
// `version` is the format written: kiln writes kFormatVersion; tests write 3 to check it still
// loads.
Status write_graph(const ir::Graph& g, ByteWriter& graph, ByteWriter& weights,
                   uint32_t version = kFormatVersion);
// `version`: the file's format version (3 has no `replaced` in node records).
StatusOr<ir::Graph> read_graph(std::span<const uint8_t> graph, std::span<const uint8_t> weights,
                               uint32_t version);

// META: value plans, arena slot sizes, profiles. NODE: the per-node plan.
// `version`: the format written or read (before 5, META has no data-dependent dims).
Status write_meta(const Plan& p, ByteWriter& w, uint32_t version = kFormatVersion);
Status read_meta(std::span<const uint8_t> bytes, Plan* p, uint32_t version);
void write_nodes(const Plan& p, ByteWriter& w);
Status read_nodes(std::span<const uint8_t> bytes, Plan* p);

// Semantic checks shared by save and load; `prefix` ("cannot save plan: " or "engine file is
// corrupted: ") says which side found the problem. validate_plan covers everything but the backend
// sections, whose tags engine_file.cc checks.
Status validate_graph(const ir::Graph& g, const std::string& prefix, int depth);
Status validate_plan(const Plan& p, const std::string& prefix);

}  // namespace kiln::plan::detail

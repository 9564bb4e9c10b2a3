// The engine file (.kiln): serializes a Plan to bytes and back, refusing any truncated, corrupted,
// hostile or version-mismatched file with a specific reason. Loading never trusts the file.
//
// Format version 7 (versions 3 to 6 are still read: 3's node records end at attrs, and only 7's
// have guards; META gains data-dependent dims in 5, shape-value inputs in 6, and the lower
// bounds of data-dependent dims in 7: plan.h says what each loads as). Every integer is
// little-endian with the size given; f32 is IEEE bits as u32. str = u64 byte count + bytes. A
// "count" is a u64. Offsets are from the start of the file.
//
//   header   magic "KILNENG\0" (8 bytes), format_version u32 (= plan::kFormatVersion),
//            kiln_version str, device u32 (0 cpu, 1 cuda), builder_flags u32, model_hash u64,
//            file_size u64, num_sections u32 (at most 64),
//            num_sections x {tag u32, flags u32, offset u64, size u64, checksum u64},
//            header_checksum u64 = checksum64(every header byte before it)
//   then the section payloads, each at a 64-byte aligned offset past the header, not overlapping,
//   every byte between the header and the payloads and between payloads zero; the file ends where
//   the payload that ends last ends. Payloads may lie in any order, and the table may list the
//   sections in any order (kiln writes META NODE GRPH WGTS, then the backend's, in that order).
//   Padding must be zero, so that with the header and section checksums one changed byte anywhere
//   in the file is detected.
//
// The table is keyed by tag (four ASCII letters or digits read as a little-endian u32; a tag
// appears at most once). flags bit 0 = required; the other bits are zero. META, NODE, GRPH and WGTS
// are kiln's own and required. Any other section belongs to a backend (Plan::backend_sections):
// deserialize returns those whose tag the caller's backend owns (its `backend_tags`), in table
// order; of the others, an optional one is checksummed and skipped (not kept: a plan re-saved by
// this kiln holds only sections it understood), a required one refuses the file.
//
// Core sections:
//   META  values: count, each {storage u8 (plan::Storage), slot i32, alias_of i32};
//         slot_bytes: dims;
//         profiles: count, each {inputs: count, each {name str, min, opt, max: count + i64 each};
//                                symbols: count, each {name str, lo i64, hi i64}}
//   NODE  node plans (parallel to the graph's nodes): count, each {impl str, tactic str,
//         compute u8 (DType code, 0 = the node's own dtypes), tf32 u8 (0 or 1), layout str,
//         workspace_slot i64 (an arena slot, -1 for none)}
//   GRPH  graph = name str;
//                 opsets: count, each {domain str, version i64};
//                 values: count, each {name str, dtype u8, has_shape u8 [dims],
//                                      has_constant u8 [tensor], has_sym_value u8 [dims],
//                                      producer i32};
//                 nodes: count, each {name str, op_type str, domain str, opset i32,
//                                     inputs: count + i32 each (-1 = omitted), outputs: same,
//                                     attrs: count, each {name str, type u8, payload},
//                                     replaced (format 4): count, each {op_type str, count i64}
//                                       (ir::Node::replaced: a fused node's model nodes, op types
//                                       unique and non-empty, counts 1..2^31-1),
//                                     guards (format 7): count, each {cond i32, when u8}
//                                       (ir::Node::guards: the node runs in an If's branch)};
//                 inputs: count + i32 each;  outputs: count + i32 each
//         dims   = count, each dim;  dim = kind u8, then 0: i64 constant, or 1: str formula printed
//                  by Dim::to_string and re-read by Dim::parse (unparsable on load = corruption)
//         tensor = dtype u8 (0: empty tensor, nothing follows), dims: count + i64 each,
//                  offset u64, size u64 (its bytes in WGTS, at a 64-aligned offset)
//         attribute payload, by type (ir::AttrType): float f32 | int i64 | string str |
//                  tensor tensor | graph {present u8, [graph]} |
//                  floats, ints, strings, tensors, graphs: count + items (graphs: present u8 each)
//         Subgraphs nest at most 16 deep.
//   WGTS  the bytes of every constant tensor (values and attributes), each at a 64-byte aligned
//         offset within the section, so the file can later be mmapped and weights used in place.
// Every section is parsed to its last byte; what it says is then checked as a whole: tables
// parallel to the graph, indices in range, enums known, a node plan names its implementation and
// computes in a known dtype (or 0), a value is kAlias exactly when alias_of >= 0, and an alias
// names another value that is not itself an alias.
//
// checksum64 (byte_io.h) is FNV-1a 64 over 64-bit words: one changed byte always changes it (each
// step is a bijection of the state), and word-wise it keeps up with large weight sections. It is
// for accidental damage only: anyone can recompute it, so the runtime verifies what a plan says
// against the invariants it relies on before using it (runtime/verify_plan.cc).
//
// Errors: every file kiln cannot load is kInvalidArgument. One of another format version names
// its version and says to rebuild the engine from the ONNX model ("engine file format version 1
// was written by an older kiln; ..."); one with a required section this kiln does not know names
// the tag ("engine file needs section 'XYZW', which this kiln does not know; ..."); a malformed one
// (bad magic, truncated, corrupted, hostile counts, duplicate tags, a missing core section,
// out-of-range indices or enums, unparsable formulas) has a message starting "not a kiln engine
// file", "engine file is truncated" or "engine file is corrupted". A missing file is kNotFound
// naming the path. A plan that cannot be
// stored (tables not parallel to the graph, an index out of range, a formula that does not survive
// its text form, a backend section with a reserved, unprintable or repeated tag) is
// kInvalidArgument "cannot save plan: ..." at save time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/plan.h"

namespace kiln::plan {

inline constexpr char kEngineMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};

// A section tag: four ASCII letters or digits read as a little-endian u32.
constexpr uint32_t section_tag(char a, char b, char c, char d) {
  return uint32_t(uint8_t(a)) | uint32_t(uint8_t(b)) << 8 | uint32_t(uint8_t(c)) << 16 |
         uint32_t(uint8_t(d)) << 24;
}
inline constexpr uint32_t kSectionMeta = section_tag('M', 'E', 'T', 'A');
inline constexpr uint32_t kSectionNode = section_tag('N', 'O', 'D', 'E');
inline constexpr uint32_t kSectionGraph = section_tag('G', 'R', 'P', 'H');
inline constexpr uint32_t kSectionWeights = section_tag('W', 'G', 'T', 'S');
inline constexpr uint32_t kSectionRequired = 1;  // SectionEntry::flags bit 0

// One entry of the section table.
struct SectionEntry {
  uint32_t tag = 0;
  uint32_t flags = 0;  // kSectionRequired or 0
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;

  bool required() const { return (flags & kSectionRequired) != 0; }
};

// What the header says; read_header checks magic, version, header checksum, the section table
// (flags, no repeated tag, the core sections present, placement, zero padding) and the file size,
// but not the section payloads, nor whether an unknown required section is understood
// (deserialize does both), so `kiln inspect` can list any well-formed file's sections.
struct EngineHeader {
  uint32_t format_version = 0;
  std::string kiln_version;
  Device device = Device::kCPU;
  uint32_t builder_flags = 0;
  uint64_t model_hash = 0;
  uint32_t num_sections = 0;
  uint64_t file_size = 0;
  std::vector<SectionEntry> sections;  // in table order
  uint64_t header_size = 0;            // bytes up to and including the header checksum
};

// "META" etc. for a tag of four letters or digits; "0x........" for any other.
std::string section_tag_name(uint32_t tag);

// Serializes the plan; on a plan that cannot be stored returns an empty vector (which deserialize
// refuses). Use try_serialize or save_file to learn why.
std::vector<uint8_t> serialize(const Plan& plan);
StatusOr<std::vector<uint8_t>> try_serialize(const Plan& plan);
// `backend_tags`: the sections the caller's backend owns, returned in plan.backend_sections (core
// tags among them are ignored); any other non-core section is skipped if optional, refused if
// required.
StatusOr<Plan> deserialize(std::span<const uint8_t> bytes,
                           std::span<const uint32_t> backend_tags = {});
StatusOr<EngineHeader> read_header(std::span<const uint8_t> bytes);  // for `kiln inspect`
Status save_file(const Plan& plan, const std::string& path);
// The largest engine file load_file() reads: far above any engine kiln builds (weights are most
// of one), and low enough that a wrong path never exhausts memory.
inline constexpr uint64_t kMaxEngineFileBytes = uint64_t(16) << 30;
// A path that is not a regular file (a directory, device, FIFO) or is over kMaxEngineFileBytes is
// refused before any byte is read.
StatusOr<Plan> load_file(const std::string& path, std::span<const uint32_t> backend_tags = {});

}  // namespace kiln::plan

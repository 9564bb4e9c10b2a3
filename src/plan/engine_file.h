// The engine file (.kiln): serializes a Plan to bytes and back, refusing any truncated, corrupted,
// hostile or version-mismatched file with a specific reason. Loading never trusts the file.
//
// Format version 1. Every integer is little-endian with the size given; f32 is IEEE bits as u32.
// str = u64 byte count + bytes. A "count" is a u64. Offsets are from the start of the file.
//
//   header   magic "KILNENG\0" (8 bytes), format_version u32 (= plan::kFormatVersion),
//            kiln_version str, device u32 (0 cpu, 1 cuda), builder_flags u32, model_hash u64,
//            file_size u64, num_sections u32,
//            num_sections x {tag u32, offset u64, size u64, checksum u64},
//            header_checksum u64 = checksum64(every header byte before it)
//   zero padding to 64, then the section payloads in table order, each at a 64-byte aligned offset,
//   zero padding between them; the file ends where the last payload ends. Padding must be zero, so
//   that with the header and section checksums one changed byte anywhere in the file is detected.
//
// Sections (tag = the four ASCII letters read as a little-endian u32; each appears exactly once):
//   META  values: count, each {storage u8 (plan::Storage), slot i32};
//         kernels: count, each str;  precisions: count, each str;  slot_bytes: dims;
//         profiles: count, each {inputs: count, each {name str, min, opt, max: count + i64 each};
//                                symbols: count, each {name str, lo i64, hi i64}}
//   GRPH  graph = name str;
//                 opsets: count, each {domain str, version i64};
//                 values: count, each {name str, dtype u8, has_shape u8 [dims],
//                                      has_constant u8 [tensor], has_sym_value u8 [dims],
//                                      producer i32};
//                 nodes: count, each {name str, op_type str, domain str, opset i32,
//                                     inputs: count + i32 each (-1 = omitted), outputs: same,
//                                     attrs: count, each {name str, type u8, payload}};
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
//
// checksum64 (byte_io.h) is FNV-1a 64 over 64-bit words: one changed byte always changes it (each
// step is a bijection of the state), and word-wise it keeps up with large weight sections.
//
// Errors: a malformed file (bad magic, unsupported version, truncated, corrupted, hostile counts,
// out-of-range indices or enums, unparsable formulas) is kInvalidArgument, with a message starting
// "not a kiln engine file", "engine file format version", "engine file is truncated" or
// "engine file is corrupted". A missing file is kNotFound naming the path. A plan that cannot be
// stored (tables not parallel to the graph, an index out of range, a formula that does not survive
// its text form) is kInvalidArgument "cannot save plan: ..." at save time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/plan.h"

namespace kiln::plan {

inline constexpr char kEngineMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};

// One entry of the section table.
struct SectionEntry {
  uint32_t tag = 0;  // 'META', 'GRPH', 'WGTS' as little-endian u32
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// What the header says; read_header checks magic, version, header checksum, the section table's
// bounds and the file size, but not the section payloads (deserialize does).
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

// "META" etc. for a tag; "0x........" for unknown ones.
std::string section_tag_name(uint32_t tag);

// Serializes the plan; on a plan that cannot be stored returns an empty vector (which deserialize
// refuses). Use try_serialize or save_file to learn why.
std::vector<uint8_t> serialize(const Plan& plan);
StatusOr<std::vector<uint8_t>> try_serialize(const Plan& plan);
StatusOr<Plan> deserialize(std::span<const uint8_t> bytes);
StatusOr<EngineHeader> read_header(std::span<const uint8_t> bytes);  // for `kiln inspect`
Status save_file(const Plan& plan, const std::string& path);
StatusOr<Plan> load_file(const std::string& path);

}  // namespace kiln::plan

// Engine file writer and reader (format in engine_file.h): the header, the section table, and the
// top-level save and load. The sections' contents are in section_meta.cc and section_graph.cc; the
// reader checks structure while parsing and meaning afterwards, through the validate_plan the
// writer also runs.
#include "plan/engine_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/file.h"
#include "plan/byte_io.h"
#include "plan/sections.h"

namespace kiln::plan {
namespace {

using detail::align_up;
using detail::kAlign;

constexpr uint32_t kCoreTags[] = {kSectionMeta, kSectionNode, kSectionGraph, kSectionWeights};
constexpr uint32_t kMaxSections = 64;
constexpr size_t kSectionEntryBytes = 4 + 4 + 8 + 8 + 8;

bool is_core_tag(uint32_t tag) {
  return std::find(std::begin(kCoreTags), std::end(kCoreTags), tag) != std::end(kCoreTags);
}

// Four ASCII letters or digits, so that every message can name the section.
bool printable_tag(uint32_t tag) {
  for (int k = 0; k < 4; ++k) {
    char c = char((tag >> (8 * k)) & 0xff);
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

// One section as the writer lays it out.
struct OutSection {
  uint32_t tag;
  uint32_t flags;
  std::span<const uint8_t> bytes;
};

Status validate_backend_sections(const Plan& plan) {
  const std::string prefix = "cannot save plan: backend section ";
  for (size_t i = 0; i < plan.backend_sections.size(); ++i) {
    const uint32_t tag = plan.backend_sections[i].tag;
    const std::string name = section_tag_name(tag);
    if (!printable_tag(tag)) {
      return invalid_argument(prefix + name + " is not four ASCII letters or digits");
    }
    if (is_core_tag(tag)) return invalid_argument(prefix + name + " uses a tag kiln reserves");
    for (size_t k = 0; k < i; ++k) {
      if (plan.backend_sections[k].tag == tag) {
        return invalid_argument(prefix + name + " appears twice");
      }
    }
  }
  if (plan.backend_sections.size() > kMaxSections - std::size(kCoreTags)) {
    return invalid_argument("cannot save plan: " + std::to_string(plan.backend_sections.size()) +
                            " backend sections; the format allows " +
                            std::to_string(kMaxSections - std::size(kCoreTags)));
  }
  return ok_status();
}

// The version is judged before the header checksum because another version's header has another
// layout; the message says what to do, since the user cannot fix the file itself.
Status check_format_version(uint32_t version) {
  if (version >= kOldestReadableFormatVersion && version <= kFormatVersion) return ok_status();
  const std::string what = "engine file format version " + std::to_string(version);
  const std::string ours = "this kiln reads versions " +
                           std::to_string(kOldestReadableFormatVersion) + " to " +
                           std::to_string(kFormatVersion);
  if (version < kOldestReadableFormatVersion) {
    return invalid_argument(what + " was written by an older kiln; " + ours +
                            ": rebuild the engine from the ONNX model");
  }
  return invalid_argument(what + " was written by a newer kiln; " + ours +
                          ": rebuild the engine from the ONNX model with this kiln (" +
                          kKilnVersion + ")");
}

// The table: flags known, every tag once, the core sections present and required.
Status check_table(const EngineHeader& h, const ByteReader& r) {
  for (size_t i = 0; i < h.sections.size(); ++i) {
    const SectionEntry& e = h.sections[i];
    const std::string name = section_tag_name(e.tag);
    if ((e.flags & ~kSectionRequired) != 0) {
      return r.corrupted("section " + name + " has unknown flags " + std::to_string(e.flags));
    }
    for (size_t k = 0; k < i; ++k) {
      if (h.sections[k].tag == e.tag) return r.corrupted("section " + name + " appears twice");
    }
    if (is_core_tag(e.tag) && !e.required()) {
      return r.corrupted("core section " + name + " is not marked required");
    }
  }
  for (uint32_t tag : kCoreTags) {
    auto it = std::find_if(h.sections.begin(), h.sections.end(),
                           [tag](const SectionEntry& e) { return e.tag == tag; });
    if (it == h.sections.end()) return r.corrupted("has no section " + section_tag_name(tag));
  }
  return ok_status();
}

// Payloads lie after the header, aligned, not overlapping, with every byte between them zero; the
// one that ends last ends the file. Taken in file order, whatever the table order.
Status check_placement(const EngineHeader& h, std::span<const uint8_t> bytes, const ByteReader& r) {
  std::vector<const SectionEntry*> by_offset;
  for (const SectionEntry& e : h.sections) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const SectionEntry* a, const SectionEntry* b) {
                     return a->offset != b->offset ? a->offset < b->offset : a->size < b->size;
                   });
  uint64_t end = h.header_size;
  for (const SectionEntry* e : by_offset) {
    if (e->offset % kAlign != 0 || e->offset < end || e->offset > h.file_size ||
        e->size > h.file_size - e->offset) {
      return r.corrupted("section " + section_tag_name(e->tag) + " at offset " +
                         std::to_string(e->offset) + " size " + std::to_string(e->size) +
                         " is misplaced in a file of " + std::to_string(h.file_size) + " bytes");
    }
    for (uint64_t k = end; k < e->offset; ++k) {
      if (bytes[k] != 0) {
        return invalid_argument("engine file is corrupted: nonzero padding byte at offset " +
                                std::to_string(k));
      }
    }
    end = e->offset + e->size;
  }
  if (end != h.file_size) {
    return r.corrupted("the last section ends at " + std::to_string(end) +
                       ", not at the end of file (" + std::to_string(h.file_size) + ")");
  }
  return ok_status();
}

}  // namespace

std::string section_tag_name(uint32_t tag) {
  if (!printable_tag(tag)) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", tag);
    return buf;
  }
  std::string s;
  for (int k = 0; k < 4; ++k) s += char((tag >> (8 * k)) & 0xff);
  return s;
}

StatusOr<std::vector<uint8_t>> try_serialize(const Plan& plan) {
  KILN_RETURN_IF_ERROR(detail::validate_plan(plan, "cannot save plan: "));
  KILN_RETURN_IF_ERROR(validate_backend_sections(plan));
  ByteWriter meta, node, graph, weights;
  KILN_RETURN_IF_ERROR(detail::write_graph(plan.graph, graph, weights));
  KILN_RETURN_IF_ERROR(detail::write_meta(plan, meta));
  detail::write_nodes(plan, node);
  std::vector<OutSection> sections = {{kSectionMeta, kSectionRequired, meta.data()},
                                      {kSectionNode, kSectionRequired, node.data()},
                                      {kSectionGraph, kSectionRequired, graph.data()},
                                      {kSectionWeights, kSectionRequired, weights.data()}};
  for (const BackendSection& b : plan.backend_sections) {
    sections.push_back({b.tag, b.required ? kSectionRequired : 0, b.bytes});
  }

  const uint64_t header_size = 8 + 4 + 8 + plan.kiln_version.size() + 4 + 4 + 8 + 8 + 4 +
                               sections.size() * kSectionEntryBytes + 8;
  std::vector<uint64_t> offsets;
  uint64_t end = header_size;
  for (const OutSection& s : sections) {
    offsets.push_back(align_up(end));
    end = offsets.back() + s.bytes.size();
  }
  const uint64_t file_size = end;

  ByteWriter w;
  w.bytes({reinterpret_cast<const uint8_t*>(kEngineMagic), sizeof(kEngineMagic)});
  w.u32(kFormatVersion);
  w.str(plan.kiln_version);
  w.u32(uint32_t(plan.device));
  w.u32(plan.builder_flags);
  w.u64(plan.model_hash);
  w.u64(file_size);
  w.u32(uint32_t(sections.size()));
  for (size_t i = 0; i < sections.size(); ++i) {
    w.u32(sections[i].tag);
    w.u32(sections[i].flags);
    w.u64(offsets[i]);
    w.u64(sections[i].bytes.size());
    w.u64(checksum64(sections[i].bytes));
  }
  w.u64(checksum64(w.data()));
  KILN_CHECK(w.size() == header_size);
  for (size_t i = 0; i < sections.size(); ++i) {
    w.align(kAlign);
    KILN_CHECK(w.size() == offsets[i]);
    w.bytes(sections[i].bytes);
  }
  KILN_CHECK(w.size() == file_size);
  return w.take();
}

std::vector<uint8_t> serialize(const Plan& plan) {
  auto bytes = try_serialize(plan);
  if (!bytes.ok()) return {};
  return std::move(bytes).value();
}

StatusOr<EngineHeader> read_header(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return invalid_argument("not a kiln engine file (it is empty)");
  const size_t n = std::min(bytes.size(), sizeof(kEngineMagic));
  if (std::memcmp(bytes.data(), kEngineMagic, n) != 0) {
    return invalid_argument("not a kiln engine file (bad magic)");
  }
  if (bytes.size() < sizeof(kEngineMagic)) {
    return invalid_argument("engine file is truncated: " + std::to_string(bytes.size()) +
                            " bytes, too short for its header");
  }
  ByteReader r(bytes, "header", /*overrun_is_truncation=*/true);
  KILN_RETURN_IF_ERROR(r.take(sizeof(kEngineMagic)).status());
  EngineHeader h;
  KILN_ASSIGN_OR_RETURN(h.format_version, r.u32());
  KILN_RETURN_IF_ERROR(check_format_version(h.format_version));
  // Fields are read raw first and judged after the header checksum, so a flipped byte is reported
  // as corruption rather than as whatever the flipped value happens to mean.
  KILN_ASSIGN_OR_RETURN(uint64_t version_len, r.u64());
  if (version_len > detail::kMaxVersionString) {
    return r.corrupted("kiln version string of " + std::to_string(version_len) +
                       " bytes is implausibly long");
  }
  KILN_ASSIGN_OR_RETURN(auto version_bytes, r.take(size_t(version_len)));
  h.kiln_version.assign(reinterpret_cast<const char*>(version_bytes.data()), version_bytes.size());
  KILN_ASSIGN_OR_RETURN(uint32_t device, r.u32());
  KILN_ASSIGN_OR_RETURN(h.builder_flags, r.u32());
  KILN_ASSIGN_OR_RETURN(h.model_hash, r.u64());
  KILN_ASSIGN_OR_RETURN(h.file_size, r.u64());
  KILN_ASSIGN_OR_RETURN(h.num_sections, r.u32());
  if (h.num_sections > kMaxSections) {
    return r.corrupted("section count " + std::to_string(h.num_sections) + " is implausible");
  }
  for (uint32_t i = 0; i < h.num_sections; ++i) {
    SectionEntry e;
    KILN_ASSIGN_OR_RETURN(e.tag, r.u32());
    KILN_ASSIGN_OR_RETURN(e.flags, r.u32());
    KILN_ASSIGN_OR_RETURN(e.offset, r.u64());
    KILN_ASSIGN_OR_RETURN(e.size, r.u64());
    KILN_ASSIGN_OR_RETURN(e.checksum, r.u64());
    h.sections.push_back(e);
  }
  const uint64_t computed = checksum64(bytes.first(r.pos()));
  KILN_ASSIGN_OR_RETURN(uint64_t stored, r.u64());
  if (stored != computed)
    return invalid_argument("engine file is corrupted: header checksum mismatch");
  h.header_size = r.pos();

  if (device > uint32_t(Device::kCUDA))
    return r.corrupted("unknown device " + std::to_string(device));
  h.device = Device(device);
  if (bytes.size() < h.file_size) {
    return invalid_argument("engine file is truncated: expected " + std::to_string(h.file_size) +
                            " bytes, found " + std::to_string(bytes.size()));
  }
  if (bytes.size() > h.file_size) {
    return invalid_argument("engine file is corrupted: found " + std::to_string(bytes.size()) +
                            " bytes but the header declares " + std::to_string(h.file_size));
  }
  KILN_RETURN_IF_ERROR(check_table(h, r));
  KILN_RETURN_IF_ERROR(check_placement(h, bytes, r));
  return h;
}

StatusOr<Plan> deserialize(std::span<const uint8_t> bytes, std::span<const uint32_t> backend_tags) {
  KILN_ASSIGN_OR_RETURN(EngineHeader h, read_header(bytes));
  // Every payload is checksummed, skipped ones included, so no changed byte goes unnoticed.
  for (const SectionEntry& e : h.sections) {
    if (checksum64(bytes.subspan(size_t(e.offset), size_t(e.size))) != e.checksum) {
      return invalid_argument("engine file is corrupted: checksum mismatch in section " +
                              section_tag_name(e.tag));
    }
  }
  Plan plan;
  plan.device = h.device;
  plan.builder_flags = h.builder_flags;
  plan.model_hash = h.model_hash;
  plan.kiln_version = h.kiln_version;

  auto payload = [&](uint32_t tag) {
    auto it = std::find_if(h.sections.begin(), h.sections.end(),
                           [tag](const SectionEntry& e) { return e.tag == tag; });
    KILN_CHECK(it != h.sections.end());  // read_header made sure every core section is there
    return bytes.subspan(size_t(it->offset), size_t(it->size));
  };
  for (const SectionEntry& e : h.sections) {
    if (is_core_tag(e.tag)) continue;
    if (std::find(backend_tags.begin(), backend_tags.end(), e.tag) != backend_tags.end()) {
      auto b = bytes.subspan(size_t(e.offset), size_t(e.size));
      plan.backend_sections.push_back({e.tag, e.required(), {b.begin(), b.end()}});
    } else if (e.required()) {
      return invalid_argument("engine file needs section '" + section_tag_name(e.tag) +
                              "', which this kiln does not know; rebuild the engine with this "
                              "kiln");
    }
  }
  KILN_ASSIGN_OR_RETURN(plan.graph, detail::read_graph(payload(kSectionGraph),
                                                       payload(kSectionWeights), h.format_version));
  KILN_RETURN_IF_ERROR(detail::read_meta(payload(kSectionMeta), &plan, h.format_version));
  KILN_RETURN_IF_ERROR(detail::read_nodes(payload(kSectionNode), &plan));
  KILN_RETURN_IF_ERROR(detail::validate_plan(plan, "engine file is corrupted: "));
  return plan;
}

Status save_file(const Plan& plan, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, try_serialize(plan));
  // A regular file only, replaced in one rename: --saveEngine naming a FIFO blocked forever.
  return write_regular_file(path, bytes, "engine");
}

StatusOr<Plan> load_file(const std::string& path, std::span<const uint32_t> backend_tags) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                        read_regular_file(path, kMaxEngineFileBytes, "engine"));
  auto plan = deserialize(bytes, backend_tags);
  if (!plan.ok()) {
    Status s = plan.status();
    s.with_context("engine file '" + path + "'");
    return s;
  }
  return plan;
}

}  // namespace kiln::plan

// The engine file's section table (format version 3): node plans, aliases and backend sections
// round trip; sections load in any order; unknown optional sections are skipped, unknown required
// ones and other format versions are refused with a message saying what to do; duplicate tags,
// missing core sections and hostile node plans or aliases are corruption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "engine_file_test_util.h"
#include "plan/byte_io.h"
#include "plan/engine_file.h"
#include "plan/sections.h"

namespace kiln::plan {
namespace {

using namespace engine_file_test;

constexpr uint32_t kTagExtra = section_tag('X', 'T', 'R', 'A');

std::vector<uint8_t> some_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + 13 * i);
  return b;
}

std::string load_error(const std::vector<uint8_t>& bytes) {
  auto r = load(bytes);
  if (r.ok()) return "(loaded)";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
  return r.status().message();
}

TEST(EngineFileSections, RoundTripsNodePlansAliasesAndBackendSections) {
  Plan p = make_plan();
  std::vector<uint8_t> bytes = serialize(p);
  auto loaded = load(bytes);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  ASSERT_EQ(loaded->nodes.size(), 2u);
  EXPECT_EQ(loaded->nodes[0].impl, "cpu.Shape");
  EXPECT_EQ(loaded->nodes[0].precision.compute, DType::kUndefined);
  EXPECT_FALSE(loaded->nodes[0].precision.tf32);
  EXPECT_EQ(loaded->nodes[1].impl, "cuda.cublaslt.MatMul");
  EXPECT_EQ(loaded->nodes[1].tactic, "algo=3 split_k=2");
  EXPECT_EQ(loaded->nodes[1].precision.compute, DType::kFloat32);
  EXPECT_TRUE(loaded->nodes[1].precision.tf32);
  EXPECT_EQ(loaded->nodes[1].layout, "NHWC");
  EXPECT_EQ(loaded->values[4].storage, Storage::kAlias);
  EXPECT_EQ(loaded->values[4].alias_of, 3);
  EXPECT_EQ(loaded->values[3].alias_of, -1);
  ASSERT_EQ(loaded->backend_sections.size(), 2u);
  EXPECT_EQ(loaded->backend_sections[0].tag, kTagTimingCache);
  EXPECT_FALSE(loaded->backend_sections[0].required);
  EXPECT_EQ(loaded->backend_sections[0].bytes, p.backend_sections[0].bytes);
  EXPECT_EQ(loaded->backend_sections[1].tag, kTagPrepared);
  EXPECT_TRUE(loaded->backend_sections[1].required);
  EXPECT_TRUE(loaded->backend_sections[1].bytes.empty());

  // A backend that owns only PREP does not get TCCH (optional, skipped, not kept), so re-saving
  // writes only what this loader understood.
  const uint32_t prep_only[] = {kTagPrepared};
  auto partial = deserialize(bytes, prep_only);
  ASSERT_TRUE(partial.ok()) << partial.status().to_string();
  ASSERT_EQ(partial->backend_sections.size(), 1u);
  EXPECT_EQ(partial->backend_sections[0].tag, kTagPrepared);
  expect_graph_eq(p.graph, partial->graph);
  std::vector<uint8_t> resaved = serialize(*partial);
  auto h = read_header(resaved);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->num_sections, 5u);
  EXPECT_TRUE(load(resaved).ok());

  // Core tags among a caller's backend tags change nothing.
  const uint32_t with_core[] = {kSectionGraph, kTagTimingCache, kTagPrepared, kSectionMeta};
  auto again = deserialize(bytes, with_core);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  expect_plan_eq(p, *again);
}

TEST(EngineFileSections, AssembleReproducesTheWriter) {
  // The test's own assembler lays a file out exactly as serialize does, so the crafted files
  // below differ from real ones only in what each test changes.
  std::vector<uint8_t> bytes = serialize(make_plan());
  EXPECT_EQ(assemble(bytes, sections_of(bytes)), bytes);
}

TEST(EngineFileSections, SectionsLoadInAnyOrder) {
  Plan p = make_plan();
  std::vector<uint8_t> bytes = serialize(p);
  std::vector<Piece> table = sections_of(bytes);
  std::reverse(table.begin(), table.end());  // PREP TCCH WGTS GRPH NODE META
  std::vector<uint8_t> crafted = assemble(bytes, table, {2, 0, 5, 3, 1, 4});
  auto h = read_header(crafted);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(section_tag_name(h->sections[0].tag), "PREP");
  EXPECT_GT(h->sections[0].offset, h->sections[2].offset);  // file order differs from table order
  auto loaded = load(crafted);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::reverse(p.backend_sections.begin(), p.backend_sections.end());  // they come in table order
  expect_plan_eq(p, *loaded);
}

TEST(EngineFileSections, UnknownOptionalSectionIsSkipped) {
  Plan p = make_plan();
  std::vector<uint8_t> bytes = serialize(p);
  std::vector<Piece> table = sections_of(bytes);
  table.insert(table.begin() + 2, Piece{kTagExtra, 0, some_bytes(77, 5)});
  std::vector<uint8_t> crafted = assemble(bytes, table);

  auto h = read_header(crafted);  // `kiln inspect` lists it
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_EQ(h->num_sections, 7u);
  EXPECT_EQ(section_tag_name(h->sections[2].tag), "XTRA");
  EXPECT_FALSE(h->sections[2].required());
  auto loaded = load(crafted);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_plan_eq(p, *loaded);  // XTRA is not kept
  EXPECT_EQ(serialize(*loaded), bytes);

  // Skipped is not unchecked: a changed byte in it is still caught.
  std::vector<uint8_t> bad = crafted;
  bad[h->sections[2].offset + 40] ^= 0x04;
  EXPECT_EQ(load_error(bad), "engine file is corrupted: checksum mismatch in section XTRA");
}

TEST(EngineFileSections, UnknownRequiredSectionIsRefusedByTag) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  std::vector<Piece> table = sections_of(bytes);
  table.push_back({section_tag('X', 'Y', 'Z', 'W'), kSectionRequired, some_bytes(9, 1)});
  std::vector<uint8_t> crafted = assemble(bytes, table);
  EXPECT_TRUE(read_header(crafted).ok());
  EXPECT_EQ(load_error(crafted),
            "engine file needs section 'XYZW', which this kiln does not know; rebuild the engine "
            "with this kiln");

  // The same section, optional, loads: only the flag made the difference.
  table.back().flags = 0;
  EXPECT_TRUE(load(assemble(bytes, table)).ok());

  // A tag that is not four letters or digits is named in hex.
  table.back() = {0x01020304u, kSectionRequired, {}};
  EXPECT_EQ(load_error(assemble(bytes, table)),
            "engine file needs section '0x01020304', which this kiln does not know; rebuild the "
            "engine with this kiln");

  // A backend section is unknown to a caller whose backend does not own it.
  auto r = deserialize(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "engine file needs section 'PREP', which this kiln does not know; rebuild the engine "
            "with this kiln");
}

// Format 3 had no `replaced` in node records: such a file still loads, every node's empty.
TEST(EngineFileSections, Version3FileLoadsWithoutReplacedNodes) {
  Plan p = make_plan();
  ASSERT_FALSE(p.graph.nodes[1].replaced.empty());
  std::vector<uint8_t> bytes = serialize(p);
  std::vector<Piece> table = sections_of(bytes);
  ByteWriter graph, weights, meta;
  ASSERT_TRUE(detail::write_graph(p.graph, graph, weights, 3).ok());
  ASSERT_TRUE(detail::write_meta(p, meta, 3).ok());
  int swapped = 0;
  for (Piece& piece : table) {
    if (piece.tag == kSectionGraph) {
      EXPECT_LT(graph.size(), piece.bytes.size());  // one count less per node, subgraphs' too
      piece.bytes = graph.take();
      ++swapped;
    } else if (piece.tag == kSectionMeta) {
      // No count of data-dependent dims, of each profile's shape values, of shape-value inputs.
      EXPECT_EQ(meta.size() + 8 + 8 * p.profiles.size() + 8, piece.bytes.size());
      piece.bytes = meta.take();
      ++swapped;
    }
  }
  ASSERT_EQ(swapped, 2);
  std::vector<uint8_t> v3 = assemble(bytes, table, {}, 3);
  EXPECT_EQ(read_header(v3)->format_version, 3u);
  auto loaded = load(v3);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  for (ir::Node& n : p.graph.nodes) n.replaced.clear();
  expect_plan_eq(p, *loaded);
  // Read as format 6, the same bytes are one count short per node: corruption, not a crash.
  EXPECT_NE(load_error(assemble(bytes, table)).find("engine file is"), std::string::npos)
      << load_error(assemble(bytes, table));
}

TEST(EngineFileSections, HostileReplacedCountsAreRefused) {
  Plan p = make_plan();
  for (auto [op, times, want] :
       {std::tuple<std::string, int64_t, std::string>{"MatMul", 0, "replaced op 'MatMul' 0 times"},
        {"MatMul", -5, "replaced op 'MatMul' -5 times"},
        {"", 1, "replaced op '' 1 times"},
        {"MatMul", int64_t(1) << 31, "replaced op 'MatMul' 2147483648 times"}}) {
    p.graph.nodes[1].replaced = {{op, times}};
    // The writer does not judge: the reader does, behind valid checksums.
    std::vector<uint8_t> bytes = serialize(p);
    EXPECT_NE(
        load_error(bytes).find("engine file is corrupted: section GRPH: node 'matmul_1' " + want),
        std::string::npos)
        << load_error(bytes);
  }
}

TEST(EngineFileSections, Version1FileIsRefused) {
  // A version-1 header: 3 sections of {tag, offset, size, checksum}, valid header checksum.
  const std::string version = "0.1.0";
  const uint64_t header_size = 8 + 4 + 8 + version.size() + 4 + 4 + 8 + 8 + 4 + 3 * 28 + 8;
  const uint64_t file_size = (header_size + 63) / 64 * 64;
  ByteWriter w;
  w.bytes({reinterpret_cast<const uint8_t*>(kEngineMagic), 8});
  w.u32(1);
  w.str(version);
  w.u32(0);
  w.u32(0);
  w.u64(42);
  w.u64(file_size);
  w.u32(3);
  for (uint32_t tag : {kSectionMeta, kSectionGraph, kSectionWeights}) {
    w.u32(tag);
    w.u64(file_size);
    w.u64(0);
    w.u64(checksum64({}));
  }
  w.u64(checksum64(w.data()));
  ASSERT_EQ(w.size(), header_size);
  w.align(64);
  std::vector<uint8_t> v1 = w.take();
  const std::string want =
      "engine file format version 1 was written by an older kiln; this kiln reads versions 3 to 7: "
      "rebuild the engine from the ONNX model";
  EXPECT_EQ(load_error(v1), want);
  EXPECT_EQ(read_header(v1).status().message(), want);

  std::string path = ::testing::TempDir() + "/engine_file_sections_v1.kiln";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(v1.data(), 1, v1.size(), f), v1.size());
  std::fclose(f);
  auto r = load_file(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("version 1"), std::string::npos);
  EXPECT_NE(r.status().to_string().find("rebuild the engine"), std::string::npos);
  std::remove(path.c_str());
}

TEST(EngineFileSections, DuplicateTagsAreCorruption) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  std::vector<Piece> table = sections_of(bytes);
  table.push_back(table[2]);  // a second GRPH
  EXPECT_EQ(load_error(assemble(bytes, table)),
            "engine file is corrupted: header: section GRPH appears twice");
  table.pop_back();
  table.push_back({kTagExtra, 0, {}});
  table.push_back({kTagExtra, 0, some_bytes(3, 0)});
  EXPECT_EQ(load_error(assemble(bytes, table)),
            "engine file is corrupted: header: section XTRA appears twice");

  // The writer refuses to make such a file, or one whose backend tag kiln reserves or cannot name.
  Plan p = make_plan();
  p.backend_sections.push_back({kTagTimingCache, false, {}});
  auto r = try_serialize(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "cannot save plan: backend section TCCH appears twice");
  p = make_plan();
  p.backend_sections[0].tag = kSectionWeights;
  EXPECT_EQ(try_serialize(p).status().message(),
            "cannot save plan: backend section WGTS uses a tag kiln reserves");
  p.backend_sections[0].tag = section_tag('a', '-', 'b', 'c');
  EXPECT_NE(try_serialize(p).status().message().find("not four ASCII letters or digits"),
            std::string::npos);
}

TEST(EngineFileSections, CoreSectionsArePresentAndRequired) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  std::vector<Piece> table = sections_of(bytes);
  ASSERT_EQ(section_tag_name(table[1].tag), "NODE");
  std::vector<Piece> no_node = table;
  no_node.erase(no_node.begin() + 1);
  EXPECT_EQ(load_error(assemble(bytes, no_node)),
            "engine file is corrupted: header: has no section NODE");

  std::vector<Piece> optional_meta = table;
  optional_meta[0].flags = 0;
  EXPECT_EQ(load_error(assemble(bytes, optional_meta)),
            "engine file is corrupted: header: core section META is not marked required");

  std::vector<Piece> odd_flags = table;
  odd_flags[4].flags = 2;
  EXPECT_EQ(load_error(assemble(bytes, odd_flags)),
            "engine file is corrupted: header: section TCCH has unknown flags 2");
}

// Value plans sit in META after its u64 count, 9 bytes each: storage u8, slot i32, alias_of i32.
void set_value(std::vector<uint8_t>& bytes, size_t value, int storage, int32_t alias_of) {
  SectionEntry m = section(bytes, "META");
  size_t at = m.offset + 8 + 9 * value;
  if (storage >= 0) bytes[at] = uint8_t(storage);
  for (int k = 0; k < 4; ++k) bytes[at + 5 + k] = uint8_t(uint32_t(alias_of) >> (8 * k));
}

TEST(EngineFileSections, HostileAliasesAreRefused) {
  const std::vector<uint8_t> bytes = serialize(make_plan());
  struct Case {
    size_t value;
    int storage;  // -1: unchanged
    int32_t alias_of;
    std::string want;
  };
  const Case cases[] = {
      {4, -1, 4, "value 'unknown_rank' aliases itself"},
      {4, -1, 99, "value 'unknown_rank' aliases value 99 but there are 5 values"},
      {4, -1, -1, "value 'unknown_rank' has storage alias and alias_of -1"},
      {4, -1, -7, "value 'unknown_rank' has storage alias and alias_of -7"},
      {3, -1, 0, "value 'y' has storage output and alias_of 0"},
      {0, 6, -1, "unknown value storage 6"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bad = bytes;
    set_value(bad, c.value, c.storage, c.alias_of);
    reseal(bad);
    std::string msg = load_error(bad);
    EXPECT_NE(msg.find(c.want), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("engine file is corrupted: ", 0), 0u) << msg;
  }
  // y made an alias of x: then unknown_rank, which views y, views an alias.
  std::vector<uint8_t> bad = bytes;
  set_value(bad, 3, int(Storage::kAlias), 0);
  reseal(bad);
  EXPECT_NE(
      load_error(bad).find("value 'unknown_rank' aliases value 'y', which is itself an alias"),
      std::string::npos)
      << load_error(bad);

  // The writer holds plans to the same rules.
  Plan p = make_plan();
  p.values[4].alias_of = 4;
  EXPECT_EQ(try_serialize(p).status().message(),
            "cannot save plan: value 'unknown_rank' aliases itself");
  p = make_plan();
  p.values[2].alias_of = 0;
  EXPECT_FALSE(try_serialize(p).ok());
}

TEST(EngineFileSections, HostileNodePlansAreRefused) {
  const std::vector<uint8_t> bytes = serialize(make_plan());
  SectionEntry nd = section(bytes, "NODE");
  // NODE: count, then node 0 = impl "cpu.Shape" (8 + 9), tactic "" (8), compute u8, tf32 u8.
  const size_t compute_at = nd.offset + 8 + 8 + 9 + 8;
  ASSERT_EQ(bytes[compute_at], 0);
  std::vector<uint8_t> bad = bytes;
  bad[compute_at] = 200;
  reseal(bad);
  EXPECT_NE(load_error(bad).find("section NODE: node plan 0 computes in unknown dtype code 200"),
            std::string::npos)
      << load_error(bad);
  bad = bytes;
  bad[compute_at + 1] = 2;
  reseal(bad);
  EXPECT_NE(load_error(bad).find("is neither 0 nor 1"), std::string::npos) << load_error(bad);

  // A node plan without an implementation id, behind valid checksums.
  ByteWriter node;
  node.u64(2);
  for (int i = 0; i < 2; ++i) {
    node.str(i == 0 ? "cpu.Shape" : "");
    node.str("");
    node.u8(0);
    node.u8(0);
    node.str("");
    node.i64(-1);
  }
  std::vector<Piece> table = sections_of(bytes);
  table[1].bytes = node.data();
  EXPECT_NE(load_error(assemble(bytes, table)).find("names no implementation"), std::string::npos)
      << load_error(assemble(bytes, table));
  // One node plan short of the graph's two nodes.
  node = ByteWriter();
  node.u64(1);
  node.str("cpu.Shape");
  node.str("");
  node.u8(0);
  node.u8(0);
  node.str("");
  node.i64(-1);
  table[1].bytes = node.data();
  EXPECT_NE(load_error(assemble(bytes, table))
                .find("the plan has 1 node-plan entries but the graph has 2 nodes"),
            std::string::npos);
  // A workspace slot outside the arena, and one that is not even an int.
  for (int64_t slot : {int64_t(99), int64_t(-2), int64_t(1) << 40}) {
    node = ByteWriter();
    node.u64(2);
    for (int i = 0; i < 2; ++i) {
      node.str("cpu.Shape");
      node.str("");
      node.u8(0);
      node.u8(0);
      node.str("");
      node.i64(i == 1 ? slot : -1);
    }
    table[1].bytes = node.data();
    const std::string err = load_error(assemble(bytes, table));
    EXPECT_TRUE(err.find("workspace slot " + std::to_string(slot)) != std::string::npos) << err;
  }

  Plan p = make_plan();
  p.nodes[0].impl.clear();
  auto r = try_serialize(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("names no implementation"), std::string::npos)
      << r.status().message();
  p = make_plan();
  p.nodes[1].precision.compute = DType(200);
  EXPECT_FALSE(try_serialize(p).ok());
}

}  // namespace
}  // namespace kiln::plan

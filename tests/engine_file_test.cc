// Engine file format: full round trip of a hand-built plan, and refusal (never a crash) of
// truncated, corrupted, hostile, foreign and other-version files. Tests of the section table
// (tags, flags, order, backend sections) are in engine_file_sections_test.cc.
#include "plan/engine_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine_file_test_util.h"
#include "plan/byte_io.h"
#include "test_util.h"

namespace kiln::plan {
namespace {

using namespace engine_file_test;

TEST(EngineFile, RoundTripsEveryField) {
  Plan p = make_plan();
  auto bytes = try_serialize(p);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto loaded = load(*bytes);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_plan_eq(p, *loaded);
  // Every formula survived as an expression, not as a fresh symbol named after its text.
  const auto& yshape = *loaded->graph.values[3].shape;
  EXPECT_EQ(yshape[1].eval({{"batch", 2}, {"seq", 9}}), 10);
  EXPECT_EQ(yshape[2].eval({{"batch", 2}, {"seq", 9}}), 15);
  EXPECT_FALSE(loaded->graph.values[4].shape.has_value());
  // Writing the loaded plan again gives the same bytes: nothing was dropped or reordered.
  EXPECT_EQ(serialize(*loaded), *bytes);
}

TEST(EngineFile, HeaderAndAlignedWeights) {
  Plan p = make_plan();
  std::vector<uint8_t> bytes = serialize(p);
  ASSERT_FALSE(bytes.empty());
  auto h = read_header(bytes);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->format_version, kFormatVersion);
  EXPECT_EQ(h->kiln_version, "0.1.0");
  EXPECT_EQ(h->device, Device::kCUDA);
  EXPECT_EQ(h->builder_flags, 0x5u);
  EXPECT_EQ(h->model_hash, 0x0123456789abcdefull);
  EXPECT_EQ(h->file_size, bytes.size());
  ASSERT_EQ(h->num_sections, 6u);
  const char* names[] = {"META", "NODE", "GRPH", "WGTS", "TCCH", "PREP"};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(section_tag_name(h->sections[i].tag), names[i]);
    EXPECT_EQ(h->sections[i].required(), i != 4) << names[i];  // TCCH is the optional one
    EXPECT_EQ(h->sections[i].flags & ~kSectionRequired, 0u);
    EXPECT_EQ(h->sections[i].offset % 64, 0u);
  }
  EXPECT_EQ(std::memcmp(bytes.data(), "KILNENG\0", 8), 0);
  // The weight tensor's bytes sit in WGTS at a 64-byte aligned file offset.
  const Tensor& w = *p.graph.values[1].constant;
  SectionEntry wg = h->sections[3];
  size_t at = find_bytes(bytes, wg.offset, w.data(), w.nbytes());
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(at % 64, 0u);
  EXPECT_LE(at + w.nbytes(), wg.offset + wg.size);
}

TEST(EngineFile, SaveAndLoadFile) {
  Plan p = make_plan();
  std::string path = ::testing::TempDir() + "/engine_file_test_plan.kiln";
  ASSERT_TRUE(save_file(p, path).ok());
  auto loaded = load_file(path, kBackendTags);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_plan_eq(p, *loaded);
  // Without the backend's tags the required backend section refuses the file, naming the path.
  auto refused = load_file(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("section 'PREP'"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().to_string().find(path), std::string::npos)
      << refused.status().to_string();
  std::remove(path.c_str());
}

TEST(EngineFile, MissingFileIsNotFound) {
  std::string path = ::testing::TempDir() + "/no_such_dir_kiln/missing.kiln";
  auto loaded = load_file(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find(path), std::string::npos) << loaded.status().message();
}

TEST(EngineFile, EveryTruncationIsRefused) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  ASSERT_GT(bytes.size(), 256u);
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto r = load(std::span<const uint8_t>(bytes).first(len));
    ASSERT_FALSE(r.ok()) << "prefix of " << len << " bytes loaded";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << len;
  }
  auto r = load(std::span<const uint8_t>(bytes).first(bytes.size() - 1));
  EXPECT_EQ(r.status().message(), "engine file is truncated: expected " +
                                      std::to_string(bytes.size()) + " bytes, found " +
                                      std::to_string(bytes.size() - 1));
  auto h = read_header(std::span<const uint8_t>(bytes).first(20));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("engine file is truncated"), std::string::npos)
      << h.status().message();
  // A trailing extra byte is refused too.
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(load(longer).ok());
}

TEST(EngineFile, EveryFlippedByteIsDetected) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80)}) {
      std::vector<uint8_t> bad = bytes;
      bad[i] ^= mask;
      auto r = load(bad);
      ASSERT_FALSE(r.ok()) << "flip of byte " << i << " with mask " << int(mask) << " loaded";
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << i;
    }
  }
  for (const char* tag : {"META", "NODE", "GRPH", "WGTS", "TCCH"}) {  // PREP is empty
    SectionEntry e = section(bytes, tag);
    std::vector<uint8_t> bad = bytes;
    bad[e.offset + e.size / 2] ^= 0x10;
    auto r = load(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              std::string("engine file is corrupted: checksum mismatch in section ") + tag);
  }
  std::vector<uint8_t> bad = bytes;
  bad[40] ^= 0x02;  // inside the header fields
  EXPECT_EQ(load(bad).status().message(), "engine file is corrupted: header checksum mismatch");
}

TEST(EngineFile, BadMagicAndNewerVersion) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'P';
  EXPECT_EQ(deserialize(bad).status().message(), "not a kiln engine file (bad magic)");
  std::vector<uint8_t> text = {'{', '"', 'a', '"', ':', '1', '}', '\n', 0, 0, 0, 0};
  EXPECT_EQ(read_header(text).status().message(), "not a kiln engine file (bad magic)");
  EXPECT_FALSE(deserialize({}).ok());

  bad = bytes;
  bad[8] = 8;  // format version, little-endian u32 right after the magic
  auto r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      r.status().message(),
      "engine file format version 8 was written by a newer kiln; this kiln reads versions 3 to 7: "
      "rebuild the engine from the ONNX model with this kiln (0.1.0)");
}

TEST(EngineFile, HostileCountsAreRefusedBeforeAllocating) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  SectionEntry g = section(bytes, "GRPH");
  SectionEntry m = section(bytes, "META");
  SectionEntry nd = section(bytes, "NODE");
  // GRPH opens with the graph name ("tiny"), then the opset count (2), two opsets, the value count.
  ASSERT_EQ(get_u64(bytes, g.offset), 4u);
  ASSERT_EQ(get_u64(bytes, g.offset + 12), 2u);
  size_t values_at = g.offset + 12 + 8 + (8 + 0 + 8) + (8 + 13 + 8);
  ASSERT_EQ(get_u64(bytes, values_at), 5u);
  // META opens with the value-plan count, NODE with the node-plan count, then the first impl id.
  ASSERT_EQ(get_u64(bytes, m.offset), 5u);
  ASSERT_EQ(get_u64(bytes, nd.offset), 2u);
  ASSERT_EQ(get_u64(bytes, nd.offset + 8), std::string("cpu.Shape").size());

  const uint64_t huge = uint64_t(1) << 60;
  for (size_t at : {size_t(g.offset), size_t(g.offset + 12), values_at, size_t(m.offset),
                    size_t(nd.offset), size_t(nd.offset + 8)}) {
    std::vector<uint8_t> bad = bytes;
    put_u64(bad, at, huge);
    reseal(bad);
    auto r = load(bad);
    ASSERT_FALSE(r.ok()) << at;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("1152921504606846976"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("engine file is corrupted"), std::string::npos);
  }
  // Resealing an unmodified file changes nothing, so the edits above were what got refused.
  std::vector<uint8_t> same = bytes;
  reseal(same);
  EXPECT_EQ(same, bytes);
}

TEST(EngineFile, HostileContentBehindValidChecksums) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  SectionEntry g = section(bytes, "GRPH");

  // An unparsable shape formula.
  std::vector<uint8_t> bad = bytes;
  size_t at = find_bytes(bad, g.offset, "seq + 1", 7);
  ASSERT_NE(at, std::string::npos);
  bad[at + 4] = '@';
  reseal(bad);
  auto r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unparsable shape formula 'seq @ 1'"), std::string::npos)
      << r.status().message();

  // The graph output index (the last i32 of GRPH) pointing past the value table.
  bad = bytes;
  size_t last = g.offset + g.size - 4;
  ASSERT_EQ(bad[last], 3);
  bad[last] = 99;
  reseal(bad);
  r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("refers to value 99"), std::string::npos)
      << r.status().message();

  // The weight tensor's dims made huge: numel * 4 overflows, checked before any allocation.
  // Its record is dtype 1, rank 2, dims 8 and 4.
  uint8_t rec[1 + 8 * 3] = {};
  rec[0] = 1;
  rec[1] = 2;
  rec[9] = 8;
  rec[17] = 4;
  at = find_bytes(bytes, g.offset, rec, sizeof(rec));
  ASSERT_NE(at, std::string::npos);
  bad = bytes;
  put_u64(bad, at + 9, uint64_t(1) << 40);
  put_u64(bad, at + 17, uint64_t(1) << 40);
  reseal(bad);
  r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("negative or overflows"), std::string::npos)
      << r.status().message();
  // Same tensor, a plausible shape whose size disagrees with the recorded byte count.
  bad = bytes;
  put_u64(bad, at + 9, 1000);
  reseal(bad);
  r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs 16000 bytes but records 128"), std::string::npos)
      << r.status().message();
  // Its offset moved out of the weight section.
  bad = bytes;
  put_u64(bad, at + 25, uint64_t(1) << 62);
  reseal(bad);
  r = load(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("section WGTS"), std::string::npos) << r.status().message();
}

// Random edits inside META, NODE and GRPH with checksums fixed up reach every parser path; each
// must end in a clean error or in a plan that is valid enough to be written and read back.
TEST(EngineFile, RandomEditsBehindValidChecksumsNeverCrash) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  const SectionEntry sections[] = {section(bytes, "META"), section(bytes, "NODE"),
                                   section(bytes, "GRPH")};
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  int refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bad = bytes;
    int edits = 1 + int(next() % 3);
    for (int k = 0; k < edits; ++k) {
      const SectionEntry& e = sections[next() % 3];
      size_t at = e.offset + next() % e.size;
      bad[at] = next() % 4 == 0 ? uint8_t(0xff) : uint8_t(next());
    }
    reseal(bad);
    auto r = load(bad);
    if (!r.ok()) {
      ++refused;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
      continue;
    }
    auto again = try_serialize(*r);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(load(*again).ok());
  }
  EXPECT_GT(refused, 1000);
}

TEST(EngineFile, SaveRefusesInconsistentPlans) {
  Plan p = make_plan();
  p.nodes.pop_back();
  auto r = try_serialize(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 node-plan entries but the graph has 2 nodes"),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(serialize(p).empty());
  std::string path = ::testing::TempDir() + "/engine_file_test_bad.kiln";
  EXPECT_FALSE(save_file(p, path).ok());

  p = make_plan();
  p.values[2].slot = 7;
  r = try_serialize(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("arena slot 7 but there are 2 slots"), std::string::npos)
      << r.status().message();

  p = make_plan();
  p.graph.nodes[1].inputs[0] = 5;
  EXPECT_FALSE(try_serialize(p).ok());
}

}  // namespace
}  // namespace kiln::plan

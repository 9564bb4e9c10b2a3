// Engine file format: full round trip of a hand-built plan, and refusal (never a crash) of
// truncated, corrupted, hostile, foreign and future-version files.
#include "plan/engine_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "plan/byte_io.h"
#include "test_util.h"

namespace kiln::plan {
namespace {

using ir::Dim;

ir::Attribute attr_float(float f) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = f;
  return a;
}

// A subgraph with its own constant, so nested tensors also go through the weight section.
std::shared_ptr<ir::Graph> make_body(const std::string& name) {
  auto g = std::make_shared<ir::Graph>();
  g->name = name;
  int c = g->add_value(name + "_c");
  g->values[c].dtype = DType::kInt64;
  g->values[c].shape = std::vector<Dim>{3};
  g->values[c].constant = testing::make_i64({3}, {1, -2, 3});
  int o = g->add_value(name + "_out");
  g->values[o].dtype = DType::kInt64;
  ir::Node n;
  n.name = name + "_id";
  n.op_type = "Identity";
  n.inputs = {c};
  n.outputs = {o};
  g->values[o].producer = 0;
  g->nodes.push_back(n);
  g->outputs = {o};
  return g;
}

Plan make_plan() {
  Plan p;
  p.device = Device::kCUDA;
  p.builder_flags = 0x5;
  p.model_hash = 0x0123456789abcdefull;
  p.kiln_version = "0.1.0";

  ir::Graph& g = p.graph;
  g.name = "tiny";
  g.opsets = {{"", 17}, {"com.microsoft", 1}};
  Dim batch = Dim::symbol("batch"), seq = Dim::symbol("seq");

  int x = g.add_value("x");
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<Dim>{batch, seq + 1, 8};
  int w = g.add_value("w");
  g.values[w].dtype = DType::kFloat32;
  g.values[w].shape = std::vector<Dim>{8, 4};
  std::vector<float> wdata(32);
  for (int i = 0; i < 32; ++i) wdata[i] = 0.5f * float(i) - 3.0f;
  g.values[w].constant = testing::make_f32({8, 4}, wdata);
  int sh = g.add_value("x_shape");
  g.values[sh].dtype = DType::kInt64;
  g.values[sh].shape = std::vector<Dim>{3};
  g.values[sh].sym_value = std::vector<Dim>{batch, seq + 1, 8};
  g.values[sh].producer = 0;
  int y = g.add_value("y");
  g.values[y].dtype = DType::kFloat32;
  g.values[y].shape = std::vector<Dim>{batch, seq + 1, Dim::floor_div(seq, Dim(2)) * 4 - 1};
  g.values[y].producer = 1;
  int u = g.add_value("unknown_rank");  // dtype and rank not known: both must survive as such
  g.values[u].producer = 1;

  ir::Node shape_node;
  shape_node.name = "shape_0";
  shape_node.op_type = "Shape";
  shape_node.opset = 17;
  shape_node.inputs = {x};
  shape_node.outputs = {sh};
  g.nodes.push_back(shape_node);

  ir::Node mm;
  mm.name = "matmul_1";
  mm.op_type = "FusedMatMul";
  mm.domain = "com.microsoft";
  mm.opset = 1;
  mm.inputs = {x, w, -1};
  mm.outputs = {y, -1, u};
  mm.attrs.set("alpha", attr_float(0.25f));
  ir::Attribute a;
  a.type = ir::AttrType::kInt;
  a.i = -(int64_t(1) << 40);
  mm.attrs.set("axis", a);
  a = {};
  a.type = ir::AttrType::kString;
  a.s = std::string("fa\0st", 5);
  mm.attrs.set("mode", a);
  a = {};
  a.type = ir::AttrType::kTensor;
  a.t = testing::make_i64({2}, {7, -9});
  mm.attrs.set("value", a);
  a = {};
  a.type = ir::AttrType::kFloats;
  a.floats = {1.5f, -2.0f, 1e-30f};
  mm.attrs.set("scales", a);
  a = {};
  a.type = ir::AttrType::kInts;
  a.ints = {0, 2, 1, -1};
  mm.attrs.set("perm", a);
  a = {};
  a.type = ir::AttrType::kStrings;
  a.strings = {"a", "", "ccc"};
  mm.attrs.set("names", a);
  a = {};
  a.type = ir::AttrType::kTensors;
  a.tensors = {testing::make_f32({2, 2}, {1, 2, 3, 4}), Tensor::zeros(DType::kInt8, {0, 3}).value(),
               Tensor()};
  mm.attrs.set("tensors", a);
  a = {};
  a.type = ir::AttrType::kGraph;
  a.g = make_body("then");
  mm.attrs.set("then_branch", a);
  a = {};
  a.type = ir::AttrType::kGraphs;
  a.graphs = {make_body("g0"), nullptr};
  mm.attrs.set("branches", a);
  g.nodes.push_back(mm);
  g.inputs = {x};
  g.outputs = {y};

  p.values = {{Storage::kInput, -1},
              {Storage::kConstant, -1},
              {Storage::kSymbolic, 0},
              {Storage::kOutput, -1},
              {Storage::kActivation, 1}};
  p.kernels = {"cpu.shape", "cpu.matmul.ref"};
  p.precisions = {"fp32", "fp16"};
  p.slot_bytes = {24, batch * (seq + 1) * 32};

  Profile p0;
  p0.inputs = {{"x", {1, 1, 8}, {4, 16, 8}, {8, 64, 8}}};
  p0.symbols = {{"batch", {1, 8}}, {"seq", {0, 63}}};
  Profile p1;
  p1.inputs = {{"x", {16, 2, 8}, {32, 2, 8}, {64, 2, 8}}};
  p1.symbols = {{"batch", {16, 64}}, {"seq", {1, 1}}};
  p.profiles = {p0, p1};
  return p;
}

void expect_tensor_eq(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.empty(), b.empty()) << what;
  if (a.empty()) return;
  EXPECT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
}

void expect_dims_eq(const std::optional<std::vector<Dim>>& a,
                    const std::optional<std::vector<Dim>>& b, const std::string& what) {
  ASSERT_EQ(a.has_value(), b.has_value()) << what;
  if (!a) return;
  ASSERT_EQ(a->size(), b->size()) << what;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i], (*b)[i]) << what << " dim " << i << ": " << (*a)[i].to_string() << " vs "
                                << (*b)[i].to_string();
  }
}

void expect_graph_eq(const ir::Graph& a, const ir::Graph& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.opsets, b.opsets);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.outputs, b.outputs);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    const ir::Value &va = a.values[i], &vb = b.values[i];
    EXPECT_EQ(va.name, vb.name);
    EXPECT_EQ(va.dtype, vb.dtype) << va.name;
    EXPECT_EQ(va.producer, vb.producer) << va.name;
    expect_dims_eq(va.shape, vb.shape, va.name + " shape");
    expect_dims_eq(va.sym_value, vb.sym_value, va.name + " sym_value");
    ASSERT_EQ(va.constant.has_value(), vb.constant.has_value()) << va.name;
    if (va.constant) expect_tensor_eq(*va.constant, *vb.constant, va.name);
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const ir::Node &na = a.nodes[i], &nb = b.nodes[i];
    EXPECT_EQ(na.name, nb.name);
    EXPECT_EQ(na.op_type, nb.op_type);
    EXPECT_EQ(na.domain, nb.domain);
    EXPECT_EQ(na.opset, nb.opset);
    EXPECT_EQ(na.inputs, nb.inputs);
    EXPECT_EQ(na.outputs, nb.outputs);
    ASSERT_EQ(na.attrs.all().size(), nb.attrs.all().size()) << na.name;
    for (const auto& [name, x] : na.attrs.all()) {
      const ir::Attribute* y = nb.attrs.find(name);
      ASSERT_NE(y, nullptr) << name;
      ASSERT_EQ(x.type, y->type) << name;
      switch (x.type) {
        case ir::AttrType::kFloat:
          EXPECT_EQ(x.f, y->f) << name;
          break;
        case ir::AttrType::kInt:
          EXPECT_EQ(x.i, y->i) << name;
          break;
        case ir::AttrType::kString:
          EXPECT_EQ(x.s, y->s) << name;
          break;
        case ir::AttrType::kTensor:
          expect_tensor_eq(x.t, y->t, name);
          break;
        case ir::AttrType::kFloats:
          EXPECT_EQ(x.floats, y->floats) << name;
          break;
        case ir::AttrType::kInts:
          EXPECT_EQ(x.ints, y->ints) << name;
          break;
        case ir::AttrType::kStrings:
          EXPECT_EQ(x.strings, y->strings) << name;
          break;
        case ir::AttrType::kTensors:
          ASSERT_EQ(x.tensors.size(), y->tensors.size()) << name;
          for (size_t k = 0; k < x.tensors.size(); ++k) {
            expect_tensor_eq(x.tensors[k], y->tensors[k], name);
          }
          break;
        case ir::AttrType::kGraph:
          ASSERT_EQ(x.g != nullptr, y->g != nullptr) << name;
          if (x.g) expect_graph_eq(*x.g, *y->g);
          break;
        case ir::AttrType::kGraphs:
          ASSERT_EQ(x.graphs.size(), y->graphs.size()) << name;
          for (size_t k = 0; k < x.graphs.size(); ++k) {
            ASSERT_EQ(x.graphs[k] != nullptr, y->graphs[k] != nullptr) << name;
            if (x.graphs[k]) expect_graph_eq(*x.graphs[k], *y->graphs[k]);
          }
          break;
      }
    }
  }
}

void expect_plan_eq(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.builder_flags, b.builder_flags);
  EXPECT_EQ(a.model_hash, b.model_hash);
  EXPECT_EQ(a.kiln_version, b.kiln_version);
  expect_graph_eq(a.graph, b.graph);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    EXPECT_EQ(a.values[i].storage, b.values[i].storage) << i;
    EXPECT_EQ(a.values[i].slot, b.values[i].slot) << i;
  }
  EXPECT_EQ(a.kernels, b.kernels);
  EXPECT_EQ(a.precisions, b.precisions);
  expect_dims_eq(a.slot_bytes, b.slot_bytes, "slot_bytes");
  ASSERT_EQ(a.profiles.size(), b.profiles.size());
  for (size_t i = 0; i < a.profiles.size(); ++i) {
    const Profile &pa = a.profiles[i], &pb = b.profiles[i];
    ASSERT_EQ(pa.inputs.size(), pb.inputs.size());
    for (size_t k = 0; k < pa.inputs.size(); ++k) {
      EXPECT_EQ(pa.inputs[k].name, pb.inputs[k].name);
      EXPECT_EQ(pa.inputs[k].min, pb.inputs[k].min);
      EXPECT_EQ(pa.inputs[k].opt, pb.inputs[k].opt);
      EXPECT_EQ(pa.inputs[k].max, pb.inputs[k].max);
    }
    ASSERT_EQ(pa.symbols.size(), pb.symbols.size());
    for (const auto& [name, r] : pa.symbols) {
      auto it = pb.symbols.find(name);
      ASSERT_NE(it, pb.symbols.end()) << name;
      EXPECT_EQ(r.lo, it->second.lo) << name;
      EXPECT_EQ(r.hi, it->second.hi) << name;
    }
  }
}

// Recomputes every section checksum and the header checksum after a test edits a payload, so the
// edit reaches the parser instead of being caught by a checksum.
void reseal(std::vector<uint8_t>& bytes) {
  // The header checksum no longer matches after an edit, so locate the table from the layout.
  uint64_t vlen = 0;
  for (int k = 0; k < 8; ++k) vlen |= uint64_t(bytes[12 + k]) << (8 * k);
  size_t table = 12 + 8 + vlen + 4 + 4 + 8 + 8 + 4;
  uint32_t nsec = bytes[table - 4];
  for (uint32_t i = 0; i < nsec; ++i) {
    size_t e = table + i * 28;
    uint64_t off = 0, size = 0;
    for (int k = 0; k < 8; ++k) off |= uint64_t(bytes[e + 4 + k]) << (8 * k);
    for (int k = 0; k < 8; ++k) size |= uint64_t(bytes[e + 12 + k]) << (8 * k);
    uint64_t sum = checksum64(std::span<const uint8_t>(bytes).subspan(off, size));
    for (int k = 0; k < 8; ++k) bytes[e + 20 + k] = uint8_t(sum >> (8 * k));
  }
  size_t hend = table + nsec * 28;
  uint64_t sum = checksum64(std::span<const uint8_t>(bytes).first(hend));
  for (int k = 0; k < 8; ++k) bytes[hend + k] = uint8_t(sum >> (8 * k));
}

SectionEntry section(const std::vector<uint8_t>& bytes, const char* tag) {
  auto h = read_header(bytes);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  for (const SectionEntry& e : h->sections) {
    if (section_tag_name(e.tag) == tag) return e;
  }
  ADD_FAILURE() << "no section " << tag;
  return {};
}

void put_u64(std::vector<uint8_t>& bytes, size_t at, uint64_t v) {
  for (int k = 0; k < 8; ++k) bytes[at + k] = uint8_t(v >> (8 * k));
}
uint64_t get_u64(const std::vector<uint8_t>& bytes, size_t at) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= uint64_t(bytes[at + k]) << (8 * k);
  return v;
}

size_t find_bytes(const std::vector<uint8_t>& hay, size_t from, const void* needle, size_t n) {
  for (size_t i = from; i + n <= hay.size(); ++i) {
    if (std::memcmp(hay.data() + i, needle, n) == 0) return i;
  }
  return std::string::npos;
}

TEST(EngineFile, RoundTripsEveryField) {
  Plan p = make_plan();
  auto bytes = try_serialize(p);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto loaded = deserialize(*bytes);
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
  ASSERT_EQ(h->num_sections, 3u);
  EXPECT_EQ(section_tag_name(h->sections[0].tag), "META");
  EXPECT_EQ(section_tag_name(h->sections[1].tag), "GRPH");
  EXPECT_EQ(section_tag_name(h->sections[2].tag), "WGTS");
  for (const SectionEntry& e : h->sections) EXPECT_EQ(e.offset % 64, 0u);
  EXPECT_EQ(std::memcmp(bytes.data(), "KILNENG\0", 8), 0);
  // The weight tensor's bytes sit in WGTS at a 64-byte aligned file offset.
  const Tensor& w = *p.graph.values[1].constant;
  SectionEntry wg = h->sections[2];
  size_t at = find_bytes(bytes, wg.offset, w.data(), w.nbytes());
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(at % 64, 0u);
  EXPECT_LE(at + w.nbytes(), wg.offset + wg.size);
}

TEST(EngineFile, SaveAndLoadFile) {
  Plan p = make_plan();
  std::string path = ::testing::TempDir() + "/engine_file_test_plan.kiln";
  ASSERT_TRUE(save_file(p, path).ok());
  auto loaded = load_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_plan_eq(p, *loaded);
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
    auto r = deserialize(std::span<const uint8_t>(bytes).first(len));
    ASSERT_FALSE(r.ok()) << "prefix of " << len << " bytes loaded";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << len;
  }
  auto r = deserialize(std::span<const uint8_t>(bytes).first(bytes.size() - 1));
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
  EXPECT_FALSE(deserialize(longer).ok());
}

TEST(EngineFile, EveryFlippedByteIsDetected) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80)}) {
      std::vector<uint8_t> bad = bytes;
      bad[i] ^= mask;
      auto r = deserialize(bad);
      ASSERT_FALSE(r.ok()) << "flip of byte " << i << " with mask " << int(mask) << " loaded";
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << i;
    }
  }
  for (const char* tag : {"META", "GRPH", "WGTS"}) {
    SectionEntry e = section(bytes, tag);
    std::vector<uint8_t> bad = bytes;
    bad[e.offset + e.size / 2] ^= 0x10;
    auto r = deserialize(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              std::string("engine file is corrupted: checksum mismatch in section ") + tag);
  }
  std::vector<uint8_t> bad = bytes;
  bad[40] ^= 0x02;  // inside the header fields
  EXPECT_EQ(deserialize(bad).status().message(),
            "engine file is corrupted: header checksum mismatch");
}

TEST(EngineFile, BadMagicAndFutureVersion) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'P';
  EXPECT_EQ(deserialize(bad).status().message(), "not a kiln engine file (bad magic)");
  std::vector<uint8_t> text = {'{', '"', 'a', '"', ':', '1', '}', '\n', 0, 0, 0, 0};
  EXPECT_EQ(read_header(text).status().message(), "not a kiln engine file (bad magic)");
  EXPECT_FALSE(deserialize({}).ok());

  bad = bytes;
  bad[8] = 7;  // format version, little-endian u32 right after the magic
  auto r = deserialize(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "engine file format version 7 is not supported by this kiln (supports 1); rebuild the "
            "engine with kiln 0.1.0");
}

TEST(EngineFile, HostileCountsAreRefusedBeforeAllocating) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  SectionEntry g = section(bytes, "GRPH");
  SectionEntry m = section(bytes, "META");
  // GRPH opens with the graph name ("tiny"), then the opset count (2), two opsets, the value count.
  ASSERT_EQ(get_u64(bytes, g.offset), 4u);
  ASSERT_EQ(get_u64(bytes, g.offset + 12), 2u);
  size_t values_at = g.offset + 12 + 8 + (8 + 0 + 8) + (8 + 13 + 8);
  ASSERT_EQ(get_u64(bytes, values_at), 5u);
  // META opens with the value-plan count.
  ASSERT_EQ(get_u64(bytes, m.offset), 5u);

  const uint64_t huge = uint64_t(1) << 60;
  for (size_t at : {size_t(g.offset), size_t(g.offset + 12), values_at, size_t(m.offset)}) {
    std::vector<uint8_t> bad = bytes;
    put_u64(bad, at, huge);
    reseal(bad);
    auto r = deserialize(bad);
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
  auto r = deserialize(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unparsable shape formula 'seq @ 1'"), std::string::npos)
      << r.status().message();

  // The graph output index (the last i32 of GRPH) pointing past the value table.
  bad = bytes;
  size_t last = g.offset + g.size - 4;
  ASSERT_EQ(bad[last], 3);
  bad[last] = 99;
  reseal(bad);
  r = deserialize(bad);
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
  r = deserialize(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("negative or overflows"), std::string::npos)
      << r.status().message();
  // Same tensor, a plausible shape whose size disagrees with the recorded byte count.
  bad = bytes;
  put_u64(bad, at + 9, 1000);
  reseal(bad);
  r = deserialize(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs 16000 bytes but records 128"), std::string::npos)
      << r.status().message();
  // Its offset moved out of the weight section.
  bad = bytes;
  put_u64(bad, at + 25, uint64_t(1) << 62);
  reseal(bad);
  r = deserialize(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("section WGTS"), std::string::npos) << r.status().message();
}

// Random edits inside META and GRPH with checksums fixed up reach every parser path; each must end
// in a clean error or in a plan that is valid enough to be written and read back.
TEST(EngineFile, RandomEditsBehindValidChecksumsNeverCrash) {
  std::vector<uint8_t> bytes = serialize(make_plan());
  SectionEntry m = section(bytes, "META");
  SectionEntry g = section(bytes, "GRPH");
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
      const SectionEntry& e = next() % 2 ? m : g;
      size_t at = e.offset + next() % e.size;
      bad[at] = next() % 4 == 0 ? uint8_t(0xff) : uint8_t(next());
    }
    reseal(bad);
    auto r = deserialize(bad);
    if (!r.ok()) {
      ++refused;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
      continue;
    }
    auto again = try_serialize(*r);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(deserialize(*again).ok());
  }
  EXPECT_GT(refused, 1000);
}

TEST(EngineFile, SaveRefusesInconsistentPlans) {
  Plan p = make_plan();
  p.kernels.pop_back();
  auto r = try_serialize(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 kernel entries but the graph has 2 nodes"),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(serialize(p).empty());
  std::string path = ::testing::TempDir() + "/engine_file_test_bad.kiln";
  EXPECT_FALSE(save_file(p, path).ok());

  p = make_plan();
  p.values[4].slot = 7;
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

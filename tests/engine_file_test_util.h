// Shared by the engine file tests: a hand-built plan touching every field of the format, deep
// comparisons, and byte-level tools to edit a serialized file behind valid checksums (reseal) or
// to re-assemble it from its sections (sections_of, assemble).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "plan/byte_io.h"
#include "plan/engine_file.h"
#include "test_util.h"

namespace kiln::plan::engine_file_test {

using ir::Dim;

// The tags of the backend sections make_plan carries, and a load that knows them.
inline constexpr uint32_t kTagTimingCache = section_tag('T', 'C', 'C', 'H');
inline constexpr uint32_t kTagPrepared = section_tag('P', 'R', 'E', 'P');
inline constexpr uint32_t kBackendTags[] = {kTagTimingCache, kTagPrepared};
inline StatusOr<Plan> load(std::span<const uint8_t> bytes) {
  return deserialize(bytes, kBackendTags);
}

inline ir::Attribute attr_float(float f) {
  ir::Attribute a;
  a.type = ir::AttrType::kFloat;
  a.f = f;
  return a;
}

// A subgraph with its own constant, so nested tensors also go through the weight section.
inline std::shared_ptr<ir::Graph> make_body(const std::string& name) {
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

inline Plan make_plan() {
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
  mm.replaced = {{"MatMul", 1}, {"Mul", 2}, {"Softmax", int64_t(1) << 30}};  // a fused node
  g.nodes.push_back(mm);
  g.inputs = {x};
  g.outputs = {y};

  p.values = {{Storage::kInput, -1, -1},
              {Storage::kConstant, -1, -1},
              {Storage::kSymbolic, 0, -1},
              {Storage::kOutput, -1, -1},
              {Storage::kAlias, -1, 3}};  // unknown_rank views y's bytes
  p.nodes = {{"cpu.Shape", "", {}, ""},
             {"cuda.cublaslt.MatMul", "algo=3 split_k=2", {DType::kFloat32, true}, "NHWC"}};
  p.slot_bytes = {24, batch * (seq + 1) * 32};

  Profile p0;
  p0.inputs = {{"x", {1, 1, 8}, {4, 16, 8}, {8, 64, 8}}};
  p0.symbols = {{"batch", {1, 8}}, {"seq", {0, 63}}};
  Profile p1;
  p1.inputs = {{"x", {16, 2, 8}, {32, 2, 8}, {64, 2, 8}}};
  p1.symbols = {{"batch", {16, 64}}, {"seq", {1, 1}}};
  p.profiles = {p0, p1};

  // One optional and one required backend section; an empty payload must survive too.
  std::vector<uint8_t> cache(100);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = uint8_t(i * 7 + 1);
  p.backend_sections = {{kTagTimingCache, false, cache}, {kTagPrepared, true, {}}};
  return p;
}

inline void expect_tensor_eq(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.empty(), b.empty()) << what;
  if (a.empty()) return;
  EXPECT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
}

inline void expect_dims_eq(const std::optional<std::vector<Dim>>& a,
                           const std::optional<std::vector<Dim>>& b, const std::string& what) {
  ASSERT_EQ(a.has_value(), b.has_value()) << what;
  if (!a) return;
  ASSERT_EQ(a->size(), b->size()) << what;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i], (*b)[i]) << what << " dim " << i << ": " << (*a)[i].to_string() << " vs "
                                << (*b)[i].to_string();
  }
}

inline void expect_graph_eq(const ir::Graph& a, const ir::Graph& b) {
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
    EXPECT_EQ(na.replaced, nb.replaced) << na.name;
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

inline void expect_plan_eq(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.builder_flags, b.builder_flags);
  EXPECT_EQ(a.model_hash, b.model_hash);
  EXPECT_EQ(a.kiln_version, b.kiln_version);
  expect_graph_eq(a.graph, b.graph);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    EXPECT_EQ(a.values[i].storage, b.values[i].storage) << i;
    EXPECT_EQ(a.values[i].slot, b.values[i].slot) << i;
    EXPECT_EQ(a.values[i].alias_of, b.values[i].alias_of) << i;
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    EXPECT_EQ(a.nodes[i].impl, b.nodes[i].impl) << i;
    EXPECT_EQ(a.nodes[i].tactic, b.nodes[i].tactic) << i;
    EXPECT_EQ(a.nodes[i].precision, b.nodes[i].precision) << i;
    EXPECT_EQ(a.nodes[i].layout, b.nodes[i].layout) << i;
  }
  ASSERT_EQ(a.backend_sections.size(), b.backend_sections.size());
  for (size_t i = 0; i < a.backend_sections.size(); ++i) {
    EXPECT_EQ(a.backend_sections[i].tag, b.backend_sections[i].tag) << i;
    EXPECT_EQ(a.backend_sections[i].required, b.backend_sections[i].required) << i;
    EXPECT_EQ(a.backend_sections[i].bytes, b.backend_sections[i].bytes) << i;
  }
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
inline void reseal(std::vector<uint8_t>& bytes) {
  // The header checksum no longer matches after an edit, so locate the table from the layout.
  uint64_t vlen = 0;
  for (int k = 0; k < 8; ++k) vlen |= uint64_t(bytes[12 + k]) << (8 * k);
  size_t table = 12 + 8 + vlen + 4 + 4 + 8 + 8 + 4;
  uint32_t nsec = bytes[table - 4];
  for (uint32_t i = 0; i < nsec; ++i) {
    size_t e = table + i * 32;  // tag u32, flags u32, offset, size, checksum
    uint64_t off = 0, size = 0;
    for (int k = 0; k < 8; ++k) off |= uint64_t(bytes[e + 8 + k]) << (8 * k);
    for (int k = 0; k < 8; ++k) size |= uint64_t(bytes[e + 16 + k]) << (8 * k);
    uint64_t sum = checksum64(std::span<const uint8_t>(bytes).subspan(off, size));
    for (int k = 0; k < 8; ++k) bytes[e + 24 + k] = uint8_t(sum >> (8 * k));
  }
  size_t hend = table + nsec * 32;
  uint64_t sum = checksum64(std::span<const uint8_t>(bytes).first(hend));
  for (int k = 0; k < 8; ++k) bytes[hend + k] = uint8_t(sum >> (8 * k));
}

inline SectionEntry section(const std::vector<uint8_t>& bytes, const char* tag) {
  auto h = read_header(bytes);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  for (const SectionEntry& e : h->sections) {
    if (section_tag_name(e.tag) == tag) return e;
  }
  ADD_FAILURE() << "no section " << tag;
  return {};
}

inline void put_u64(std::vector<uint8_t>& bytes, size_t at, uint64_t v) {
  for (int k = 0; k < 8; ++k) bytes[at + k] = uint8_t(v >> (8 * k));
}
inline uint64_t get_u64(const std::vector<uint8_t>& bytes, size_t at) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= uint64_t(bytes[at + k]) << (8 * k);
  return v;
}

inline size_t find_bytes(const std::vector<uint8_t>& hay, size_t from, const void* needle,
                         size_t n) {
  for (size_t i = from; i + n <= hay.size(); ++i) {
    if (std::memcmp(hay.data() + i, needle, n) == 0) return i;
  }
  return std::string::npos;
}

// One section of a file: what assemble lays out.
struct Piece {
  uint32_t tag = 0;
  uint32_t flags = 0;
  std::vector<uint8_t> bytes;
};

// The sections of a well-formed file, in table order.
inline std::vector<Piece> sections_of(const std::vector<uint8_t>& file) {
  auto h = read_header(file);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  std::vector<Piece> out;
  if (!h.ok()) return out;
  for (const SectionEntry& e : h->sections) {
    out.push_back({e.tag, e.flags, {file.begin() + e.offset, file.begin() + e.offset + e.size}});
  }
  return out;
}

// Writes a file of format `version` with `file`'s header facts and `table` as its sections, listed
// in table order and laid out in `layout` order (default: table order), with offsets, padding and
// checksums as the writer makes them.
inline std::vector<uint8_t> assemble(const std::vector<uint8_t>& file,
                                     const std::vector<Piece>& table,
                                     std::vector<size_t> layout = {},
                                     uint32_t version = kFormatVersion) {
  auto h = read_header(file);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  if (layout.empty()) {
    for (size_t i = 0; i < table.size(); ++i) layout.push_back(i);
  }
  const uint64_t header_size =
      8 + 4 + 8 + h->kiln_version.size() + 4 + 4 + 8 + 8 + 4 + table.size() * 32 + 8;
  std::vector<uint64_t> offsets(table.size());
  uint64_t end = header_size;
  for (size_t i : layout) {
    offsets[i] = (end + 63) / 64 * 64;
    end = offsets[i] + table[i].bytes.size();
  }
  ByteWriter w;
  w.bytes({reinterpret_cast<const uint8_t*>(kEngineMagic), 8});
  w.u32(version);
  w.str(h->kiln_version);
  w.u32(uint32_t(h->device));
  w.u32(h->builder_flags);
  w.u64(h->model_hash);
  w.u64(end);
  w.u32(uint32_t(table.size()));
  for (size_t i = 0; i < table.size(); ++i) {
    w.u32(table[i].tag);
    w.u32(table[i].flags);
    w.u64(offsets[i]);
    w.u64(table[i].bytes.size());
    w.u64(checksum64(table[i].bytes));
  }
  w.u64(checksum64(w.data()));
  for (size_t i : layout) {
    w.align(64);
    w.bytes(table[i].bytes);
  }
  EXPECT_EQ(w.size(), end);
  return w.take();
}

}  // namespace kiln::plan::engine_file_test

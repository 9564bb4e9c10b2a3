// Engine file writer and reader (format in engine_file.h). The reader checks structure while
// parsing and meaning afterwards, through the validate_plan the writer also runs.
#include "plan/engine_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "core/checked.h"
#include "plan/byte_io.h"

namespace kiln::plan {
namespace {

constexpr uint32_t make_tag(char a, char b, char c, char d) {
  return uint32_t(uint8_t(a)) | uint32_t(uint8_t(b)) << 8 | uint32_t(uint8_t(c)) << 16 |
         uint32_t(uint8_t(d)) << 24;
}
constexpr uint32_t kTagMeta = make_tag('M', 'E', 'T', 'A');
constexpr uint32_t kTagGraph = make_tag('G', 'R', 'P', 'H');
constexpr uint32_t kTagWeights = make_tag('W', 'G', 'T', 'S');
constexpr uint32_t kSectionTags[] = {kTagMeta, kTagGraph, kTagWeights};  // table order
constexpr uint32_t kNumSections = 3;

constexpr size_t kAlign = 64;
constexpr size_t kSectionEntryBytes = 4 + 8 + 8 + 8;
constexpr size_t kMaxVersionString = 256;
constexpr int kMaxGraphDepth = 16;
constexpr uint8_t kDimConst = 0;
constexpr uint8_t kDimFormula = 1;
constexpr uint8_t kMaxStorage = uint8_t(Storage::kOutput);
constexpr uint8_t kMaxAttrType = uint8_t(ir::AttrType::kGraphs);

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::string clip(std::string_view s) {
  if (s.size() <= 64) return std::string(s);
  return std::string(s.substr(0, 64)) + "...";
}

// Dim::parse recurses per parenthesis and unary minus; bounding both (and the length, which
// Dim::parse bounds at 4096 itself) keeps a hostile formula from exhausting a thread's stack.
// The writer applies the same rule, so every formula it writes can be read back.
bool formula_text_ok(std::string_view text) {
  if (text.empty() || text.size() > 4096) return false;
  int parens = 0, minuses = 0;
  for (char c : text) {
    parens += c == '(';
    minuses += c == '-';
  }
  return parens <= 256 && minuses <= 256;
}

bool known_dtype_code(uint8_t code) { return dtype_size(DType(code)) != 0; }

// ---------------------------------------------------------------------------------------------
// Semantic checks shared by save and load. `prefix` says which side found the problem.

Status validate_graph(const ir::Graph& g, const std::string& prefix, int depth) {
  if (depth > kMaxGraphDepth) {
    return invalid_argument(prefix + "subgraphs nest deeper than " +
                            std::to_string(kMaxGraphDepth));
  }
  const int64_t nv = int64_t(g.values.size());
  const int64_t nn = int64_t(g.nodes.size());
  const std::string gname = "graph '" + g.name + "'";
  for (const ir::Value& v : g.values) {
    if (v.producer < -1 || v.producer >= nn) {
      return invalid_argument(prefix + gname + ": value '" + v.name + "' has producer " +
                              std::to_string(v.producer) + " but there are " + std::to_string(nn) +
                              " nodes");
    }
  }
  for (const ir::Node& n : g.nodes) {
    for (const auto* list : {&n.inputs, &n.outputs}) {
      for (int idx : *list) {
        if (idx < -1 || idx >= nv) {
          return invalid_argument(prefix + gname + ": " + n.describe() + " refers to value " +
                                  std::to_string(idx) + " but there are " + std::to_string(nv) +
                                  " values");
        }
      }
    }
    for (const auto& [name, a] : n.attrs.all()) {
      if (uint8_t(a.type) > kMaxAttrType) {
        return invalid_argument(prefix + n.describe() + ": attribute '" + name +
                                "' has unknown type");
      }
      if (a.type == ir::AttrType::kGraph && a.g) {
        KILN_RETURN_IF_ERROR(validate_graph(*a.g, prefix, depth + 1));
      }
      if (a.type == ir::AttrType::kGraphs) {
        for (const auto& sub : a.graphs) {
          if (sub) KILN_RETURN_IF_ERROR(validate_graph(*sub, prefix, depth + 1));
        }
      }
    }
  }
  for (const auto* list : {&g.inputs, &g.outputs}) {
    for (int idx : *list) {
      if (idx < 0 || idx >= nv) {
        return invalid_argument(prefix + gname + ": graph " +
                                (list == &g.inputs ? "input" : "output") + " refers to value " +
                                std::to_string(idx) + " but there are " + std::to_string(nv) +
                                " values");
      }
    }
  }
  return ok_status();
}

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
  KILN_RETURN_IF_ERROR(parallel(p.kernels.size(), p.graph.nodes.size(), "kernel", "nodes"));
  KILN_RETURN_IF_ERROR(parallel(p.precisions.size(), p.graph.nodes.size(), "precision", "nodes"));
  const int64_t nslots = int64_t(p.slot_bytes.size());
  for (size_t i = 0; i < p.values.size(); ++i) {
    const ValuePlan& vp = p.values[i];
    if (uint8_t(vp.storage) > kMaxStorage) {
      return invalid_argument(prefix + "value '" + p.graph.values[i].name +
                              "' has unknown storage " + std::to_string(int(vp.storage)));
    }
    if (vp.slot < -1 || vp.slot >= nslots) {
      return invalid_argument(prefix + "value '" + p.graph.values[i].name + "' uses arena slot " +
                              std::to_string(vp.slot) + " but there are " + std::to_string(nslots) +
                              " slots");
    }
  }
  for (size_t pi = 0; pi < p.profiles.size(); ++pi) {
    const std::string where = "profile " + std::to_string(pi) + ": ";
    for (const InputRange& in : p.profiles[pi].inputs) {
      if (in.min.size() != in.opt.size() || in.min.size() != in.max.size()) {
        return invalid_argument(prefix + where + "input '" + in.name +
                                "' has min/opt/max shapes of different ranks");
      }
      for (size_t d = 0; d < in.min.size(); ++d) {
        if (!(in.min[d] <= in.opt[d] && in.opt[d] <= in.max[d])) {
          return invalid_argument(prefix + where + "input '" + in.name + "' dimension " +
                                  std::to_string(d) + " does not satisfy min <= opt <= max");
        }
      }
    }
    for (const auto& [name, range] : p.profiles[pi].symbols) {
      if (range.lo > range.hi) {
        return invalid_argument(prefix + where + "symbol '" + name + "' has an empty range [" +
                                std::to_string(range.lo) + ", " + std::to_string(range.hi) + "]");
      }
    }
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Writing.

class PlanWriter {
 public:
  Status write_graph(ByteWriter& w, const ir::Graph& g, int depth) {
    if (depth > kMaxGraphDepth) {
      return invalid_argument("cannot save plan: subgraphs nest deeper than " +
                              std::to_string(kMaxGraphDepth));
    }
    w.str(g.name);
    w.u64(g.opsets.size());
    for (const auto& [domain, version] : g.opsets) {
      w.str(domain);
      w.i64(version);
    }
    w.u64(g.values.size());
    for (const ir::Value& v : g.values) {
      const std::string owner = "value '" + v.name + "'";
      w.str(v.name);
      w.u8(uint8_t(v.dtype));
      w.u8(v.shape.has_value());
      if (v.shape) KILN_RETURN_IF_ERROR(write_dims(w, *v.shape, owner));
      w.u8(v.constant.has_value());
      if (v.constant) KILN_RETURN_IF_ERROR(write_tensor(w, *v.constant, owner));
      w.u8(v.sym_value.has_value());
      if (v.sym_value) KILN_RETURN_IF_ERROR(write_dims(w, *v.sym_value, owner));
      w.i32(v.producer);
    }
    w.u64(g.nodes.size());
    for (const ir::Node& n : g.nodes) {
      w.str(n.name);
      w.str(n.op_type);
      w.str(n.domain);
      w.i32(n.opset);
      for (const auto* list : {&n.inputs, &n.outputs}) {
        w.u64(list->size());
        for (int idx : *list) w.i32(idx);
      }
      w.u64(n.attrs.all().size());
      for (const auto& [name, a] : n.attrs.all()) {
        w.str(name);
        KILN_RETURN_IF_ERROR(write_attr(w, a, n.describe() + " attribute '" + name + "'", depth));
      }
    }
    for (const auto* list : {&g.inputs, &g.outputs}) {
      w.u64(list->size());
      for (int idx : *list) w.i32(idx);
    }
    return ok_status();
  }

  Status write_dims(ByteWriter& w, const std::vector<ir::Dim>& dims, const std::string& owner) {
    w.u64(dims.size());
    for (const ir::Dim& d : dims) KILN_RETURN_IF_ERROR(write_dim(w, d, owner));
    return ok_status();
  }

  Status write_dim(ByteWriter& w, const ir::Dim& d, const std::string& owner) {
    if (d.is_const()) {
      w.u8(kDimConst);
      w.i64(d.value());
      return ok_status();
    }
    std::string text = d.to_string();
    std::optional<ir::Dim> again;
    if (formula_text_ok(text)) again = ir::Dim::parse(text);
    if (!again || *again != d) {
      return invalid_argument("cannot save plan: the formula '" + clip(text) + "' of " + owner +
                              " does not survive its text form");
    }
    w.u8(kDimFormula);
    w.str(text);
    return ok_status();
  }

  Status write_tensor(ByteWriter& w, const Tensor& t, const std::string& owner) {
    if (t.empty()) {
      w.u8(0);
      return ok_status();
    }
    size_t esize = dtype_size(t.dtype());
    auto numel = checked_numel(t.shape());
    std::optional<int64_t> nbytes;
    if (numel) nbytes = checked_mul(*numel, int64_t(esize));
    if (esize == 0 || !nbytes) {
      return invalid_argument("cannot save plan: the tensor of " + owner +
                              " has an unknown dtype or an invalid shape");
    }
    if (*nbytes > 0 && t.data() == nullptr) {
      return invalid_argument("cannot save plan: the tensor of " + owner + " has no data");
    }
    w.u8(uint8_t(t.dtype()));
    w.u64(t.shape().size());
    for (int64_t d : t.shape()) w.i64(d);
    uint64_t offset = weights.align(kAlign);
    weights.bytes({static_cast<const uint8_t*>(t.data()), size_t(*nbytes)});
    w.u64(offset);
    w.u64(uint64_t(*nbytes));
    return ok_status();
  }

  Status write_attr(ByteWriter& w, const ir::Attribute& a, const std::string& owner, int depth) {
    w.u8(uint8_t(a.type));
    switch (a.type) {
      case ir::AttrType::kFloat:
        w.f32(a.f);
        return ok_status();
      case ir::AttrType::kInt:
        w.i64(a.i);
        return ok_status();
      case ir::AttrType::kString:
        w.str(a.s);
        return ok_status();
      case ir::AttrType::kTensor:
        return write_tensor(w, a.t, owner);
      case ir::AttrType::kGraph:
        w.u8(a.g != nullptr);
        return a.g ? write_graph(w, *a.g, depth + 1) : ok_status();
      case ir::AttrType::kFloats:
        w.u64(a.floats.size());
        for (float f : a.floats) w.f32(f);
        return ok_status();
      case ir::AttrType::kInts:
        w.u64(a.ints.size());
        for (int64_t i : a.ints) w.i64(i);
        return ok_status();
      case ir::AttrType::kStrings:
        w.u64(a.strings.size());
        for (const std::string& s : a.strings) w.str(s);
        return ok_status();
      case ir::AttrType::kTensors:
        w.u64(a.tensors.size());
        for (const Tensor& t : a.tensors) KILN_RETURN_IF_ERROR(write_tensor(w, t, owner));
        return ok_status();
      case ir::AttrType::kGraphs:
        w.u64(a.graphs.size());
        for (const auto& g : a.graphs) {
          w.u8(g != nullptr);
          if (g) KILN_RETURN_IF_ERROR(write_graph(w, *g, depth + 1));
        }
        return ok_status();
    }
    return invalid_argument("cannot save plan: " + owner + " has an unknown attribute type");
  }

  ByteWriter weights;
};

Status write_meta(ByteWriter& w, const Plan& p, PlanWriter& pw) {
  w.u64(p.values.size());
  for (const ValuePlan& vp : p.values) {
    w.u8(uint8_t(vp.storage));
    w.i32(vp.slot);
  }
  for (const auto* list : {&p.kernels, &p.precisions}) {
    w.u64(list->size());
    for (const std::string& s : *list) w.str(s);
  }
  KILN_RETURN_IF_ERROR(pw.write_dims(w, p.slot_bytes, "an arena slot size"));
  w.u64(p.profiles.size());
  for (const Profile& prof : p.profiles) {
    w.u64(prof.inputs.size());
    for (const InputRange& in : prof.inputs) {
      w.str(in.name);
      for (const auto* shape : {&in.min, &in.opt, &in.max}) {
        w.u64(shape->size());
        for (int64_t d : *shape) w.i64(d);
      }
    }
    w.u64(prof.symbols.size());
    for (const auto& [name, range] : prof.symbols) {
      w.str(name);
      w.i64(range.lo);
      w.i64(range.hi);
    }
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Reading.

class PlanReader {
 public:
  explicit PlanReader(std::span<const uint8_t> weights) : weights_(weights) {}

  StatusOr<ir::Graph> read_graph(ByteReader& r, int depth) {
    if (depth > kMaxGraphDepth) {
      return r.corrupted("subgraphs nest deeper than " + std::to_string(kMaxGraphDepth));
    }
    ir::Graph g;
    KILN_ASSIGN_OR_RETURN(g.name, r.str());
    KILN_ASSIGN_OR_RETURN(size_t nopsets, r.count(16, "opsets"));
    for (size_t i = 0; i < nopsets; ++i) {
      KILN_ASSIGN_OR_RETURN(std::string domain, r.str());
      KILN_ASSIGN_OR_RETURN(int64_t version, r.i64());
      if (version < 0 || version > std::numeric_limits<int>::max()) {
        return r.corrupted("opset version " + std::to_string(version) + " of domain '" +
                           clip(domain) + "' is out of range");
      }
      if (!g.opsets.emplace(std::move(domain), int(version)).second) {
        return r.corrupted("an opset domain appears twice");
      }
    }
    KILN_ASSIGN_OR_RETURN(size_t nvalues, r.count(8 + 1 + 3 + 4, "values"));
    g.values.resize(nvalues);
    for (ir::Value& v : g.values) {
      KILN_ASSIGN_OR_RETURN(v.name, r.str());
      KILN_ASSIGN_OR_RETURN(uint8_t dtype, r.u8());
      if (dtype != 0 && !known_dtype_code(dtype)) {
        return r.corrupted("value '" + clip(v.name) + "' has unknown dtype code " +
                           std::to_string(dtype));
      }
      v.dtype = DType(dtype);
      KILN_ASSIGN_OR_RETURN(bool has_shape, read_bool(r));
      if (has_shape) {
        KILN_ASSIGN_OR_RETURN(v.shape, read_dims(r, v.name));
      }
      KILN_ASSIGN_OR_RETURN(bool has_constant, read_bool(r));
      if (has_constant) {
        KILN_ASSIGN_OR_RETURN(v.constant, read_tensor(r, "value '" + clip(v.name) + "'"));
      }
      KILN_ASSIGN_OR_RETURN(bool has_sym, read_bool(r));
      if (has_sym) {
        KILN_ASSIGN_OR_RETURN(v.sym_value, read_dims(r, v.name));
      }
      KILN_ASSIGN_OR_RETURN(v.producer, r.i32());
    }
    KILN_ASSIGN_OR_RETURN(size_t nnodes, r.count(3 * 8 + 4 + 3 * 8, "nodes"));
    g.nodes.resize(nnodes);
    for (ir::Node& n : g.nodes) {
      KILN_ASSIGN_OR_RETURN(n.name, r.str());
      KILN_ASSIGN_OR_RETURN(n.op_type, r.str());
      KILN_ASSIGN_OR_RETURN(n.domain, r.str());
      KILN_ASSIGN_OR_RETURN(n.opset, r.i32());
      KILN_RETURN_IF_ERROR(read_indices(r, &n.inputs, "node inputs"));
      KILN_RETURN_IF_ERROR(read_indices(r, &n.outputs, "node outputs"));
      KILN_ASSIGN_OR_RETURN(size_t nattrs, r.count(8 + 1, "attributes"));
      for (size_t i = 0; i < nattrs; ++i) {
        KILN_ASSIGN_OR_RETURN(std::string name, r.str());
        if (n.attrs.has(name)) {
          return r.corrupted("node '" + clip(n.name) + "' has attribute '" + clip(name) +
                             "' twice");
        }
        KILN_ASSIGN_OR_RETURN(ir::Attribute a, read_attr(r, n.name, name, depth));
        n.attrs.set(std::move(name), std::move(a));
      }
    }
    KILN_RETURN_IF_ERROR(read_indices(r, &g.inputs, "graph inputs"));
    KILN_RETURN_IF_ERROR(read_indices(r, &g.outputs, "graph outputs"));
    return g;
  }

  StatusOr<std::vector<ir::Dim>> read_dims(ByteReader& r, const std::string& owner) {
    KILN_ASSIGN_OR_RETURN(size_t rank, r.count(1 + 8, "dims"));
    std::vector<ir::Dim> dims;
    dims.reserve(rank);
    for (size_t i = 0; i < rank; ++i) {
      KILN_ASSIGN_OR_RETURN(uint8_t kind, r.u8());
      if (kind == kDimConst) {
        KILN_ASSIGN_OR_RETURN(int64_t v, r.i64());
        dims.emplace_back(v);
      } else if (kind == kDimFormula) {
        KILN_ASSIGN_OR_RETURN(std::string text, r.str());
        std::optional<ir::Dim> d;
        if (formula_text_ok(text)) d = ir::Dim::parse(text);
        if (!d) {
          return r.corrupted("unparsable shape formula '" + clip(text) + "' in value '" +
                             clip(owner) + "'");
        }
        dims.push_back(std::move(*d));
      } else {
        return r.corrupted("unknown dim kind " + std::to_string(kind) + " in value '" +
                           clip(owner) + "'");
      }
    }
    return dims;
  }

  StatusOr<Tensor> read_tensor(ByteReader& r, const std::string& owner) {
    KILN_ASSIGN_OR_RETURN(uint8_t code, r.u8());
    if (code == 0) return Tensor();
    if (!known_dtype_code(code)) {
      return r.corrupted("tensor of " + owner + " has unknown dtype code " + std::to_string(code));
    }
    DType dtype = DType(code);
    KILN_ASSIGN_OR_RETURN(size_t rank, r.count(8, "tensor dims"));
    Shape shape(rank);
    for (int64_t& d : shape) {
      KILN_ASSIGN_OR_RETURN(d, r.i64());
    }
    KILN_ASSIGN_OR_RETURN(uint64_t offset, r.u64());
    KILN_ASSIGN_OR_RETURN(uint64_t size, r.u64());
    auto numel = checked_numel(shape);
    std::optional<int64_t> nbytes;
    if (numel) nbytes = checked_mul(*numel, int64_t(dtype_size(dtype)));
    if (!nbytes) {
      return r.corrupted("tensor of " + owner + " has shape " + shape_to_string(shape) +
                         ", which is negative or overflows");
    }
    if (uint64_t(*nbytes) != size) {
      return r.corrupted("tensor of " + owner + " (" + std::string(dtype_name(dtype)) + " " +
                         shape_to_string(shape) + ") needs " + std::to_string(*nbytes) +
                         " bytes but records " + std::to_string(size));
    }
    if (offset % kAlign != 0 || offset > weights_.size() || size > weights_.size() - offset) {
      return r.corrupted("tensor of " + owner + " claims bytes [" + std::to_string(offset) + ", +" +
                         std::to_string(size) + ") of section WGTS, which holds " +
                         std::to_string(weights_.size()) + " bytes at 64-byte aligned offsets");
    }
    // Tensors never share weight bytes in a file kiln writes; capping the total at the section size
    // stops many tensors aimed at one region from multiplying the memory a small file costs.
    weight_bytes_used_ += size;
    if (weight_bytes_used_ > weights_.size()) {
      return r.corrupted("tensors claim more bytes than section WGTS holds (" +
                         std::to_string(weights_.size()) + ")");
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, std::move(shape)));
    if (size > 0) std::memcpy(t.data(), weights_.data() + offset, size_t(size));
    return t;
  }

  StatusOr<ir::Attribute> read_attr(ByteReader& r, const std::string& node, const std::string& name,
                                    int depth) {
    const std::string owner = "node '" + clip(node) + "' attribute '" + clip(name) + "'";
    KILN_ASSIGN_OR_RETURN(uint8_t type, r.u8());
    if (type > kMaxAttrType) {
      return r.corrupted(owner + " has unknown type " + std::to_string(type));
    }
    ir::Attribute a;
    a.type = ir::AttrType(type);
    switch (a.type) {
      case ir::AttrType::kFloat: {
        KILN_ASSIGN_OR_RETURN(a.f, r.f32());
        break;
      }
      case ir::AttrType::kInt: {
        KILN_ASSIGN_OR_RETURN(a.i, r.i64());
        break;
      }
      case ir::AttrType::kString: {
        KILN_ASSIGN_OR_RETURN(a.s, r.str());
        break;
      }
      case ir::AttrType::kTensor: {
        KILN_ASSIGN_OR_RETURN(a.t, read_tensor(r, owner));
        break;
      }
      case ir::AttrType::kGraph: {
        KILN_ASSIGN_OR_RETURN(a.g, read_subgraph(r, depth));
        break;
      }
      case ir::AttrType::kFloats: {
        KILN_ASSIGN_OR_RETURN(size_t n, r.count(4, "floats"));
        a.floats.resize(n);
        for (float& f : a.floats) {
          KILN_ASSIGN_OR_RETURN(f, r.f32());
        }
        break;
      }
      case ir::AttrType::kInts: {
        KILN_ASSIGN_OR_RETURN(size_t n, r.count(8, "ints"));
        a.ints.resize(n);
        for (int64_t& i : a.ints) {
          KILN_ASSIGN_OR_RETURN(i, r.i64());
        }
        break;
      }
      case ir::AttrType::kStrings: {
        KILN_ASSIGN_OR_RETURN(size_t n, r.count(8, "strings"));
        a.strings.resize(n);
        for (std::string& s : a.strings) {
          KILN_ASSIGN_OR_RETURN(s, r.str());
        }
        break;
      }
      case ir::AttrType::kTensors: {
        KILN_ASSIGN_OR_RETURN(size_t n, r.count(1, "tensors"));
        a.tensors.resize(n);
        for (Tensor& t : a.tensors) {
          KILN_ASSIGN_OR_RETURN(t, read_tensor(r, owner));
        }
        break;
      }
      case ir::AttrType::kGraphs: {
        KILN_ASSIGN_OR_RETURN(size_t n, r.count(1, "graphs"));
        a.graphs.resize(n);
        for (auto& g : a.graphs) {
          KILN_ASSIGN_OR_RETURN(g, read_subgraph(r, depth));
        }
        break;
      }
    }
    return a;
  }

 private:
  StatusOr<std::shared_ptr<ir::Graph>> read_subgraph(ByteReader& r, int depth) {
    KILN_ASSIGN_OR_RETURN(bool present, read_bool(r));
    if (!present) return std::shared_ptr<ir::Graph>();
    KILN_ASSIGN_OR_RETURN(ir::Graph g, read_graph(r, depth + 1));
    return std::make_shared<ir::Graph>(std::move(g));
  }

  static StatusOr<bool> read_bool(ByteReader& r) {
    size_t at = r.pos();
    KILN_ASSIGN_OR_RETURN(uint8_t b, r.u8());
    if (b > 1) {
      return r.corrupted("flag byte " + std::to_string(b) + " at offset " + std::to_string(at) +
                         " is neither 0 nor 1");
    }
    return b == 1;
  }

  static Status read_indices(ByteReader& r, std::vector<int>* out, std::string_view what) {
    KILN_ASSIGN_OR_RETURN(size_t n, r.count(4, what));
    out->resize(n);
    for (int& idx : *out) {
      KILN_ASSIGN_OR_RETURN(idx, r.i32());
    }
    return ok_status();
  }

  std::span<const uint8_t> weights_;
  uint64_t weight_bytes_used_ = 0;
};

Status read_meta(ByteReader& r, Plan* p) {
  KILN_ASSIGN_OR_RETURN(size_t nvalues, r.count(5, "value plans"));
  p->values.resize(nvalues);
  for (ValuePlan& vp : p->values) {
    KILN_ASSIGN_OR_RETURN(uint8_t storage, r.u8());
    if (storage > kMaxStorage) {
      return r.corrupted("unknown value storage " + std::to_string(storage));
    }
    vp.storage = Storage(storage);
    KILN_ASSIGN_OR_RETURN(vp.slot, r.i32());
  }
  for (auto* list : {&p->kernels, &p->precisions}) {
    KILN_ASSIGN_OR_RETURN(size_t n, r.count(8, list == &p->kernels ? "kernels" : "precisions"));
    list->resize(n);
    for (std::string& s : *list) {
      KILN_ASSIGN_OR_RETURN(s, r.str());
    }
  }
  PlanReader dims_reader({});
  KILN_ASSIGN_OR_RETURN(p->slot_bytes, dims_reader.read_dims(r, "arena slot sizes"));
  KILN_ASSIGN_OR_RETURN(size_t nprofiles, r.count(16, "profiles"));
  p->profiles.resize(nprofiles);
  for (Profile& prof : p->profiles) {
    KILN_ASSIGN_OR_RETURN(size_t ninputs, r.count(8 * 4, "profile inputs"));
    prof.inputs.resize(ninputs);
    for (InputRange& in : prof.inputs) {
      KILN_ASSIGN_OR_RETURN(in.name, r.str());
      for (auto* shape : {&in.min, &in.opt, &in.max}) {
        KILN_ASSIGN_OR_RETURN(size_t rank, r.count(8, "profile dims"));
        shape->resize(rank);
        for (int64_t& d : *shape) {
          KILN_ASSIGN_OR_RETURN(d, r.i64());
        }
      }
    }
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
  return ok_status();
}

}  // namespace

std::string section_tag_name(uint32_t tag) {
  std::string s;
  for (int k = 0; k < 4; ++k) {
    char c = char((tag >> (8 * k)) & 0xff);
    if (c < 'A' || c > 'Z') {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "0x%08x", tag);
      return buf;
    }
    s += c;
  }
  return s;
}

StatusOr<std::vector<uint8_t>> try_serialize(const Plan& plan) {
  KILN_RETURN_IF_ERROR(validate_plan(plan, "cannot save plan: "));
  PlanWriter pw;
  ByteWriter graph, meta;
  KILN_RETURN_IF_ERROR(pw.write_graph(graph, plan.graph, 0));
  KILN_RETURN_IF_ERROR(write_meta(meta, plan, pw));
  const ByteWriter* payloads[kNumSections] = {&meta, &graph, &pw.weights};

  const uint64_t header_size = 8 + 4 + 8 + plan.kiln_version.size() + 4 + 4 + 8 + 8 + 4 +
                               kNumSections * kSectionEntryBytes + 8;
  uint64_t offsets[kNumSections];
  uint64_t end = header_size;
  for (uint32_t i = 0; i < kNumSections; ++i) {
    offsets[i] = align_up(end);
    end = offsets[i] + payloads[i]->size();
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
  w.u32(kNumSections);
  for (uint32_t i = 0; i < kNumSections; ++i) {
    w.u32(kSectionTags[i]);
    w.u64(offsets[i]);
    w.u64(payloads[i]->size());
    w.u64(checksum64(payloads[i]->data()));
  }
  w.u64(checksum64(w.data()));
  KILN_CHECK(w.size() == header_size);
  for (uint32_t i = 0; i < kNumSections; ++i) {
    w.align(kAlign);
    KILN_CHECK(w.size() == offsets[i]);
    w.bytes(payloads[i]->data());
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
  if (h.format_version != kFormatVersion) {
    return invalid_argument("engine file format version " + std::to_string(h.format_version) +
                            " is not supported by this kiln (supports " +
                            std::to_string(kFormatVersion) + "); rebuild the engine with kiln " +
                            kKilnVersion);
  }
  // Fields are read raw first and judged after the header checksum, so a flipped byte is reported
  // as corruption rather than as whatever the flipped value happens to mean.
  KILN_ASSIGN_OR_RETURN(uint64_t version_len, r.u64());
  if (version_len > kMaxVersionString) {
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
  if (h.num_sections > 64) {
    return r.corrupted("section count " + std::to_string(h.num_sections) + " is implausible");
  }
  for (uint32_t i = 0; i < h.num_sections; ++i) {
    SectionEntry e;
    KILN_ASSIGN_OR_RETURN(e.tag, r.u32());
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
  if (h.num_sections != kNumSections) {
    return r.corrupted("has " + std::to_string(h.num_sections) + " sections; format version " +
                       std::to_string(kFormatVersion) + " has " + std::to_string(kNumSections));
  }
  // Sections lie in table order after the header, aligned, not overlapping, and every byte between
  // them is zero; the last one ends the file.
  uint64_t end = h.header_size;
  for (uint32_t i = 0; i < kNumSections; ++i) {
    const SectionEntry& e = h.sections[i];
    const std::string name = section_tag_name(e.tag);
    if (e.tag != kSectionTags[i]) {
      return r.corrupted("section " + std::to_string(i) + " is " + name + ", expected " +
                         section_tag_name(kSectionTags[i]));
    }
    if (e.offset % kAlign != 0 || e.offset < end || e.offset > h.file_size ||
        e.size > h.file_size - e.offset) {
      return r.corrupted("section " + name + " at offset " + std::to_string(e.offset) + " size " +
                         std::to_string(e.size) + " is misplaced in a file of " +
                         std::to_string(h.file_size) + " bytes");
    }
    for (uint64_t k = end; k < e.offset; ++k) {
      if (bytes[k] != 0) {
        return invalid_argument("engine file is corrupted: nonzero padding byte at offset " +
                                std::to_string(k));
      }
    }
    end = e.offset + e.size;
  }
  if (end != h.file_size) {
    return r.corrupted("the last section ends at " + std::to_string(end) +
                       ", not at the end of file (" + std::to_string(h.file_size) + ")");
  }
  return h;
}

StatusOr<Plan> deserialize(std::span<const uint8_t> bytes) {
  KILN_ASSIGN_OR_RETURN(EngineHeader h, read_header(bytes));
  std::span<const uint8_t> payload[kNumSections];
  for (uint32_t i = 0; i < kNumSections; ++i) {
    const SectionEntry& e = h.sections[i];
    payload[i] = bytes.subspan(size_t(e.offset), size_t(e.size));
    if (checksum64(payload[i]) != e.checksum) {
      return invalid_argument("engine file is corrupted: checksum mismatch in section " +
                              section_tag_name(e.tag));
    }
  }
  Plan plan;
  plan.device = h.device;
  plan.builder_flags = h.builder_flags;
  plan.model_hash = h.model_hash;
  plan.kiln_version = h.kiln_version;

  PlanReader pr(payload[2]);
  ByteReader graph(payload[1], "section GRPH");
  KILN_ASSIGN_OR_RETURN(plan.graph, pr.read_graph(graph, 0));
  if (graph.remaining() != 0) {
    return graph.corrupted(std::to_string(graph.remaining()) + " unread bytes at its end");
  }
  ByteReader meta(payload[0], "section META");
  KILN_RETURN_IF_ERROR(read_meta(meta, &plan));
  if (meta.remaining() != 0) {
    return meta.corrupted(std::to_string(meta.remaining()) + " unread bytes at its end");
  }
  KILN_RETURN_IF_ERROR(validate_plan(plan, "engine file is corrupted: "));
  return plan;
}

Status save_file(const Plan& plan, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, try_serialize(plan));
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    return invalid_argument("cannot write engine file '" + path + "': " + std::strerror(errno));
  }
  size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  int write_errno = errno;
  bool closed = std::fclose(f) == 0;
  if (written != bytes.size() || !closed) {
    return invalid_argument("cannot write engine file '" + path +
                            "': " + std::strerror(written != bytes.size() ? write_errno : errno));
  }
  return ok_status();
}

StatusOr<Plan> load_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT) return not_found("engine file '" + path + "' does not exist");
    return invalid_argument("cannot open engine file '" + path + "': " + std::strerror(errno));
  }
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.insert(bytes.end(), buf, buf + got);
  bool failed = std::ferror(f) != 0;
  int read_errno = errno;
  std::fclose(f);
  if (failed) {
    return invalid_argument("cannot read engine file '" + path + "': " + std::strerror(read_errno));
  }
  auto plan = deserialize(bytes);
  if (!plan.ok()) {
    Status s = plan.status();
    s.with_context("engine file '" + path + "'");
    return s;
  }
  return plan;
}

}  // namespace kiln::plan

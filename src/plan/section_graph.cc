// Sections GRPH and WGTS of the engine file (format in engine_file.h): the optimized graph with its
// values, nodes, attributes and shape formulas, and the weight bytes its tensors point into.
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "core/checked.h"
#include "plan/sections.h"

namespace kiln::plan::detail {
namespace {

constexpr uint8_t kDimConst = 0;
constexpr uint8_t kDimFormula = 1;
constexpr uint8_t kMaxAttrType = uint8_t(ir::AttrType::kGraphs);

// Dim::parse bounds what it reads (nesting depth, runs of minus signs, length) so that a hostile
// formula cannot exhaust a thread's stack; the writer checks that every formula it writes reads
// back through the same parser.
bool formula_text_ok(std::string_view text) { return !text.empty(); }

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

// Writes a graph to GRPH and its tensors' bytes to WGTS.
class GraphWriter {
 public:
  GraphWriter(ByteWriter& weights, uint32_t version) : weights_(weights), version_(version) {}

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
      if (version_ >= 4) {
        w.u64(n.replaced.size());
        for (const auto& [op, count] : n.replaced) {
          w.str(op);
          w.i64(count);
        }
      }
      if (version_ >= 7) {
        w.u64(n.guards.size());
        for (const ir::Guard& gd : n.guards) {
          w.i32(gd.cond);
          w.u8(gd.when ? 1 : 0);
        }
      } else if (!n.guards.empty()) {
        return invalid_argument("cannot save plan: " + n.describe() +
                                " runs in an If's branch, which format " +
                                std::to_string(version_) + " cannot record");
      }
    }
    for (const auto* list : {&g.inputs, &g.outputs}) {
      w.u64(list->size());
      for (int idx : *list) w.i32(idx);
    }
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
    uint64_t offset = weights_.align(kAlign);
    weights_.bytes({static_cast<const uint8_t*>(t.data()), size_t(*nbytes)});
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

 private:
  ByteWriter& weights_;
  uint32_t version_;
};

// Reads a graph from GRPH, copying its tensors' bytes out of WGTS.
class GraphReader {
 public:
  GraphReader(std::span<const uint8_t> weights, uint32_t version)
      : weights_(weights), version_(version) {}

  // Format 4: what a fused node stands for, each op type once with a count of at least 1.
  Status read_replaced(ByteReader& r, ir::Node* n) {
    KILN_ASSIGN_OR_RETURN(size_t count, r.count(8 + 8, "replaced op types"));
    for (size_t i = 0; i < count; ++i) {
      KILN_ASSIGN_OR_RETURN(std::string op, r.str());
      KILN_ASSIGN_OR_RETURN(int64_t times, r.i64());
      if (op.empty() || times < 1 || times > std::numeric_limits<int32_t>::max()) {
        return r.corrupted("node '" + clip(n->name) + "' replaced op '" + clip(op) + "' " +
                           std::to_string(times) + " times");
      }
      if (!n->replaced.emplace(std::move(op), times).second) {
        return r.corrupted("node '" + clip(n->name) + "' names a replaced op type twice");
      }
    }
    return ok_status();
  }

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
        KILN_ASSIGN_OR_RETURN(v.shape, read_dims(r, "value '" + clip(v.name) + "'"));
      }
      KILN_ASSIGN_OR_RETURN(bool has_constant, read_bool(r));
      if (has_constant) {
        KILN_ASSIGN_OR_RETURN(v.constant, read_tensor(r, "value '" + clip(v.name) + "'"));
      }
      KILN_ASSIGN_OR_RETURN(bool has_sym, read_bool(r));
      if (has_sym) {
        KILN_ASSIGN_OR_RETURN(v.sym_value, read_dims(r, "value '" + clip(v.name) + "'"));
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
      if (version_ >= 4) KILN_RETURN_IF_ERROR(read_replaced(r, &n));
      if (version_ >= 7) {
        KILN_ASSIGN_OR_RETURN(size_t nguards, r.count(4 + 1, "guards"));
        n.guards.resize(nguards);
        for (ir::Guard& gd : n.guards) {
          KILN_ASSIGN_OR_RETURN(gd.cond, r.i32());
          KILN_ASSIGN_OR_RETURN(bool when, read_bool(r));
          gd.when = when;
        }
      }
    }
    KILN_RETURN_IF_ERROR(read_indices(r, &g.inputs, "graph inputs"));
    KILN_RETURN_IF_ERROR(read_indices(r, &g.outputs, "graph outputs"));
    return g;
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

  static Status read_indices(ByteReader& r, std::vector<int>* out, std::string_view what) {
    KILN_ASSIGN_OR_RETURN(size_t n, r.count(4, what));
    out->resize(n);
    for (int& idx : *out) {
      KILN_ASSIGN_OR_RETURN(idx, r.i32());
    }
    return ok_status();
  }

  std::span<const uint8_t> weights_;
  uint32_t version_;
  uint64_t weight_bytes_used_ = 0;
};

}  // namespace

StatusOr<bool> read_bool(ByteReader& r) {
  size_t at = r.pos();
  KILN_ASSIGN_OR_RETURN(uint8_t b, r.u8());
  if (b > 1) {
    return r.corrupted("flag byte " + std::to_string(b) + " at offset " + std::to_string(at) +
                       " is neither 0 nor 1");
  }
  return b == 1;
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
        return r.corrupted("unparsable shape formula '" + clip(text) + "' in " + owner);
      }
      dims.push_back(std::move(*d));
    } else {
      return r.corrupted("unknown dim kind " + std::to_string(kind) + " in " + owner);
    }
  }
  return dims;
}

Status write_dims(ByteWriter& w, const std::vector<ir::Dim>& dims, const std::string& owner) {
  w.u64(dims.size());
  for (const ir::Dim& d : dims) KILN_RETURN_IF_ERROR(write_dim(w, d, owner));
  return ok_status();
}

Status write_graph(const ir::Graph& g, ByteWriter& graph, ByteWriter& weights, uint32_t version) {
  GraphWriter gw(weights, version);
  return gw.write_graph(graph, g, 0);
}

StatusOr<ir::Graph> read_graph(std::span<const uint8_t> graph, std::span<const uint8_t> weights,
                               uint32_t version) {
  GraphReader gr(weights, version);
  ByteReader r(graph, "section GRPH");
  KILN_ASSIGN_OR_RETURN(ir::Graph g, gr.read_graph(r, 0));
  if (r.remaining() != 0) {
    return r.corrupted(std::to_string(r.remaining()) + " unread bytes at its end");
  }
  return g;
}

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

}  // namespace kiln::plan::detail

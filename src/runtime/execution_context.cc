// ExecutionContext: binds input shapes to the engine's symbols, resolves every value's shape from
// its formula, lays out the activation arena for those shapes (growing it only when they grow),
// and runs the kernels.
#include <cstdlib>
#include <cstring>

#include "core/checked.h"
#include "runtime/engine.h"
#include "runtime/engine_data.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 64;

std::string shape_str(const Shape& s) { return shape_to_string(s); }

}  // namespace

ExecutionContext::ExecutionContext(std::shared_ptr<const EngineData> data) : data_(std::move(data)) {
  input_shapes_.resize(data_->num_inputs);
  input_set_.assign(data_->num_inputs, 0);
  io_address_.assign(data_->io_values.size(), nullptr);
  allocators_.assign(data_->io_values.size(), nullptr);
}

ExecutionContext::~ExecutionContext() { std::free(arena_); }

Status ExecutionContext::prepare_kernels() {
  const ir::Graph& g = data_->plan.graph;
  for (const ir::Node& node : g.nodes) {
    backends::KernelQuery q{node, {}, {}};
    for (int v : node.inputs) q.inputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    for (int v : node.outputs) q.outputs.push_back(v >= 0 ? &g.values[v] : nullptr);
    auto kernel = data_->backend->create_kernel(q);
    if (!kernel.ok()) return Status(kernel.status()).with_context("preparing kernels");
    kernels_.push_back(std::move(kernel).value());
  }
  node_in_.resize(g.nodes.size());
  node_out_.resize(g.nodes.size());
  return ok_status();
}

StatusOr<int> ExecutionContext::io_index(const std::string& name) const {
  auto it = data_->io_by_name.find(name);
  if (it == data_->io_by_name.end()) {
    std::string names;
    for (const auto& [n, i] : data_->io_by_name) names += (names.empty() ? "" : ", ") + n;
    return not_found("no IO tensor named '" + name + "'; this engine's IO tensors are: " + names);
  }
  return it->second;
}

Status ExecutionContext::set_optimization_profile(int profile) {
  int n = int(data_->plan.profiles.size());
  if (profile < 0 || profile >= std::max(n, 1)) {
    return invalid_argument("profile " + std::to_string(profile) + " does not exist; the engine has " +
                            std::to_string(n) + " profile(s)");
  }
  profile_ = profile;
  resolved_ = false;
  return ok_status();
}

Status ExecutionContext::set_input_shape(const std::string& name, const Shape& shape) {
  KILN_ASSIGN_OR_RETURN(int io, io_index(name));
  if (io >= data_->num_inputs) {
    return invalid_argument("'" + name + "' is an output; set_input_shape takes an input");
  }
  const auto& bindings = data_->input_bindings[io];
  const ir::Value& val = data_->plan.graph.values[data_->io_values[io]];
  if (shape.size() != bindings.size()) {
    return invalid_argument("input '" + name + "' has rank " + std::to_string(bindings.size()) + " " +
                            ir::dims_to_string(*val.shape) + ", but the shape given, " + shape_str(shape) +
                            ", has rank " + std::to_string(shape.size()));
  }
  const plan::InputRange* range = nullptr;
  if (!data_->plan.profiles.empty()) {
    for (const auto& r : data_->plan.profiles[profile_].inputs) {
      if (r.name == name) range = &r;
    }
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    const auto& b = bindings[d];
    std::string where = "input '" + name + "' dim " + std::to_string(d) + " (" + (*val.shape)[d].to_string() + ")";
    if (b.fixed) {
      if (shape[d] != b.value) {
        return invalid_argument(where + " is fixed at " + std::to_string(b.value) + ", got " +
                                std::to_string(shape[d]) + " in shape " + shape_str(shape));
      }
      continue;
    }
    if (range && (shape[d] < range->min[d] || shape[d] > range->max[d])) {
      return invalid_argument(where + " = " + std::to_string(shape[d]) + " is outside the range [" +
                              std::to_string(range->min[d]) + ", " + std::to_string(range->max[d]) +
                              "] of optimization profile " + std::to_string(profile_) + " (shape given: " +
                              shape_str(shape) + ")");
    }
    if ((shape[d] - b.offset) % b.coeff != 0) {
      return invalid_argument(where + " = " + std::to_string(shape[d]) + " is not of the form " +
                              (*val.shape)[d].to_string() + " for an integer " + b.symbol);
    }
  }
  input_shapes_[io] = shape;
  input_set_[io] = 1;
  resolved_ = false;
  return ok_status();
}

Status ExecutionContext::resolve() {
  std::string unset;
  for (int i = 0; i < data_->num_inputs; ++i) {
    if (!input_set_[i]) unset += (unset.empty() ? "" : ", ") + data_->plan.graph.values[data_->io_values[i]].name;
  }
  if (!unset.empty()) return invalid_argument("input shape(s) not set: " + unset + "; call set_input_shape first");

  // Bind symbols from the input dims; inputs sharing a symbol must agree.
  symbols_.clear();
  std::map<std::string, std::string> bound_by;
  for (int i = 0; i < data_->num_inputs; ++i) {
    const std::string& name = data_->plan.graph.values[data_->io_values[i]].name;
    for (size_t d = 0; d < input_shapes_[i].size(); ++d) {
      const auto& b = data_->input_bindings[i][d];
      if (b.fixed) continue;
      int64_t v = (input_shapes_[i][d] - b.offset) / b.coeff;
      std::string where = "input '" + name + "' dim " + std::to_string(d);
      auto [it, inserted] = symbols_.emplace(b.symbol, v);
      if (!inserted && it->second != v) {
        return invalid_argument(where + " implies " + b.symbol + " = " + std::to_string(v) + ", but " +
                                bound_by[b.symbol] + " implies " + b.symbol + " = " + std::to_string(it->second));
      }
      bound_by.emplace(b.symbol, where);
    }
  }

  const ir::Graph& g = data_->plan.graph;
  shapes_.assign(g.values.size(), {});
  for (size_t v = 0; v < g.values.size(); ++v) {
    const ir::Value& val = g.values[v];
    if (val.constant) {
      shapes_[v] = val.constant->shape();
      continue;
    }
    if (!val.shape) continue;
    Shape s;
    for (const auto& d : *val.shape) {
      auto x = d.eval(symbols_);
      if (!x || *x < 0) {
        return internal_error("cannot evaluate dim " + d.to_string() + " of '" + val.name + "' for the given input shapes");
      }
      s.push_back(*x);
    }
    if (!checked_numel(s)) return invalid_argument("tensor '" + val.name + "' of shape " + shape_str(s) + " is too large");
    shapes_[v] = std::move(s);
  }

  // Arena layout for these shapes.
  const auto& slots = data_->plan.slot_bytes;
  slot_offset_.assign(slots.size(), 0);
  size_t total = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    auto bytes = slots[k].eval(symbols_);
    if (!bytes || *bytes < 0) return internal_error("cannot evaluate arena slot " + std::to_string(k));
    slot_offset_[k] = total;
    size_t aligned = (size_t(*bytes) + kAlign - 1) / kAlign * kAlign;
    if (total + aligned < total) return out_of_memory("activation arena size overflows");
    total += aligned;
  }
  if (total > arena_capacity_) {
    void* p = std::aligned_alloc(kAlign, std::max<size_t>(total, kAlign));
    if (!p) return out_of_memory("cannot allocate " + std::to_string(total) + " bytes of activation memory");
    std::free(arena_);
    arena_ = p;
    arena_capacity_ = total;
  }

  // Shape tensors whose elements are formulas: written once per set of shapes.
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (data_->plan.values[v].storage != plan::Storage::kSymbolic) continue;
    const ir::Value& val = g.values[v];
    char* dst = static_cast<char*>(arena_) + slot_offset_[data_->plan.values[v].slot];
    for (size_t i = 0; i < val.sym_value->size(); ++i) {
      auto x = (*val.sym_value)[i].eval(symbols_);
      if (!x) return internal_error("cannot evaluate element " + std::to_string(i) + " of '" + val.name + "'");
      switch (val.dtype) {
        case DType::kInt64: reinterpret_cast<int64_t*>(dst)[i] = *x; break;
        case DType::kInt32: reinterpret_cast<int32_t*>(dst)[i] = int32_t(*x); break;
        case DType::kBool: case DType::kUInt8: reinterpret_cast<uint8_t*>(dst)[i] = uint8_t(*x); break;
        case DType::kInt8: reinterpret_cast<int8_t*>(dst)[i] = int8_t(*x); break;
        default: return internal_error("symbolic value '" + val.name + "' has dtype " + std::string(dtype_name(val.dtype)));
      }
    }
  }

  // Views: shapes now, data pointers at execute time (IO addresses may change between runs).
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const ir::Node& node = g.nodes[n];
    node_in_[n].assign(node.inputs.size(), TensorView{});
    node_out_[n].assign(node.outputs.size(), TensorView{});
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      int v = node.inputs[i];
      if (v >= 0) node_in_[n][i] = TensorView{nullptr, g.values[v].dtype, shapes_[v]};
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      int v = node.outputs[i];
      if (v >= 0) node_out_[n][i] = TensorView{nullptr, g.values[v].dtype, shapes_[v]};
    }
  }
  resolved_ = true;
  return ok_status();
}

Status ExecutionContext::infer_shapes() {
  if (resolved_) return ok_status();
  return resolve();
}

StatusOr<Shape> ExecutionContext::tensor_shape(const std::string& name) {
  KILN_ASSIGN_OR_RETURN(int io, io_index(name));
  if (io < data_->num_inputs) {
    if (!input_set_[io]) return invalid_argument("the shape of input '" + name + "' is not set yet");
    return input_shapes_[io];
  }
  KILN_RETURN_IF_ERROR(infer_shapes());
  return shapes_[data_->io_values[io]];
}

Status ExecutionContext::set_tensor_address(const std::string& name, void* data) {
  KILN_ASSIGN_OR_RETURN(int io, io_index(name));
  io_address_[io] = data;
  return ok_status();
}

void* ExecutionContext::tensor_address(const std::string& name) const {
  auto io = io_index(name);
  return io.ok() ? io_address_[*io] : nullptr;
}

Status ExecutionContext::set_output_allocator(const std::string& name, OutputAllocator* allocator) {
  KILN_ASSIGN_OR_RETURN(int io, io_index(name));
  if (io < data_->num_inputs) return invalid_argument("'" + name + "' is an input; output allocators are for outputs");
  allocators_[io] = allocator;
  return ok_status();
}

Status ExecutionContext::execute() {
  KILN_RETURN_IF_ERROR(infer_shapes());
  const plan::Plan& p = data_->plan;
  const ir::Graph& g = p.graph;
  std::vector<void*>& io = io_address_;
  auto nbytes = [&](int v) { return size_t(shape_numel(shapes_[v])) * dtype_size(g.values[v].dtype); };
  for (size_t i = 0; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    const std::string& name = g.values[v].name;
    if (i >= size_t(data_->num_inputs) && allocators_[i]) {
      void* ptr = allocators_[i]->reallocate_output(name, io[i], nbytes(v), kAlign);
      if (!ptr && nbytes(v) > 0) {
        return out_of_memory("the output allocator for '" + name + "' returned no buffer for " +
                             std::to_string(nbytes(v)) + " bytes");
      }
      io[i] = ptr;
      allocators_[i]->notify_shape(name, shapes_[v]);
    }
    if (!io[i] && nbytes(v) > 0) {
      return invalid_argument(std::string(i < size_t(data_->num_inputs) ? "input" : "output") + " '" + name +
                              "' has no address: call set_tensor_address" +
                              (i < size_t(data_->num_inputs) ? "" : " or set_output_allocator"));
    }
  }
  const std::vector<int>& io_of_value = data_->io_of_value;
  auto address = [&](int v) -> void* {
    switch (p.values[v].storage) {
      case plan::Storage::kInput:
      case plan::Storage::kOutput: return io[io_of_value[v]];
      case plan::Storage::kConstant: return g.values[v].constant->data();
      case plan::Storage::kSymbolic:
      case plan::Storage::kActivation: return static_cast<char*>(arena_) + slot_offset_[p.values[v].slot];
    }
    return nullptr;
  };
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const ir::Node& node = g.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (node.inputs[i] >= 0) node_in_[n][i].data = address(node.inputs[i]);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] >= 0) node_out_[n][i].data = address(node.outputs[i]);
    }
    Status st = kernels_[n]->execute(node_in_[n], node_out_[n]);
    if (!st.ok()) return st.with_context(node.describe() + " [" + kernels_[n]->name() + "]");
  }
  // Outputs no node writes (a constant, an input, a shape formula) are copied to their buffers.
  for (size_t i = data_->num_inputs; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    void* src = address(v);
    if (p.values[v].storage == plan::Storage::kOutput && src == io[i]) continue;
    if (nbytes(v) > 0) std::memmove(io[i], src, nbytes(v));
  }
  return ok_status();
}

StatusOr<std::map<std::string, Tensor>> ExecutionContext::run(const std::map<std::string, Tensor>& inputs) {
  const ir::Graph& g = data_->plan.graph;
  for (const auto& [name, t] : inputs) {
    KILN_ASSIGN_OR_RETURN(int io, io_index(name));
    if (io >= data_->num_inputs) return invalid_argument("'" + name + "' is an output of the engine, not an input");
    DType want = g.values[data_->io_values[io]].dtype;
    if (t.dtype() != want) {
      return invalid_argument("input '" + name + "' has dtype " + std::string(dtype_name(t.dtype())) +
                              ", but the engine expects " + std::string(dtype_name(want)));
    }
    KILN_RETURN_IF_ERROR(set_input_shape(name, t.shape()));
    io_address_[io] = t.data();
  }
  std::string missing;
  for (int i = 0; i < data_->num_inputs; ++i) {
    const std::string& name = g.values[data_->io_values[i]].name;
    if (!inputs.count(name)) missing += (missing.empty() ? "" : ", ") + name;
  }
  if (!missing.empty()) return invalid_argument("missing input(s): " + missing);
  KILN_RETURN_IF_ERROR(infer_shapes());
  std::map<std::string, Tensor> outputs;
  for (size_t i = data_->num_inputs; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(g.values[v].dtype, shapes_[v]));
    io_address_[i] = t.data();
    allocators_[i] = nullptr;
    outputs[g.values[v].name] = std::move(t);
  }
  KILN_RETURN_IF_ERROR(execute());
  return outputs;
}

}  // namespace kiln

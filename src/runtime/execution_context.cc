// ExecutionContext: binds input shapes to the engine's symbols, resolves every value's shape from
// its formula, lays out the activation arena for those shapes (growing it only when they grow),
// and runs the kernels. On a device backend (CUDA) the arena and constants are device memory,
// the run is enqueued on the context's stream (optionally as a CUDA graph), and run() stages host
// tensors through page-locked buffers.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include "core/checked.h"
#include "runtime/engine.h"
#include "ops/loop_end.h"
#include "plan/loops.h"
#include "runtime/engine_data.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 64;

std::string shape_str(const Shape& s) { return shape_to_string(s); }

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The value whose bytes v is: its root for an alias (never itself an alias).
int root_of(const plan::Plan& p, int v) {
  return p.values[size_t(v)].storage == plan::Storage::kAlias ? p.values[size_t(v)].alias_of : v;
}

// A small tensor's elements for a message: "[1, 0, 2]" (the first 16, then "...").
std::string values_text(const Tensor& t) {
  std::string s = "[";
  const bool ints = is_integer(t.dtype()) || t.dtype() == DType::kBool;
  for (int64_t i = 0; i < t.numel() && i < 16; ++i) {
    if (i) s += ", ";
    if (ints) {
      s += std::to_string(t.int_at(i));
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", t.float_at(i));
      s += buf;
    }
  }
  return s + (t.numel() > 16 ? ", ...]" : "]");
}

}  // namespace

StatusOr<ir::SymbolRanges> size_ranges(const plan::Plan& plan, const ir::SymbolValues& at) {
  ir::SymbolRanges ranges;
  for (const auto& [name, v] : at) ranges[name] = ir::Interval{v, v};
  for (const ir::DataDependentDim& d : plan.data_dependent) {
    if (at.count(d.symbol)) continue;
    const ir::Interval b = d.bound.bounds(ranges);
    if (b.hi >= ir::Interval::kInf) {
      return invalid_argument("data-dependent dim " + d.symbol + " has no finite bound: " + d.bound.to_string());
    }
    ranges[d.symbol] = ir::data_dependent_range(d, ranges);
  }
  return ranges;
}

std::optional<int64_t> value_or_upper(const ir::Dim& d, const ir::SymbolValues& at, const ir::SymbolRanges& ranges) {
  if (auto x = d.eval(at)) return x;
  const ir::Interval b = d.bounds(ranges);
  if (b.hi >= ir::Interval::kInf || b.lo <= -ir::Interval::kInf) return std::nullopt;
  return b.hi;
}

GrowingOutputAllocator::GrowingOutputAllocator(Device device) {
  auto b = backends::get_backend(device);
  if (b.ok()) backend_ = *b;
}

GrowingOutputAllocator::~GrowingOutputAllocator() {
  if (ptr_) backend_->deallocate(ptr_);
}

void* GrowingOutputAllocator::reallocate_output(const std::string&, void*, size_t bytes, size_t) {
  if (!backend_) return nullptr;
  if (ptr_ && bytes <= capacity_) return ptr_;
  auto p = backend_->allocate(std::max<size_t>(bytes, 1));
  if (!p.ok()) return nullptr;
  if (ptr_) backend_->deallocate(ptr_);
  ptr_ = *p;
  capacity_ = bytes;
  return ptr_;
}

Status upload_constants(EngineData& data) {
  const backends::Backend* b = data.backend;
  if (b->host_accessible()) return ok_status();
  const ir::Graph& g = data.plan.graph;
  data.device_constants.assign(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (data.plan.values[v].storage != plan::Storage::kConstant || !g.values[v].constant) continue;
    const Tensor& t = *g.values[v].constant;
    KILN_ASSIGN_OR_RETURN(void* p, b->allocate(t.nbytes()));
    data.device_constants[v] = p;
    Status st = b->copy(p, t.data(), t.nbytes(), backends::CopyKind::kHostToDevice, nullptr);
    if (!st.ok()) return st.with_context("uploading constant '" + g.values[v].name + "'");
  }
  return b->synchronize(nullptr);
}

Status prepare_implementations(EngineData& data) {
  const plan::Plan& p = data.plan;
  // verify_plan has checked the tables, storage and aliases, and that each id names a kernel of
  // this device for the node's op.
  const backends::KernelRegistry& registry = backends::kernel_registry();
  data.impls.assign(p.graph.nodes.size(), nullptr);
  data.prepared.assign(p.graph.nodes.size(), nullptr);
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    const ir::Node& node = p.graph.nodes[n];
    const std::string& id = p.nodes[n].impl;
    if (id == plan::kAliasImpl || id == plan::kControlImpl) continue;  // a view runs nothing; a loop's boundary runs in the context
    const backends::KernelImpl* impl = registry.find(id);
    backends::KernelQuery q = data.query(n);
    // The file may have been edited: the implementation must still accept the node as planned.
    Status st = impl->supports(q);
    if (!st.ok()) return st.with_context("loading the plan: " + node.describe());
    auto prepared = impl->prepare(q, *data.backend);
    if (!prepared.ok()) return Status(prepared.status()).with_context("preparing " + node.describe());
    data.impls[n] = impl;
    data.prepared[n] = std::move(prepared).value();
  }
  return ok_status();
}

ExecutionContext::ExecutionContext(std::shared_ptr<const EngineData> data) : data_(std::move(data)) {
  input_shapes_.resize(data_->num_inputs);
  input_set_.assign(data_->num_inputs, 0);
  io_address_.assign(data_->io_values.size(), nullptr);
  allocators_.assign(data_->io_values.size(), nullptr);
  run_buffers_.resize(data_->io_values.size());
}

ExecutionContext::~ExecutionContext() {
  const backends::Backend* b = data_->backend;
  if (stream_) (void)b->synchronize(stream_);  // a destructor has no one to report to
  kernels_.clear();
  run_buffers_.clear();
  kernel_stream_ = stream_;  // a caller's stream may be gone by now: the caller waited for its work
  drop_graphs(false);
  for (void* p : bucket_buffers_) {
    if (p) b->deallocate(p);
  }
  for (void* m : markers_) b->destroy_marker(m);
  if (arena_) b->deallocate(arena_);
  if (io_device_) b->deallocate(io_device_);
  if (sym_host_) b->deallocate_host(sym_host_);
  if (staging_) b->deallocate_host(staging_);
  if (loop_words_) b->deallocate_host(loop_words_);
  if (stream_) b->destroy_stream(stream_);
}

Status ExecutionContext::prepare_kernels() {
  const ir::Graph& g = data_->plan.graph;
  KILN_ASSIGN_OR_RETURN(stream_, data_->backend->create_stream());
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const backends::KernelImpl* impl = data_->impls[n];
    if (!impl) {  // an alias: its output is its input's bytes, nothing runs
      kernels_.push_back(nullptr);
      continue;
    }
    backends::KernelQuery q = data_->query(n);
    q.prepared = data_->prepared[n].get();
    auto kernel = impl->instantiate(q, data_->prepared[n]);
    if (!kernel.ok()) return Status(kernel.status()).with_context("instantiating " + impl->id());
    kernels_.push_back(std::move(kernel).value());
    kernels_.back()->set_stream(stream_);
  }
  kernel_stream_ = stream_;
  node_in_.resize(g.nodes.size());
  node_out_.resize(g.nodes.size());
  return ok_status();
}

StatusOr<int> ExecutionContext::io_index(const std::string& name) const {
  return data_->find_io(name);
}

Status ExecutionContext::set_optimization_profile(int profile) {
  int n = int(data_->plan.profiles.size());
  if (profile < 0 || profile >= std::max(n, 1)) {
    return invalid_argument("profile " + std::to_string(profile) + " does not exist; the engine has " +
                            std::to_string(n) + " profile(s)");
  }
  profile_ = profile;
  pinned_ = true;
  resolved_ = false;
  return ok_status();
}

Status ExecutionContext::check_in_profile(int io, const Shape& shape, int p) const {
  const std::string& name = data_->plan.graph.values[data_->io_values[io]].name;
  const ir::Value& val = data_->plan.graph.values[data_->io_values[io]];
  const plan::InputRange* range = nullptr;
  for (const auto& r : data_->plan.profiles[size_t(p)].inputs) {
    if (r.name == name) range = &r;
  }
  if (!range) return ok_status();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (data_->input_bindings[io][d].fixed) continue;
    if (shape[d] < range->min[d] || shape[d] > range->max[d]) {
      return invalid_argument("input '" + name + "' dim " + std::to_string(d) + " (" + (*val.shape)[d].to_string() +
                              ") = " + std::to_string(shape[d]) + " is outside the range [" +
                              std::to_string(range->min[d]) + ", " + std::to_string(range->max[d]) +
                              "] of optimization profile " + std::to_string(p) + " (shape given: " +
                              shape_str(shape) + ")");
    }
  }
  return ok_status();
}

Status ExecutionContext::choose_profile() {
  const auto& profiles = data_->plan.profiles;
  int best = -1;
  double best_distance = 0;
  std::string why;
  for (int p = 0; p < int(profiles.size()); ++p) {
    double distance = 0;
    Status fits = ok_status();
    for (int i = 0; i < data_->num_inputs && fits.ok(); ++i) {
      fits = check_in_profile(i, input_shapes_[i], p);
      const std::string& name = data_->plan.graph.values[data_->io_values[i]].name;
      for (const auto& r : profiles[size_t(p)].inputs) {
        if (r.name != name) continue;
        for (size_t d = 0; d < r.opt.size() && d < input_shapes_[i].size(); ++d) {
          distance += std::abs(double(input_shapes_[i][d] - r.opt[d])) / double(std::max<int64_t>(r.opt[d], 1));
        }
      }
    }
    if (!fits.ok()) {
      why += "\n  " + fits.message();
      continue;
    }
    if (best < 0 || distance < best_distance) {
      best = p;
      best_distance = distance;
    }
  }
  if (best < 0) {
    return invalid_argument("no optimization profile holds every input's shape at once:" + why);
  }
  if (best != profile_) resolved_ = false;
  profile_ = best;
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
  const int n_profiles = int(data_->plan.profiles.size());
  const bool choose = !pinned_ && n_profiles > 1;
  if (n_profiles > 0 && !choose) KILN_RETURN_IF_ERROR(check_in_profile(io, shape, profile_));
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
    if ((shape[d] - b.offset) % b.coeff != 0) {
      // The dim moves in steps of coeff (a model's 4*h, or a profile's step): name the two
      // nearest values it takes.
      int64_t below = shape[d] - b.offset;
      below = below / b.coeff * b.coeff - (below < 0 ? b.coeff : 0) + b.offset;
      return invalid_argument(where + " = " + std::to_string(shape[d]) + " is not of the form " +
                              (*val.shape)[d].to_string() + " for an integer " + b.symbol + ": it moves in steps of " +
                              std::to_string(b.coeff) + " (the nearest values are " + std::to_string(below) +
                              " and " + std::to_string(below + b.coeff) + ")");
    }
  }
  if (choose) {
    // The shape must fit some profile; which one is decided once every input is set.
    std::string ranges;
    bool fits = false;
    for (int p = 0; p < n_profiles && !fits; ++p) {
      Status st = check_in_profile(io, shape, p);
      fits = st.ok();
      if (!fits) ranges += "\n  " + st.message();
    }
    if (!fits) {
      return invalid_argument("input '" + name + "' shape " + shape_str(shape) + " fits none of the engine's " +
                              std::to_string(n_profiles) + " optimization profiles:" + ranges);
    }
  }
  input_shapes_[io] = shape;
  input_set_[io] = 1;
  resolved_ = false;
  // Every input set: choose now, so optimization_profile() reports the choice. The shapes may be
  // half-way through a change (a new x with the previous y), so a set no profile holds is refused
  // by the run (resolve), not here.
  if (choose && std::all_of(input_set_.begin(), input_set_.end(), [](char c) { return c != 0; })) {
    (void)choose_profile();
  }
  return ok_status();
}

Status ExecutionContext::resolve() {
  std::string unset;
  for (int i = 0; i < data_->num_inputs; ++i) {
    if (!input_set_[i]) unset += (unset.empty() ? "" : ", ") + data_->plan.graph.values[data_->io_values[i]].name;
  }
  if (!unset.empty()) return invalid_argument("input shape(s) not set: " + unset + "; call set_input_shape first");
  // An unpinned context re-checks the choice: a set_input_shape that found no profile for the
  // whole set of shapes failed, but left the shape it was given.
  if (!pinned_ && data_->plan.profiles.size() > 1) KILN_RETURN_IF_ERROR(choose_profile());

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
  KILN_RETURN_IF_ERROR(bind_shape_values());

  const ir::Graph& g = data_->plan.graph;
  // Data-dependent dims are unbound until their nodes run: a value that names one is pending, and
  // holds the shape of its upper bound meanwhile (what its arena slot is sized for).
  KILN_ASSIGN_OR_RETURN(ranges_, size_ranges(data_->plan, symbols_));
  shapes_.assign(g.values.size(), {});
  pending_.assign(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const ir::Value& val = g.values[v];
    if (val.constant) {
      shapes_[v] = val.constant->shape();
      continue;
    }
    if (!val.shape) continue;
    pending_[v] = data_->value_data_dependent[v];
    Shape s;
    for (const auto& d : *val.shape) {
      auto x = value_or_upper(d, symbols_, ranges_);
      if (!x || *x < 0) {
        return internal_error("cannot evaluate dim " + d.to_string() + " of '" + val.name + "' for the given input shapes");
      }
      s.push_back(*x);
    }
    // Checked here once so every later numel * dtype_size of this shape is known not to wrap.
    auto numel = checked_numel(s);
    if (!numel || !checked_mul(*numel, int64_t(dtype_size(val.dtype)))) {
      return invalid_argument("tensor '" + val.name + "' of shape " + shape_str(s) + " is too large");
    }
    shapes_[v] = std::move(s);
  }

  // Arena layout for these shapes.
  const auto& slots = data_->plan.slot_bytes;
  slot_offset_.assign(slots.size(), 0);
  slot_size_.assign(slots.size(), 0);
  size_t total = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    auto bytes = value_or_upper(slots[k], symbols_, ranges_);
    if (!bytes || *bytes < 0) return internal_error("cannot evaluate arena slot " + std::to_string(k));
    slot_offset_[k] = total;
    slot_size_[k] = size_t(*bytes);
    size_t aligned = (size_t(*bytes) + kAlign - 1) / kAlign * kAlign;
    if (total + aligned < total) return out_of_memory("activation arena size overflows");
    total += aligned;
  }
  const backends::Backend* backend = data_->backend;
  const bool host = backend->host_accessible();
  if (total > arena_capacity_) {
    // In-flight work may still use the old arena, and captured graphs name its addresses.
    if (kernel_stream_) KILN_RETURN_IF_ERROR(backend->synchronize(kernel_stream_));
    drop_graphs(true);
    auto p = backend->allocate(std::max<size_t>(total, kAlign));
    if (!p.ok()) {
      return out_of_memory("cannot allocate " + std::to_string(total) + " bytes of activation memory: " +
                           p.status().message());
    }
    if (arena_) backend->deallocate(arena_);
    arena_ = *p;
    arena_capacity_ = total;
  }
  // On a device backend symbolic values live in page-locked host memory: kernels that need them
  // on the host (Slice starts, Resize scales) read them there, device kernels read them in place.
  if (!host) {
    sym_offset_.assign(slots.size(), 0);
    size_t sym_total = 0;
    for (size_t v = 0; v < g.values.size(); ++v) {
      if (data_->plan.values[v].storage != plan::Storage::kSymbolic) continue;
      int slot = data_->plan.values[v].slot;
      sym_offset_[slot] = sym_total;
      sym_total += align_up(slot_size_[slot]);
    }
    // A direct run still in flight may read them (graphs read their own copies).
    if (kernel_stream_ && sym_in_flight_) KILN_RETURN_IF_ERROR(backend->synchronize(kernel_stream_));
    sym_in_flight_ = false;
    if (sym_total > sym_capacity_) {
      KILN_ASSIGN_OR_RETURN(void* p, backend->allocate_host(sym_total));
      if (sym_host_) backend->deallocate_host(sym_host_);
      sym_host_ = p;
      sym_capacity_ = sym_total;
    }
  }

  // Shape tensors whose elements are formulas: written once per set of shapes (those that wait
  // for a data-dependent dim, once it is bound).
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (data_->plan.values[v].storage != plan::Storage::kSymbolic || pending_[v]) continue;
    KILN_RETURN_IF_ERROR(write_symbolic(v));
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

Status ExecutionContext::write_symbolic(size_t v) {
  const ir::Value& val = data_->plan.graph.values[v];
  const int slot = data_->plan.values[v].slot;
  char* dst = data_->backend->host_accessible() ? static_cast<char*>(arena_) + slot_offset_[slot]
                                                : static_cast<char*>(sym_host_) + sym_offset_[slot];
  if (val.sym_value->size() * dtype_size(val.dtype) > slot_size_[slot]) {
    return internal_error("symbolic value '" + val.name + "' does not fit its arena slot");
  }
  for (size_t i = 0; i < val.sym_value->size(); ++i) {
    auto x = (*val.sym_value)[i].eval(symbols_);
    if (!x) return internal_error("cannot evaluate element " + std::to_string(i) + " of '" + val.name + "'");
    switch (val.dtype) {
      case DType::kInt64: reinterpret_cast<int64_t*>(dst)[i] = *x; break;
      case DType::kInt32: reinterpret_cast<int32_t*>(dst)[i] = int32_t(*x); break;
      case DType::kBool: case DType::kUInt8: reinterpret_cast<uint8_t*>(dst)[i] = uint8_t(*x); break;
      case DType::kInt8: reinterpret_cast<int8_t*>(dst)[i] = int8_t(*x); break;
      // Exact float shape math (ops/elementwise.cc): integers the float holds exactly.
      case DType::kFloat32: reinterpret_cast<float*>(dst)[i] = float(*x); break;
      case DType::kFloat64: reinterpret_cast<double*>(dst)[i] = double(*x); break;
      default: return internal_error("symbolic value '" + val.name + "' has dtype " + std::string(dtype_name(val.dtype)));
    }
  }
  return ok_status();
}

Status ExecutionContext::bind_data_dependent(size_t n, void* stream) {
  const ir::Graph& g = data_->plan.graph;
  const ir::Node& node = g.nodes[n];
  const backends::Backend* backend = data_->backend;
  // The kernel's sizes are on the host once its work has finished.
  if (!backend->host_accessible()) KILN_RETURN_IF_ERROR(backend->synchronize(stream));
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const int v = node.outputs[o];
    if (v < 0 || !pending_[v]) continue;
    const ir::Value& val = g.values[v];
    auto actual = kernels_[n]->data_dependent_shape(o);
    if (!actual.ok()) return Status(actual.status()).with_context(node.describe() + " output '" + val.name + "'");
    const std::string where = node.describe() + " [" + kernels_[n]->name() + "] output '" + val.name + "'";
    if (actual->size() != val.shape->size()) {
      return internal_error(where + " has rank " + std::to_string(actual->size()) + ", the plan says " +
                            ir::dims_to_string(*val.shape));
    }
    for (size_t d = 0; d < actual->size(); ++d) {
      const ir::Dim& f = (*val.shape)[d];
      const int64_t x = (*actual)[d];
      if (auto known = f.eval(symbols_)) {
        if (*known != x) {
          return internal_error(where + " dim " + std::to_string(d) + " (" + f.to_string() + ") is " +
                                std::to_string(x) + ", not " + std::to_string(*known));
        }
        continue;
      }
      const auto r = f.is_symbol() ? ranges_.find(f.to_string()) : ranges_.end();
      if (r == ranges_.end() || x < r->second.lo || x > r->second.hi) {
        return internal_error(where + " dim " + std::to_string(d) + " (" + f.to_string() + ") is " +
                              std::to_string(x) + ", outside what the run sized it for" +
                              (r == ranges_.end() ? std::string()
                                                  : " [" + std::to_string(r->second.lo) + ", " +
                                                        std::to_string(r->second.hi) + "]"));
      }
      symbols_[r->first] = x;
      r->second = ir::Interval{x, x};
    }
  }
  // Shapes and symbolic values that were waiting, and the views of the nodes still to run.
  std::vector<char> ready(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (!pending_[v]) continue;
    const ir::Value& val = g.values[v];
    Shape s;
    bool known = true;
    for (const auto& d : *val.shape) {
      auto x = d.eval(symbols_);
      known = known && x && *x >= 0;
      if (known) s.push_back(*x);
    }
    if (known && val.sym_value) {
      for (const auto& e : *val.sym_value) known = known && e.eval(symbols_).has_value();
    }
    if (!known) continue;
    auto numel = checked_numel(s);
    if (!numel || !checked_mul(*numel, int64_t(dtype_size(val.dtype))) ||
        size_t(*numel) * dtype_size(val.dtype) > size_t(shape_numel(shapes_[v])) * dtype_size(val.dtype)) {
      return internal_error("value '" + val.name + "' of shape " + shape_str(s) + " is larger than its bound " +
                            shape_str(shapes_[v]));
    }
    shapes_[v] = std::move(s);
    pending_[v] = 0;
    ready[v] = 1;
    if (data_->plan.values[v].storage == plan::Storage::kSymbolic) KILN_RETURN_IF_ERROR(write_symbolic(v));
  }
  for (size_t m = n; m < g.nodes.size(); ++m) {
    for (size_t i = 0; i < g.nodes[m].inputs.size(); ++i) {
      const int v = g.nodes[m].inputs[i];
      if (v >= 0 && ready[v]) node_in_[m][i].shape = shapes_[v];
    }
    for (size_t i = 0; i < g.nodes[m].outputs.size(); ++i) {
      const int v = g.nodes[m].outputs[i];
      if (v >= 0 && ready[v]) node_out_[m][i].shape = shapes_[v];
    }
  }
  return ok_status();
}

Status ExecutionContext::bind_shape_values() {
  const auto& values = data_->plan.shape_values;
  shape_value_bytes_.resize(values.size());
  const plan::Profile* profile =
      data_->plan.profiles.empty() ? nullptr : &data_->plan.profiles[size_t(profile_)];
  for (size_t k = 0; k < values.size(); ++k) {
    const plan::ShapeValueInput& sv = values[k];
    KILN_ASSIGN_OR_RETURN(int io, io_index(sv.name));
    const void* ptr = io_address_[size_t(io)];
    const Tensor& fixed = sv.fixed;
    const size_t nbytes = fixed.nbytes();
    if (!ptr && nbytes > 0) {
      return invalid_argument("input '" + sv.name + "' holds shape values: bind its values in host memory "
                              "(set_tensor_address) before shapes are resolved, or pass it to run()");
    }
    if (nbytes > 0 && data_->backend->is_device_pointer(ptr)) {
      return invalid_argument("input '" + sv.name + "' holds shape values, which the run reads on the host: "
                              "its address is device memory; give it host memory");
    }
    const auto* bytes = static_cast<const uint8_t*>(ptr);
    shape_value_bytes_[k].assign(bytes, bytes + nbytes);
    KILN_ASSIGN_OR_RETURN(Tensor given, Tensor::zeros(fixed.dtype(), fixed.shape()));
    if (nbytes) std::memcpy(given.data(), bytes, nbytes);
    bool any_symbol = false;
    for (const std::string& sym : sv.symbols) any_symbol = any_symbol || !sym.empty();
    if (!any_symbol) {
      if (nbytes && std::memcmp(bytes, fixed.data(), nbytes) != 0) {
        return invalid_argument("input '" + sv.name + "' = " + values_text(given) + ", but the engine was built for the value " +
                                values_text(fixed) + " (its profile fixes it); build a profile with a range of values "
                                "(set_shape_values with min and max) to give others");
      }
      continue;
    }
    const plan::InputRange* range = nullptr;
    if (profile) {
      for (const auto& r : profile->values) {
        if (r.name == sv.name) range = &r;
      }
    }
    for (size_t i = 0; i < sv.symbols.size(); ++i) {
      const int64_t x = given.int_at(int64_t(i));
      const std::string where = "input '" + sv.name + "' element " + std::to_string(i);
      if (sv.symbols[i].empty()) {
        if (x != fixed.int_at(int64_t(i))) {
          return invalid_argument(where + " = " + std::to_string(x) + ", but the engine's profiles fix it at " +
                                  std::to_string(fixed.int_at(int64_t(i))) + " (values given: " + values_text(given) + ")");
        }
        continue;
      }
      if (range && i < range->min.size() && (x < range->min[i] || x > range->max[i])) {
        return invalid_argument(where + " (" + sv.symbols[i] + ") = " + std::to_string(x) + " is outside the range [" +
                                std::to_string(range->min[i]) + ", " + std::to_string(range->max[i]) +
                                "] of optimization profile " + std::to_string(profile_) + " (values given: " +
                                values_text(given) + ")");
      }
      symbols_[sv.symbols[i]] = x;
    }
  }
  return ok_status();
}

bool ExecutionContext::shape_values_changed() const {
  const auto& values = data_->plan.shape_values;
  if (shape_value_bytes_.size() != values.size()) return !values.empty();
  for (size_t k = 0; k < values.size(); ++k) {
    auto io = io_index(values[k].name);
    if (!io.ok()) return true;
    const auto* p = static_cast<const uint8_t*>(io_address_[size_t(*io)]);
    const auto& last = shape_value_bytes_[k];
    if (!last.empty() && (!p || std::memcmp(p, last.data(), last.size()) != 0)) return true;
  }
  return false;
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
  const int v = data_->io_values[io];
  if (!pending_[v]) return shapes_[v];
  Shape s;
  for (const auto& d : *data_->plan.graph.values[v].shape) s.push_back(d.eval(symbols_).value_or(-1));
  return s;
}

Status ExecutionContext::set_tensor_address(const std::string& name, void* data) {
  KILN_ASSIGN_OR_RETURN(int io, io_index(name));
  if (io < data_->num_inputs && data_->shape_value_of_input[size_t(io)] >= 0 && io_address_[io] != data) {
    resolved_ = false;  // its values are read there when shapes resolve
  }
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

Status ExecutionContext::allocate_output(size_t i) {
  const int v = data_->io_values[i];
  const std::string& name = data_->plan.graph.values[v].name;
  const size_t bytes = size_t(shape_numel(shapes_[v])) * dtype_size(data_->plan.graph.values[v].dtype);
  void* ptr = allocators_[i]->reallocate_output(name, io_address_[i], bytes, kAlign);
  if (!ptr && bytes > 0) {
    return out_of_memory("the output allocator for '" + name + "' returned no buffer for " +
                         std::to_string(bytes) + " bytes");
  }
  io_address_[i] = ptr;
  allocators_[i]->notify_shape(name, shapes_[v]);
  return ok_status();
}

Status ExecutionContext::check_io_addresses() {
  const ir::Graph& g = data_->plan.graph;
  std::vector<void*>& io = io_address_;
  auto nbytes = [&](int v) { return size_t(shape_numel(shapes_[v])) * dtype_size(g.values[v].dtype); };
  for (size_t i = 0; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    const std::string& name = g.values[v].name;
    if (data_->shape_data_dependent[v]) {
      // Sized by the run: its allocator gets the exact size when the data has decided it.
      if (!allocators_[i]) {
        return invalid_argument("output '" + name + "' has a data-dependent shape " +
                                ir::dims_to_string(*g.values[v].shape) +
                                ": give it an output allocator (set_output_allocator), or use run()");
      }
      continue;
    }
    if (i >= size_t(data_->num_inputs) && allocators_[i]) KILN_RETURN_IF_ERROR(allocate_output(i));
    if (!io[i] && nbytes(v) > 0) {
      return invalid_argument(std::string(i < size_t(data_->num_inputs) ? "input" : "output") + " '" + name +
                              "' has no address: call set_tensor_address" +
                              (i < size_t(data_->num_inputs) ? "" : " or set_output_allocator"));
    }
  }
  return ok_status();
}

// Before node n runs in an engine with data-dependent dims: its inputs' sizes are known, and
// only a node that makes such a dim has an output still waiting for one (a plan that orders them
// otherwise would run a kernel on a bound instead of a size).
Status ExecutionContext::check_sized(size_t n) const {
  const ir::Graph& g = data_->plan.graph;
  const ir::Node& node = g.nodes[n];
  // kiln::SelectBranch reads its condition and the branch that ran: the other one's values were
  // never sized.
  const size_t k = node.outputs.size();
  const bool select = data_->node_selects_branch[n] && node.inputs.size() == 1 + 2 * k;
  const int8_t taken = select ? condition_[size_t(node.inputs[0])] : -1;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const int v = node.inputs[i];
    if (select && i > 0 && (taken < 0 || (i <= k) != (taken == 1))) continue;
    if (v >= 0 && pending_[v]) {
      return internal_error(node.describe() + " reads '" + g.values[v].name + "' " +
                            ir::dims_to_string(*g.values[v].shape) + " before the run has sized it");
    }
  }
  for (int v : node.outputs) {
    if (v >= 0 && pending_[v] && !data_->node_makes_data_dependent[n]) {
      return internal_error(node.describe() + " writes '" + g.values[v].name + "' " +
                            ir::dims_to_string(*g.values[v].shape) + " before the run has sized it");
    }
  }
  return ok_status();
}

// The scalar value v as the run has it now, copied to host memory (waiting for the stream where it
// lives on the device).
Status ExecutionContext::read_scalar(int v, DType dtype, void* out, void* stream) {
  const ir::Value& val = data_->plan.graph.values[size_t(v)];
  if (pending_[size_t(v)] || shape_numel(shapes_[size_t(v)]) != 1 || val.dtype != dtype) {
    return internal_error("'" + val.name + "' is not one sized " + std::string(dtype_name(dtype)));
  }
  const void* address = value_address(v);
  const size_t bytes = dtype_size(dtype);
  const backends::Backend* backend = data_->backend;
  if (backend->host_accessible() || in_host_memory(v)) {
    std::memcpy(out, address, bytes);
    return ok_status();
  }
  KILN_RETURN_IF_ERROR(backend->copy(out, address, bytes, backends::CopyKind::kDeviceToHost, stream));
  return backend->synchronize(stream);
}

StatusOr<bool> ExecutionContext::read_condition(int v, void* stream) {
  if (condition_[size_t(v)] >= 0) return condition_[size_t(v)] == 1;
  uint8_t byte = 0;
  KILN_RETURN_IF_ERROR(read_scalar(v, DType::kBool, &byte, stream));
  condition_[size_t(v)] = byte != 0 ? 1 : 0;
  return byte != 0;
}

void* ExecutionContext::value_address(int v) const {
  const plan::Plan& p = data_->plan;
  v = root_of(p, v);
  const bool host = data_->backend->host_accessible();
  const plan::ValuePlan& vp = p.values[size_t(v)];
  switch (vp.storage) {
    case plan::Storage::kInput:
    case plan::Storage::kOutput: return io_address_[size_t(data_->io_of_value[size_t(v)])];
    case plan::Storage::kConstant: return host ? p.graph.values[size_t(v)].constant->data() : data_->device_constants[size_t(v)];
    case plan::Storage::kSymbolic:
      if (!host) return static_cast<char*>(sym_host_) + sym_offset_[size_t(vp.slot)];
      return static_cast<char*>(arena_) + slot_offset_[size_t(vp.slot)];
    case plan::Storage::kActivation: return static_cast<char*>(arena_) + slot_offset_[size_t(vp.slot)];
    case plan::Storage::kAlias: return nullptr;  // an alias's root is never an alias
  }
  return nullptr;
}

Status ExecutionContext::copy_bytes(void* to, const void* from, size_t bytes, bool from_host, void* stream) {
  if (bytes == 0 || to == from) return ok_status();
  const backends::Backend* backend = data_->backend;
  if (backend->host_accessible()) {
    std::memmove(to, from, bytes);
    return ok_status();
  }
  return backend->copy(to, from, bytes, from_host ? backends::CopyKind::kHostToDevice : backends::CopyKind::kDeviceToDevice,
                       stream);
}

bool ExecutionContext::in_host_memory(int v) const {
  return data_->plan.values[size_t(root_of(data_->plan, v))].storage == plan::Storage::kSymbolic;
}

size_t ExecutionContext::value_bytes(int v) const {
  return size_t(shape_numel(shapes_[size_t(v)])) * dtype_size(data_->plan.graph.values[size_t(v)].dtype);
}

Status ExecutionContext::copy_value(int to, int from, void* stream) {
  return copy_bytes(value_address(to), value_address(from), value_bytes(from), in_host_memory(from), stream);
}

// A run-time loop's boundary (plan/loops.h). LoopBegin reads M and cond, copies the initial values
// in and starts the counter; LoopEnd reads the body's condition and either goes back (the next
// values copied over the carried ones, the counter written, the body's conditions forgotten) or
// copies the last values out. On a device each read of M or of a condition computed on it waits
// for the stream, as an If on data does; a loop whose body passes its condition through waits only
// where M is data.
StatusOr<size_t> ExecutionContext::run_loop_node(size_t n, void* stream) {
  const ir::Graph& g = data_->plan.graph;
  const int index = data_->loop_at_node[n];
  const plan::LoopRegion& r = data_->loops[size_t(index)];
  LoopFrame& f = loop_frames_[size_t(index)];
  const ir::Node& begin = g.nodes[size_t(r.begin)];
  const ir::Node& end = g.nodes[size_t(r.end)];
  const ops::LoopEndLayout l = *ops::LoopEndLayout::of(end.inputs.size(), end.outputs.size());  // verify_plan checked
  auto write = [&](int v, const void* bytes, size_t size) -> Status {
    if (data_->backend->host_accessible()) return copy_bytes(value_address(v), bytes, size, true, stream);
    if (!loop_words_) {
      KILN_ASSIGN_OR_RETURN(loop_words_, data_->backend->allocate_host(kLoopWords * sizeof(int64_t)));
    }
    if (loop_word_next_ == kLoopWords) {  // a lap: the copies from these words have finished
      KILN_RETURN_IF_ERROR(data_->backend->synchronize(stream));
      loop_word_next_ = 0;
    }
    char* word = static_cast<char*>(loop_words_) + sizeof(int64_t) * loop_word_next_++;
    std::memcpy(word, bytes, size);
    return copy_bytes(value_address(v), word, size, true, stream);
  };
  // A growing loop's dims bound to what the carried values `from` have now (the initial values, or
  // the body's next ones), and every shape that names them resolved again: the values', the
  // views the kernels are given, and symbolic values (after a wait: a kernel still running may
  // read those in host memory).
  const auto& growth = data_->loop_growth[size_t(index)];
  auto bind_growth = [&](const std::vector<int>& from) -> Status {
    if (growth.empty()) return ok_status();
    if (!data_->backend->host_accessible()) KILN_RETURN_IF_ERROR(data_->backend->synchronize(stream));
    for (const auto& grow : growth) {
      const int64_t x = shapes_[size_t(from[grow.carried])][grow.dim];
      symbols_[grow.symbol] = x;
      ranges_[grow.symbol] = ir::Interval{x, x};
    }
    std::vector<char> changed(g.values.size(), 0);
    for (int v : data_->loop_values[size_t(index)]) {
      const ir::Value& val = g.values[size_t(v)];
      Shape shape;
      for (const ir::Dim& d : *val.shape) {
        const auto x = d.eval(symbols_);
        if (!x || *x < 0) return internal_error("value '" + val.name + "' dim " + d.to_string() + " has no size in the loop");
        shape.push_back(*x);
      }
      const plan::ValuePlan& rp = data_->plan.values[size_t(root_of(data_->plan, v))];
      const size_t bytes = size_t(shape_numel(shape)) * dtype_size(val.dtype);
      if (rp.storage == plan::Storage::kActivation && bytes > slot_size_[size_t(rp.slot)]) {
        return internal_error("value '" + val.name + "' of shape " + shape_str(shape) + " is larger than its slot (" +
                              std::to_string(slot_size_[size_t(rp.slot)]) + " bytes)");
      }
      shapes_[size_t(v)] = std::move(shape);
      pending_[size_t(v)] = 0;
      changed[size_t(v)] = 1;
      if (data_->plan.values[size_t(v)].storage == plan::Storage::kSymbolic) KILN_RETURN_IF_ERROR(write_symbolic(size_t(v)));
    }
    for (size_t m = 0; m < g.nodes.size(); ++m) {
      for (size_t i = 0; i < g.nodes[m].inputs.size(); ++i) {
        const int v = g.nodes[m].inputs[i];
        if (v >= 0 && changed[size_t(v)]) node_in_[m][i].shape = shapes_[size_t(v)];
      }
      for (size_t i = 0; i < g.nodes[m].outputs.size(); ++i) {
        const int v = g.nodes[m].outputs[i];
        if (v >= 0 && changed[size_t(v)]) node_out_[m][i].shape = shapes_[size_t(v)];
      }
    }
    return ok_status();
  };
  std::vector<int> inits(begin.inputs.begin() + 2, begin.inputs.end()), nexts;
  for (size_t j = 0; j < l.k; ++j) nexts.push_back(end.inputs[l.next(j)]);
  // The carried values out of the loop: the body's last ones, or the initial ones after no
  // iteration. Stacked outputs hold a row per iteration by then, as their shapes say.
  auto finish = [&](bool ran) -> StatusOr<size_t> {
    std::vector<size_t> bytes;
    for (size_t j = 0; j < l.k; ++j) bytes.push_back(value_bytes(ran ? nexts[j] : begin.outputs[2 + j]));
    if (ran) KILN_RETURN_IF_ERROR(bind_growth(nexts));  // the final values' shapes
    for (size_t j = 0; j < l.k; ++j) {
      const int from = ran ? nexts[j] : begin.outputs[2 + j];
      if (end.outputs[j] >= 0) {
        KILN_RETURN_IF_ERROR(copy_bytes(value_address(end.outputs[j]), value_address(from), bytes[j], in_host_memory(from), stream));
      }
    }
    for (size_t j = 0; j < l.q; ++j) {
      const int v = end.outputs[l.stacked(j)];
      if (v >= 0 && shapes_[size_t(v)][0] != f.iteration) {
        return internal_error("the loop ran " + std::to_string(f.iteration) + " iterations, but its scan output '" +
                              g.values[size_t(v)].name + "' has " + std::to_string(shapes_[size_t(v)][0]) + " rows");
      }
    }
    return size_t(r.end) + 1;
  };
  if (int(n) == r.begin) {
    f.trips = std::numeric_limits<int64_t>::max();
    f.iteration = 0;
    if (begin.inputs[0] >= 0) KILN_RETURN_IF_ERROR(read_scalar(begin.inputs[0], DType::kInt64, &f.trips, stream));
    bool go = true;
    if (begin.inputs[1] >= 0) {
      KILN_ASSIGN_OR_RETURN(go, read_condition(begin.inputs[1], stream));
    }
    for (size_t j = 0; j < l.k; ++j) KILN_RETURN_IF_ERROR(copy_value(begin.outputs[2 + j], begin.inputs[2 + j], stream));
    KILN_RETURN_IF_ERROR(bind_growth(inits));
    const int64_t zero = 0;
    const uint8_t yes = 1;
    KILN_RETURN_IF_ERROR(write(begin.outputs[0], &zero, sizeof zero));
    KILN_RETURN_IF_ERROR(write(begin.outputs[1], &yes, sizeof yes));
    if (f.trips <= 0 || !go) return finish(false);
    return n + 1;
  }
  // This iteration's row of each stacked output.
  for (size_t j = 0; j < l.q; ++j) {
    const int v = end.outputs[l.stacked(j)], from = end.inputs[l.scan(j)];
    if (v < 0) continue;
    const size_t row = value_bytes(from);
    if (f.iteration >= shapes_[size_t(v)][0]) {
      return internal_error("the loop's iteration " + std::to_string(f.iteration) + " is past the rows of its scan output '" +
                            g.values[size_t(v)].name + "'");
    }
    char* to = static_cast<char*>(value_address(v)) + size_t(f.iteration) * row;
    KILN_RETURN_IF_ERROR(copy_bytes(to, value_address(from), row, in_host_memory(from), stream));
  }
  bool go = true;
  if (end.inputs[l.cond_out] >= 0) {
    KILN_ASSIGN_OR_RETURN(go, read_condition(end.inputs[l.cond_out], stream));
  }
  ++f.iteration;
  ++run_loop_iterations_;
  if (!go || f.iteration >= f.trips) return finish(true);
  // The budget bounds the whole run: nested loops each under it would otherwise multiply (1e6
  // outer iterations of 1e6 inner ones).
  if (run_loop_iterations_ >= max_loop_iterations_) {
    return invalid_argument("the loop of " + begin.describe() + " ran " + std::to_string(f.iteration) +
                            " iterations and its condition still holds" +
                            (begin.inputs[0] >= 0 ? " (its trip count is " + std::to_string(f.trips) + ")" : "") +
                            (run_loop_iterations_ != f.iteration
                                 ? "; the run's loops ran " + std::to_string(run_loop_iterations_) + " iterations in all"
                                 : std::string()) +
                            "; ExecutionContext::set_max_loop_iterations (" + std::to_string(max_loop_iterations_) +
                            ", for all of a run's loops together) raises the limit");
  }
  // v_j = next_j for the next iteration, through the workspace where one next_j views another v;
  // then a growing loop's dims take the next values' sizes.
  const int ws = data_->plan.nodes[n].workspace_slot;
  auto aligned = [](size_t bytes) { return (bytes + plan::kLoopCopyAlign - 1) / plan::kLoopCopyAlign * plan::kLoopCopyAlign; };
  std::vector<size_t> bytes;
  for (int v : nexts) bytes.push_back(value_bytes(v));
  if (ws >= 0) {
    char* stage = static_cast<char*>(arena_) + slot_offset_[size_t(ws)];
    size_t at = 0;
    for (size_t j = 0; j < l.k; ++j) {
      KILN_RETURN_IF_ERROR(copy_bytes(stage + at, value_address(nexts[j]), bytes[j], in_host_memory(nexts[j]), stream));
      at += aligned(bytes[j]);
    }
    at = 0;
    for (size_t j = 0; j < l.k; ++j) {
      KILN_RETURN_IF_ERROR(copy_bytes(value_address(end.inputs[l.carried(j)]), stage + at, bytes[j], false, stream));
      at += aligned(bytes[j]);
    }
  } else {
    for (size_t j = 0; j < l.k; ++j) {
      KILN_RETURN_IF_ERROR(copy_bytes(value_address(end.inputs[l.carried(j)]), value_address(nexts[j]), bytes[j],
                                      in_host_memory(nexts[j]), stream));
    }
  }
  KILN_RETURN_IF_ERROR(bind_growth(nexts));
  KILN_RETURN_IF_ERROR(write(begin.outputs[0], &f.iteration, sizeof f.iteration));
  for (int m = r.begin; m < r.end; ++m) {
    for (int v : g.nodes[size_t(m)].outputs) {
      if (v >= 0) condition_[size_t(v)] = -1;
    }
  }
  return size_t(r.begin) + 1;
}

Status ExecutionContext::enqueue_kernels(void* stream) {
  const plan::Plan& p = data_->plan;
  const ir::Graph& g = p.graph;
  const backends::Backend* backend = data_->backend;
  const bool host = backend->host_accessible();
  std::vector<void*>& io = io_address_;
  auto nbytes = [&](int v) { return value_bytes(v); };
  auto resolve_address = [&](int v) { return value_address(v); };
  if (profiler_) {
    while (markers_.size() < g.nodes.size() + 1) {
      KILN_ASSIGN_OR_RETURN(void* m, backend->create_marker());
      markers_.push_back(m);
    }
    KILN_RETURN_IF_ERROR(backend->record_marker(markers_[0], stream));
  }
  condition_.assign(g.values.size(), -1);
  loop_frames_.assign(data_->loops.size(), LoopFrame{});
  run_loop_iterations_ = 0;
  const uint64_t serial = run_serial_.fetch_add(1, std::memory_order_acq_rel) + 1;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const ir::Node& node = g.nodes[n];
    if (cancel_serial_.load(std::memory_order_acquire) >= serial) {
      return cancelled("the run was cancelled (ExecutionContext::cancel) before " + node.describe() + ", node " +
                       std::to_string(n) + " of " + std::to_string(g.nodes.size()));
    }
    // A node of an If's branch runs only when the run takes that branch.
    bool runs = true;
    for (const ir::Guard& gd : node.guards) {
      KILN_ASSIGN_OR_RETURN(bool c, read_condition(gd.cond, stream));
      if (c != gd.when) {
        runs = false;
        break;
      }
    }
    if (runs && data_->loop_at_node[n] >= 0) {  // a loop's boundary: the run's own copies and jump
      if (data_->plan.data_dependent.size()) KILN_RETURN_IF_ERROR(check_sized(n));
      auto next = run_loop_node(n, stream);
      if (!next.ok()) return Status(next.status()).with_context(node.describe());
      // Going back, the marker after the LoopBegin is set again, so the body's layers report their
      // last iteration; going past the body, each skipped layer gets its mark.
      if (profiler_) {
        const size_t first = *next <= n ? *next : n + 1, last = *next <= n ? *next : *next;
        for (size_t m = first; m <= last; ++m) KILN_RETURN_IF_ERROR(backend->record_marker(markers_[m], stream));
      }
      n = *next - 1;
      continue;
    }
    if (!kernels_[n] || !runs) {  // an alias, or a branch not taken
      if (profiler_) KILN_RETURN_IF_ERROR(backend->record_marker(markers_[n + 1], stream));
      continue;
    }
    if (data_->node_selects_branch[n] && !node.inputs.empty() && node.inputs[0] >= 0) {
      KILN_RETURN_IF_ERROR(read_condition(node.inputs[0], stream).status());
    }
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (node.inputs[i] >= 0) node_in_[n][i].data = resolve_address(node.inputs[i]);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] >= 0) node_out_[n][i].data = resolve_address(node.outputs[i]);
    }
    const int ws = p.nodes[n].workspace_slot;
    if (ws >= 0) {
      kernels_[n]->set_workspace(static_cast<char*>(arena_) + slot_offset_[ws], slot_size_[ws]);
    }
    if (data_->plan.data_dependent.size()) KILN_RETURN_IF_ERROR(check_sized(n));
    Status st = kernels_[n]->execute(node_in_[n], node_out_[n]);
    if (!st.ok()) return st.with_context(node.describe() + " [" + kernels_[n]->name() + "]");
    if (data_->node_makes_data_dependent[n]) KILN_RETURN_IF_ERROR(bind_data_dependent(n, stream));
    if (profiler_) KILN_RETURN_IF_ERROR(backend->record_marker(markers_[n + 1], stream));
  }
  // Outputs no node writes (a constant, an input, a shape formula) are copied to their buffers,
  // and so are outputs of data-dependent size, into what their allocators give for the exact size.
  for (size_t i = data_->num_inputs; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    void* src = resolve_address(v);
    if (data_->shape_data_dependent[v]) {
      const std::string& name = g.values[v].name;
      if (pending_[v]) return internal_error("output '" + name + "' was never sized by the run");
      KILN_RETURN_IF_ERROR(allocate_output(i));
    }
    if (p.values[v].storage == plan::Storage::kOutput && src == io[i]) continue;
    if (nbytes(v) == 0 || src == io[i]) continue;
    if (host) {
      std::memmove(io[i], src, nbytes(v));
      continue;
    }
    auto kind = p.values[v].storage == plan::Storage::kSymbolic ? backends::CopyKind::kHostToDevice
                                                               : backends::CopyKind::kDeviceToDevice;
    KILN_RETURN_IF_ERROR(backend->copy(io[i], src, nbytes(v), kind, stream));
  }
  return ok_status();
}

Status ExecutionContext::enqueue(void* stream) {
  // Data-dependent dims are bound anew by every run.
  const bool data_dependent = !data_->plan.data_dependent.empty();
  if (data_dependent || shape_values_changed()) resolved_ = false;
  KILN_RETURN_IF_ERROR(infer_shapes());
  KILN_RETURN_IF_ERROR(check_io_addresses());
  if (!stream) stream = stream_;
  if (stream != kernel_stream_) {
    for (auto& k : kernels_) {
      if (k) k->set_stream(stream);
    }
    kernel_stream_ = stream;
  }
  const backends::Backend* backend = data_->backend;
  if (profiler_) {
    KILN_RETURN_IF_ERROR(enqueue_kernels(stream));
    return report_layer_times(stream);
  }
  if (!use_graph_ || backend->host_accessible() || data_dependent || data_->has_guards || !data_->loops.empty()) {
    sym_in_flight_ = !backend->host_accessible();
    return enqueue_kernels(stream);
  }
  if (!buckets_.empty()) {
    bool ran = false;
    KILN_RETURN_IF_ERROR(enqueue_bucketed(stream, &ran));
    if (ran) return ok_status();
  }
  return enqueue_graph(stream);
}

void ExecutionContext::set_cuda_graph_cache_capacity(size_t capacity) {
  graph_capacity_ = capacity;
  while (graphs_.size() > graph_capacity_) (void)evict_oldest_graph();  // a setter has no one to report to
}

void ExecutionContext::release_graph(CachedGraph& c) {
  data_->backend->destroy_graph(c.graph);
  if (c.sym) data_->backend->deallocate_host(c.sym);
}

Status ExecutionContext::evict_oldest_graph() {
  // The graph may still run.
  Status st = kernel_stream_ ? data_->backend->synchronize(kernel_stream_) : ok_status();
  release_graph(graphs_.back());
  graphs_.pop_back();
  ++graph_stats_.evictions;
  return st;
}

ExecutionContext::GraphStats ExecutionContext::cuda_graph_stats() const {
  GraphStats s = graph_stats_;
  s.cached = graphs_.size();
  return s;
}

void ExecutionContext::drop_graphs(bool evicted) {
  const backends::Backend* b = data_->backend;
  if (!graphs_.empty() && kernel_stream_) (void)b->synchronize(kernel_stream_);
  for (CachedGraph& c : graphs_) release_graph(c);
  if (evicted) graph_stats_.evictions += int64_t(graphs_.size());
  graphs_.clear();
}

// The run as a CUDA graph: a cached one for these shapes, addresses and stream, or a direct run
// followed by a capture of the same work (kernels size their scratch and choose algorithms on the
// direct run), kept in the cache.
Status ExecutionContext::enqueue_graph(void* stream) {
  const backends::Backend* backend = data_->backend;
  std::vector<int64_t> key;
  for (const Shape& s : input_shapes_) {
    key.push_back(int64_t(s.size()));
    key.insert(key.end(), s.begin(), s.end());
  }
  for (void* a : io_address_) key.push_back(int64_t(reinterpret_cast<intptr_t>(a)));
  key.push_back(int64_t(reinterpret_cast<intptr_t>(stream)));
  for (const auto& bytes : shape_value_bytes_) key.insert(key.end(), bytes.begin(), bytes.end());
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (it->key != key) continue;
    graphs_.splice(graphs_.begin(), graphs_, it);
    ++graph_stats_.replays;
    return backend->launch_graph(graphs_.front().graph, stream);
  }
  KILN_RETURN_IF_ERROR(enqueue_kernels(stream));
  sym_in_flight_ = true;
  if (key == graph_failed_key_ || graph_capacity_ == 0) return ok_status();
  // The graph reads its own copy of the symbolic values: later shapes rewrite the shared ones.
  CachedGraph entry;
  entry.key = std::move(key);
  if (sym_capacity_ > 0) {
    KILN_ASSIGN_OR_RETURN(entry.sym, backend->allocate_host(sym_capacity_));
    std::memcpy(entry.sym, sym_host_, sym_capacity_);
  }
  void* shared = sym_host_;
  if (entry.sym) sym_host_ = entry.sym;
  Status begun = backend->begin_capture(stream);
  Status captured = begun.ok() ? enqueue_kernels(stream) : begun;
  auto graph = begun.ok() ? backend->end_capture(stream) : StatusOr<void*>(begun);
  sym_host_ = shared;
  if (!captured.ok() || !graph.ok()) {
    if (graph.ok()) backend->destroy_graph(*graph);
    if (entry.sym) backend->deallocate_host(entry.sym);
    graph_failed_key_ = entry.key;  // this set of shapes runs without a graph
    return ok_status();
  }
  entry.graph = *graph;
  graphs_.push_front(std::move(entry));
  if (graphs_.size() > graph_capacity_) KILN_RETURN_IF_ERROR(evict_oldest_graph());
  ++graph_stats_.captures;
  return ok_status();
}

Status ExecutionContext::set_batch_buckets(std::vector<int64_t> buckets) {
  const backends::Backend* b = data_->backend;
  const ir::Graph& g = data_->plan.graph;
  if (buckets.empty()) {
    buckets_.clear();
    return ok_status();
  }
  if (b->host_accessible()) {
    return invalid_argument("batch buckets pad runs to replay CUDA graphs; the " +
                            std::string(device_name(data_->plan.device)) + " backend has none");
  }
  if (!data_->plan.data_dependent.empty()) {
    return invalid_argument("batch buckets: this engine has data-dependent sizes, whose runs use no CUDA graph");
  }
  if (!data_->plan.shape_values.empty()) {
    return invalid_argument("batch buckets: this engine has shape-value inputs, which padding would not follow");
  }
  if (data_->has_guards) {
    return invalid_argument("batch buckets: this engine has an If on data, whose runs use no CUDA graph");
  }
  if (!data_->loops.empty()) {
    return invalid_argument("batch buckets: this engine has a loop that runs at run time, whose runs use no CUDA graph");
  }
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  if (buckets.front() < 1) return invalid_argument("batch buckets must be positive, got " + std::to_string(buckets.front()));
  // The batch: the symbol every input's dim 0 is, alone.
  std::string batch;
  for (int i = 0; i < data_->num_inputs; ++i) {
    const std::string& name = g.values[data_->io_values[i]].name;
    const auto& bind = data_->input_bindings[i];
    if (bind.empty() || bind[0].fixed || bind[0].coeff != 1 || bind[0].offset != 0 ||
        (!batch.empty() && bind[0].symbol != batch)) {
      return invalid_argument("batch buckets: input '" + name + "' dim 0 is " +
                              (bind.empty() ? std::string("absent (a scalar)") : (*g.values[data_->io_values[i]].shape)[0].to_string()) +
                              ", not the batch every input starts with" + (batch.empty() ? "" : " (" + batch + ")"));
    }
    batch = bind[0].symbol;
  }
  auto names_batch = [&](const std::vector<ir::Dim>& dims, size_t from) {
    std::set<std::string> syms;
    for (size_t d = from; d < dims.size(); ++d) dims[d].collect_symbols(&syms);
    return syms.count(batch) > 0;
  };
  for (size_t i = 0; i < data_->io_values.size(); ++i) {
    const ir::Value& v = g.values[data_->io_values[i]];
    const bool output = i >= size_t(data_->num_inputs);
    if (output && (v.shape->empty() || !((*v.shape)[0] == ir::Dim::symbol(batch)))) {
      return invalid_argument("batch buckets: output '" + v.name + "' " + ir::dims_to_string(*v.shape) +
                              " does not start with the batch " + batch + ", so its rows cannot be sliced back");
    }
    if (names_batch(*v.shape, 1)) {
      return invalid_argument("batch buckets: " + std::string(output ? "output" : "input") + " '" + v.name + "' " +
                              ir::dims_to_string(*v.shape) + " depends on the batch " + batch + " past dim 0");
    }
  }
  for (const ir::Node& node : g.nodes) {
    bool in = false, out = false;
    for (int v : node.inputs) in = in || (v >= 0 && g.values[v].shape && names_batch(*g.values[v].shape, 0));
    for (int v : node.outputs) out = out || (v >= 0 && g.values[v].shape && names_batch(*g.values[v].shape, 0));
    if (in && !out && !node.outputs.empty()) {
      return invalid_argument("batch buckets: " + node.describe() + " reduces across the batch " + batch +
                              ", so padded rows would change its result");
    }
  }
  buckets_ = std::move(buckets);
  bucket_buffers_.resize(data_->io_values.size(), nullptr);
  bucket_capacity_.resize(data_->io_values.size(), 0);
  return ok_status();
}

// Runs at the bucket (the batch's, or the next one up): the inputs copied into the bucket's
// buffers (zero rows after the real ones), the run (a cached graph per bucket), and each output's
// first rows copied back. Buffers are sized for the largest bucket at once, so their addresses,
// part of the graphs' keys, stay.
Status ExecutionContext::enqueue_bucketed(void* stream, bool* ran) {
  *ran = false;
  const backends::Backend* b = data_->backend;
  const ir::Graph& g = data_->plan.graph;
  const int64_t batch = input_shapes_[0][0];
  auto up = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  // A batch that is a bucket goes through the buffers too: its graph is then the bucket's, one
  // per bucket whatever the caller's addresses.
  if (up == buckets_.end()) return ok_status();
  const int64_t bucket = *up;
  std::vector<Shape> padded = input_shapes_;
  for (Shape& s : padded) s[0] = bucket;
  if (!data_->plan.profiles.empty()) {
    for (int i = 0; i < data_->num_inputs; ++i) {
      if (!check_in_profile(i, padded[i], profile_).ok()) return ok_status();  // runs as it is
    }
  }
  // Exact outputs, and the addresses the caller bound (allocators answered by check_io_addresses).
  std::vector<size_t> out_bytes(io_address_.size(), 0);
  for (size_t i = data_->num_inputs; i < io_address_.size(); ++i) {
    const int v = data_->io_values[i];
    out_bytes[i] = size_t(shape_numel(shapes_[v])) * dtype_size(g.values[v].dtype);
  }
  const std::vector<void*> caller = io_address_;
  const std::vector<Shape> exact = input_shapes_;
  auto restore = [&] {
    io_address_ = caller;
    input_shapes_ = exact;
    resolved_ = false;  // tensor_shape() and the next run resolve the exact shapes again
  };
  input_shapes_ = padded;
  resolved_ = false;
  Status st = infer_shapes();
  if (!st.ok()) {
    restore();
    return st;
  }
  // Buffers for the largest bucket: rows of each IO tensor times buckets_.back().
  for (size_t i = 0; i < io_address_.size() && st.ok(); ++i) {
    const int v = data_->io_values[i];
    const size_t bytes = size_t(shape_numel(shapes_[v])) * dtype_size(g.values[v].dtype);
    const size_t row = bucket > 0 ? bytes / size_t(bucket) : 0;
    const size_t need = std::max<size_t>(row * size_t(buckets_.back()), 1);
    if (need > bucket_capacity_[i]) {
      st = b->synchronize(stream);  // the buffer may still be read
      if (!st.ok()) break;
      auto p = b->allocate(need);
      if (!p.ok()) {
        st = p.status();
        break;
      }
      if (bucket_buffers_[i]) b->deallocate(bucket_buffers_[i]);
      bucket_buffers_[i] = *p;
      bucket_capacity_[i] = need;
    }
    io_address_[i] = bucket_buffers_[i];
    if (i < size_t(data_->num_inputs)) {
      const size_t real = row * size_t(batch);
      if (real) st = b->copy(bucket_buffers_[i], caller[i], real, backends::CopyKind::kDeviceToDevice, stream);
      if (st.ok() && bytes > real) st = b->fill_zero(static_cast<char*>(bucket_buffers_[i]) + real, bytes - real, stream);
    }
  }
  if (st.ok()) st = enqueue_graph(stream);
  for (size_t i = data_->num_inputs; i < io_address_.size() && st.ok(); ++i) {
    if (out_bytes[i]) st = b->copy(caller[i], bucket_buffers_[i], out_bytes[i], backends::CopyKind::kDeviceToDevice, stream);
  }
  restore();
  if (st.ok()) *ran = true;
  return st;
}

// After a profiled enqueue_kernels: waits for the run, then reports each kernel's time (between
// the markers before and after it).
Status ExecutionContext::report_layer_times(void* stream) {
  const backends::Backend* backend = data_->backend;
  KILN_RETURN_IF_ERROR(backend->synchronize(stream));
  const ir::Graph& g = data_->plan.graph;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    if (!kernels_[n]) continue;
    KILN_ASSIGN_OR_RETURN(double ms, backend->marker_elapsed_ms(markers_[n], markers_[n + 1]));
    profiler_->report_layer_time(g.nodes[n].name, ms);
  }
  return ok_status();
}

Status ExecutionContext::enqueue_on_default_stream() {
  const backends::Backend* b = data_->backend;
  if (b->host_accessible()) return enqueue(stream_);
  KILN_RETURN_IF_ERROR(b->order_after(stream_, nullptr));
  Status run = enqueue(stream_);
  // Even a run that failed part-way may have queued kernels: stream 0's later work waits for them.
  Status fenced = b->order_after(nullptr, stream_);
  return run.ok() ? fenced : run;
}

Status ExecutionContext::execute() {
  KILN_RETURN_IF_ERROR(enqueue(stream_));
  return data_->backend->synchronize(stream_);
}

// run() on a device backend: host tensors go through page-locked staging into device buffers
// owned by the context (grown, never per call), or straight from where they are when they are
// page-locked already (kiln.empty_pinned); device tensors are bound as they are.
Status ExecutionContext::run_on_device(const std::map<std::string, Tensor>& inputs,
                                       std::map<std::string, Tensor>* outputs) {
  const ir::Graph& g = data_->plan.graph;
  const backends::Backend* b = data_->backend;
  size_t n_io = data_->io_values.size();
  std::vector<size_t> off(n_io, 0);
  std::vector<char> staged(n_io, 0);
  size_t total = 0;
  for (size_t i = 0; i < n_io; ++i) {
    int v = data_->io_values[i];
    if (data_->shape_data_dependent[v]) continue;  // run() copies it from its allocator's buffer
    size_t bytes = size_t(shape_numel(shapes_[v])) * dtype_size(g.values[v].dtype);
    if (i < size_t(data_->num_inputs)) {
      const Tensor& t = inputs.at(g.values[v].name);
      if (data_->shape_value_of_input[i] >= 0) continue;  // read on the host, where run() set it
      if (t.nbytes() > 0 && b->is_device_pointer(t.data())) {
        io_address_[i] = t.data();
        continue;
      }
    }
    staged[i] = 1;
    off[i] = total;
    total += align_up(std::max<size_t>(bytes, 1));
  }
  if (total > staging_capacity_) {
    KILN_RETURN_IF_ERROR(b->synchronize(stream_));
    KILN_ASSIGN_OR_RETURN(void* h, b->allocate_host(total));
    auto d = b->allocate(total);
    if (!d.ok()) {
      b->deallocate_host(h);
      return d.status();
    }
    if (staging_) b->deallocate_host(staging_);
  if (loop_words_) b->deallocate_host(loop_words_);
    if (io_device_) b->deallocate(io_device_);
    staging_ = h, io_device_ = *d;
    staging_capacity_ = io_device_capacity_ = total;
  }
  char* host = static_cast<char*>(staging_);
  char* dev = static_cast<char*>(io_device_);
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  last_timing_ = {};
  auto t0 = Clock::now();
  for (size_t i = 0; i < n_io; ++i) {
    if (!staged[i]) continue;
    io_address_[i] = dev + off[i];
    if (i >= size_t(data_->num_inputs)) continue;
    const Tensor& t = inputs.at(g.values[data_->io_values[i]].name);
    const void* from = t.data();
    if (t.nbytes() > 0 && !b->is_page_locked(from)) {
      std::memcpy(host + off[i], from, t.nbytes());
      from = host + off[i];
    }
    KILN_RETURN_IF_ERROR(b->copy(dev + off[i], from, t.nbytes(), backends::CopyKind::kHostToDevice, stream_));
  }
  if (time_phases_) {
    KILN_RETURN_IF_ERROR(b->synchronize(stream_));
    last_timing_.h2d_ms = ms_since(t0);
    t0 = Clock::now();
  }
  KILN_RETURN_IF_ERROR(enqueue(stream_));
  if (time_phases_) {
    KILN_RETURN_IF_ERROR(b->synchronize(stream_));
    last_timing_.compute_ms = ms_since(t0);
    t0 = Clock::now();
  }
  for (size_t i = data_->num_inputs; i < n_io; ++i) {
    if (!staged[i]) continue;
    const Tensor& t = outputs->at(g.values[data_->io_values[i]].name);
    KILN_RETURN_IF_ERROR(b->copy(host + off[i], dev + off[i], t.nbytes(), backends::CopyKind::kDeviceToHost, stream_));
  }
  KILN_RETURN_IF_ERROR(b->synchronize(stream_));
  if (time_phases_) last_timing_.d2h_ms = ms_since(t0);
  for (size_t i = data_->num_inputs; i < n_io; ++i) {
    if (!staged[i]) continue;
    const Tensor& t = outputs->at(g.values[data_->io_values[i]].name);
    std::memcpy(t.data(), host + off[i], t.nbytes());
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
  const backends::Backend* b = data_->backend;
  std::map<std::string, Tensor> outputs;
  for (size_t i = data_->num_inputs; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    allocators_[i] = nullptr;
    if (data_->shape_data_dependent[v]) {
      // Sized by the run: a buffer of the context's until then, copied out below.
      if (!run_buffers_[i]) run_buffers_[i] = std::make_unique<GrowingOutputAllocator>(data_->plan.device);
      allocators_[i] = run_buffers_[i].get();
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(g.values[v].dtype, shapes_[v]));
    io_address_[i] = t.data();
    outputs[g.values[v].name] = std::move(t);
  }
  if (!b->host_accessible()) {
    KILN_RETURN_IF_ERROR(run_on_device(inputs, &outputs));
  } else {
    auto t0 = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(execute());
    last_timing_ = {0, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), 0};
  }
  for (size_t i = data_->num_inputs; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    if (!data_->shape_data_dependent[v]) continue;
    const GrowingOutputAllocator& buf = *run_buffers_[i];
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(g.values[v].dtype, buf.shape()));
    const auto kind = b->host_accessible() ? backends::CopyKind::kHostToHost : backends::CopyKind::kDeviceToHost;
    KILN_RETURN_IF_ERROR(b->copy(t.data(), buf.data(), t.nbytes(), kind, stream_));
    outputs[g.values[v].name] = std::move(t);
    allocators_[i] = nullptr;
  }
  if (!data_->plan.data_dependent.empty()) KILN_RETURN_IF_ERROR(b->synchronize(stream_));  // the copies above
  return outputs;
}

}  // namespace kiln

// ExecutionContext's shape binding: the profile, input shapes and shape-value inputs bound to the
// engine's symbols, every value's shape resolved from its formula and the arena laid out for them,
// and the data-dependent dims bound as the run learns them (execution_context.cc runs).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include "core/checked.h"
#include "ops/loop_end.h"
#include "plan/loops.h"
#include "runtime/arena.h"
#include "runtime/engine.h"
#include "runtime/engine_data.h"

namespace kiln {
namespace {

std::string shape_str(const Shape& s) { return shape_to_string(s); }

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

Status ExecutionContext::set_optimization_profile(int profile) {
  int n = int(data_->plan.profiles.size());
  if (profile < 0 || profile >= std::max(n, 1)) {
    return invalid_argument("profile " + std::to_string(profile) +
                            " does not exist; the engine has " + std::to_string(n) + " profile(s)");
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
      return invalid_argument("input '" + name + "' dim " + std::to_string(d) + " (" +
                              (*val.shape)[d].to_string() + ") = " + std::to_string(shape[d]) +
                              " is outside the range [" + std::to_string(range->min[d]) + ", " +
                              std::to_string(range->max[d]) + "] of optimization profile " +
                              std::to_string(p) + " (shape given: " + shape_str(shape) + ")");
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
          distance += std::abs(double(input_shapes_[i][d] - r.opt[d])) /
                      double(std::max<int64_t>(r.opt[d], 1));
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
    return invalid_argument("input '" + name + "' has rank " + std::to_string(bindings.size()) +
                            " " + ir::dims_to_string(*val.shape) + ", but the shape given, " +
                            shape_str(shape) + ", has rank " + std::to_string(shape.size()));
  }
  const int n_profiles = int(data_->plan.profiles.size());
  const bool choose = !pinned_ && n_profiles > 1;
  if (n_profiles > 0 && !choose) KILN_RETURN_IF_ERROR(check_in_profile(io, shape, profile_));
  for (size_t d = 0; d < shape.size(); ++d) {
    const auto& b = bindings[d];
    // Built only for an error: a run sets every input's shape, most often the one it had.
    auto where = [&] {
      return "input '" + name + "' dim " + std::to_string(d) + " (" + (*val.shape)[d].to_string() +
             ")";
    };
    if (b.fixed) {
      if (shape[d] != b.value) {
        return invalid_argument(where() + " is fixed at " + std::to_string(b.value) + ", got " +
                                std::to_string(shape[d]) + " in shape " + shape_str(shape));
      }
      continue;
    }
    if ((shape[d] - b.offset) % b.coeff != 0) {
      // The dim moves in steps of coeff (a model's 4*h, or a profile's step): name the two
      // nearest values it takes.
      int64_t below = shape[d] - b.offset;
      below = below / b.coeff * b.coeff - (below < 0 ? b.coeff : 0) + b.offset;
      return invalid_argument(where() + " = " + std::to_string(shape[d]) + " is not of the form " +
                              (*val.shape)[d].to_string() + " for an integer " + b.symbol +
                              ": it moves in steps of " + std::to_string(b.coeff) +
                              " (the nearest values are " + std::to_string(below) + " and " +
                              std::to_string(below + b.coeff) + ")");
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
      return invalid_argument("input '" + name + "' shape " + shape_str(shape) +
                              " fits none of the engine's " + std::to_string(n_profiles) +
                              " optimization profiles:" + ranges);
    }
  }
  // The shape it already had keeps the resolved shapes, arena and graphs (run() sets every input
  // each call; re-resolving a 180-layer decoder cost more than its kernels at a few tokens).
  if (!input_set_[io] || input_shapes_[io] != shape) resolved_ = false;
  input_shapes_[io] = shape;
  input_set_[io] = 1;
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
    if (!input_set_[i])
      unset += (unset.empty() ? "" : ", ") + data_->plan.graph.values[data_->io_values[i]].name;
  }
  if (!unset.empty())
    return invalid_argument("input shape(s) not set: " + unset + "; call set_input_shape first");
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
        return invalid_argument(where + " implies " + b.symbol + " = " + std::to_string(v) +
                                ", but " + bound_by[b.symbol] + " implies " + b.symbol + " = " +
                                std::to_string(it->second));
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
        return internal_error("cannot evaluate dim " + d.to_string() + " of '" + val.name +
                              "' for the given input shapes");
      }
      s.push_back(*x);
    }
    // Checked here once so every later numel * dtype_size of this shape is known not to wrap.
    auto numel = checked_numel(s);
    if (!numel || !checked_mul(*numel, int64_t(dtype_size(val.dtype)))) {
      return invalid_argument("tensor '" + val.name + "' of shape " + shape_str(s) +
                              " is too large");
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
    if (!bytes || *bytes < 0)
      return internal_error("cannot evaluate arena slot " + std::to_string(k));
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
    KILN_RETURN_IF_ERROR(wait_for_runs());
    drop_graphs(true);
    auto p = backend->allocate(std::max<size_t>(total, kAlign));
    if (!p.ok()) {
      return out_of_memory("cannot allocate " + std::to_string(total) +
                           " bytes of activation memory: " + p.status().message());
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
    if (kernel_stream_ && sym_in_flight_)
      KILN_RETURN_IF_ERROR(backend->synchronize(kernel_stream_));
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
    if (!x)
      return internal_error("cannot evaluate element " + std::to_string(i) + " of '" + val.name +
                            "'");
    switch (val.dtype) {
      case DType::kInt64:
        reinterpret_cast<int64_t*>(dst)[i] = *x;
        break;
      case DType::kInt32:
        reinterpret_cast<int32_t*>(dst)[i] = int32_t(*x);
        break;
      case DType::kBool:
      case DType::kUInt8:
        reinterpret_cast<uint8_t*>(dst)[i] = uint8_t(*x);
        break;
      case DType::kInt8:
        reinterpret_cast<int8_t*>(dst)[i] = int8_t(*x);
        break;
      // Exact float shape math (ops/elementwise.cc): integers the float holds exactly.
      case DType::kFloat32:
        reinterpret_cast<float*>(dst)[i] = float(*x);
        break;
      case DType::kFloat64:
        reinterpret_cast<double*>(dst)[i] = double(*x);
        break;
      default:
        return internal_error("symbolic value '" + val.name + "' has dtype " +
                              std::string(dtype_name(val.dtype)));
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
    if (!actual.ok())
      return Status(actual.status()).with_context(node.describe() + " output '" + val.name + "'");
    const std::string where =
        node.describe() + " [" + kernels_[n]->name() + "] output '" + val.name + "'";
    if (actual->size() != val.shape->size()) {
      return internal_error(where + " has rank " + std::to_string(actual->size()) +
                            ", the plan says " + ir::dims_to_string(*val.shape));
    }
    for (size_t d = 0; d < actual->size(); ++d) {
      const ir::Dim& f = (*val.shape)[d];
      const int64_t x = (*actual)[d];
      if (auto known = f.eval(symbols_)) {
        if (*known != x) {
          return internal_error(where + " dim " + std::to_string(d) + " (" + f.to_string() +
                                ") is " + std::to_string(x) + ", not " + std::to_string(*known));
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
        size_t(*numel) * dtype_size(val.dtype) >
            size_t(shape_numel(shapes_[v])) * dtype_size(val.dtype)) {
      return internal_error("value '" + val.name + "' of shape " + shape_str(s) +
                            " is larger than its bound " + shape_str(shapes_[v]));
    }
    shapes_[v] = std::move(s);
    pending_[v] = 0;
    ready[v] = 1;
    if (data_->plan.values[v].storage == plan::Storage::kSymbolic)
      KILN_RETURN_IF_ERROR(write_symbolic(v));
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
      return invalid_argument(
          "input '" + sv.name +
          "' holds shape values: bind its values in host memory "
          "(set_tensor_address) before shapes are resolved, or pass it to run()");
    }
    if (nbytes > 0 && data_->backend->is_device_pointer(ptr)) {
      return invalid_argument("input '" + sv.name +
                              "' holds shape values, which the run reads on the host: "
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
        return invalid_argument("input '" + sv.name + "' = " + values_text(given) +
                                ", but the engine was built for the value " + values_text(fixed) +
                                " (its profile fixes it); build a profile with a range of values "
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
          return invalid_argument(where + " = " + std::to_string(x) +
                                  ", but the engine's profiles fix it at " +
                                  std::to_string(fixed.int_at(int64_t(i))) +
                                  " (values given: " + values_text(given) + ")");
        }
        continue;
      }
      if (range && i < range->min.size() && (x < range->min[i] || x > range->max[i])) {
        return invalid_argument(where + " (" + sv.symbols[i] + ") = " + std::to_string(x) +
                                " is outside the range [" + std::to_string(range->min[i]) + ", " +
                                std::to_string(range->max[i]) + "] of optimization profile " +
                                std::to_string(profile_) + " (values given: " + values_text(given) +
                                ")");
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
    if (!input_set_[io])
      return invalid_argument("the shape of input '" + name + "' is not set yet");
    return input_shapes_[io];
  }
  KILN_RETURN_IF_ERROR(infer_shapes());
  const int v = data_->io_values[io];
  if (!pending_[v]) return shapes_[v];
  Shape s;
  for (const auto& d : *data_->plan.graph.values[v].shape)
    s.push_back(d.eval(symbols_).value_or(-1));
  return s;
}

}  // namespace kiln

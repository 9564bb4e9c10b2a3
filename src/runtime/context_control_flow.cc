// ExecutionContext's values and control flow: where a value's bytes are, copies between values,
// the conditions If branches and guards read, and run-time loops (kiln::LoopBegin, kiln::LoopEnd).
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
#include "runtime/engine.h"
#include "runtime/engine_data.h"

namespace kiln {
namespace {

std::string shape_str(const Shape& s) { return shape_to_string(s); }

// The value whose bytes v is: its root for an alias (never itself an alias).
int root_of(const plan::Plan& p, int v) {
  return p.values[size_t(v)].storage == plan::Storage::kAlias ? p.values[size_t(v)].alias_of : v;
}

}  // namespace

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
                            ir::dims_to_string(*g.values[v].shape) +
                            " before the run has sized it");
    }
  }
  for (int v : node.outputs) {
    if (v >= 0 && pending_[v] && !data_->node_makes_data_dependent[n]) {
      return internal_error(node.describe() + " writes '" + g.values[v].name + "' " +
                            ir::dims_to_string(*g.values[v].shape) +
                            " before the run has sized it");
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
  KILN_RETURN_IF_ERROR(
      backend->copy(out, address, bytes, backends::CopyKind::kDeviceToHost, stream));
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
    case plan::Storage::kOutput:
      return io_address_[size_t(data_->io_of_value[size_t(v)])];
    case plan::Storage::kConstant:
      return host ? p.graph.values[size_t(v)].constant->data() : data_->device_constants[size_t(v)];
    case plan::Storage::kSymbolic:
      if (!host) return static_cast<char*>(sym_host_) + sym_offset_[size_t(vp.slot)];
      return static_cast<char*>(arena_) + slot_offset_[size_t(vp.slot)];
    case plan::Storage::kActivation:
      return static_cast<char*>(arena_) + slot_offset_[size_t(vp.slot)];
    case plan::Storage::kAlias:
      return nullptr;  // an alias's root is never an alias
  }
  return nullptr;
}

Status ExecutionContext::copy_bytes(void* to, const void* from, size_t bytes, bool from_host,
                                    void* stream) {
  if (bytes == 0 || to == from) return ok_status();
  const backends::Backend* backend = data_->backend;
  if (backend->host_accessible()) {
    std::memmove(to, from, bytes);
    return ok_status();
  }
  return backend->copy(
      to, from, bytes,
      from_host ? backends::CopyKind::kHostToDevice : backends::CopyKind::kDeviceToDevice, stream);
}

bool ExecutionContext::in_host_memory(int v) const {
  return data_->plan.values[size_t(root_of(data_->plan, v))].storage == plan::Storage::kSymbolic;
}

size_t ExecutionContext::value_bytes(int v) const {
  return size_t(shape_numel(shapes_[size_t(v)])) *
         dtype_size(data_->plan.graph.values[size_t(v)].dtype);
}

Status ExecutionContext::copy_value(int to, int from, void* stream) {
  return copy_bytes(value_address(to), value_address(from), value_bytes(from), in_host_memory(from),
                    stream);
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
  const ops::LoopEndLayout l =
      *ops::LoopEndLayout::of(end.inputs.size(), end.outputs.size());  // verify_plan checked
  auto write = [&](int v, const void* bytes, size_t size) -> Status {
    if (data_->backend->host_accessible())
      return copy_bytes(value_address(v), bytes, size, true, stream);
    if (!loop_words_) {
      KILN_ASSIGN_OR_RETURN(loop_words_,
                            data_->backend->allocate_host(kLoopWords * sizeof(int64_t)));
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
    if (!data_->backend->host_accessible())
      KILN_RETURN_IF_ERROR(data_->backend->synchronize(stream));
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
        if (!x || *x < 0)
          return internal_error("value '" + val.name + "' dim " + d.to_string() +
                                " has no size in the loop");
        shape.push_back(*x);
      }
      const plan::ValuePlan& rp = data_->plan.values[size_t(root_of(data_->plan, v))];
      const size_t bytes = size_t(shape_numel(shape)) * dtype_size(val.dtype);
      if (rp.storage == plan::Storage::kActivation && bytes > slot_size_[size_t(rp.slot)]) {
        return internal_error("value '" + val.name + "' of shape " + shape_str(shape) +
                              " is larger than its slot (" +
                              std::to_string(slot_size_[size_t(rp.slot)]) + " bytes)");
      }
      shapes_[size_t(v)] = std::move(shape);
      pending_[size_t(v)] = 0;
      changed[size_t(v)] = 1;
      if (data_->plan.values[size_t(v)].storage == plan::Storage::kSymbolic)
        KILN_RETURN_IF_ERROR(write_symbolic(size_t(v)));
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
    for (size_t j = 0; j < l.k; ++j)
      bytes.push_back(value_bytes(ran ? nexts[j] : begin.outputs[2 + j]));
    if (ran) KILN_RETURN_IF_ERROR(bind_growth(nexts));  // the final values' shapes
    for (size_t j = 0; j < l.k; ++j) {
      const int from = ran ? nexts[j] : begin.outputs[2 + j];
      if (end.outputs[j] >= 0) {
        KILN_RETURN_IF_ERROR(copy_bytes(value_address(end.outputs[j]), value_address(from),
                                        bytes[j], in_host_memory(from), stream));
      }
    }
    for (size_t j = 0; j < l.q; ++j) {
      const int v = end.outputs[l.stacked(j)];
      if (v >= 0 && shapes_[size_t(v)][0] != f.iteration) {
        return internal_error("the loop ran " + std::to_string(f.iteration) +
                              " iterations, but its scan output '" + g.values[size_t(v)].name +
                              "' has " + std::to_string(shapes_[size_t(v)][0]) + " rows");
      }
    }
    return size_t(r.end) + 1;
  };
  if (int(n) == r.begin) {
    f.trips = std::numeric_limits<int64_t>::max();
    f.iteration = 0;
    if (begin.inputs[0] >= 0)
      KILN_RETURN_IF_ERROR(read_scalar(begin.inputs[0], DType::kInt64, &f.trips, stream));
    bool go = true;
    if (begin.inputs[1] >= 0) {
      KILN_ASSIGN_OR_RETURN(go, read_condition(begin.inputs[1], stream));
    }
    for (size_t j = 0; j < l.k; ++j)
      KILN_RETURN_IF_ERROR(copy_value(begin.outputs[2 + j], begin.inputs[2 + j], stream));
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
      return internal_error("the loop's iteration " + std::to_string(f.iteration) +
                            " is past the rows of its scan output '" + g.values[size_t(v)].name +
                            "'");
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
    return invalid_argument(
        "the loop of " + begin.describe() + " ran " + std::to_string(f.iteration) +
        " iterations and its condition still holds" +
        (begin.inputs[0] >= 0 ? " (its trip count is " + std::to_string(f.trips) + ")" : "") +
        (run_loop_iterations_ != f.iteration
             ? "; the run's loops ran " + std::to_string(run_loop_iterations_) +
                   " iterations in all"
             : std::string()) +
        "; ExecutionContext::set_max_loop_iterations (" + std::to_string(max_loop_iterations_) +
        ", for all of a run's loops together) raises the limit");
  }
  // v_j = next_j for the next iteration, through the workspace where one next_j views another v;
  // then a growing loop's dims take the next values' sizes.
  const int ws = data_->plan.nodes[n].workspace_slot;
  auto aligned = [](size_t bytes) {
    return (bytes + plan::kLoopCopyAlign - 1) / plan::kLoopCopyAlign * plan::kLoopCopyAlign;
  };
  std::vector<size_t> bytes;
  for (int v : nexts) bytes.push_back(value_bytes(v));
  if (ws >= 0) {
    char* stage = static_cast<char*>(arena_) + slot_offset_[size_t(ws)];
    size_t at = 0;
    for (size_t j = 0; j < l.k; ++j) {
      KILN_RETURN_IF_ERROR(copy_bytes(stage + at, value_address(nexts[j]), bytes[j],
                                      in_host_memory(nexts[j]), stream));
      at += aligned(bytes[j]);
    }
    at = 0;
    for (size_t j = 0; j < l.k; ++j) {
      KILN_RETURN_IF_ERROR(
          copy_bytes(value_address(end.inputs[l.carried(j)]), stage + at, bytes[j], false, stream));
      at += aligned(bytes[j]);
    }
  } else {
    for (size_t j = 0; j < l.k; ++j) {
      KILN_RETURN_IF_ERROR(copy_bytes(value_address(end.inputs[l.carried(j)]),
                                      value_address(nexts[j]), bytes[j], in_host_memory(nexts[j]),
                                      stream));
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

}  // namespace kiln

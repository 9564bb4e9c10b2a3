// ExecutionContext: binds input shapes to the engine's symbols, resolves every value's shape from
// its formula, lays out the activation arena for those shapes (growing it only when they grow),
// and runs the kernels. On a device backend (CUDA) the arena and constants are device memory,
// the run is enqueued on the context's stream (optionally as a CUDA graph), and run() stages host
// tensors through page-locked buffers. This file holds construction, IO binding and the run loop;
// context_shapes.cc the shape binding, context_control_flow.cc values, conditions and loops,
// context_cuda_graphs.cc the graph cache and batch buckets.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include "backends/cpu/thread_pool.h"
#include "core/checked.h"
#include "ops/loop_end.h"
#include "plan/loops.h"
#include "runtime/arena.h"
#include "runtime/engine.h"
#include "runtime/engine_data.h"

namespace kiln {

StatusOr<ir::SymbolRanges> size_ranges(const plan::Plan& plan, const ir::SymbolValues& at) {
  ir::SymbolRanges ranges;
  for (const auto& [name, v] : at) ranges[name] = ir::Interval{v, v};
  for (const ir::DataDependentDim& d : plan.data_dependent) {
    if (at.count(d.symbol)) continue;
    const ir::Interval b = d.bound.bounds(ranges);
    if (b.hi >= ir::Interval::kInf) {
      return invalid_argument("data-dependent dim " + d.symbol +
                              " has no finite bound: " + d.bound.to_string());
    }
    ranges[d.symbol] = ir::data_dependent_range(d, ranges);
  }
  return ranges;
}

std::optional<int64_t> value_or_upper(const ir::Dim& d, const ir::SymbolValues& at,
                                      const ir::SymbolRanges& ranges) {
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
    if (id == plan::kAliasImpl || id == plan::kControlImpl)
      continue;  // a view runs nothing; a loop's boundary runs in the context
    const backends::KernelImpl* impl = registry.find(id);
    backends::KernelQuery q = data.query(n);
    // The file may have been edited: the implementation must still accept the node as planned.
    Status st = impl->supports(q);
    if (!st.ok()) return st.with_context("loading the plan: " + node.describe());
    auto prepared = impl->prepare(q, *data.backend);
    if (!prepared.ok())
      return Status(prepared.status()).with_context("preparing " + node.describe());
    data.impls[n] = impl;
    data.prepared[n] = std::move(prepared).value();
  }
  return ok_status();
}

ExecutionContext::ExecutionContext(std::shared_ptr<const EngineData> data)
    : data_(std::move(data)) {
  input_shapes_.resize(data_->num_inputs);
  input_set_.assign(data_->num_inputs, 0);
  io_address_.assign(data_->io_values.size(), nullptr);
  allocators_.assign(data_->io_values.size(), nullptr);
  run_buffers_.resize(data_->io_values.size());
}

ExecutionContext::~ExecutionContext() {
  const backends::Backend* b = data_->backend;
  if (stream_) (void)b->synchronize(stream_);  // a destructor has no one to report to
  if (replayed_on_default_) (void)b->synchronize(nullptr);
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

Status ExecutionContext::set_tensor_address(const std::string& name, void* data) {
  KILN_ASSIGN_OR_RETURN(int io, io_index(name));
  if (io < data_->num_inputs && data_->shape_value_of_input[size_t(io)] >= 0 &&
      io_address_[io] != data) {
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
  if (io < data_->num_inputs)
    return invalid_argument("'" + name + "' is an input; output allocators are for outputs");
  allocators_[io] = allocator;
  return ok_status();
}

Status ExecutionContext::allocate_output(size_t i) {
  const int v = data_->io_values[i];
  const std::string& name = data_->plan.graph.values[v].name;
  const size_t bytes =
      size_t(shape_numel(shapes_[v])) * dtype_size(data_->plan.graph.values[v].dtype);
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
  auto nbytes = [&](int v) {
    return size_t(shape_numel(shapes_[v])) * dtype_size(g.values[v].dtype);
  };
  for (size_t i = 0; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    const std::string& name = g.values[v].name;
    if (data_->shape_data_dependent[v]) {
      // Sized by the run: its allocator gets the exact size when the data has decided it.
      if (!allocators_[i]) {
        return invalid_argument(
            "output '" + name + "' has a data-dependent shape " +
            ir::dims_to_string(*g.values[v].shape) +
            ": give it an output allocator (set_output_allocator), or use run()");
      }
      continue;
    }
    if (i >= size_t(data_->num_inputs) && allocators_[i]) KILN_RETURN_IF_ERROR(allocate_output(i));
    if (!io[i] && nbytes(v) > 0) {
      return invalid_argument(std::string(i < size_t(data_->num_inputs) ? "input" : "output") +
                              " '" + name + "' has no address: call set_tensor_address" +
                              (i < size_t(data_->num_inputs) ? "" : " or set_output_allocator"));
    }
  }
  return ok_status();
}

Status ExecutionContext::set_cpu_threads(int threads) {
  if (threads < 0 || threads > backends::cpu::kMaxCpuThreads) {
    return invalid_argument("cpu threads " + std::to_string(threads) + " is outside 0.." +
                            std::to_string(backends::cpu::kMaxCpuThreads) +
                            " (0: the process's default)");
  }
  cpu_threads_ = threads;
  return ok_status();
}

int ExecutionContext::cpu_threads() const {
  return cpu_threads_ > 0 ? cpu_threads_ : backends::cpu::cpu_threads();
}

Status ExecutionContext::enqueue_kernels(void* stream) {
  // The CPU kernels' parallel_for calls from this thread use the context's thread count.
  backends::cpu::ScopedThreadLimit thread_limit(cpu_threads_);
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
      return cancelled("the run was cancelled (ExecutionContext::cancel) before " +
                       node.describe() + ", node " + std::to_string(n) + " of " +
                       std::to_string(g.nodes.size()));
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
        const size_t first = *next <= n ? *next : n + 1, last = *next;
        for (size_t m = first; m <= last; ++m)
          KILN_RETURN_IF_ERROR(backend->record_marker(markers_[m], stream));
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
    auto kind = p.values[v].storage == plan::Storage::kSymbolic
                    ? backends::CopyKind::kHostToDevice
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
  // A graph replayed on stream 0 may still be running: this run shares its arena. Once `stream`
  // waits for it, waiting for the kernels' stream (wait_for_runs) covers the replay too.
  if (replayed_on_default_) {
    KILN_RETURN_IF_ERROR(data_->backend->order_after(stream, nullptr));
    replayed_on_default_ = false;
  }
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
  if (!runs_as_graph()) {
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

bool ExecutionContext::runs_as_graph() const {
  return use_graph_ && !data_->backend->host_accessible() && data_->plan.data_dependent.empty() &&
         !data_->has_guards && data_->loops.empty();
}

Status ExecutionContext::enqueue_on_default_stream() {
  const backends::Backend* b = data_->backend;
  if (b->host_accessible()) return enqueue(stream_);
  if (runs_as_graph() && buckets_.empty() && !profiler_ && !shape_values_changed()) {
    // A graph captured on the context's stream replays on stream 0 itself: CUDA launches a graph
    // on any stream, so stream 0's order holds without the two fences below.
    KILN_RETURN_IF_ERROR(infer_shapes());
    KILN_RETURN_IF_ERROR(check_io_addresses());
    bool replayed = false;
    KILN_RETURN_IF_ERROR(replay_graph(graph_key(stream_), nullptr, &replayed));
    if (replayed) {
      replayed_on_default_ = true;
      return ok_status();
    }
  }
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
  // A graph replayed on stream 0 may still read the buffers written below.
  if (replayed_on_default_) KILN_RETURN_IF_ERROR(b->order_after(stream_, nullptr));
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
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
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
    KILN_RETURN_IF_ERROR(
        b->copy(dev + off[i], from, t.nbytes(), backends::CopyKind::kHostToDevice, stream_));
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
    KILN_RETURN_IF_ERROR(b->copy(host + off[i], dev + off[i], t.nbytes(),
                                 backends::CopyKind::kDeviceToHost, stream_));
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

StatusOr<std::map<std::string, Tensor>> ExecutionContext::run(
    const std::map<std::string, Tensor>& inputs) {
  const ir::Graph& g = data_->plan.graph;
  for (const auto& [name, t] : inputs) {
    KILN_ASSIGN_OR_RETURN(int io, io_index(name));
    if (io >= data_->num_inputs)
      return invalid_argument("'" + name + "' is an output of the engine, not an input");
    DType want = g.values[data_->io_values[io]].dtype;
    if (t.dtype() != want) {
      return invalid_argument("input '" + name + "' has dtype " +
                              std::string(dtype_name(t.dtype())) + ", but the engine expects " +
                              std::string(dtype_name(want)));
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
      if (!run_buffers_[i])
        run_buffers_[i] = std::make_unique<GrowingOutputAllocator>(data_->plan.device);
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
    last_timing_ = {
        0, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
        0};
  }
  for (size_t i = data_->num_inputs; i < data_->io_values.size(); ++i) {
    int v = data_->io_values[i];
    if (!data_->shape_data_dependent[v]) continue;
    const GrowingOutputAllocator& buf = *run_buffers_[i];
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(g.values[v].dtype, buf.shape()));
    const auto kind =
        b->host_accessible() ? backends::CopyKind::kHostToHost : backends::CopyKind::kDeviceToHost;
    KILN_RETURN_IF_ERROR(b->copy(t.data(), buf.data(), t.nbytes(), kind, stream_));
    outputs[g.values[v].name] = std::move(t);
    allocators_[i] = nullptr;
  }
  if (!data_->plan.data_dependent.empty())
    KILN_RETURN_IF_ERROR(b->synchronize(stream_));  // the copies above
  return outputs;
}

}  // namespace kiln

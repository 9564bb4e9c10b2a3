// ExecutionContext's CUDA graphs: the cache of captured runs (one per shapes, addresses and
// stream), and batch buckets, which run a batch padded to its bucket so a few graphs serve all.
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

void ExecutionContext::set_cuda_graph_cache_capacity(size_t capacity) {
  graph_capacity_ = capacity;
  while (graphs_.size() > graph_capacity_)
    (void)evict_oldest_graph();  // a setter has no one to report to
}

void ExecutionContext::release_graph(CachedGraph& c) {
  data_->backend->destroy_graph(c.graph);
  if (c.sym) data_->backend->deallocate_host(c.sym);
}

Status ExecutionContext::wait_for_runs() {
  const backends::Backend* b = data_->backend;
  if (kernel_stream_) KILN_RETURN_IF_ERROR(b->synchronize(kernel_stream_));
  if (replayed_on_default_) KILN_RETURN_IF_ERROR(b->synchronize(nullptr));  // stream 0
  replayed_on_default_ = false;
  return ok_status();
}

Status ExecutionContext::evict_oldest_graph() {
  // The graph may still run.
  Status st = wait_for_runs();
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
  if (!graphs_.empty()) (void)wait_for_runs();
  for (CachedGraph& c : graphs_) release_graph(c);
  if (evicted) graph_stats_.evictions += int64_t(graphs_.size());
  graphs_.clear();
}

std::vector<int64_t> ExecutionContext::graph_key(void* stream) const {
  std::vector<int64_t> key;
  for (const Shape& s : input_shapes_) {
    key.push_back(int64_t(s.size()));
    key.insert(key.end(), s.begin(), s.end());
  }
  for (void* a : io_address_) key.push_back(int64_t(reinterpret_cast<intptr_t>(a)));
  key.push_back(int64_t(reinterpret_cast<intptr_t>(stream)));
  for (const auto& bytes : shape_value_bytes_) key.insert(key.end(), bytes.begin(), bytes.end());
  return key;
}

Status ExecutionContext::replay_graph(const std::vector<int64_t>& key, void* launch, bool* ran) {
  *ran = false;
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (it->key != key) continue;
    graphs_.splice(graphs_.begin(), graphs_, it);
    ++graph_stats_.replays;
    *ran = true;
    return data_->backend->launch_graph(graphs_.front().graph, launch);
  }
  return ok_status();
}

// The run as a CUDA graph: a cached one for these shapes, addresses and stream, or a direct run
// followed by a capture of the same work (kernels size their scratch and choose algorithms on the
// direct run), kept in the cache.
Status ExecutionContext::enqueue_graph(void* stream) {
  const backends::Backend* backend = data_->backend;
  std::vector<int64_t> key = graph_key(stream);
  bool replayed = false;
  KILN_RETURN_IF_ERROR(replay_graph(key, stream, &replayed));
  if (replayed) return ok_status();
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
    return invalid_argument(
        "batch buckets: this engine has data-dependent sizes, whose runs use no CUDA graph");
  }
  if (!data_->plan.shape_values.empty()) {
    return invalid_argument(
        "batch buckets: this engine has shape-value inputs, which padding would not follow");
  }
  if (data_->has_guards) {
    return invalid_argument(
        "batch buckets: this engine has an If on data, whose runs use no CUDA graph");
  }
  if (!data_->loops.empty()) {
    return invalid_argument(
        "batch buckets: this engine has a loop that runs at run time, whose runs use no CUDA "
        "graph");
  }
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  if (buckets.front() < 1)
    return invalid_argument("batch buckets must be positive, got " +
                            std::to_string(buckets.front()));
  // The batch: the symbol every input's dim 0 is, alone.
  std::string batch;
  for (int i = 0; i < data_->num_inputs; ++i) {
    const std::string& name = g.values[data_->io_values[i]].name;
    const auto& bind = data_->input_bindings[i];
    if (bind.empty() || bind[0].fixed || bind[0].coeff != 1 || bind[0].offset != 0 ||
        (!batch.empty() && bind[0].symbol != batch)) {
      return invalid_argument(
          "batch buckets: input '" + name + "' dim 0 is " +
          (bind.empty() ? std::string("absent (a scalar)")
                        : (*g.values[data_->io_values[i]].shape)[0].to_string()) +
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
      return invalid_argument("batch buckets: output '" + v.name + "' " +
                              ir::dims_to_string(*v.shape) + " does not start with the batch " +
                              batch + ", so its rows cannot be sliced back");
    }
    if (names_batch(*v.shape, 1)) {
      return invalid_argument("batch buckets: " + std::string(output ? "output" : "input") + " '" +
                              v.name + "' " + ir::dims_to_string(*v.shape) +
                              " depends on the batch " + batch + " past dim 0");
    }
  }
  for (const ir::Node& node : g.nodes) {
    bool in = false, out = false;
    for (int v : node.inputs)
      in = in || (v >= 0 && g.values[v].shape && names_batch(*g.values[v].shape, 0));
    for (int v : node.outputs)
      out = out || (v >= 0 && g.values[v].shape && names_batch(*g.values[v].shape, 0));
    if (in && !out && !node.outputs.empty()) {
      return invalid_argument("batch buckets: " + node.describe() + " reduces across the batch " +
                              batch + ", so padded rows would change its result");
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
      if (real)
        st = b->copy(bucket_buffers_[i], caller[i], real, backends::CopyKind::kDeviceToDevice,
                     stream);
      if (st.ok() && bytes > real)
        st = b->fill_zero(static_cast<char*>(bucket_buffers_[i]) + real, bytes - real, stream);
    }
  }
  if (st.ok()) st = enqueue_graph(stream);
  for (size_t i = data_->num_inputs; i < io_address_.size() && st.ok(); ++i) {
    if (out_bytes[i])
      st = b->copy(caller[i], bucket_buffers_[i], out_bytes[i], backends::CopyKind::kDeviceToDevice,
                   stream);
  }
  restore();
  if (st.ok()) *ran = true;
  return st;
}

}  // namespace kiln

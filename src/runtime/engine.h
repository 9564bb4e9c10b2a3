// The public runtime API, named after TensorRT 10's tensor-name API in snake_case: an Engine
// (immutable, shareable across threads), loaded or made by the Builder (builder/engine_builder.h);
// each ExecutionContext runs it for one caller. Nothing here needs the builder or the frontend.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ir/dim.h"

namespace kiln {

namespace plan {
struct Plan;
}
namespace backends {
class Backend;
class Kernel;
}  // namespace backends
struct EngineData;
class ExecutionContext;

enum class TensorIOMode { kNONE = 0, kINPUT = 1, kOUTPUT = 2 };

// Which shape of an optimization profile (BuilderConfig's OptimizationProfile) a query asks for.
enum class OptProfileSelector { kMIN = 0, kOPT = 1, kMAX = 2 };

// One node that runs in an engine, as `kiln inspect` and the build summary show it.
struct LayerInfo {
  std::string name;  // the model's node name
  std::string op_type;
  std::string kernel;     // the implementation the builder chose ("cuda.cublaslt.MatMul"), or
                          // "alias" for a view that runs nothing
  std::string tactic;     // its tactic parameters; empty when it has none
  std::string precision;  // what the kernel computes in ("float32", "tf32", "float16", "int64")
  std::string alias_of;   // for an alias: the tensor whose bytes its output is
  std::string layout;     // "NHWC" for a channels-last layer (assign_layout); empty: ONNX's layout
  // A fused layer: the model's nodes it runs in place of, op type -> count (ir::Node::replaced);
  // empty for a layer that is one of the model's nodes, or one the builder inserted.
  std::map<std::string, int64_t> replaced;
  // Its output sizes come from its data (NonZero, Unique, Compress, NonMaxSuppression): the run
  // learns them when it has run (on a device, by waiting for it on the host, and without a CUDA
  // graph), and what follows is sized by them.
  bool data_dependent = false;
  // The conditions it runs under (a node of an If's branch whose condition only the run knows,
  // ir::Node::guards): the bool tensor's name and the value it must have, all of them; empty for a
  // layer every run executes.
  std::vector<std::pair<std::string, bool>> runs_when;
  // A layer of a loop that runs at run time (an ONNX Loop or Scan the build could not unroll): the
  // name of the loop's kiln::LoopBegin layer, whose loop runs this layer once per iteration (the
  // innermost such loop); empty for a layer that runs once per run.
  std::string repeats_in;
};

// Receives output buffers whose size is only known once input shapes are, or, for an output of
// data-dependent size (a NonZero's), once the run has computed it (TensorRT's IOutputAllocator):
// such an output needs an allocator (or run()), which is called during the run with the exact
// size, and notify_shape gives the exact shape. On CUDA the buffer is device memory. Return
// nullptr to fail the run with an out-of-memory error.
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  virtual void* reallocate_output(const std::string& name, void* current, size_t bytes,
                                  size_t alignment) = 0;
  virtual void notify_shape(const std::string& name, const Shape& shape) {}
};

// An OutputAllocator over memory of a device's backend (device memory on CUDA, host memory on the
// CPU): it grows when a run needs more and keeps its buffer for later runs; shape() is the shape
// last notified. run() and kiln bench give it to outputs of data-dependent size.
class GrowingOutputAllocator : public OutputAllocator {
 public:
  explicit GrowingOutputAllocator(Device device);
  ~GrowingOutputAllocator() override;
  GrowingOutputAllocator(const GrowingOutputAllocator&) = delete;
  GrowingOutputAllocator& operator=(const GrowingOutputAllocator&) = delete;
  void* reallocate_output(const std::string& name, void* current, size_t bytes,
                          size_t alignment) override;
  void notify_shape(const std::string& name, const Shape& shape) override { shape_ = shape; }
  void* data() const { return ptr_; }
  const Shape& shape() const { return shape_; }

 private:
  const backends::Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
  Shape shape_;
};

class Engine {
 public:
  // load, deserialize and from_plan all verify the plan (runtime/verify_plan.cc) before using it:
  // a file edited behind recomputed checksums is kInvalidArgument naming the broken invariant.
  static StatusOr<Engine> load(const std::string& path);
  // An engine from a plan, checked and prepared as a loaded one is (tests and tools that edit
  // plans use it): kUnsupported when it names an implementation this build lacks.
  static StatusOr<Engine> from_plan(plan::Plan plan);
  static StatusOr<Engine> deserialize(std::span<const uint8_t> bytes);
  Status save(const std::string& path) const;
  std::vector<uint8_t> serialize() const;

  int num_io_tensors() const;
  // Inputs first, then outputs, each in model order. Empty for an index out of range.
  std::string io_tensor_name(int index) const;
  // Integer view: -1 where the dim is dynamic (TensorRT's convention).
  StatusOr<Shape> tensor_shape(const std::string& name) const;
  // Symbolic view: "[batch_size, seq_len + 1, 8]".
  StatusOr<std::vector<ir::Dim>> tensor_symbolic_shape(const std::string& name) const;
  StatusOr<DType> tensor_dtype(const std::string& name) const;
  TensorIOMode tensor_mode(const std::string& name) const;  // kNONE for unknown names
  int num_profiles() const;
  StatusOr<Shape> profile_shape(const std::string& input, int profile,
                                OptProfileSelector which) const;
  // Shape-value inputs (OptimizationProfile::set_shape_values; TensorRT's isShapeInferenceIO): the
  // run reads their values in host memory (set_tensor_address on the host, or run()'s tensors).
  bool is_shape_inference_io(const std::string& name) const;
  // The min, opt or max values of an integer shape-value input in a profile.
  StatusOr<std::vector<int64_t>> profile_tensor_values(const std::string& input, int profile,
                                                       OptProfileSelector which) const;
  // Activation memory in bytes as a formula over the input symbols, and its value for given shapes.
  ir::Dim activation_bytes_formula() const;
  Device device() const;
  int num_layers() const;                 // nodes that run
  std::vector<LayerInfo> layers() const;  // in execution order
  // Activation memory at a profile's min, opt or max input shapes: what an execution context's
  // arena holds for those shapes (each slot rounded up to the arena's 64-byte alignment).
  StatusOr<int64_t> activation_bytes(int profile, OptProfileSelector which) const;
  const plan::Plan& plan() const;

  StatusOr<std::unique_ptr<ExecutionContext>> create_execution_context() const;

 private:
  explicit Engine(std::shared_ptr<const EngineData> data) : data_(std::move(data)) {}
  std::shared_ptr<const EngineData> data_;
};

// Receives each layer's time after a run with it set (TensorRT's IProfiler). Layers are the
// engine's layers() in order, by name; aliases (views that run nothing) are not reported.
class Profiler {
 public:
  virtual ~Profiler() = default;
  virtual void report_layer_time(const std::string& layer, double ms) = 0;
};

class ExecutionContext {
 public:
  ~ExecutionContext();
  // Pins the context to `profile`: every shape is then checked against its ranges alone.
  Status set_optimization_profile(int profile);
  // The profile the run uses: the pinned one, or (an unpinned context of a several-profile engine)
  // the one chosen once every input's shape is set; 0 before that.
  int optimization_profile() const { return profile_; }
  // Whether set_optimization_profile pinned the context.
  bool profile_pinned() const { return pinned_; }
  // Validated against the active profile (pinned, or a single-profile engine): rank, each dim's
  // range, consistency of shared symbols. Unpinned with several profiles, a shape must fit some
  // profile (else the error names every profile's range for the input); once every input is set,
  // the profile whose ranges hold all the shapes and whose opt shapes are nearest is chosen
  // (relative distance |dim - opt| / opt summed over the dynamic dims; the lower index on a tie).
  Status set_input_shape(const std::string& name, const Shape& shape);
  // Inputs: the shape set; outputs: the exact shape the current input shapes imply. An output of
  // data-dependent size has -1 in the dims its data decides until a run has computed them.
  StatusOr<Shape> tensor_shape(const std::string& name);
  // Resolves every shape; the error names the inputs whose shapes are still unset.
  Status infer_shapes();
  // On a device backend IO addresses are device memory, except a shape-value input's
  // (Engine::is_shape_inference_io), which is host memory: its values are read there when shapes
  // are resolved (tensor_shape, infer_shapes) and again by every run, and checked against the
  // profile (an element outside its range, or unlike the one value the engine was built for, is
  // refused by name).
  Status set_tensor_address(const std::string& name, void* data);
  void* tensor_address(const std::string& name) const;
  Status set_output_allocator(const std::string& name, OutputAllocator* allocator);
  // Runs with the bound addresses; outputs go to their addresses or allocators. On CUDA the
  // addresses are device pointers. execute() = enqueue() on the context's stream + synchronize.
  Status execute();
  // Enqueues the run on `stream` (a cudaStream_t on CUDA; nullptr: the context's own stream)
  // without waiting for it. On the CPU it runs synchronously.
  Status enqueue(void* stream = nullptr);
  // Enqueues the run as if on CUDA's legacy default stream (stream 0, TensorRT's enqueueV3(0)):
  // after the work queued there so far and before the work queued there later, without waiting.
  // A graph already captured for this run's shapes and addresses is launched on stream 0 itself;
  // any other run (direct, or the run that captures: CUDA captures on no legacy stream) goes on
  // the context's own stream, fenced both ways by events. On the CPU it runs synchronously.
  Status enqueue_on_default_stream();
  // The context's own stream (nullptr on the CPU).
  void* stream() const { return stream_; }
  // CUDA graphs: the run is captured once per set of input shapes and IO addresses, then
  // replayed; a change re-captures. Ignored by backends without graph capture, and by engines
  // with data-dependent sizes (the run waits for them on the host).
  void set_use_cuda_graph(bool use) { use_graph_ = use; }
  bool use_cuda_graph() const { return use_graph_; }
  // The captured graphs kept, one per set of input shapes, IO addresses and stream: up to
  // `capacity` (default 4), the least recently used destroyed first; 0 keeps none (every run then
  // runs its kernels directly). Growing the activation arena drops them all (their addresses die).
  void set_cuda_graph_cache_capacity(size_t capacity);
  size_t cuda_graph_cache_capacity() const { return graph_capacity_; }
  struct GraphStats {
    int64_t captures = 0;   // graphs captured
    int64_t replays = 0;    // runs that launched a cached graph
    int64_t evictions = 0;  // graphs dropped for capacity (or an arena that grew)
    size_t cached = 0;      // graphs held now
  };
  GraphStats cuda_graph_stats() const;
  // Batch buckets for CUDA graphs: a batch runs at its bucket (the next one up), its inputs copied
  // into buffers of the context's and padded with zero rows, and only its own rows of each output
  // copied back, so outputs keep their exact shapes while a batch that changes every call replays
  // one of a few graphs (one per bucket, whatever the caller's addresses). The batch
  // is the symbol every input's dim 0 is. Refused, with the reason, on a backend without graphs,
  // for an engine with data-dependent sizes, and where padding could change real rows: an output
  // whose dim 0 is not the batch, another dim that depends on it, or a node whose outputs lose it
  // (a reduction across the batch). A batch past the last bucket, or whose bucket lies outside the
  // profile, runs as it is. Empty: no bucketing.
  Status set_batch_buckets(std::vector<int64_t> buckets);
  const std::vector<int64_t>& batch_buckets() const { return buckets_; }
  // Convenience: binds the named host tensors, runs, and returns outputs of exactly their shapes.
  StatusOr<std::map<std::string, Tensor>> run(const std::map<std::string, Tensor>& inputs);
  // Phase times of the last run(), in milliseconds. With set_time_phases(true), run() on a device
  // engine synchronizes after its host-to-device copies and after compute, so each phase is timed
  // on its own (this adds two syncs; leave it off when measuring end-to-end latency). On the CPU
  // the copies are 0 and compute is the whole run.
  struct RunTiming {
    double h2d_ms = 0, compute_ms = 0, d2h_ms = 0;
  };
  void set_time_phases(bool on) { time_phases_ = on; }
  const RunTiming& last_run_timing() const { return last_timing_; }
  // Per-layer times: with a profiler set, every run reports each layer's time to it once the run
  // has finished. Such runs use no CUDA graph and synchronize their stream (enqueue() too): the
  // times are per layer, at the cost of the overlap and launch savings. nullptr turns it off.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }
  Profiler* profiler() const { return profiler_; }
  // Loops that run at run time (an ONNX Loop whose trip count or condition is data) stop the run
  // with an error naming the loop once the run's loops have run this many iterations together
  // (nested ones included) with a condition still true: a model whose condition never turns false,
  // or whose nested loops multiply, ends instead of hanging. Default 1,000,000.
  void set_max_loop_iterations(int64_t n) { max_loop_iterations_ = n; }
  int64_t max_loop_iterations() const { return max_loop_iterations_; }
  // CPU engines: the threads each run of this context may split its kernels over, the calling
  // thread included (ONNX Runtime's intra_op_num_threads). 0, the default: the process's default,
  // KILN_CPU_THREADS or else the CPUs it may run on. Every context draws on one pool of workers,
  // which grows to the largest count asked for. kInvalidArgument outside 0..256.
  Status set_cpu_threads(int threads);
  // The threads a run uses: the count set, or the process's default.
  int cpu_threads() const;
  // Stops the run in progress on this context, from any thread (a watchdog's deadline, a client
  // gone): the run returns a kCancelled status naming the node it stopped before. It is checked
  // between nodes and loop iterations (a kernel already running finishes; on CUDA, work already
  // enqueued runs on the stream). A run that starts after the call is not affected, and a call
  // with no run in progress does nothing. ONNX Runtime's RunOptions terminate flag, per run.
  void cancel() {
    cancel_serial_.store(run_serial_.load(std::memory_order_acquire), std::memory_order_release);
  }
  // Bytes the activation arena holds now (it grows to the largest shapes run, never to the max).
  size_t arena_bytes() const { return arena_capacity_; }

 private:
  friend class Engine;
  explicit ExecutionContext(std::shared_ptr<const EngineData> data);
  Status prepare_kernels();
  Status resolve();
  Status check_io_addresses();
  // Output i's buffer from its allocator for the shape resolved now, and the shape notified.
  Status allocate_output(size_t i);
  // Why `shape` of input `io` is outside profile `p`'s ranges, or ok.
  Status check_in_profile(int io, const Shape& shape, int p) const;
  // An unpinned context of a several-profile engine: picks the profile for the shapes set.
  Status choose_profile();
  Status enqueue_kernels(void* stream);
  Status check_sized(size_t n) const;
  // The bool scalar v, which node conditions, kiln::SelectBranch and loops read: read once per run
  // (per iteration inside a run-time loop), waiting for the stream where it lives on the device,
  // then remembered.
  StatusOr<bool> read_condition(int v, void* stream);
  Status read_scalar(int v, DType dtype, void* out, void* stream);
  // Where value v's bytes are for this run (an alias: its root's), their size, and whether they
  // are in host memory on a device backend (symbolic values).
  void* value_address(int v) const;
  size_t value_bytes(int v) const;
  bool in_host_memory(int v) const;
  // Copies on the stream (memmove on the CPU); `from_host`: the source is host memory.
  Status copy_bytes(void* to, const void* from, size_t bytes, bool from_host, void* stream);
  Status copy_value(int to, int from, void* stream);
  // Runs node n, a run-time loop's kiln::LoopBegin or kiln::LoopEnd (plan/loops.h); gives the node
  // to run next: the body's first, or the one after the loop.
  StatusOr<size_t> run_loop_node(size_t n, void* stream);
  // Reads the shape-value inputs from their host memory into symbols_, checked against the profile.
  Status bind_shape_values();
  // Whether a shape-value input's memory holds other values than the last resolve read.
  bool shape_values_changed() const;
  // After node n, which makes data-dependent dims, has run: binds them from its kernel's sizes and
  // resolves the shapes (and symbolic values) that were waiting for them.
  Status bind_data_dependent(size_t n, void* stream);
  // Writes symbolic value v's elements (its slot in the arena, or in page-locked memory).
  Status write_symbolic(size_t v);
  Status report_layer_times(void* stream);
  Status run_on_device(const std::map<std::string, Tensor>& inputs,
                       std::map<std::string, Tensor>* outputs);
  StatusOr<int> io_index(const std::string& name) const;

  std::shared_ptr<const EngineData> data_;
  int profile_ = 0;
  bool pinned_ = false;
  std::vector<std::unique_ptr<backends::Kernel>> kernels_;
  std::vector<Shape> input_shapes_;  // per engine input; empty until set
  std::vector<char> input_set_;
  std::vector<void*> io_address_;  // per IO tensor
  std::vector<OutputAllocator*> allocators_;
  bool resolved_ = false;
  ir::SymbolValues symbols_;
  std::vector<std::vector<uint8_t>>
      shape_value_bytes_;      // per plan.shape_values: the bytes last read
  ir::SymbolRanges ranges_;    // input symbols as points, data-dependent dims as ranges
  std::vector<Shape> shapes_;  // resolved shape of every plan value
  // Per value: its shape waits for a data-dependent dim (shapes_ holds its upper bound meanwhile).
  std::vector<char> pending_;
  std::vector<int8_t> condition_;  // per value: a condition this run read (0, 1), or -1
  struct LoopFrame {
    int64_t trips = 0;      // M, or the largest int64 without one
    int64_t iteration = 0;  // the iteration running
  };
  std::vector<LoopFrame> loop_frames_;  // per loop of EngineData::loops
  int64_t max_loop_iterations_ = 1000000;
  int cpu_threads_ = 0;              // set_cpu_threads'; 0: the process's default
  int64_t run_loop_iterations_ = 0;  // this run's, every loop's together
  // Runs are numbered as they start; cancel() stops every run numbered up to cancel_serial_.
  std::atomic<uint64_t> run_serial_{0}, cancel_serial_{0};
  // Device backends: page-locked words the loops' counters and conditions are copied from (a copy
  // from pageable memory would wait for the stream each iteration), used in turn; the stream is
  // waited for once per lap, before the first word is written again.
  static constexpr size_t kLoopWords = 1024;
  void* loop_words_ = nullptr;
  size_t loop_word_next_ = 0;
  // run()'s buffers for outputs of data-dependent size, per IO tensor.
  std::vector<std::unique_ptr<GrowingOutputAllocator>> run_buffers_;
  std::vector<size_t> slot_offset_;
  std::vector<size_t> slot_size_;  // bytes of each arena slot for the current shapes
  void* arena_ = nullptr;
  size_t arena_capacity_ = 0;
  // Device backends: the stream, symbolic values in page-locked host memory (kernels read them on
  // the host; the device reads them in place), run()'s staging and device IO buffers, the graph.
  void* stream_ = nullptr;
  void* kernel_stream_ = nullptr;  // the stream kernels were last given
  // A graph was replayed on stream 0 (enqueue_on_default_stream) and nothing since waits for it:
  // wait_for_runs() waits for stream 0 as well as kernel_stream_, and the next enqueue() orders its
  // stream after stream 0.
  bool replayed_on_default_ = false;
  std::vector<size_t> sym_offset_;  // per slot, offset into sym_host_ (symbolic slots only)
  void* sym_host_ = nullptr;
  size_t sym_capacity_ = 0;
  void* staging_ = nullptr;
  size_t staging_capacity_ = 0;
  void* io_device_ = nullptr;
  size_t io_device_capacity_ = 0;
  bool use_graph_ = false;
  bool time_phases_ = false;
  Profiler* profiler_ = nullptr;
  std::vector<void*> markers_;  // a marker before the first layer and after each (set_profiler)
  RunTiming last_timing_;
  // The graph cache, most recently used first. Each graph reads its own copy of the symbolic
  // values (page-locked), so replaying it after other shapes ran needs nothing rewritten.
  struct CachedGraph {
    std::vector<int64_t> key;
    void* graph = nullptr;
    void* sym = nullptr;
  };
  std::list<CachedGraph> graphs_;
  size_t graph_capacity_ = 4;
  GraphStats graph_stats_;
  std::vector<int64_t> graph_failed_key_;
  // A direct (uncaptured) device run may still be reading sym_host_: resolve() waits for it before
  // rewriting them.
  bool sym_in_flight_ = false;
  void drop_graphs(bool evicted);
  void release_graph(CachedGraph& c);  // destroys the graph and frees its shape values
  Status evict_oldest_graph();         // waits for the last run, then releases the oldest graph
  // A graph's key: the run's input shapes, IO addresses, `stream` and shape-value bytes.
  std::vector<int64_t> graph_key(void* stream) const;
  // Replays the cached graph of `key` on `launch` (which may differ from the stream the key names);
  // *ran says whether there was one. No graph is captured here.
  Status replay_graph(const std::vector<int64_t>& key, void* launch, bool* ran);
  Status enqueue_graph(void* stream);
  bool runs_as_graph() const;  // enqueue() would run through the graph cache
  Status wait_for_runs();  // waits for the context's work in flight (before freeing what it reads)
  // Runs the bucketed form of this run when buckets apply (*ran = true), else leaves it.
  Status enqueue_bucketed(void* stream, bool* ran);
  std::vector<int64_t> buckets_;
  std::vector<void*> bucket_buffers_;  // per IO tensor: device memory of the padded tensor
  std::vector<size_t> bucket_capacity_;
  std::vector<std::vector<TensorView>> node_in_, node_out_;
};

}  // namespace kiln

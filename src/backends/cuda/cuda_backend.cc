// The CUDA backend object: device memory (cudaMalloc, never managed memory), page-locked staging,
// streams, CUDA graph capture, per-stream library handles, and kernel creation by op.
#include "backends/cuda/cuda_backend.h"

#include <cstring>
#include <map>
#include <mutex>

#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

Status cuda_status(cudaError_t e, const std::string& what) {
  std::string msg = what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) return out_of_memory(msg);
  return internal_error(msg);
}

ir::Dim workspace_piece(const ir::Value* v, size_t elem_size) {
  if (!v || !v->shape) return 0;
  ir::Dim n = int64_t(elem_size);
  for (const ir::Dim& d : *v->shape) n = n * d;
  const int64_t align = int64_t(kWorkspaceAlign);
  return ir::Dim::ceil_div(n, align) * align;
}

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct ResourceTable {
  std::mutex mu;
  std::map<cudaStream_t, std::unique_ptr<StreamResources>> by_stream;
};
ResourceTable& resource_table() {
  static ResourceTable* t = new ResourceTable;  // leaked: handles outlive static destruction order
  return *t;
}

void release_resources(cudaStream_t stream) {
  ResourceTable& t = resource_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_stream.find(stream);
  if (it == t.by_stream.end()) return;
  StreamResources* r = it->second.get();
  if (r->lt) cublasLtDestroy(r->lt);
  if (r->dnn) cudnnDestroy(r->dnn);
  if (r->workspace) cudaFree(r->workspace);
  t.by_stream.erase(it);
}

// A CUDA implementation in the shared registry: a family file's factory plus what it declared.
class CudaImpl final : public KernelImpl {
 public:
  CudaImpl(const Registry::Entry& e)
      : id_(std::string("cuda.") + (*e.info.library ? std::string(e.info.library) + "." : "") +
            std::string(ops::op_name(e.op))),
        entry_(e) {}
  const std::string& id() const override { return id_; }
  Device device() const override { return Device::kCUDA; }
  NodePrecision precision(const KernelQuery& q) const override {
    if (!entry_.info.reduced_precision || q.output_dtype(0) != DType::kFloat32) return {};
    DType reduced = q.policy.reduced_float();
    if (reduced != DType::kFloat32) return {reduced, false};
    return {DType::kFloat32, q.policy.tf32};
  }
  Status supports(const KernelQuery& q) const override {
    if (entry_.info.float32_only) {
      auto check = [&](const ir::Value* v, const char* what, size_t i) -> Status {
        if (v && is_float(v->dtype) && v->dtype != DType::kFloat32) {
          return unsupported(id_ + " computes on float32 tensors; " + what + " " +
                             std::to_string(i) + " ('" + v->name + "') is " +
                             std::string(dtype_name(v->dtype)));
        }
        return ok_status();
      };
      // The data tensors (input 0, output 0) are float32 exactly; other float inputs (Scale, B,
      // scales) are float32 too, while integer ones (Resize sizes) are read as they are.
      for (auto [v, what] : {std::pair{q.inputs.empty() ? nullptr : q.inputs[0], "input"},
                             std::pair{q.outputs.empty() ? nullptr : q.outputs[0], "output"}}) {
        if (v && v->dtype != DType::kFloat32) {
          return unsupported(id_ + " computes on float32 tensors; " + what + " 0 ('" + v->name +
                             "') is " + std::string(dtype_name(v->dtype)));
        }
      }
      for (size_t i = 0; i < q.inputs.size(); ++i)
        KILN_RETURN_IF_ERROR(check(q.inputs[i], "input", i));
      for (size_t i = 0; i < q.outputs.size(); ++i)
        KILN_RETURN_IF_ERROR(check(q.outputs[i], "output", i));
    }
    for (const ir::Value* v : q.inputs) {
      if (v && dtype_size(v->dtype) == 0) {
        return unsupported(id_ + ": input '" + v->name + "' is " +
                           std::string(dtype_name(v->dtype)) +
                           ", which the CUDA backend does not store");
      }
    }
    // The factory validates attributes and ranks; constructing a kernel allocates nothing.
    KernelQuery with_precision = q;
    with_precision.precision = precision(q);
    auto kernel = entry_.factory(with_precision);
    return kernel.ok() ? ok_status() : kernel.status();
  }
  Status declines(const KernelQuery& q) const override {
    return entry_.info.declines ? entry_.info.declines(q) : ok_status();
  }
  StatusOr<std::shared_ptr<const PreparedNode>> prepare(const KernelQuery& q,
                                                        const Backend&) const override {
    if (!entry_.info.prepare) return std::shared_ptr<const PreparedNode>();
    return entry_.info.prepare(q);
  }
  ir::Dim workspace_bytes(const KernelQuery& q) const override {
    return entry_.info.workspace ? entry_.info.workspace(q) : ir::Dim(0);
  }
  int in_place_input() const override { return entry_.info.in_place_input; }
  std::vector<std::string> tactics(const KernelQuery& q) const override {
    return entry_.info.tactics ? entry_.info.tactics(q) : std::vector<std::string>{""};
  }
  std::vector<TimedTactic> timed_tactics(const KernelQuery& q) const override {
    return entry_.info.timed_tactics ? entry_.info.timed_tactics(q) : std::vector<TimedTactic>{};
  }
  StatusOr<std::unique_ptr<Kernel>> instantiate(
      const KernelQuery& q, std::shared_ptr<const PreparedNode>) const override {
    return entry_.factory(q);
  }

 private:
  std::string id_;
  Registry::Entry entry_;
};

class CudaBackend final : public Backend {
 public:
  Device device() const override { return Device::kCUDA; }

  StatusOr<void*> allocate(size_t bytes) const override {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return out_of_memory("cannot allocate " + std::to_string(bytes) +
                           " bytes of device memory (" + std::to_string(free_b) + " of " +
                           std::to_string(total_b) + " bytes free): " + cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* p) const override {
    if (p) cudaFree(p);
  }
  StatusOr<void*> allocate_host(size_t bytes) const override {
    void* p = nullptr;
    cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return out_of_memory("cannot allocate " + std::to_string(bytes) +
                           " bytes of page-locked host memory: " + cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate_host(void* p) const override {
    if (p) cudaFreeHost(p);
  }
  Status copy(void* dst, const void* src, size_t bytes, CopyKind kind,
              void* stream) const override {
    if (bytes == 0) return ok_status();
    cudaMemcpyKind k = kind == CopyKind::kHostToDevice     ? cudaMemcpyHostToDevice
                       : kind == CopyKind::kDeviceToHost   ? cudaMemcpyDeviceToHost
                       : kind == CopyKind::kDeviceToDevice ? cudaMemcpyDeviceToDevice
                                                           : cudaMemcpyHostToHost;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)),
                    "copying " + std::to_string(bytes) + " bytes");
    return ok_status();
  }
  Status fill_zero(void* dst, size_t bytes, void* stream) const override {
    if (bytes == 0) return ok_status();
    KILN_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)),
                    "zeroing " + std::to_string(bytes) + " bytes");
    return ok_status();
  }
  uint64_t weights_prepared() const override { return cuda::weights_prepared(); }
  // The GPU model and compute capability, and the cuDNN and cuBLASLt versions: what makes a timed
  // choice valid. A failed query yields an identity no real device has, so nothing cached matches.
  std::string device_identity() const override {
    int dev = 0;
    cudaDeviceProp prop{};
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return std::string("cuda (device query failed: ") + cudaGetErrorName(e) + ")";
    }
    return std::string(prop.name) + " sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + " cudnn " + std::to_string(cudnnGetVersion()) +
           " cublasLt " + std::to_string(cublasLtGetVersion());
  }
  Status synchronize(void* stream) const override {
    // nullptr is CUDA's legacy default stream (stream 0) whatever the compile's default stream.
    KILN_CUDA_CHECK(
        cudaStreamSynchronize(stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy),
        "synchronizing the stream");
    return ok_status();
  }
  bool host_accessible() const override { return false; }
  bool is_device_pointer(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  bool is_page_locked(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  int device_ordinal() const override {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return dev;
  }
  StatusOr<void*> create_stream() const override {
    cudaStream_t s = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
    // Library handles and their workspace now, so that no kernel's first execute allocates them.
    auto r = stream_resources(s);
    if (!r.ok()) {
      cudaStreamDestroy(s);
      return r.status();
    }
    return static_cast<void*>(s);
  }
  void destroy_stream(void* stream) const override {
    if (!stream) return;
    release_resources(static_cast<cudaStream_t>(stream));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  Status begin_capture(void* stream) const override {
    KILN_CUDA_CHECK(
        cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
        "beginning CUDA graph capture");
    return ok_status();
  }
  StatusOr<void*> end_capture(void* stream) const override {
    cudaGraph_t graph = nullptr;
    KILN_CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph),
                    "ending CUDA graph capture");
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_CHECK(e, "instantiating the captured CUDA graph");
    return static_cast<void*>(exec);
  }
  Status launch_graph(void* graph, void* stream) const override {
    KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph),
                                    stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy),
                    "launching the CUDA graph");
    return ok_status();
  }
  Status order_after(void* waiter, void* producer) const override {
    auto handle = [](void* s) { return s ? static_cast<cudaStream_t>(s) : cudaStreamLegacy; };
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                    "creating a stream-ordering event");
    cudaError_t err = cudaEventRecord(e, handle(producer));
    if (err == cudaSuccess) err = cudaStreamWaitEvent(handle(waiter), e, 0);
    cudaEventDestroy(e);  // released once the wait has passed it
    KILN_CUDA_CHECK(err, "ordering one stream after another");
    return ok_status();
  }
  void destroy_graph(void* graph) const override {
    if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }
  StatusOr<void*> create_marker() const override {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreate(&e), "creating a layer-timing event");
    return static_cast<void*>(e);
  }
  Status record_marker(void* marker, void* stream) const override {
    KILN_CUDA_CHECK(
        cudaEventRecord(static_cast<cudaEvent_t>(marker), static_cast<cudaStream_t>(stream)),
        "recording a layer-timing event");
    return ok_status();
  }
  StatusOr<double> marker_elapsed_ms(void* from, void* to) const override {
    float ms = 0;
    KILN_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)),
        "reading layer-timing events");
    return double(ms);
  }
  void destroy_marker(void* marker) const override {
    if (marker) cudaEventDestroy(static_cast<cudaEvent_t>(marker));
  }

 private:
};

}  // namespace

StatusOr<StreamResources*> stream_resources(cudaStream_t stream) {
  ResourceTable& t = resource_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto& slot = t.by_stream[stream];
  if (slot) return slot.get();
  auto r = std::make_unique<StreamResources>();
  r->stream = stream;
  if (cublasLtCreate(&r->lt) != CUBLAS_STATUS_SUCCESS) {
    t.by_stream.erase(stream);
    return internal_error("cublasLtCreate failed");
  }
  if (cudnnCreate(&r->dnn) != CUDNN_STATUS_SUCCESS) {
    cublasLtDestroy(r->lt);
    t.by_stream.erase(stream);
    return internal_error("cudnnCreate failed (is cuDNN 9 installed?)");
  }
  cudnnSetStream(r->dnn, stream);
  cudaError_t e = cudaMalloc(&r->workspace, kWorkspaceBytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cublasLtDestroy(r->lt);
    cudnnDestroy(r->dnn);
    t.by_stream.erase(stream);
    return out_of_memory("cannot allocate the " + std::to_string(kWorkspaceBytes) +
                         "-byte GEMM workspace");
  }
  r->workspace_bytes = kWorkspaceBytes;
  slot = std::move(r);
  return slot.get();
}

int current_sm() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

int current_sms() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return std::max(sms, 1);
}

std::vector<int64_t> row_major_strides(std::span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

std::vector<double> read_numbers(const void* data, DType dtype, int64_t n) {
  std::vector<double> out(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32:
        out[i] = static_cast<const float*>(data)[i];
        break;
      case DType::kFloat64:
        out[i] = static_cast<const double*>(data)[i];
        break;
      case DType::kInt64:
        out[i] = double(static_cast<const int64_t*>(data)[i]);
        break;
      case DType::kInt32:
        out[i] = static_cast<const int32_t*>(data)[i];
        break;
      case DType::kInt8:
        out[i] = static_cast<const int8_t*>(data)[i];
        break;
      case DType::kUInt8:
      case DType::kBool:
        out[i] = static_cast<const uint8_t*>(data)[i];
        break;
      case DType::kFloat16:
        out[i] = half_to_float(static_cast<const uint16_t*>(data)[i]);
        break;
      case DType::kBFloat16:
        out[i] = bf16_to_float(static_cast<const uint16_t*>(data)[i]);
        break;
      default:
        out[i] = 0;
        break;
    }
  }
  return out;
}

std::vector<int64_t> read_int64s(const void* data, DType dtype, int64_t n) {
  std::vector<int64_t> out(size_t(std::max<int64_t>(n, 0)));
  if (dtype == DType::kInt64) {
    std::memcpy(out.data(), data, out.size() * 8);
    return out;
  }
  if (dtype == DType::kInt32) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<const int32_t*>(data)[i];
    return out;
  }
  std::vector<double> d = read_numbers(data, dtype, n);
  for (int64_t i = 0; i < n; ++i) {
    double x = d[i];
    out[i] = x != x ? 0 : x >= 9.2e18 ? INT64_MAX : x <= -9.2e18 ? INT64_MIN : int64_t(x);
  }
  return out;
}

void HostParam::init(const KernelQuery& q, int input) {
  present_ = input < int(q.inputs.size()) && q.inputs[input] != nullptr;
  if (!present_) return;
  const ir::Value& v = *q.inputs[input];
  if (v.constant) {
    constant_ = true;
    values_ = read_numbers(v.constant->data(), v.constant->dtype(), v.constant->numel());
    ints_ = read_int64s(v.constant->data(), v.constant->dtype(), v.constant->numel());
  } else if (v.sym_value && v.producer < 0) {
    host_ = true;  // the runtime keeps shape formulas in page-locked host memory on CUDA
  }
}

StatusOr<std::vector<double>> HostParam::get(const TensorView& v, cudaStream_t stream) const {
  if (constant_) return values_;
  int64_t n = v.numel();
  if (host_) return read_numbers(v.data, v.dtype, n);
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &cs);
  if (cs != cudaStreamCaptureStatusNone) {
    return unsupported(
        "a parameter tensor computed on the device cannot be read while capturing a CUDA graph");
  }
  std::vector<uint8_t> host(v.nbytes());
  KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), v.data, host.size(), cudaMemcpyDeviceToHost, stream),
                  "reading a parameter tensor");
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream), "reading a parameter tensor");
  return read_numbers(host.data(), v.dtype, n);
}

StatusOr<std::vector<int64_t>> HostParam::get_ints(const TensorView& v, cudaStream_t stream) const {
  if (constant_) return ints_;
  int64_t n = v.numel();
  if (host_) return read_int64s(v.data, v.dtype, n);
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &cs);
  if (cs != cudaStreamCaptureStatusNone) {
    return unsupported(
        "a parameter tensor computed on the device cannot be read while capturing a CUDA graph");
  }
  std::vector<uint8_t> host(v.nbytes());
  KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), v.data, host.size(), cudaMemcpyDeviceToHost, stream),
                  "reading a parameter tensor");
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream), "reading a parameter tensor");
  return read_int64s(host.data(), v.dtype, n);
}

Status require_float_data(const KernelQuery& q) {
  const DType t = q.input_dtype(0);
  if (t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) {
    return unsupported(q.node.describe() +
                       ": the CUDA kernel takes float32, float16 or bfloat16 X, not " +
                       std::string(dtype_name(t)));
  }
  if (q.output_dtype(0) != t) {
    return unsupported(q.node.describe() + ": Y is " + std::string(dtype_name(q.output_dtype(0))) +
                       " while X is " + std::string(dtype_name(t)));
  }
  auto check = [&](const ir::Value* v, const char* what, size_t i) -> Status {
    if (!v || !is_float(v->dtype) || v->dtype == t || v->dtype == DType::kFloat32) {
      return ok_status();
    }
    return unsupported(
        q.node.describe() + ": " + what + " " + std::to_string(i) + " ('" + v->name + "') is " +
        std::string(dtype_name(v->dtype)) + "; with " + std::string(dtype_name(t)) +
        " X the CUDA kernel takes it in float32" +
        (t == DType::kFloat32 ? std::string() : " or " + std::string(dtype_name(t))));
  };
  for (size_t i = 1; i < q.inputs.size(); ++i) KILN_RETURN_IF_ERROR(check(q.inputs[i], "input", i));
  for (size_t i = 1; i < q.outputs.size(); ++i) {
    KILN_RETURN_IF_ERROR(check(q.outputs[i], "output", i));
  }
  return ok_status();
}

MathMode math_mode(const KernelQuery& q) {
  if (q.precision.tf32) return MathMode::kTf32;
  switch (q.precision.compute) {
    case DType::kFloat16:
      return MathMode::kFp16;
    case DType::kBFloat16:
      return MathMode::kBf16;
    default:
      return MathMode::kFp32;
  }
}

// Ops with no device kernel yet (RNN, GRU, LSTM, RoiAlign, Col2Im, DeformConv, TensorScatter, Det):
// the CPU reference runs on page-locked memory. A register_* function of its own, so that the op
// coverage test's reading of the sources sees them.
static void register_host_fallbacks(Registry& r) {
  for (ops::OpKind op : {ops::OpKind::kRNN, ops::OpKind::kGRU, ops::OpKind::kLSTM,
                         ops::OpKind::kRoiAlign, ops::OpKind::kCol2Im, ops::OpKind::kDeformConv,
                         ops::OpKind::kTensorScatter, ops::OpKind::kDet}) {
    register_host_run(r, op);
  }
}

void register_kernels(::kiln::backends::KernelRegistry& registry) {
  Registry families;
  register_elementwise(families);
  register_broadcast_copy(families);
  register_generators(families);
  register_gemm(families);
  register_fused_elementwise(families);
  register_conv_gemm(families);  // before register_conv_graph and register_conv: preferred
  register_conv_depthwise(families);
  register_conv_graph(families);  // where each applies
  register_conv(families);
  register_norm(families);
  register_bias_softmax(families);
  register_relayout(families);
  register_data(families);
  register_resize(families);
  register_pool(families);
  register_squeeze_excite(families);
  register_channel_norm(families);
  register_shape(families);
  register_conv_transpose(families);
  register_reduce(families);
  register_math(families);
  register_quant(families);
  register_quant_gemm(families);
  register_einsum(families);
  register_attention_sdpa(families);  // before register_attention: preferred where it applies
  register_attention(families);
  register_loss(families);
  register_index(families);
  register_spatial(families);
  register_sequence_models(families);
  register_swiglu(families);
  register_unpool(families);
  register_dft(families);
  register_data_dependent(families);
  register_host_fallbacks(families);
  for (const Registry::Entry& e : families.entries)
    registry.add(e.op, std::make_unique<CudaImpl>(e));
}

const char* math_mode_name(MathMode m) {
  switch (m) {
    case MathMode::kFp32:
      return "float32";
    case MathMode::kTf32:
      return "tf32";
    case MathMode::kFp16:
      return "float16";
    case MathMode::kBf16:
      return "bfloat16";
  }
  return "float32";
}

StatusOr<const Backend*> cuda_backend() {
  static const Status device_status = [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return unsupported(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
    }
    if (n == 0) return unsupported("no CUDA device is present");
    return ok_status();
  }();
  if (!device_status.ok()) return device_status;
  static const CudaBackend* backend = new CudaBackend;
  return backend;
}

}  // namespace kiln::backends::cuda

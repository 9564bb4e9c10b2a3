// Shared pieces of the CUDA backend: error mapping, the kernel base class (stream and per-stream
// library handles), growable device scratch buffers, host-side reads of small parameter tensors,
// and the per-family registration functions.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ops/conv_activation.h"
#include "ops/schema.h"

namespace kiln::backends::cuda {

// A CUDA error as a Status; allocation failures become kOutOfMemory.
Status cuda_status(cudaError_t e, const std::string& what);

// A cuDNN call whose failure returns kInternal naming `what` and cuDNN's error string.
#define KILN_DNN_CHECK(expr, what)                                                    \
  do {                                                                                \
    cudnnStatus_t kiln_s_ = (expr);                                                   \
    if (kiln_s_ != CUDNN_STATUS_SUCCESS) {                                            \
      return internal_error(std::string(what) + ": " + cudnnGetErrorString(kiln_s_)); \
    }                                                                                 \
  } while (0)
#define KILN_CUDA_CHECK(expr, what)                                                        \
  do {                                                                                     \
    cudaError_t kiln_e_ = (expr);                                                          \
    if (kiln_e_ != cudaSuccess) return ::kiln::backends::cuda::cuda_status(kiln_e_, what); \
  } while (0)

// After a kernel launch: reports a bad launch configuration without synchronizing.
inline Status launch_status(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? ok_status() : cuda_status(e, std::string("launching ") + kernel);
}

// Library handles and a GEMM workspace, one set per stream (kernels on one stream run in order,
// so they can share them).
struct StreamResources {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
StatusOr<StreamResources*> stream_resources(cudaStream_t stream);

// Kernel workspace (Kernel::set_workspace) is carved into pieces each aligned to this.
inline constexpr size_t kWorkspaceAlign = 256;
inline size_t workspace_piece(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}
// The same as a formula: numel(v) * elem_size rounded up to kWorkspaceAlign.
ir::Dim workspace_piece(const ir::Value* v, size_t elem_size);

// float16 or bfloat16: the types the tensor-core paths (cuBLASLt, cuDNN's graph API) take natively.
inline bool is_half(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// Base of every CUDA kernel: the stream execute() enqueues on.
class CudaKernel : public Kernel {
 public:
  explicit CudaKernel(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

 protected:
  StatusOr<StreamResources*> resources() const { return stream_resources(stream_); }
  std::string name_;
  cudaStream_t stream_ = nullptr;
};

// A small integer or float input a kernel needs on the host (Slice starts, Resize scales, a
// CumSum axis). Constants are read when the kernel is created; shape formulas live in page-locked
// host memory the runtime writes; anything else is copied from the device (a synchronization,
// refused while a CUDA graph is being captured).
class HostParam {
 public:
  void init(const KernelQuery& q, int input);
  bool present() const { return present_; }
  StatusOr<std::vector<double>> get(const TensorView& v, cudaStream_t stream) const;
  StatusOr<std::vector<int64_t>> get_ints(const TensorView& v, cudaStream_t stream) const;

 private:
  bool present_ = false;
  bool constant_ = false;
  bool host_ = false;
  std::vector<double> values_;
  std::vector<int64_t> ints_;  // exact for integer constants (INT64_MAX ends of Slice)
};

// The current device's compute capability as major * 10 + minor (90 on an H100 or H200), or 0
// where there is no current device (the CUDA error is cleared).
int current_sm();

// The current device's SM count, or 1 where there is none (the CUDA error is cleared).
int current_sms();

// Row-major (contiguous) element strides of a shape.
std::vector<int64_t> row_major_strides(std::span<const int64_t> shape);

// Values of a host-readable integer tensor as int64 (floats truncate).
std::vector<int64_t> read_int64s(const void* data, DType dtype, int64_t n);

// Values of a host-readable tensor as doubles (any numeric dtype).
std::vector<double> read_numbers(const void* data, DType dtype, int64_t n);

// Calls f(E{}) with E an unsigned integer of the element size (data movement works on bytes, so
// one instantiation per size serves every dtype); kUnsupported naming `what` for other sizes, else
// the launch status, named after `kernel` when given.
template <typename F>
Status by_element_size(size_t es, const std::string& what, F&& f, const char* kernel = nullptr) {
  switch (es) {
    case 1:
      f(uint8_t{});
      break;
    case 2:
      f(uint16_t{});
      break;
    case 4:
      f(uint32_t{});
      break;
    case 8:
      f(uint64_t{});
      break;
    default:
      return unsupported(what + ": elements of " + std::to_string(es) + " bytes");
  }
  return launch_status(kernel ? kernel : what.c_str());
}

// How a GEMM or convolution computes: the precision the plan assigned to the node (q.precision).
enum class MathMode { kFp32, kTf32, kFp16, kBf16 };
MathMode math_mode(const KernelQuery& q);
const char* math_mode_name(MathMode m);

// A kernel factory: builds the kernel for a node, or returns why it cannot (attributes, ranks).
// It allocates nothing (supports() calls it to ask).
using Factory = StatusOr<std::unique_ptr<Kernel>> (*)(const KernelQuery& q);
// Once per engine: state from the node's constants (nullptr when it needs none).
using Prepare = StatusOr<std::shared_ptr<const PreparedNode>> (*)(const KernelQuery& q);
// The workspace a kernel needs, as a formula over the input symbols (KernelImpl::workspace_bytes).
using Workspace = ir::Dim (*)(const KernelQuery& q);
// The tactics, ranked at the opt shapes, the default first (KernelImpl::tactics).
using Tactics = std::vector<std::string> (*)(const KernelQuery& q);
// The tactics with their measured times (KernelImpl::timed_tactics).
using TimedTactics = std::vector<TimedTactic> (*)(const KernelQuery& q);
// KernelImpl::declines for a node the factory accepts.
using Declines = Status (*)(const KernelQuery& q);

// A constant converted to a GEMM's or convolution's input precision, in device memory. Shared by
// every engine of the process that holds the same bytes (an engine loaded twice prepares once).
struct DeviceWeight {
  void* data = nullptr;
  DeviceWeight() = default;
  DeviceWeight(const DeviceWeight&) = delete;
  DeviceWeight& operator=(const DeviceWeight&) = delete;
  ~DeviceWeight();
};

// Constant operands of a node, converted once: by input index, null where not prepared.
class PreparedOperands final : public PreparedNode {
 public:
  std::vector<std::shared_ptr<const DeviceWeight>> operands;
  // The converted operand i, or nullptr when the kernel must convert it itself.
  static const void* operand(const KernelQuery& q, size_t i);
};

// FP16/BF16 copies of the node's float32 constant inputs `which` when the plan assigned FP16 or
// BF16 (q.precision); no state otherwise.
StatusOr<std::shared_ptr<const PreparedNode>> prepare_low_precision_operands(
    const KernelQuery& q, std::initializer_list<int> which);
// `bytes` (a kernel's own re-layout of a constant, told apart by `layout`) in device memory,
// uploaded once per process and shared by every engine that prepares the same bytes.
StatusOr<std::shared_ptr<const DeviceWeight>> device_bytes(std::span<const uint8_t> bytes,
                                                           int layout);
// How many weights this process has converted and uploaded (the backend's weights_prepared()).
uint64_t weights_prepared();

// For kernels that run float32, float16 or bfloat16 data natively (instead of
// ImplInfo::float32_only): ok when X (input 0) and Y (output 0) have one of those types and every
// other float input and output is float32 or, for float16/bfloat16 data, X's type; else
// kUnsupported naming the node, the tensor and its dtype.
Status require_float_data(const KernelQuery& q);

// What the shared registry needs to know of a factory beyond the factory itself.
struct ImplInfo {
  const char* library = "";        // "cublaslt", "cudnn": part of the implementation id
  bool reduced_precision = false;  // float32 layers may compute in TF32/FP16/BF16 per the policy
  bool float32_only = false;       // its float inputs and outputs must be float32
  Prepare prepare = nullptr;       // once-per-engine state, when the kernel has any
  Workspace workspace = nullptr;   // scratch per execute, when the kernel needs any
  Tactics tactics = nullptr;       // algorithm choices, when the library offers several
  TimedTactics timed_tactics = nullptr;  // the same with their times, where weighed against rivals
  Declines declines = nullptr;           // KernelImpl::declines, when it ever declines
  int in_place_input = -1;               // KernelImpl::in_place_input
};

// What the family files fill; register_kernels() turns every entry into an implementation
// "cuda[.library].<Op>" of the shared registry.
struct Registry {
  struct Entry {
    ops::OpKind op;
    Factory factory;
    ImplInfo info;
  };
  std::vector<Entry> entries;
  void add(ops::OpKind op, Factory f, ImplInfo info = {}) { entries.push_back({op, f, info}); }
};

void register_elementwise(Registry& r);     // unary and binary ops, Cast, Clip (elementwise.cu)
void register_broadcast_copy(Registry& r);  // Where, Expand, copy-only ops (broadcast_copy.cu)
void register_generators(Registry& r);      // Range, ConstantOfShape, EyeLike, Shape, Size
void register_gemm(Registry& r);
void register_fused_elementwise(Registry& r);  // kiln::Elementwise (fused_elementwise.cu)
void register_conv_gemm(Registry& r);          // channels-last 1x1 FusedConv as a cuBLASLt GEMM
void register_conv_depthwise(Registry& r);     // channels-last depthwise FusedConv, our kernel
void register_conv_graph(Registry& r);         // channels-last FusedConv on cuDNN's graph API
void register_conv(Registry& r);
void register_norm(Registry& r);
void register_bias_softmax(Registry& r);  // kiln::BiasSoftmax (bias_softmax.cu)
void register_relayout(Registry& r);      // kiln::Relayout (relayout.cu)
void register_data(Registry& r);          // Transpose, Concat, Slice, Gather, ...
void register_pool(Registry& r);          // MaxPool, AveragePool, LpPool, kiln::Pool, global pools
void register_squeeze_excite(Registry& r);  // kiln::SqueezeExcite (squeeze_excite.cu)
void register_channel_norm(
    Registry& r);                  // BatchNormalization, Instance/Group/Lp/MeanVariance norms, LRN
void register_shape(Registry& r);  // Split, Tile, Pad, SpaceToDepth, Trilu (shape.cu)
void register_conv_transpose(Registry& r);
void register_reduce(Registry& r);  // Reduce* (every op and dtype), ArgMax/ArgMin, Hardmax, TopK
void register_math(
    Registry& r);  // trigonometry, activations, bitwise, BitShift, Sum/Mean/Max/Min, Dropout
void register_quant(Registry& r);       // Quantize/DequantizeLinear, DynamicQuantizeLinear
void register_quant_gemm(Registry& r);  // ConvInteger, QLinearConv, MatMulInteger, QLinearMatMul
void register_einsum(Registry& r);
void register_attention(Registry& r);  // Attention, RotaryEmbedding
void register_loss(Registry& r);       // NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
void register_index(
    Registry& r);  // GatherElements, ScatterElements, OneHot, ScatterND, ReverseSequence
void register_spatial(Registry& r);          // GridSample, AffineGrid, CenterCropPad
void register_resize(Registry& r);           // Resize
void register_sequence_models(Registry& r);  // LinearAttention, CausalConvWithState
void register_swiglu(Registry& r);           // SwiGLU
void register_unpool(Registry& r);           // MaxUnpool
void register_dft(Registry& r);              // DFT, STFT
void register_data_dependent(
    Registry& r);  // NonZero, Compress, Unique, NonMaxSuppression, TopK (host)
// Runs `op` on CUDA through its CPU kernel on page-locked memory ("cuda.host.<Op>",
// data_dependent.cc): for ops with no device kernel yet. The op's CPU kernel must be registered.
void register_host_run(Registry& r, ops::OpKind op);

// Conversion kernels around low-precision GEMMs and convolutions.
Status convert_f32_to_f16(const float* in, void* out, int64_t n, cudaStream_t s);
Status convert_f32_to_bf16(const float* in, void* out, int64_t n, cudaStream_t s);
Status convert_f16_to_f32(const void* in, float* out, int64_t n, cudaStream_t s);
Status convert_bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t s);
// out[i] += bias[(i / inner) % channels]; act: 0 none, 1 relu.
Status add_channel_bias(float* out, const float* bias, int64_t n, int64_t channels, int64_t inner,
                        int act, cudaStream_t s);
// The same for float16/bfloat16 `dtype` out and bias: the sum in float, rounded to dtype.
Status add_channel_bias_half(void* out, const void* bias, DType dtype, int64_t n, int64_t channels,
                             int64_t inner, cudaStream_t s);
// kiln::FusedConv's activations (its `activation` attribute), and its epilogue where cuDNN's fused
// convolution does not apply it: y = act(y + bias[channel] + z) in float, rounded once to `dtype`
// (float32, float16 or bfloat16); bias and z may be null. The channel of element i is
// (i / inner) % channels (inner = 1 for channels-last).
// kiln::MatMulBias's epilogue after its GEMM (matmul_bias.cu): y = act(y + bias), bias (may be
// null) broadcast to Y from the right, in float (double for float64 Y), rounded once to Y's type.
enum class MatMulActivation { kNone, kRelu, kGeluErf, kGeluTanh };
Status matmul_bias_epilogue(DType dtype, void* y, std::span<const int64_t> y_shape,
                            const void* bias, std::span<const int64_t> bias_shape,
                            MatMulActivation act, cudaStream_t s);
using ConvActivation = ops::ConvActivation;  // ops/conv_activation.h
Status conv_epilogue(DType dtype, void* y, const void* bias, const void* z, int64_t n,
                     int64_t channels, int64_t inner, ConvActivation act, float p0, float p1,
                     cudaStream_t s);
// Column-major GEMM of float16, bfloat16 or float64 tensors `data`, strided over `batch` problems:
// D = alpha * op(A) op(B) + beta * D with op(A) m x k and op(B) k x n (cuBLAS conventions);
// gemm.cc's fallback where cuBLASLt has no algorithm for such a problem.
Status gemm_fallback(DType data, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                     double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                     int64_t ldb, int64_t stride_b, double beta, void* d, int64_t ldc,
                     int64_t stride_c, int64_t batch, cudaStream_t s);
// Broadcast copy of `in` (shape in_shape) to `out` (shape out_shape), any dtype.
Status broadcast_copy(const void* in, std::span<const int64_t> in_shape, void* out,
                      std::span<const int64_t> out_shape, size_t elem_size, cudaStream_t s);

// out[j] = in[j + begin] per axis, zero where that leaves `in` (a crop, or a zero Pad). Any
// dtype (it moves elements of in's size); in, out and begin have the same rank.
Status copy_window(const TensorView& in, const TensorView& out, std::span<const int64_t> begin,
                   cudaStream_t s);

// A constant-mode Pad of the innermost axis only (pad_last_axis.cu): y's rows are x's rows
// shifted by `begin` (negative crops), the fill elsewhere: *fill_ptr (a device element of the
// data's dtype) when given, else fill_bits' low bytes. Any dtype of 1, 2, 4 or 8 bytes; x and y
// have the same rank and the same dims but the last.
Status pad_last_axis(const TensorView& x, const TensorView& y, int64_t begin, const void* fill_ptr,
                     uint64_t fill_bits, cudaStream_t s);

// Whether p may be read or written as 16-byte vectors (uint4, eight 16-bit elements).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Kernel launch grid for n elements.
inline unsigned grid_for(int64_t n, int block = 256) {
  int64_t g = (n + block - 1) / block;
  return unsigned(g < 1 ? 1 : (g > 65535LL * 32 ? 65535LL * 32 : g));
}

}  // namespace kiln::backends::cuda

// kiln::Elementwise on CUDA: a fused chain of elementwise ops (ops/elementwise_program.h) in one
// pass over memory. The program is data, interpreted per element: each thread takes kVec
// elements a block-width apart (every load and store coalesced), runs the instructions over them
// in per-thread slots (local memory, as a slot is a runtime index; the op is a runtime code, as in
// the per-op kernels of elementwise.cu, with their math), and rounds each result to its dtype as
// the unfused op would store it. Each input is loaded once per element into its slot (a scalar
// once per thread) before the instructions run; results live in slots reused once dead
// (liveness, at kernel creation). A first version fetched inputs per
// operand, with an index division each: ViT-B/16's GELU chain at batch 64 took 1.46 ms.
//
// Inputs are read where the output element maps: (i / div) % mod covers an input of the
// output's shape (div 1, mod n), a scalar (mod 1), a trailing bias [C] (div 1, mod C), a
// per-channel [C, 1, 1] or per-sample [N, C, 1, 1] gate (div H*W); two such terms an attention
// mask [N, 1, 1, S] over [N, H, S, S]; any other broadcast walks the output's dims with the
// input's strides.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/ew_math.cuh"
#include "backends/cuda/jit.h"
#include "backends/cuda/typed.cuh"
#include "core/hash.h"
#include "ops/elementwise_program.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kMaxCode = ops::kMaxElementwiseInstructions;
constexpr int kMaxIn = ops::kMaxElementwiseInputs;
constexpr int kMaxSlots = kMaxIn + kMaxCode;
constexpr int kVec = 4;

enum Round : uint8_t { kRoundNone, kRoundHalf, kRoundBf16 };
// How output element i finds its element of an input.
enum Map : uint8_t { kMapSame, kMapScalar, kMapDivMod, kMapDivMod2, kMapWalk };

// Slots 0..n_in-1 hold the inputs (loaded once per element, a scalar once per thread); results
// take the slots after them, reused once dead.
struct Program {
  int n_in = 0;
  int n_code = 0;
  uint8_t op[kMaxCode];
  uint8_t binary[kMaxCode];
  uint8_t a[kMaxCode], b[kMaxCode];  // operand slots
  uint8_t dst[kMaxCode];
  uint8_t round[kMaxCode];
  float alpha[kMaxCode], beta[kMaxCode];
  int slots_used = 0;  // one past the highest slot the program touches
};

struct Io {
  const void* in[kMaxIn];
  int in_dtype[kMaxIn];
  uint8_t map[kMaxIn];
  // kMapDivMod: (i / div[0]) % mod[0]; kMapDivMod2: that times mul[0], plus (i / div[1]) % mod[1]
  int64_t div[kMaxIn][2], mod[kMaxIn][2], mul[kMaxIn];
  int rank = 0;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxIn][kMaxRank];  // kMapWalk
  void* out;
  int out_dtype;
  int64_t n;
};

__device__ __forceinline__ float round_to(float v, uint8_t r) {
  if (r == kRoundHalf) return __half2float(__float2half_rn(v));
  if (r == kRoundBf16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

// I: int32_t when the output has fewer than 2^31 - kVec * block * grid elements, int64_t else.
template <typename I>
__global__ void __launch_bounds__(256)
    fused_elementwise_kernel(const __grid_constant__ Program p, const __grid_constant__ Io io) {
  float slots[kMaxSlots][kVec];
  for (int q = 0; q < p.n_in; ++q) {
    if (io.map[q] != kMapScalar) continue;
    const float v = load_as<float>(io.in[q], io.in_dtype[q], 0);
#pragma unroll
    for (int k = 0; k < kVec; ++k) slots[q][k] = v;
  }
  const I n = I(io.n);
  const I step = I(blockDim.x);
  for (I base = I(blockIdx.x) * step * kVec; base < n; base += I(gridDim.x) * step * kVec) {
    I idx[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) idx[k] = base + I(k) * step + I(threadIdx.x);
    for (int q = 0; q < p.n_in; ++q) {
      const uint8_t map = io.map[q];
      if (map == kMapScalar) continue;
      const void* src = io.in[q];
      const int dt = io.in_dtype[q];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const I i = idx[k] < n ? idx[k] : I(0);
        int64_t off;
        if (map == kMapSame) {
          off = int64_t(i);
        } else if (map == kMapDivMod) {
          off = int64_t((i / I(io.div[q][0])) % I(io.mod[q][0]));
        } else if (map == kMapDivMod2) {
          off = int64_t((i / I(io.div[q][0])) % I(io.mod[q][0])) * io.mul[q] +
                int64_t((i / I(io.div[q][1])) % I(io.mod[q][1]));
        } else {
          off = walk_offset(int64_t(i), io.rank, io.dims, io.strides[q]);
        }
        slots[q][k] = load_as<float>(src, dt, off);
      }
    }
    for (int j = 0; j < p.n_code; ++j) {
      const Op op = Op(p.op[j]);
      const int a = p.a[j], b = p.b[j], d = p.dst[j];
      const uint8_t rnd = p.round[j];
      float r[kVec];
      if (p.binary[j]) {
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          r[k] = round_to(binary_op<float>(op, slots[a][k], slots[b][k]), rnd);
      } else {
        const float al = p.alpha[j], be = p.beta[j];
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          r[k] = round_to(unary_op<float>(op, slots[a][k], al, be), rnd);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) slots[d][k] = r[k];
    }
    const int last = p.dst[p.n_code - 1];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (idx[k] < n) store_as<float>(io.out, io.out_dtype, int64_t(idx[k]), slots[last][k]);
    }
  }
}

// The vector form, for the common case: Y and every input that is not a scalar of one float type
// T, each such input of Y's shape or a trailing bias ([C], C a multiple of the vector), all 16-byte
// aligned, and a program that fits kVecSlots slots. A thread takes V = 16 / sizeof(T) consecutive
// elements with one 16-byte load per input and one store, and keeps its slots in shared memory
// (slot-major, a thread's values kVecBlock floats apart, so a warp's accesses never share a bank)
// where fused_elementwise_kernel keeps them in local memory. Measured on an H100 at batch 64:
// BERT-base's bias + residual chains ([8192, 768] float16) take 33 us each (0.84 ms for the
// engine's 25 chains), where the scalar form took 78 us and slots in registers behind compare
// chains 94 us.
constexpr int kVecSlots = 8;
constexpr int kVecBlock = 128;

template <typename T, int V>
__global__ void __launch_bounds__(kVecBlock)
    fused_elementwise_vec_kernel(const __grid_constant__ Program p, const __grid_constant__ Io io,
                                 int32_t vecs) {
  using N = DNum<T>;
  __shared__ float slots[kVecSlots * V * kVecBlock];
  float* r = slots + threadIdx.x;  // slot s, lane k at r[(s * V + k) * kVecBlock]
  for (int q = 0; q < p.n_in; ++q) {
    if (io.map[q] != kMapScalar) continue;
    const float v = load_as<float>(io.in[q], io.in_dtype[q], 0);
#pragma unroll
    for (int k = 0; k < V; ++k) r[(q * V + k) * kVecBlock] = v;
  }
  for (int32_t vi = int32_t(blockIdx.x) * kVecBlock + threadIdx.x; vi < vecs;
       vi += int32_t(gridDim.x) * kVecBlock) {
    for (int q = 0; q < p.n_in; ++q) {
      const uint8_t map = io.map[q];
      if (map == kMapScalar) continue;
      const int32_t at = map == kMapSame ? vi : vi % int32_t(io.mod[q][0] / V);
      const uint4 u = static_cast<const uint4*>(io.in[q])[at];
      const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int k = 0; k < V; ++k) r[(q * V + k) * kVecBlock] = float(N::load(h[k]));
    }
    for (int j = 0; j < p.n_code; ++j) {
      const Op op = Op(p.op[j]);
      const uint8_t rnd = p.round[j];
      const float* a = r + p.a[j] * V * kVecBlock;
      float* d = r + p.dst[j] * V * kVecBlock;
      if (p.binary[j]) {
        const float* b = r + p.b[j] * V * kVecBlock;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          d[k * kVecBlock] =
              round_to(binary_op<float>(op, a[k * kVecBlock], b[k * kVecBlock]), rnd);
        }
      } else {
        const float al = p.alpha[j], be = p.beta[j];
#pragma unroll
        for (int k = 0; k < V; ++k)
          d[k * kVecBlock] = round_to(unary_op<float>(op, a[k * kVecBlock], al, be), rnd);
      }
    }
    const float* o = r + p.dst[p.n_code - 1] * V * kVecBlock;
    uint4 u;
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int k = 0; k < V; ++k) h[k] = N::store(typename N::C(o[k * kVecBlock]));
    static_cast<uint4*>(io.out)[vi] = u;
  }
}

Op cuda_op(ops::EwOp op) {
  using E = ops::EwOp;
  switch (op) {
    case E::kAdd:
      return Op::kAdd;
    case E::kSub:
      return Op::kSub;
    case E::kMul:
      return Op::kMul;
    case E::kDiv:
      return Op::kDiv;
    case E::kPow:
      return Op::kPow;
    case E::kRelu:
      return Op::kRelu;
    case E::kSigmoid:
      return Op::kSigmoid;
    case E::kTanh:
      return Op::kTanh;
    case E::kErf:
      return Op::kErf;
    case E::kExp:
      return Op::kExp;
    case E::kLog:
      return Op::kLog;
    case E::kSqrt:
      return Op::kSqrt;
    case E::kReciprocal:
      return Op::kReciprocal;
    case E::kNeg:
      return Op::kNeg;
    case E::kAbs:
      return Op::kAbs;
    case E::kIdentity:
    case E::kCast:
      return Op::kCopy;
    case E::kHardSigmoid:
      return Op::kHardSigmoid;
    case E::kHardSwish:
      return Op::kHardSwish;
    case E::kLeakyRelu:
      return Op::kLeakyRelu;
    case E::kGelu:
      return Op::kGelu;
    case E::kGeluTanh:
      return Op::kGeluTanh;
    case E::kSin:
      return Op::kSin;
    case E::kCos:
      return Op::kCos;
    case E::kFloor:
      return Op::kFloor;
    case E::kCeil:
      return Op::kCeil;
    case E::kSoftplus:
      return Op::kSoftplus;
  }
  return Op::kCopy;
}

// The program's slots: the inputs keep 0..n_in-1; instruction j's result takes a slot after them
// free by then, its operands' slots freed first where j is their last reader (operands are read
// before the result is written).
Program compile(const ops::ElementwiseProgram& ew) {
  Program p{};
  const int n_in = ew.num_inputs, n_code = int(ew.code.size());
  // The last instruction reading each result; the final result is read by the store.
  std::vector<int> last_use(size_t(n_code), -1);
  last_use[size_t(n_code - 1)] = n_code;
  for (int j = 0; j < n_code; ++j) {
    for (int r : {ew.code[size_t(j)].a, ew.code[size_t(j)].b}) {
      if (r >= n_in) last_use[size_t(r - n_in)] = std::max(last_use[size_t(r - n_in)], j);
    }
  }
  std::vector<int> slot_of(size_t(n_code), -1);
  std::vector<bool> busy(size_t(kMaxSlots), false);
  for (int q = 0; q < n_in; ++q) busy[size_t(q)] = true;
  auto slot = [&](int r) { return uint8_t(r < n_in ? r : slot_of[size_t(r - n_in)]); };
  p.n_in = n_in;
  p.n_code = n_code;
  p.slots_used = n_in;
  for (int j = 0; j < n_code; ++j) {
    const ops::EwInstruction& ins = ew.code[size_t(j)];
    p.op[j] = uint8_t(cuda_op(ins.op));
    p.binary[j] = ops::ew_is_binary(ins.op) ? 1 : 0;
    p.a[j] = slot(ins.a);
    p.b[j] = ins.b >= 0 ? slot(ins.b) : uint8_t(0);
    for (int r : {ins.a, ins.b}) {
      if (r >= n_in && last_use[size_t(r - n_in)] == j)
        busy[size_t(slot_of[size_t(r - n_in)])] = false;
    }
    int s = n_in;
    while (busy[size_t(s)]) ++s;  // at most n_in + n_code slots are ever taken
    busy[size_t(s)] = true;
    slot_of[size_t(j)] = s;
    p.dst[j] = uint8_t(s);
    p.slots_used = std::max(p.slots_used, s + 1);
    // A result that nothing reads (possible only in a hand-written program) frees its slot.
    if (last_use[size_t(j)] < 0) busy[size_t(s)] = false;
    p.round[j] = ins.to == DType::kFloat16    ? kRoundHalf
                 : ins.to == DType::kBFloat16 ? kRoundBf16
                                              : kRoundNone;
    p.alpha[j] = ins.alpha;
    p.beta[j] = ins.beta;
  }
  return p;
}

// ---- The generated form ----
// Where NVRTC is at hand (jit.h), each program also becomes a kernel of its own, compiled when the
// kernel is created: the 16-byte vector form of fused_elementwise_vec_kernel with the program
// unrolled into straight-line code over registers (each op a compile-time constant of the same
// ew_math.cuh functions, so the switch folds away), one vector per thread, no shared memory. It
// takes the vector form's cases (every input of the output's shape, a trailing bias or a scalar,
// in the output's dtype but for scalars), whatever the program's length. Measured on an H200: the
// SwiGLU chain of a Llama-style decoder ([8192, 2816] float16, x * sigmoid(x) * up, 138 MB) took
// 190 us interpreted (0.73 TB/s) and takes 57 us generated (2.4 TB/s; docs/performance.md).

// The kernel's argument, the same layout here and in the generated source (KilnArgs).
struct JitArgs {
  const void* in[kMaxIn];
  int kind[kMaxIn];  // 0: a vector of the output's shape, 1: a row vector (vi % mod), 2: a scalar
  int mod[kMaxIn];   // kind 1: the row's length in vectors
  void* out;
  int vecs;
};

constexpr const char* kJitPrelude = R"(typedef long long int64_t;
)";
constexpr const char* kJitHelpers = R"(
namespace kb = kiln::backends::cuda;
struct alignas(16) KilnVec { unsigned int w[4]; };
__device__ __forceinline__ float kiln_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short kiln_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float kiln_b2f(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short kiln_f2b(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
struct KilnArgs { const void* in[8]; int kind[8]; int mod[8]; void* out; int vecs; };
)";
static_assert(kMaxIn == 8, "the generated KilnArgs holds 8 inputs");

// float from an element of dtype t at pointer expression p.
std::string jit_load(DType t, const std::string& p) {
  if (t == DType::kFloat16) return "kiln_h2f(*(const unsigned short*)(" + p + "))";
  if (t == DType::kBFloat16) return "kiln_b2f(*(const unsigned short*)(" + p + "))";
  return "(*(const float*)(" + p + "))";
}

std::string jit_round(DType t, const std::string& v) {
  if (t == DType::kFloat16) return "kiln_h2f(kiln_f2h(" + v + "))";
  if (t == DType::kBFloat16) return "kiln_b2f(kiln_f2b(" + v + "))";
  return v;
}

std::string float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  char buf[40];
  std::snprintf(buf, sizeof buf, "__int_as_float(0x%08x)", u);
  return buf;
}

// The source of `ew` on vectors of t (the output's dtype) and its entry's name.
std::pair<std::string, std::string> jit_source(const ops::ElementwiseProgram& ew, DType t,
                                               const std::vector<DType>& in_dtypes) {
  const bool half = t != DType::kFloat32;
  const std::string v = half ? "8" : "4";
  const int n_in = ew.num_inputs;
  std::string body;
  auto reg = [&](int r) {
    return r < n_in ? "x" + std::to_string(r) + "[k]" : "r" + std::to_string(r - n_in);
  };
  for (int q = 0; q < n_in; ++q) {
    const std::string i = std::to_string(q);
    body += "  const float s" + i + " = a.kind[" + i + "] == 2 ? " +
            jit_load(in_dtypes[size_t(q)], "a.in[" + i + "]") + " : 0.f;\n";
  }
  body += "  for (int vi = blockIdx.x * 256 + threadIdx.x; vi < a.vecs; vi += gridDim.x * 256) {\n";
  for (int q = 0; q < n_in; ++q) {
    const std::string i = std::to_string(q);
    body += "    float x" + i + "[" + v + "];\n";
    const std::string fill = "for (int k = 0; k < " + v + "; ++k) x" + i + "[k] = s" + i + ";\n";
    if (in_dtypes[size_t(q)] != t) {  // only a scalar (launch_jit checks)
      body += "    " + fill;
      continue;
    }
    body += "    if (a.kind[" + i + "] == 2) {\n      " + fill + "    } else {\n";
    body += "      const KilnVec u = ((const KilnVec*)a.in[" + i + "])[a.kind[" + i +
            "] == 0 ? vi : vi % a.mod[" + i + "]];\n";
    if (half) {
      body += "      const unsigned short* h = (const unsigned short*)&u;\n";
      body += "      for (int k = 0; k < 8; ++k) x" + i +
              "[k] = " + (t == DType::kFloat16 ? "kiln_h2f(h[k]);\n" : "kiln_b2f(h[k]);\n");
    } else {
      body += "      const float* f = (const float*)&u;\n";
      body += "      for (int k = 0; k < 4; ++k) x" + i + "[k] = f[k];\n";
    }
    body += "    }\n";
  }
  body += "    KilnVec o;\n#pragma unroll\n    for (int k = 0; k < " + v + "; ++k) {\n";
  for (size_t j = 0; j < ew.code.size(); ++j) {
    const ops::EwInstruction& ins = ew.code[j];
    const std::string op = "kb::Op(" + std::to_string(int(cuda_op(ins.op))) + ")";
    // A step that rounds to float16 or bfloat16 takes exp, sigmoid and tanh-GELU from the
    // hardware's approximations (unary_op_rounded): the precise forms cost more instructions
    // than the vector's memory traffic takes (SwiGLU's x * sigmoid(x)).
    const bool fast = ins.to == DType::kFloat16 || ins.to == DType::kBFloat16;
    const std::string e =
        ops::ew_is_binary(ins.op)
            ? "kb::binary_op<float>(" + op + ", " + reg(ins.a) + ", " + reg(ins.b) + ")"
            : std::string(fast ? "kb::unary_op_rounded(" : "kb::unary_op<float>(") + op + ", " +
                  reg(ins.a) + ", " + float_bits(ins.alpha) + ", " + float_bits(ins.beta) + ")";
    body += "      const float r" + std::to_string(j) + " = " + jit_round(ins.to, e) + ";\n";
  }
  const std::string last = "r" + std::to_string(ew.code.size() - 1);
  if (t == DType::kFloat16) {
    body += "      ((unsigned short*)&o)[k] = kiln_f2h(" + last + ");\n";
  } else if (t == DType::kBFloat16) {
    body += "      ((unsigned short*)&o)[k] = kiln_f2b(" + last + ");\n";
  } else {
    body += "      ((float*)&o)[k] = " + last + ";\n";
  }
  body += "    }\n    ((KilnVec*)a.out)[vi] = o;\n  }\n}\n";
  const uint64_t h = fnv1a64({reinterpret_cast<const uint8_t*>(body.data()), body.size()});
  char name[40];
  std::snprintf(name, sizeof name, "kiln_elementwise_%016llx", static_cast<unsigned long long>(h));
  std::string src = std::string(kJitPrelude) + ew_math_source() + kJitHelpers +
                    "extern \"C\" __global__ void " + "__launch_bounds__(256) " + name +
                    "(const KilnArgs a) {\n" + body;
  return {std::move(src), name};
}

class FusedElementwiseKernel final : public CudaKernel {
 public:
  FusedElementwiseKernel(ops::ElementwiseProgram ew, std::vector<DType> input_dtypes)
      : CudaKernel("cuda.Elementwise"),
        ew_(std::move(ew)),
        program_(compile(ew_)),
        input_dtypes_(std::move(input_dtypes)) {
    const DType t = ew_.code.back().to;
    if (jit_enabled() && (t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32)) {
      auto [src, entry] = jit_source(ew_, t, input_dtypes_);
      auto k = jit_kernel(src, entry);
      if (k.ok()) {
        jit_ = *k;
      } else {
        warn_once(k.status());
      }
    }
  }

  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (int(in.size()) != ew_.num_inputs || out.size() != 1) {
      return invalid_argument(name_ + ": needs " + std::to_string(ew_.num_inputs) +
                              " inputs and one output");
    }
    const TensorView& y = out[0];
    if (y.dtype != ew_.code.back().to) {
      return invalid_argument(name_ + ": output is " + std::string(dtype_name(y.dtype)) +
                              ", the program computes " +
                              std::string(dtype_name(ew_.code.back().to)));
    }
    Io io{};
    io.n = y.numel();
    if (io.n == 0) return ok_status();
    io.out = y.data;
    io.out_dtype = int(y.dtype);
    const int rank = y.rank();
    if (rank > kMaxRank)
      return unsupported(name_ + ": output of rank " + std::to_string(rank) + " (at most 8)");
    io.rank = rank;
    for (int d = 0; d < rank; ++d) io.dims[d] = y.shape[size_t(d)];
    for (int k = 0; k < ew_.num_inputs; ++k) {
      const TensorView& x = in[size_t(k)];
      if (x.dtype != input_dtypes_[size_t(k)]) {
        return invalid_argument(name_ + ": input " + std::to_string(k) + " is " +
                                std::string(dtype_name(x.dtype)));
      }
      KILN_RETURN_IF_ERROR(map_input(x.shape, y.shape, k, &io));
      io.in[k] = x.data;
      io.in_dtype[k] = int(x.dtype);
    }
    if (jit_ != nullptr) {
      if (StatusOr<bool> ran = launch_jit(in, y, io); !ran.ok() || *ran) {
        return ran.ok() ? launch_status("the generated elementwise kernel") : ran.status();
      }
    }
    if (launch_vec(in, y, io)) return launch_status("fused_elementwise_vec_kernel");
    const int64_t per_block = 256 * kVec;
    const unsigned grid =
        unsigned(std::min<int64_t>((io.n + per_block - 1) / per_block, 65535LL * 32));
    if (io.n + per_block * int64_t(grid) < (int64_t(1) << 31)) {
      fused_elementwise_kernel<int32_t><<<grid, 256, 0, stream_>>>(program_, io);
    } else {
      fused_elementwise_kernel<int64_t><<<grid, 256, 0, stream_>>>(program_, io);
    }
    return launch_status("fused_elementwise_kernel");
  }

 private:
  // NVRTC missing or failing costs speed, not results: said once per process.
  static void warn_once(const Status& why) {
    static std::once_flag once;
    std::call_once(once, [&] {
      std::fprintf(stderr, "kiln: elementwise chains run interpreted on CUDA: %s\n",
                   why.to_string().c_str());
    });
  }

  // The generated kernel where it applies (true once launched); false, nothing launched, otherwise.
  StatusOr<bool> launch_jit(std::span<const TensorView> in, const TensorView& y,
                            const Io& io) const {
    const int64_t v = int64_t(16 / dtype_size(y.dtype));
    if (io.n % v != 0 || io.n / v >= (int64_t(1) << 31) - 65535LL * 32 * 256 || !aligned16(y.data))
      return false;
    JitArgs a{};
    for (int k = 0; k < ew_.num_inputs; ++k) {
      a.in[k] = in[size_t(k)].data;
      if (io.map[k] == kMapScalar) {
        a.kind[k] = 2;
        continue;
      }
      const bool row = io.map[k] == kMapDivMod && io.div[k][0] == 1 && io.mod[k][0] % v == 0;
      if (in[size_t(k)].dtype != y.dtype || !(io.map[k] == kMapSame || row) ||
          !aligned16(in[size_t(k)].data)) {
        return false;
      }
      a.kind[k] = row ? 1 : 0;
      a.mod[k] = row ? int(io.mod[k][0] / v) : 0;
    }
    a.out = y.data;
    a.vecs = int(io.n / v);
    const unsigned grid = unsigned(std::min<int64_t>((a.vecs + 255) / 256, 65535LL * 32));
    void* args[] = {&a};
    if (cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(jit_), dim3(grid), dim3(256),
                                         args, 0, stream_);
        e != cudaSuccess) {
      cudaGetLastError();
      return internal_error(name_ + ": launching the generated kernel: " + cudaGetErrorString(e));
    }
    return true;
  }

  // fused_elementwise_vec_kernel where it applies (see there); false, nothing launched, otherwise.
  bool launch_vec(std::span<const TensorView> in, const TensorView& y, const Io& io) const {
    const size_t es = dtype_size(y.dtype);
    const bool half = y.dtype == DType::kFloat16 || y.dtype == DType::kBFloat16;
    if ((!half && y.dtype != DType::kFloat32) || program_.slots_used > kVecSlots) return false;
    const int64_t v = int64_t(16 / es);
    if (io.n % v != 0 || io.n / v >= (int64_t(1) << 31) - 65535LL * 32 * kVecBlock ||
        !aligned16(y.data))
      return false;
    for (int k = 0; k < ew_.num_inputs; ++k) {
      if (io.map[k] == kMapScalar) continue;
      const bool row = io.map[k] == kMapDivMod && io.div[k][0] == 1 && io.mod[k][0] % v == 0;
      if (in[size_t(k)].dtype != y.dtype || !(io.map[k] == kMapSame || row) ||
          !aligned16(in[size_t(k)].data)) {
        return false;
      }
    }
    const int32_t vecs = int32_t(io.n / v);
    const unsigned grid =
        unsigned(std::min<int64_t>((vecs + kVecBlock - 1) / kVecBlock, 65535LL * 32));
    if (y.dtype == DType::kFloat16) {
      fused_elementwise_vec_kernel<__half, 8><<<grid, kVecBlock, 0, stream_>>>(program_, io, vecs);
    } else if (y.dtype == DType::kBFloat16) {
      fused_elementwise_vec_kernel<__nv_bfloat16, 8>
          <<<grid, kVecBlock, 0, stream_>>>(program_, io, vecs);
    } else {
      fused_elementwise_vec_kernel<float, 4><<<grid, kVecBlock, 0, stream_>>>(program_, io, vecs);
    }
    return true;
  }

  // How output element i finds input k: (i / div) % mod where the input's elements are one run of
  // consecutive output dims, else a walk of the output's dims with the input's strides.
  static Status map_input(std::span<const int64_t> xs, std::span<const int64_t> ys, int k, Io* io) {
    const int r = int(ys.size()), xr = int(xs.size());
    if (xr > r)
      return invalid_argument("Elementwise: input " + std::to_string(k) +
                              " has a higher rank than the output");
    std::vector<int64_t> full(size_t(r), 1);
    for (int d = 0; d < xr; ++d) full[size_t(r - xr + d)] = xs[size_t(d)];
    int first = -1;  // the first dim where the input is not broadcast
    for (int d = 0; d < r; ++d) {
      if (full[size_t(d)] != ys[size_t(d)] && full[size_t(d)] != 1) {
        return invalid_argument("Elementwise: input " + std::to_string(k) + " shape " +
                                shape_to_string(xs) + " does not broadcast to the output shape " +
                                shape_to_string(ys));
      }
      if (full[size_t(d)] != 1) {
        if (first < 0) first = d;
      }
    }
    // The runs of consecutive dims where the input has the output's extent (dims of 1 in both
    // join either side): one run is (i / div) % mod, two (a [N, 1, 1, S] mask over
    // [N, H, S, S]) are a sum of two such terms; more walk every dim.
    std::vector<std::pair<int, int>> runs;
    for (int d = 0; d < r; ++d) {
      const bool kept = full[size_t(d)] == ys[size_t(d)];
      const bool unit = ys[size_t(d)] == 1;
      if (!kept || (unit && (runs.empty() || runs.back().second != d - 1))) continue;
      if (!runs.empty() && runs.back().second == d - 1) {
        runs.back().second = d;
      } else {
        runs.push_back({d, d});
      }
    }
    auto term = [&](std::pair<int, int> run, int t) {
      int64_t div = 1, mod = 1;
      for (int d = r - 1; d > run.second; --d) div *= ys[size_t(d)];
      for (int d = run.first; d <= run.second; ++d) mod *= ys[size_t(d)];
      io->div[k][t] = div;
      io->mod[k][t] = mod;
    };
    if (first < 0 || runs.size() <= 1) {
      if (first < 0 || runs.empty()) {
        io->map[k] = kMapScalar;
        return ok_status();
      }
      term(runs[0], 0);
      io->map[k] = io->div[k][0] == 1 && io->mod[k][0] == shape_numel(ys) ? kMapSame : kMapDivMod;
      return ok_status();
    }
    if (runs.size() == 2) {
      term(runs[0], 0);
      term(runs[1], 1);
      int64_t inner = 1;  // the input's elements per step of the first run
      for (int d = runs[0].second + 1; d < r; ++d) inner *= full[size_t(d)];
      io->mul[k] = inner;
      io->map[k] = kMapDivMod2;
      return ok_status();
    }
    io->map[k] = kMapWalk;
    int64_t stride = 1;
    for (int d = r - 1; d >= 0; --d) {
      io->strides[k][d] = full[size_t(d)] == 1 ? 0 : stride;
      stride *= full[size_t(d)];
    }
    return ok_status();
  }

  ops::ElementwiseProgram ew_;
  Program program_;
  std::vector<DType> input_dtypes_;
  cudaKernel_t jit_ = nullptr;  // the generated kernel, where NVRTC compiled it
};

StatusOr<std::unique_ptr<Kernel>> make_fused_elementwise(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(ops::ElementwiseProgram ew, ops::elementwise_program_of(q.node, q.inputs));
  std::vector<DType> dtypes;
  for (const ir::Value* v : q.inputs) dtypes.push_back(v->dtype);  // all present: checked above
  return std::unique_ptr<Kernel>(new FusedElementwiseKernel(std::move(ew), std::move(dtypes)));
}

}  // namespace

void register_fused_elementwise(Registry& r) {
  r.add(ops::OpKind::kElementwise, &make_fused_elementwise);
}

}  // namespace kiln::backends::cuda

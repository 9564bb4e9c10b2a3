// Prepared constant operands: float32 weights of FP16/BF16 GEMMs and convolutions, converted on the
// host and uploaded once. A process-wide table keyed by the weight's bytes shares them between
// engines (the same engine file loaded twice) and between the contexts of each engine.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_common.h"
#include "core/hash.h"

namespace kiln::backends::cuda {
namespace {

struct Key {
  uint64_t hash;
  size_t bytes;
  int mode;
  bool operator<(const Key& o) const {
    return std::tie(hash, bytes, mode) < std::tie(o.hash, o.bytes, o.mode);
  }
};

struct WeightTable {
  std::mutex mu;
  std::map<Key, std::weak_ptr<const DeviceWeight>> weights;
  std::atomic<uint64_t> prepared{0};
};

WeightTable& table() {
  static WeightTable* t = new WeightTable;  // leaked: engines may be destroyed during exit
  return *t;
}

// The bytes of `host` in device memory, shared under `key` while any engine holds them.
StatusOr<std::shared_ptr<const DeviceWeight>> upload(const Key& key, const void* host,
                                                     size_t nbytes) {
  WeightTable& w = table();
  std::lock_guard<std::mutex> lock(w.mu);
  if (auto it = w.weights.find(key); it != w.weights.end()) {
    if (auto alive = it->second.lock()) return alive;
  }
  auto weight = std::make_shared<DeviceWeight>();
  KILN_CUDA_CHECK(cudaMalloc(&weight->data, std::max<size_t>(nbytes, 16)),
                  "allocating a prepared weight");
  KILN_CUDA_CHECK(cudaMemcpy(weight->data, host, nbytes, cudaMemcpyHostToDevice),
                  "uploading a prepared weight");
  w.weights[key] = weight;
  w.prepared.fetch_add(1);
  return std::shared_ptr<const DeviceWeight>(std::move(weight));
}

StatusOr<std::shared_ptr<const DeviceWeight>> device_weight(const Tensor& t, MathMode mode) {
  const auto* bytes = static_cast<const uint8_t*>(t.data());
  Key key{checksum64({bytes, t.nbytes()}), t.nbytes(), int(mode)};
  const int64_t n = t.numel();
  std::vector<uint16_t> host(size_t(std::max<int64_t>(n, 1)));
  const float* src = static_cast<const float*>(t.data());
  for (int64_t i = 0; i < n; ++i) {
    host[size_t(i)] = mode == MathMode::kFp16 ? float_to_half(src[i]) : float_to_bf16(src[i]);
  }
  return upload(key, host.data(), host.size() * sizeof(uint16_t));
}

}  // namespace

DeviceWeight::~DeviceWeight() {
  if (data) cudaFree(data);
}

const void* PreparedOperands::operand(const KernelQuery& q, size_t i) {
  const auto* p = dynamic_cast<const PreparedOperands*>(q.prepared);
  if (!p || i >= p->operands.size() || !p->operands[i]) return nullptr;
  return p->operands[i]->data;
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_low_precision_operands(
    const KernelQuery& q, std::initializer_list<int> which) {
  MathMode mode = math_mode(q);
  if (mode != MathMode::kFp16 && mode != MathMode::kBf16)
    return std::shared_ptr<const PreparedNode>();
  auto prepared = std::make_shared<PreparedOperands>();
  bool any = false;
  for (int i : which) {
    if (!q.input_is_constant(size_t(i)) || q.inputs[size_t(i)]->dtype != DType::kFloat32) continue;
    if (prepared->operands.size() <= size_t(i)) prepared->operands.resize(size_t(i) + 1);
    KILN_ASSIGN_OR_RETURN(prepared->operands[size_t(i)],
                          device_weight(*q.inputs[size_t(i)]->constant, mode));
    any = true;
  }
  if (!any) return std::shared_ptr<const PreparedNode>();
  return std::shared_ptr<const PreparedNode>(std::move(prepared));
}

StatusOr<std::shared_ptr<const DeviceWeight>> device_bytes(std::span<const uint8_t> bytes,
                                                           int layout) {
  // Keyed apart from the MathMode conversions (small non-negative ints).
  Key key{checksum64(bytes), bytes.size(), 1000 + layout};
  return upload(key, bytes.data(), bytes.size());
}

uint64_t weights_prepared() { return table().prepared.load(); }

}  // namespace kiln::backends::cuda

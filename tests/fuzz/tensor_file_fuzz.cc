// libFuzzer target: the readers of `kiln run --loadInputs` files. The first byte picks the reader
// (even: .npy, tools/kiln/npy.cc; odd: a serialized onnx.TensorProto, .pb), the rest is the file.
// A tensor that reads must hold exactly its shape's bytes.
#include <cstdint>
#include <span>

#include "frontend/onnx/parse.h"
#include "npy.h"

namespace {

void check_size(const kiln::Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) {
    // A shape whose element count overflows must have been refused.
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) __builtin_trap();
  }
  if (n != t.numel() || t.nbytes() != size_t(n) * kiln::dtype_size(t.dtype())) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> file(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto t = kiln::cli::parse_npy(file, "fuzz.npy");
    if (t.ok()) check_size(*t);
  } else {
    auto t = kiln::onnx::tensor_from_bytes(file);
    if (t.ok()) check_size(*t);
  }
  return 0;
}

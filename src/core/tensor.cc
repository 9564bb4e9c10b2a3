// Tensor helpers.
#include "core/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/checked.h"

namespace kiln {

std::string shape_to_string(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<Tensor> Tensor::zeros(DType dtype, Shape shape) {
  size_t esize = dtype_size(dtype);
  if (esize == 0) return invalid_argument("tensor of unsupported dtype");
  auto n = checked_numel(shape);
  if (!n)
    return invalid_argument("tensor shape " + shape_to_string(shape) + " overflows or is negative");
  auto bytes = checked_mul(*n, int64_t(esize));
  if (!bytes)
    return invalid_argument("tensor of shape " + shape_to_string(shape) + " is too large");
  // 64-byte alignment so kernels may use aligned vector loads on weights.
  size_t alloc = (size_t(*bytes) + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  if (!p) return out_of_memory("cannot allocate " + std::to_string(alloc) + " bytes for a tensor");
  std::memset(p, 0, alloc);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = p;
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

int64_t Tensor::int_at(int64_t i) const {
  switch (dtype_) {
    case DType::kInt64:
      return data_as<int64_t>()[i];
    case DType::kInt32:
      return data_as<int32_t>()[i];
    case DType::kInt16:
      return data_as<int16_t>()[i];
    case DType::kInt8:
      return data_as<int8_t>()[i];
    case DType::kUInt8:
      return data_as<uint8_t>()[i];
    case DType::kUInt16:
      return data_as<uint16_t>()[i];
    case DType::kUInt32:
      return data_as<uint32_t>()[i];
    case DType::kUInt64:
      return int64_t(data_as<uint64_t>()[i]);
    case DType::kBool:
      return data_as<uint8_t>()[i] != 0;
    default:
      break;
  }
  // Truncates toward zero, saturating: a float outside int64 (or NaN) has no defined conversion.
  const double f = float_at(i);
  if (std::isnan(f)) return 0;
  if (f >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (f < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return int64_t(f);
}

bool Tensor::set_int_at(int64_t i, int64_t x) const {
  switch (dtype_) {
    case DType::kInt64:
      data_as<int64_t>()[i] = x;
      return true;
    case DType::kInt32:
      data_as<int32_t>()[i] = int32_t(x);
      return true;
    case DType::kInt16:
      data_as<int16_t>()[i] = int16_t(x);
      return true;
    case DType::kInt8:
      data_as<int8_t>()[i] = int8_t(x);
      return true;
    case DType::kUInt8:
      data_as<uint8_t>()[i] = uint8_t(x);
      return true;
    case DType::kUInt16:
      data_as<uint16_t>()[i] = uint16_t(x);
      return true;
    case DType::kUInt32:
      data_as<uint32_t>()[i] = uint32_t(x);
      return true;
    case DType::kUInt64:
      data_as<uint64_t>()[i] = uint64_t(x);
      return true;
    case DType::kBool:
      data_as<uint8_t>()[i] = x != 0;
      return true;
    default:
      return false;
  }
}

bool Tensor::set_float_at(int64_t i, double x) const {
  switch (dtype_) {
    case DType::kFloat32:
      data_as<float>()[i] = float(x);
      return true;
    case DType::kFloat64:
      data_as<double>()[i] = x;
      return true;
    case DType::kFloat16:
      data_as<uint16_t>()[i] = float_to_half(float(x));
      return true;
    case DType::kBFloat16:
      data_as<uint16_t>()[i] = float_to_bf16(float(x));
      return true;
    default:
      return false;
  }
}

double Tensor::float_at(int64_t i) const {
  switch (dtype_) {
    case DType::kFloat32:
      return data_as<float>()[i];
    case DType::kFloat64:
      return data_as<double>()[i];
    case DType::kFloat16:
      return half_to_float(data_as<uint16_t>()[i]);
    case DType::kBFloat16:
      return bf16_to_float(data_as<uint16_t>()[i]);
    default:
      break;
  }
  // int_at and float_at used to defer to each other for any other dtype, so a tensor without a
  // dtype recursed until the stack overflowed; such a tensor holds no elements to read.
  KILN_CHECK(is_integer(dtype_) || dtype_ == DType::kBool);
  return double(int_at(i));
}

}  // namespace kiln

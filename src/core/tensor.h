// Tensor: a host tensor that owns (or shares) its bytes; TensorView: a non-owning view kernels use.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln {

using Shape = std::vector<int64_t>;

std::string shape_to_string(std::span<const int64_t> shape);
int64_t shape_numel(std::span<const int64_t> shape);  // caller guarantees no overflow

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUndefined;
  std::span<const int64_t> shape;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int rank() const { return int(shape.size()); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor; fails on overflow or an unknown dtype.
  static StatusOr<Tensor> zeros(DType dtype, Shape shape);
  // Wraps memory owned elsewhere (kept alive by `owner`, which may be null for caller-managed
  // data).
  static Tensor wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner);
  template <typename T>
  static Tensor from_vector(DType dtype, Shape shape, const std::vector<T>& values) {
    Tensor t = zeros(dtype, std::move(shape)).value();
    // An empty vector's data() may be null, which memcpy may not be given even for no bytes.
    if (t.nbytes() > 0) std::memcpy(t.data(), values.data(), t.nbytes());
    return t;
  }

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  bool empty() const { return dtype_ == DType::kUndefined; }
  TensorView view() const { return TensorView{data_, dtype_, shape_}; }
  // Reads element i as int64 (integer and bool dtypes) or as double (float dtypes).
  int64_t int_at(int64_t i) const;
  double float_at(int64_t i) const;
  // Writes element i of an integer or bool tensor from int64 (wrapping to the dtype's width, a
  // bool as x != 0); false, writing nothing, for other dtypes.
  bool set_int_at(int64_t i, int64_t x) const;
  // Writes element i of a float tensor (rounded to nearest even for float16 and bfloat16); false,
  // writing nothing, for other dtypes.
  bool set_float_at(int64_t i, double x) const;

 private:
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

}  // namespace kiln

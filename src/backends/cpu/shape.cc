// CPU reference kernels of the shape op family. Data movement is generic over the element size
// (1, 2, 4 or 8 bytes), so every dtype works; only Range computes on values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"
#include "backends/cpu/multiversion.h"
#include "backends/cpu/thread_pool.h"
#include "core/checked.h"

namespace kiln::backends::cpu {

void copy_by_axis_maps(const TensorView& src, const TensorView& dst,
                       std::span<const std::vector<int64_t>> maps, const void* fill);

namespace {

using ops::OpKind;

// Calls f(std::type_identity<U>{}) with U an unsigned integer of the dtype's size.
template <typename F>
Status with_element_type(DType dtype, std::string_view op, F&& f) {
  switch (dtype_size(dtype)) {
    case 1:
      f(std::type_identity<uint8_t>{});
      return ok_status();
    case 2:
      f(std::type_identity<uint16_t>{});
      return ok_status();
    case 4:
      f(std::type_identity<uint32_t>{});
      return ok_status();
    case 8:
      f(std::type_identity<uint64_t>{});
      return ok_status();
    default:
      return unsupported(std::string(op) + ": dtype " + std::string(dtype_name(dtype)) +
                         " is not supported");
  }
}

Status shape_mismatch(std::string_view op, std::string_view what, std::span<const int64_t> got,
                      std::span<const int64_t> want) {
  return invalid_argument(std::string(op) + ": " + std::string(what) + " has shape " +
                          shape_to_string(got) + ", expected " + shape_to_string(want));
}

StatusOr<std::vector<int64_t>> read_ints(const TensorView& v, std::string_view op,
                                         std::string_view what) {
  std::vector<int64_t> out(size_t(v.numel()));
  if (v.dtype == DType::kInt64) {
    std::memcpy(out.data(), v.data, out.size() * 8);
  } else if (v.dtype == DType::kInt32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = v.as<const int32_t>()[i];
  } else {
    return invalid_argument(std::string(op) + ": " + std::string(what) + " must be int32 or int64");
  }
  return out;
}

// Writes `v` as one element of `dtype` into `dst` (dtype_size(dtype) bytes).
void write_scalar(DType dtype, double v, void* dst) {
  auto put = [dst](auto x) { std::memcpy(dst, &x, sizeof(x)); };
  switch (dtype) {
    case DType::kFloat32:
      put(float(v));
      break;
    case DType::kFloat64:
      put(v);
      break;
    case DType::kFloat16:
      put(float_to_half(float(v)));
      break;
    case DType::kBFloat16:
      put(float_to_bf16(float(v)));
      break;
    case DType::kInt8:
      put(int8_t(v));
      break;
    case DType::kUInt8:
      put(uint8_t(v));
      break;
    case DType::kInt16:
      put(int16_t(v));
      break;
    case DType::kUInt16:
      put(uint16_t(v));
      break;
    case DType::kInt32:
      put(int32_t(v));
      break;
    case DType::kUInt32:
      put(uint32_t(v));
      break;
    case DType::kInt64:
      put(int64_t(v));
      break;
    case DType::kUInt64:
      put(uint64_t(v));
      break;
    case DType::kBool:
      put(uint8_t(v != 0));
      break;
    default:
      break;
  }
}

// Reshape, Squeeze, Unsqueeze, Flatten: the bytes are unchanged.
Status copy_bytes(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const TensorView& out = a.out[0];
  if (in.nbytes() != out.nbytes() || in.dtype != out.dtype) {
    return invalid_argument("Reshape/Squeeze/Unsqueeze/Flatten: input " +
                            shape_to_string(in.shape) + " and output " +
                            shape_to_string(out.shape) + " differ in size or dtype");
  }
  if (out.nbytes() > 0 && in.data != out.data) std::memmove(out.data, in.data, out.nbytes());
  return ok_status();
}

Status shape_kernel(const KernelArgs& a) {
  int64_t r = a.in[0].rank();
  KILN_ASSIGN_OR_RETURN(int64_t start, a.attrs.get_int("start", 0));
  KILN_ASSIGN_OR_RETURN(int64_t end, a.attrs.get_int("end", r));
  auto clamp = [r](int64_t v) { return std::clamp(v < 0 ? v + r : v, int64_t(0), r); };
  int64_t s = clamp(start), e = std::max(clamp(end), s);
  if (a.out[0].dtype != DType::kInt64 || a.out[0].numel() != e - s) {
    return invalid_argument("Shape: the output must be int64 with " + std::to_string(e - s) +
                            " elements");
  }
  for (int64_t i = s; i < e; ++i) a.out[0].as<int64_t>()[i - s] = a.in[0].shape[i];
  return ok_status();
}

Status size_kernel(const KernelArgs& a) {
  if (a.out[0].dtype != DType::kInt64 || a.out[0].numel() != 1) {
    return invalid_argument("Size: the output must be one int64");
  }
  *a.out[0].as<int64_t>() = a.in[0].numel();
  return ok_status();
}

Status concat_kernel(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  int r = out.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", std::nullopt));
  if (axis < -r || axis >= r) return invalid_argument("Concat: axis out of range");
  if (axis < 0) axis += r;
  int64_t inner = 1, outer = 1, total = 0;
  for (int k = 0; k < r; ++k) {
    if (k < axis) outer *= out.shape[k];
    if (k > axis) inner *= out.shape[k];
  }
  size_t esz = dtype_size(out.dtype);
  for (const TensorView& in : a.in) {
    if (in.rank() != r || in.dtype != out.dtype)
      return shape_mismatch("Concat", "an input", in.shape, out.shape);
    for (int k = 0; k < r; ++k) {
      if (k != axis && in.shape[k] != out.shape[k]) {
        return shape_mismatch("Concat", "an input", in.shape, out.shape);
      }
    }
    total += in.shape[axis];
  }
  if (total != out.shape[axis]) return invalid_argument("Concat: input axis dims do not add up");
  if (out.numel() == 0) return ok_status();
  auto* dst = static_cast<char*>(out.data);
  for (int64_t o = 0; o < outer; ++o) {
    for (const TensorView& in : a.in) {
      size_t n = size_t(in.shape[axis] * inner) * esz;
      if (n == 0) continue;
      std::memcpy(dst, static_cast<const char*>(in.data) + size_t(o) * n, n);
      dst += n;
    }
  }
  return ok_status();
}

Status split_kernel(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  int r = in.rank();
  KILN_ASSIGN_OR_RETURN(int64_t axis, a.attrs.get_int("axis", 0));
  if (axis < -r || axis >= r) return invalid_argument("Split: axis out of range");
  if (axis < 0) axis += r;
  int64_t inner = 1, outer = 1, total = 0;
  for (int k = 0; k < r; ++k) {
    if (k < axis) outer *= in.shape[k];
    if (k > axis) inner *= in.shape[k];
  }
  for (const TensorView& out : a.out) {
    if (!present(out)) return invalid_argument("Split: every output must be present");
    if (out.rank() != r || out.dtype != in.dtype)
      return shape_mismatch("Split", "an output", out.shape, in.shape);
    for (int k = 0; k < r; ++k) {
      if (k != axis && in.shape[k] != out.shape[k]) {
        return shape_mismatch("Split", "an output", out.shape, in.shape);
      }
    }
    total += out.shape[axis];
  }
  if (total != in.shape[axis]) return invalid_argument("Split: output axis dims do not add up");
  size_t esz = dtype_size(in.dtype);
  size_t row = size_t(in.shape[axis] * inner) * esz;
  size_t offset = 0;
  for (const TensorView& out : a.out) {
    size_t n = size_t(out.shape[axis] * inner) * esz;
    if (n > 0 && outer > 0) {
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(static_cast<char*>(out.data) + size_t(o) * n,
                    static_cast<const char*>(in.data) + size_t(o) * row + offset, n);
      }
    }
    offset += n;
  }
  return ok_status();
}

// Expand: output dims that the input has as 1 read index 0.
Status expand_kernel(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const TensorView& out = a.out[0];
  int r = out.rank(), off = r - in.rank();
  if (off < 0 || in.dtype != out.dtype)
    return shape_mismatch("Expand", "the output", out.shape, in.shape);
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(r));
  // An empty output copies nothing, and one of its other axes may be huge (0 x 2^45 is a valid
  // shape): building that axis's index map would allocate terabytes (found by onnx_build_fuzz).
  const bool empty = std::find(out.shape.begin(), out.shape.end(), 0) != out.shape.end();
  Shape src_shape(size_t(r), 1);
  for (int k = 0; k < r; ++k) {
    int64_t d = k >= off ? in.shape[k - off] : 1;
    src_shape[k] = d;
    if (d != out.shape[k] && d != 1)
      return shape_mismatch("Expand", "the output", out.shape, in.shape);
    if (empty) continue;
    maps[k].resize(size_t(out.shape[k]));
    for (int64_t o = 0; o < out.shape[k]; ++o) maps[k][o] = d == 1 ? 0 : o;
  }
  if (!empty) copy_by_axis_maps(TensorView{in.data, in.dtype, src_shape}, out, maps, nullptr);
  return ok_status();
}

Status tile_kernel(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const TensorView& out = a.out[0];
  int r = in.rank();
  KILN_ASSIGN_OR_RETURN(auto reps, read_ints(a.in[1], "Tile", "repeats"));
  if (out.rank() != r || int(reps.size()) != r || in.dtype != out.dtype) {
    return shape_mismatch("Tile", "the output", out.shape, in.shape);
  }
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(r));
  // An empty output copies nothing, and one of its other axes may be huge (0 x 2^45 is a valid
  // shape): building that axis's index map would allocate terabytes (found by onnx_build_fuzz).
  const bool empty = std::find(out.shape.begin(), out.shape.end(), 0) != out.shape.end();
  for (int k = 0; k < r; ++k) {
    auto want = checked_mul(in.shape[k], reps[k]);
    if (reps[k] < 0 || !want || *want != out.shape[k]) {
      return shape_mismatch("Tile", "the output", out.shape, in.shape);
    }
    if (empty) continue;
    maps[k].resize(size_t(out.shape[k]));
    for (int64_t o = 0; o < out.shape[k]; ++o) maps[k][o] = o % in.shape[k];
  }
  if (!empty) copy_by_axis_maps(in, out, maps, nullptr);
  return ok_status();
}

// dst[i * C + c] = planes[c * stride + i] for i < pixels: C channel planes interleaved into
// channels-last rows (an image's NCHW -> NHWC at the input of a channels-last CNN, C = 3; 4-byte
// elements as Transpose moves them). The grouped stores vectorize; the tiled loop below ran it at
// 7 GB/s, one element a step.
template <int C>
inline __attribute__((always_inline)) void interleave_planes(const uint32_t* __restrict planes,
                                                             int64_t stride,
                                                             uint32_t* __restrict dst,
                                                             int64_t pixels) {
  for (int64_t i = 0; i < pixels; ++i) {
    for (int c = 0; c < C; ++c) dst[i * C + c] = planes[c * stride + i];
  }
}
KILN_TARGET_CLONES void interleave2(const uint32_t* planes, int64_t stride, uint32_t* dst,
                                    int64_t n) {
  interleave_planes<2>(planes, stride, dst, n);
}
KILN_TARGET_CLONES void interleave3(const uint32_t* planes, int64_t stride, uint32_t* dst,
                                    int64_t n) {
  interleave_planes<3>(planes, stride, dst, n);
}
KILN_TARGET_CLONES void interleave4(const uint32_t* planes, int64_t stride, uint32_t* dst,
                                    int64_t n) {
  interleave_planes<4>(planes, stride, dst, n);
}

// The multi-index over dims[0, n) of linear index u (the last axis fastest) into idx, and its
// source offset.
int64_t unravel(int64_t u, std::span<const int64_t> dims, std::span<const int64_t> strides, int n,
                int64_t* idx) {
  int64_t off = 0;
  for (int k = n - 1; k >= 0; --k) {
    idx[k] = u % dims[k];
    u /= dims[k];
    off += idx[k] * strides[k];
  }
  return off;
}

// Transpose after dropping unit dims and merging runs of axes that stay adjacent, split over the
// thread pool: rows of the copy case, tile rows of the tiled case, runs of pixels of the
// interleave (every element is copied once, so the bits do not depend on the split).
template <typename T>
void transpose_impl(const T* src, T* dst, std::span<const int64_t> dims,
                    std::span<const int64_t> strides) {
  int r = int(dims.size());
  if (r == 0) {
    *dst = *src;
    return;
  }
  if (strides[r - 1] == 1) {
    // The innermost output axis is contiguous in the source: copy runs.
    const int64_t run = dims[r - 1];
    int64_t rows = 1;
    for (int k = 0; k < r - 1; ++k) rows *= dims[k];
    // A copy is cheap per element: split only from 2^18 elements (1 MiB of floats), in chunks of
    // 2^16 (ViT's 0.6 MB head moves ran slower on two threads than on one, 0.031 ms against 0.017).
    constexpr int64_t kCopyAlone = int64_t(1) << 18, kCopyGrain = int64_t(1) << 16;
    const int64_t grain = rows * run < kCopyAlone ? rows : std::max<int64_t>(1, kCopyGrain / run);
    parallel_chunks(rows, grain, [&](int64_t first, int64_t last) {
      std::vector<int64_t> idx(size_t(r), 0);
      int64_t off = unravel(first, dims, strides, r - 1, idx.data());
      for (int64_t row = first; row < last; ++row) {
        std::memcpy(dst + row * run, src + off, size_t(run) * sizeof(T));
        for (int k = r - 2; k >= 0; --k) {
          off += strides[k];
          if (++idx[k] < dims[k]) break;
          off -= strides[k] * dims[k];
          idx[k] = 0;
        }
      }
    });
    return;
  }
  if (r == 1) {
    for (int64_t j = 0; j < dims[0]; ++j) dst[j] = src[j * strides[0]];
    return;
  }
  // Tiles over the last two output axes keep both the reads and the writes in cache.
  constexpr int64_t kTile = 32;
  const int64_t d0 = dims[r - 2], d1 = dims[r - 1], s0 = strides[r - 2], s1 = strides[r - 1];
  int64_t planes = 1;
  for (int k = 0; k < r - 2; ++k) planes *= dims[k];
  // A few planes of 4-byte elements interleaved (s0 == 1: the pixels are contiguous in the
  // source), in runs of kRun pixels.
  void (*interleave)(const uint32_t*, int64_t, uint32_t*, int64_t) = nullptr;
  if constexpr (std::is_same_v<T, uint32_t>) {
    interleave = d1 == 2 ? &interleave2 : d1 == 3 ? &interleave3 : d1 == 4 ? &interleave4 : nullptr;
    if (s0 != 1) interleave = nullptr;
  }
  constexpr int64_t kRun = 4096;
  const int64_t step = interleave ? kRun : kTile, per_plane = (d0 + step - 1) / step;
  parallel_chunks(planes * per_plane, std::max<int64_t>(1, kParallelGrain / (step * d1)),
                  [&](int64_t first, int64_t last) {
                    std::vector<int64_t> idx(size_t(r), 0);
                    for (int64_t u = first; u < last; ++u) {
                      const int64_t p = u / per_plane, i0 = (u % per_plane) * step;
                      const int64_t i1 = std::min(d0, i0 + step);
                      const int64_t off = unravel(p, dims, strides, r - 2, idx.data());
                      T* out = dst + p * d0 * d1;
                      if constexpr (std::is_same_v<T, uint32_t>) {
                        if (interleave) {
                          interleave(src + off + i0, s1, out + i0 * d1, i1 - i0);
                          continue;
                        }
                      }
                      for (int64_t j0 = 0; j0 < d1; j0 += kTile) {
                        const int64_t j1 = std::min(d1, j0 + kTile);
                        for (int64_t i = i0; i < i1; ++i) {
                          const T* s = src + off + i * s0;
                          for (int64_t j = j0; j < j1; ++j) out[i * d1 + j] = s[j * s1];
                        }
                      }
                    }
                  });
}

Status transpose_kernel(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const TensorView& out = a.out[0];
  int r = in.rank();
  std::vector<int64_t> def(static_cast<size_t>(r));
  for (int k = 0; k < r; ++k) def[k] = r - 1 - k;
  KILN_ASSIGN_OR_RETURN(auto perm, a.attrs.get_ints("perm", def));
  if (int(perm.size()) != r || out.rank() != r || out.dtype != in.dtype) {
    return invalid_argument("Transpose: perm does not match the input rank");
  }
  std::vector<int64_t> in_stride(size_t(r), 1);
  for (int k = r - 2; k >= 0; --k) in_stride[k] = in_stride[k + 1] * in.shape[k + 1];
  std::vector<int64_t> dims, strides;
  std::vector<bool> seen(size_t(r), false);
  for (int k = 0; k < r; ++k) {
    int64_t p = perm[k];
    if (p < 0 || p >= r || seen[p] || out.shape[k] != in.shape[p]) {
      return invalid_argument("Transpose: perm is not a permutation matching the output shape");
    }
    seen[p] = true;
    if (in.shape[p] == 1) continue;
    if (!dims.empty() && strides.back() == in_stride[p] * in.shape[p]) {
      dims.back() *= in.shape[p];
      strides.back() = in_stride[p];
    } else {
      dims.push_back(in.shape[p]);
      strides.push_back(in_stride[p]);
    }
  }
  if (out.numel() == 0) return ok_status();
  return with_element_type(in.dtype, "Transpose", [&](auto tag) {
    using T = typename decltype(tag)::type;
    transpose_impl<T>(in.as<const T>(), out.as<T>(), dims, strides);
  });
}

template <typename T>
void range_impl(const KernelArgs& a) {
  T start = *a.in[0].as<const T>(), delta = *a.in[2].as<const T>();
  T* out = a.out[0].as<T>();
  if constexpr (std::is_integral_v<T>) {
    // Wrapping, as Range's inference does: each element fits T, but i * delta alone may not
    // (start INT64_MIN, a large delta), and a signed overflow is undefined.
    const uint64_t s = uint64_t(int64_t(start)), d = uint64_t(int64_t(delta));
    for (int64_t i = 0; i < a.out[0].numel(); ++i) out[i] = T(s + uint64_t(i) * d);
  } else {
    for (int64_t i = 0; i < a.out[0].numel(); ++i) out[i] = T(start + T(i) * delta);
  }
}

Status range_kernel(const KernelArgs& a) {
  for (int i = 0; i < 3; ++i) {
    if (a.in[i].numel() != 1 || a.in[i].dtype != a.out[0].dtype) {
      return invalid_argument("Range: start, limit and delta must be scalars of the output dtype");
    }
  }
  switch (a.out[0].dtype) {
    case DType::kFloat32:
      range_impl<float>(a);
      break;
    case DType::kFloat64:
      range_impl<double>(a);
      break;
    case DType::kInt32:
      range_impl<int32_t>(a);
      break;
    case DType::kInt64:
      range_impl<int64_t>(a);
      break;
    case DType::kInt16:
      range_impl<int16_t>(a);
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      // start + i * delta in the stash type (opset 27: float, the default, or double), rounded
      // once to the half dtype.
      KILN_ASSIGN_OR_RETURN(int64_t stash, a.attrs.get_int("stash_type", 1));
      const bool h = a.out[0].dtype == DType::kFloat16;
      auto load = [h](uint16_t v) { return h ? half_to_float(v) : bf16_to_float(v); };
      auto store = [h](float f) { return h ? float_to_half(f) : float_to_bf16(f); };
      const float start = load(*a.in[0].as<const uint16_t>());
      const float delta = load(*a.in[2].as<const uint16_t>());
      uint16_t* out = a.out[0].as<uint16_t>();
      for (int64_t i = 0; i < a.out[0].numel(); ++i) {
        out[i] = stash == 11 ? store(float(double(start) + double(i) * double(delta)))
                             : store(start + float(i) * delta);
      }
      break;
    }
    default:
      return unsupported("Range: dtype " + std::string(dtype_name(a.out[0].dtype)) +
                         " is not supported");
  }
  return ok_status();
}

// Generalized cosine windows, computed in double and rounded once to the output dtype:
// w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N = size (periodic) or size - 1.
Status window_kernel(const KernelArgs& a, const char* name, double a0, double a1, double a2) {
  const TensorView& out = a.out[0];
  auto periodic = a.attrs.get_int("periodic", 1);
  if (!periodic.ok()) return periodic.status();
  const int64_t size = out.numel();
  const double n_den = double(*periodic != 0 ? size : size - 1);
  for (int64_t i = 0; i < size; ++i) {
    const double x = 2.0 * std::numbers::pi * double(i) / n_den;
    const double w = n_den == 0 ? 1.0 : a0 - a1 * std::cos(x) + a2 * std::cos(2.0 * x);
    switch (out.dtype) {
      case DType::kFloat32:
        out.as<float>()[i] = float(w);
        break;
      case DType::kFloat64:
        out.as<double>()[i] = w;
        break;
      case DType::kFloat16:
        out.as<uint16_t>()[i] = float_to_half(float(w));
        break;
      case DType::kBFloat16:
        out.as<uint16_t>()[i] = float_to_bf16(float(w));
        break;
      default:
        return unsupported(std::string(name) + ": output dtype " +
                           std::string(dtype_name(out.dtype)) + " is not supported");
    }
  }
  return ok_status();
}

Status hann_window_kernel(const KernelArgs& a) {
  return window_kernel(a, "HannWindow", 0.5, 0.5, 0.0);
}
Status hamming_window_kernel(const KernelArgs& a) {
  return window_kernel(a, "HammingWindow", 25.0 / 46.0, 21.0 / 46.0, 0.0);
}
Status blackman_window_kernel(const KernelArgs& a) {
  return window_kernel(a, "BlackmanWindow", 0.42, 0.5, 0.08);
}

Status eye_like_kernel(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  if (out.shape.size() != 2) return invalid_argument("EyeLike: the output must be 2-D");
  auto k = a.attrs.get_int("k", 0);
  if (!k.ok()) return k.status();
  const int64_t rows = out.shape[0], cols = out.shape[1];
  std::memset(out.data, 0, out.nbytes());
  return dispatch<kAll>(out.dtype, OpKind::kEyeLike, [&]<typename T>(Tag<T>) {
    T* o = out.as<T>();
    for (int64_t r = 0; r < rows; ++r) {
      // Column r + k, skipped when outside [0, cols) (k may be any int64).
      if (*k > cols || *k < -rows) break;
      const int64_t c = r + *k;
      if (c >= 0 && c < cols) o[r * cols + c] = Num<T>::store(typename Num<T>::C(1));
    }
    return ok_status();
  });
}

// Fills `out` with copies of the `esz` bytes at `value`.
void fill_bytes(const TensorView& out, const void* value) {
  size_t esz = dtype_size(out.dtype);
  auto* dst = static_cast<char*>(out.data);
  int64_t n = out.numel();
  if (n == 0) return;
  std::memcpy(dst, value, esz);
  // Doubling copies: each memcpy copies everything written so far.
  size_t done = esz, total = size_t(n) * esz;
  while (done < total) {
    size_t c = std::min(done, total - done);
    std::memcpy(dst + done, dst, c);
    done += c;
  }
}

Status constant_of_shape_kernel(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  uint64_t bytes = 0;
  if (a.attrs.has("value")) {
    KILN_ASSIGN_OR_RETURN(Tensor v, a.attrs.get_tensor("value"));
    if (v.dtype() != out.dtype || v.numel() != 1) {
      return invalid_argument(
          "ConstantOfShape: the value attribute does not match the output dtype");
    }
    std::memcpy(&bytes, v.data(), v.nbytes());
  } else if (out.dtype != DType::kFloat32) {
    return invalid_argument("ConstantOfShape: without a value the output is float32");
  }
  fill_bytes(out, &bytes);
  return ok_status();
}

Status constant_kernel(const KernelArgs& a) {
  const TensorView& out = a.out[0];
  const ir::Attributes& at = a.attrs;
  Tensor t;
  if (at.has("value")) {
    KILN_ASSIGN_OR_RETURN(t, at.get_tensor("value"));
  } else if (at.has("value_float")) {
    KILN_ASSIGN_OR_RETURN(float v, at.get_float("value_float", std::nullopt));
    t = Tensor::from_vector(DType::kFloat32, {}, std::vector<float>{v});
  } else if (at.has("value_floats")) {
    KILN_ASSIGN_OR_RETURN(auto v, at.get_floats("value_floats", std::nullopt));
    t = Tensor::from_vector(DType::kFloat32, {int64_t(v.size())}, v);
  } else if (at.has("value_int")) {
    KILN_ASSIGN_OR_RETURN(int64_t v, at.get_int("value_int", std::nullopt));
    t = Tensor::from_vector(DType::kInt64, {}, std::vector<int64_t>{v});
  } else if (at.has("value_ints")) {
    KILN_ASSIGN_OR_RETURN(auto v, at.get_ints("value_ints", std::nullopt));
    t = Tensor::from_vector(DType::kInt64, {int64_t(v.size())}, v);
  } else {
    return unsupported("Constant: no supported value attribute");
  }
  if (t.dtype() != out.dtype || t.nbytes() != out.nbytes()) {
    return invalid_argument("Constant: the value does not match the output");
  }
  if (t.nbytes() > 0) std::memcpy(out.data, t.data(), t.nbytes());
  return ok_status();
}

// Source index of output position j of a padded axis, or -1 for the constant.
int64_t pad_source(int64_t j, int64_t begin, int64_t d, std::string_view mode) {
  int64_t s = j - begin;
  if (s >= 0 && s < d) return s;
  if (mode == "constant") return -1;
  if (mode == "edge") return s < 0 ? 0 : d - 1;
  if (mode == "wrap") return ((s % d) + d) % d;
  if (d == 1) return 0;  // reflect
  int64_t period = 2 * (d - 1);
  int64_t t = ((s % period) + period) % period;
  return t < d ? t : period - t;
}

// `sized`: the pads are computed at run time and the output is data-dependent; its view has the
// shape of its bound, *shape gets the shape the pads give, written from the view's start.
Status pad_run(const KernelArgs& a, Shape* shape) {
  const TensorView& in = a.in[0];
  TensorView out = a.out[0];
  int r = in.rank();
  KILN_ASSIGN_OR_RETURN(std::string mode, a.attrs.get_string("mode", std::string("constant")));
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap") {
    return unsupported("Pad: mode '" + mode + "' is not supported");
  }
  std::vector<int64_t> pads;
  if (a.attrs.has("pads")) {
    KILN_ASSIGN_OR_RETURN(pads, a.attrs.get_ints("pads", std::nullopt));
  } else if (a.attrs.has("paddings")) {
    KILN_ASSIGN_OR_RETURN(pads, a.attrs.get_ints("paddings", std::nullopt));
  } else if (a.in.size() > 1 && present(a.in[1])) {
    KILN_ASSIGN_OR_RETURN(pads, read_ints(a.in[1], "Pad", "pads"));
  }
  std::vector<int64_t> axes;
  if (a.in.size() > 3 && present(a.in[3])) {
    KILN_ASSIGN_OR_RETURN(axes, read_ints(a.in[3], "Pad", "axes"));
    for (int64_t& k : axes) {
      if (k < -r || k >= r) return invalid_argument("Pad: axis out of range");
      if (k < 0) k += r;
    }
  } else {
    for (int k = 0; k < r; ++k) axes.push_back(k);
  }
  if (pads.size() != 2 * axes.size() || out.rank() != r || out.dtype != in.dtype) {
    return invalid_argument("Pad: pads do not match the input rank");
  }
  std::vector<int64_t> begin(size_t(r), 0), end(size_t(r), 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    begin[axes[i]] += pads[i];
    end[axes[i]] += pads[i + axes.size()];
  }
  if (shape) {
    shape->assign(size_t(r), 0);
    for (int k = 0; k < r; ++k) {
      auto grown = checked_add(in.shape[k], begin[k]);
      if (grown) grown = checked_add(*grown, end[k]);
      if (!grown || *grown < 0) {
        return invalid_argument(
            "Pad: dim " + std::to_string(k) + " of " + std::to_string(in.shape[k]) + " padded by " +
            std::to_string(begin[k]) + " and " + std::to_string(end[k]) + " is no size");
      }
      const int64_t d = *grown;
      if (d > out.shape[k]) {
        return internal_error("Pad: dim " + std::to_string(k) + " padded to " + std::to_string(d) +
                              ", past the " + std::to_string(out.shape[k]) +
                              " the plan bounds it by");
      }
      (*shape)[size_t(k)] = d;
    }
    out.shape = *shape;
  }
  uint64_t fill = 0;
  if (a.in.size() > 2 && present(a.in[2]) && a.in[2].numel() > 0) {
    if (a.in[2].dtype != in.dtype) return invalid_argument("Pad: constant_value dtype differs");
    std::memcpy(&fill, a.in[2].data, dtype_size(in.dtype));
  } else if (a.attrs.has("value")) {
    KILN_ASSIGN_OR_RETURN(float v, a.attrs.get_float("value", 0.0f));
    write_scalar(in.dtype, v, &fill);
  }
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(r));
  // An empty output copies nothing, and one of its other axes may be huge (0 x 2^45 is a valid
  // shape): building that axis's index map would allocate terabytes (found by onnx_build_fuzz).
  const bool empty = std::find(out.shape.begin(), out.shape.end(), 0) != out.shape.end();
  for (int k = 0; k < r; ++k) {
    int64_t d = in.shape[k];
    if (d + begin[k] + end[k] != out.shape[k]) {
      return shape_mismatch("Pad", "the output", out.shape, in.shape);
    }
    if (mode != "constant" && d == 0 && out.shape[k] > 0) {
      return invalid_argument("Pad: cannot pad an empty axis in " + mode + " mode");
    }
    if (empty) continue;
    maps[k].resize(size_t(out.shape[k]));
    for (int64_t j = 0; j < out.shape[k]; ++j) maps[k][j] = pad_source(j, begin[k], d, mode);
  }
  if (!empty) copy_by_axis_maps(in, out, maps, &fill);
  return ok_status();
}

Status pad_fixed(const KernelArgs& a, std::vector<Shape>* shapes) {
  KILN_RETURN_IF_ERROR(pad_run(a, nullptr));
  (*shapes)[0].assign(a.out[0].shape.begin(), a.out[0].shape.end());
  return ok_status();
}
Status pad_sized(const KernelArgs& a, std::vector<Shape>* shapes) {
  return pad_run(a, &(*shapes)[0]);
}

StatusOr<std::unique_ptr<Kernel>> make_pad_kernel(const KernelQuery& q) {
  return make_sized_kernel(OpKind::kPad, q.node.attrs,
                           computed_at_run_time(q, 1) ? &pad_sized : &pad_fixed);
}

Status trilu_kernel(const KernelArgs& a) {
  const TensorView& in = a.in[0];
  const TensorView& out = a.out[0];
  int r = in.rank();
  if (r < 2 || out.nbytes() != in.nbytes() || out.dtype != in.dtype) {
    return invalid_argument("Trilu: the input must have rank >= 2 and match the output");
  }
  KILN_ASSIGN_OR_RETURN(int64_t upper, a.attrs.get_int("upper", 1));
  int64_t k = 0;
  if (a.in.size() > 1 && present(a.in[1])) {
    KILN_ASSIGN_OR_RETURN(auto kv, read_ints(a.in[1], "Trilu", "k"));
    if (kv.size() != 1) return invalid_argument("Trilu: k must be a scalar");
    k = kv[0];
  }
  int64_t n = in.shape[r - 2], m = in.shape[r - 1];
  if (out.numel() == 0) return ok_status();
  int64_t mats = in.numel() / (n * m);
  size_t esz = dtype_size(in.dtype);
  const auto* src = static_cast<const char*>(in.data);
  auto* dst = static_cast<char*>(out.data);
  // k is untrusted: clamp before adding so that i + k cannot overflow.
  int64_t kc = std::clamp<int64_t>(k, -n - 1, m + 1);
  for (int64_t mat = 0; mat < mats; ++mat) {
    for (int64_t i = 0; i < n; ++i) {
      size_t row = size_t((mat * n + i) * m) * esz;
      // Kept columns: [c0, c1).
      int64_t c0 = upper ? std::clamp<int64_t>(i + kc, 0, m) : 0;
      int64_t c1 = upper ? m : std::clamp<int64_t>(i + kc + 1, 0, m);
      std::memset(dst + row, 0, size_t(m) * esz);
      if (c1 > c0) {
        std::memcpy(dst + row + size_t(c0) * esz, src + row + size_t(c0) * esz,
                    size_t(c1 - c0) * esz);
      }
    }
  }
  return ok_status();
}

template <typename T>
void axis_map_impl(const T* src, std::span<const int64_t> src_shape, T* dst,
                   std::span<const int64_t> dst_shape, std::span<const std::vector<int64_t>> maps,
                   const T* fill) {
  int r = int(dst_shape.size());
  if (r == 0) {
    *dst = *src;
    return;
  }
  std::vector<int64_t> stride(size_t(r), 1);
  for (int k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * src_shape[k + 1];
  const std::vector<int64_t>& last = maps[r - 1];
  int64_t w = dst_shape[r - 1];
  bool contiguous = last[0] >= 0;
  for (int64_t j = 1; j < w && contiguous; ++j) contiguous = last[j] == last[0] + j;
  int64_t rows = shape_numel(dst_shape) / w;
  std::vector<int64_t> idx(size_t(r), 0);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0;
    bool filled = false;
    for (int k = 0; k < r - 1; ++k) {
      int64_t m = maps[k][idx[k]];
      if (m < 0) filled = true;
      off += m * stride[k];
    }
    T* d = dst + row * w;
    if (filled) {
      std::fill(d, d + w, *fill);
    } else if (contiguous) {
      std::memcpy(d, src + off + last[0], size_t(w) * sizeof(T));
    } else {
      for (int64_t j = 0; j < w; ++j) d[j] = last[j] < 0 ? *fill : src[off + last[j]];
    }
    for (int k = r - 2; k >= 0; --k) {
      if (++idx[k] < dst_shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace

// dst[o] = src[maps[0][o_0], ..., maps[r-1][o_{r-1}]], or *fill where an entry is -1. Slice, Pad,
// Tile and Expand all reduce to this; the innermost axis is copied as one run where it can be.
void copy_by_axis_maps(const TensorView& src, const TensorView& dst,
                       std::span<const std::vector<int64_t>> maps, const void* fill) {
  if (dst.numel() == 0) return;
  (void)with_element_type(dst.dtype, "copy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    axis_map_impl<T>(src.as<const T>(), src.shape, dst.as<T>(), dst.shape, maps,
                     static_cast<const T*>(fill));
  });
}

void register_shape_kernels(KernelRegistry& r) {
  r.add(OpKind::kShape, &shape_kernel);
  r.add(OpKind::kSize, &size_kernel);
  r.add(OpKind::kReshape, &copy_bytes);
  r.add(OpKind::kSqueeze, &copy_bytes);
  r.add(OpKind::kUnsqueeze, &copy_bytes);
  r.add(OpKind::kFlatten, &copy_bytes);
  r.add(OpKind::kConcat, &concat_kernel);
  r.add(OpKind::kSplit, &split_kernel);
  r.add(OpKind::kExpand, &expand_kernel);
  r.add(OpKind::kTile, &tile_kernel);
  r.add(OpKind::kTranspose, &transpose_kernel);
  r.add(OpKind::kRange, &range_kernel);
  r.add(OpKind::kConstantOfShape, &constant_of_shape_kernel);
  r.add(OpKind::kConstant, &constant_kernel);
  r.add_factory(OpKind::kPad, &make_pad_kernel);
  r.add(OpKind::kTrilu, &trilu_kernel);
  r.add(OpKind::kHannWindow, &hann_window_kernel);
  r.add(OpKind::kHammingWindow, &hamming_window_kernel);
  r.add(OpKind::kBlackmanWindow, &blackman_window_kernel);
  r.add(OpKind::kEyeLike, &eye_like_kernel);
}

}  // namespace kiln::backends::cpu

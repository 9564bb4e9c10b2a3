// CPU reference kernels of the ops whose output sizes their data decides: NonZero, Compress,
// Unique and NonMaxSuppression. Each output's view has the shape of its upper bound; a kernel
// writes the exact shape's elements from the view's start and reports that shape
// (Kernel::data_dependent_shape), refusing a size past the bound instead of writing past it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

class SizedKernel final : public Kernel {
 public:
  SizedKernel(std::string name, ir::Attributes attrs, SizedFn fn)
      : name_(std::move(name)), attrs_(std::move(attrs)), fn_(fn) {}
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    shapes_.assign(out.size(), Shape{});
    valid_ = false;
    KILN_RETURN_IF_ERROR(fn_(KernelArgs{attrs_, in, out}, &shapes_));
    valid_ = true;
    return ok_status();
  }
  std::string name() const override { return name_; }
  StatusOr<Shape> data_dependent_shape(size_t output) const override {
    if (!valid_ || output >= shapes_.size()) {
      return internal_error(name_ + " has no size for output " + std::to_string(output) +
                            " (it has not run)");
    }
    return shapes_[output];
  }

 private:
  std::string name_;
  ir::Attributes attrs_;
  SizedFn fn_;
  std::vector<Shape> shapes_;
  bool valid_ = false;
};

// The error for a size past the bound the run gave the output (a plan whose bound is wrong).
Status past_bound(std::string_view op, int64_t n, int64_t bound) {
  return internal_error(std::string(op) + ": " + std::to_string(n) + " results exceed the " +
                        std::to_string(bound) + " the plan bounds the output by");
}

// Whether element i is nonzero (-0.0 is zero; NaN is not).
StatusOr<std::vector<int64_t>> nonzero_positions(const TensorView& x, OpKind op) {
  std::vector<int64_t> pos;
  KILN_RETURN_IF_ERROR(dispatch<kAll>(x.dtype, op, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    using C = typename Num<T>::C;
    const T* p = x.as<const T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (Num<T>::load(p[i]) != C(0)) pos.push_back(i);
    }
    return ok_status();
  }));
  return pos;
}

Status nonzero_kernel(const KernelArgs& a, std::vector<Shape>* shapes) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pos, nonzero_positions(x, OpKind::kNonZero));
  const int64_t n = int64_t(pos.size());
  const int64_t rank = std::max(x.rank(), 1);
  if (y.rank() != 2 || y.shape[0] != rank)
    return internal_error("NonZero: output view is not [rank, n]");
  if (n > y.shape[1]) return past_bound("NonZero", n, y.shape[1]);
  int64_t* out = y.as<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    int64_t rest = pos[size_t(k)];
    for (int d = x.rank() - 1; d >= 0; --d) {
      out[d * n + k] = rest % x.shape[d];
      rest /= x.shape[d];
    }
    if (x.rank() == 0) out[k] = 0;
  }
  (*shapes)[0] = {rank, n};
  return ok_status();
}

// What Compress and Unique select from: slices along the axis attribute (outer x len x inner), or
// without it the elements of the flattened input.
struct Slices {
  bool has_axis = false;
  int axis = 0;
  int64_t outer = 1, len = 0, inner = 1;
};

StatusOr<Slices> slices_of(const KernelArgs& a, const TensorView& x, const std::string& op) {
  Slices s;
  s.has_axis = a.attrs.has("axis");
  s.len = x.numel();
  if (!s.has_axis) return s;
  KILN_ASSIGN_OR_RETURN(int64_t ax, a.attrs.get_int("axis", 0));
  s.axis = int(ax < 0 ? ax + x.rank() : ax);
  if (s.axis < 0 || s.axis >= x.rank()) return invalid_argument(op + ": axis out of range");
  s.len = x.shape[size_t(s.axis)];
  for (int d = 0; d < s.axis; ++d) s.outer *= x.shape[size_t(d)];
  for (int d = s.axis + 1; d < x.rank(); ++d) s.inner *= x.shape[size_t(d)];
  return s;
}

// Writes slices rows[0], rows[1], ... of x into y (outer x rows.size() x inner) and returns y's
// exact shape; the caller has checked rows.size() against y's bound.
Shape copy_slices(const TensorView& x, const TensorView& y, const Slices& s,
                  const std::vector<int64_t>& rows) {
  const int64_t n = int64_t(rows.size());
  const size_t es = dtype_size(x.dtype);
  const char* src = x.as<const char>();
  char* dst = y.as<char>();
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t k = 0; k < n; ++k) {
      std::memcpy(dst + size_t((o * n + k) * s.inner) * es,
                  src + size_t((o * s.len + rows[size_t(k)]) * s.inner) * es, size_t(s.inner) * es);
    }
  }
  if (!s.has_axis) return {n};
  Shape shape(x.shape.begin(), x.shape.end());
  shape[size_t(s.axis)] = n;
  return shape;
}

Status compress_kernel(const KernelArgs& a, std::vector<Shape>* shapes) {
  const TensorView& x = a.in[0];
  const TensorView& cond = a.in[1];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(Slices sl, slices_of(a, x, "Compress"));
  const uint8_t* c = cond.as<const uint8_t>();
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i) {
    if (!c[i]) continue;
    if (i >= sl.len) {
      return invalid_argument("Compress: condition entry " + std::to_string(i) +
                              " is true, past the " + std::to_string(sl.len) +
                              (sl.has_axis ? " slices along the axis" : " elements"));
    }
    keep.push_back(i);
  }
  const int64_t bound = sl.has_axis ? y.shape[size_t(sl.axis)] : y.shape[0];
  if (int64_t(keep.size()) > bound) return past_bound("Compress", int64_t(keep.size()), bound);
  (*shapes)[0] = copy_slices(x, y, sl, keep);
  return ok_status();
}

Status unique_kernel(const KernelArgs& a, std::vector<Shape>* shapes) {
  const TensorView& x = a.in[0];
  KILN_ASSIGN_OR_RETURN(int64_t sorted, a.attrs.get_int("sorted", 1));
  KILN_ASSIGN_OR_RETURN(Slices sl, slices_of(a, x, "Unique"));
  const int64_t outer = sl.outer, rows = sl.len, inner = sl.inner;
  // Rows (elements, or slices along the axis) in the order numpy's unique sorts them: the
  // slice's elements compared in order. A stable sort keeps each group's first occurrence first.
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> group(
      static_cast<size_t>(rows));  // row -> its group's index in sorted order
  int64_t groups = 0;
  KILN_RETURN_IF_ERROR(dispatch<kAll>(x.dtype, OpKind::kUnique, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T* p = x.as<const T>();
    auto at = [&](int64_t row, int64_t k) {
      return Num<T>::load(p[(k / inner * rows + row) * inner + k % inner]);
    };
    const int64_t per_row = outer * inner;
    auto cmp = [&](int64_t r1, int64_t r2) {  // -1, 0, 1
      for (int64_t k = 0; k < per_row; ++k) {
        auto u = at(r1, k), v = at(r2, k);
        const bool un = u != u, vn = v != v;  // NaN: after every number, equal to NaN
        if (un || vn) {
          if (un != vn) return un ? 1 : -1;
          continue;
        }
        if (u < v) return -1;
        if (v < u) return 1;
      }
      return 0;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t r1, int64_t r2) { return cmp(r1, r2) < 0; });
    for (size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || cmp(order[i - 1], order[i]) != 0) ++groups;
      group[size_t(order[i])] = groups - 1;
    }
    return ok_status();
  }));
  // Each group's first row and count; then the output order of the groups.
  std::vector<int64_t> first(size_t(groups), -1), count(size_t(groups), 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t gi = group[size_t(r)];
    if (first[size_t(gi)] < 0) first[size_t(gi)] = r;
    ++count[size_t(gi)];
  }
  std::vector<int64_t> out_order(static_cast<size_t>(groups));  // output position -> group
  std::iota(out_order.begin(), out_order.end(), 0);
  if (sorted == 0) {
    std::sort(out_order.begin(), out_order.end(),
              [&](int64_t g1, int64_t g2) { return first[size_t(g1)] < first[size_t(g2)]; });
  }
  std::vector<int64_t> position(static_cast<size_t>(groups));  // group -> output position
  for (int64_t k = 0; k < groups; ++k) position[size_t(out_order[size_t(k)])] = k;

  const TensorView& y = a.out[0];
  const int64_t bound = sl.has_axis ? y.shape[size_t(sl.axis)] : y.shape[0];
  if (groups > bound) return past_bound("Unique", groups, bound);
  std::vector<int64_t> first_rows(static_cast<size_t>(groups));
  for (int64_t k = 0; k < groups; ++k) first_rows[size_t(k)] = first[size_t(out_order[size_t(k)])];
  (*shapes)[0] = copy_slices(x, y, sl, first_rows);
  if (a.out.size() > 1 && present(a.out[1])) {
    for (int64_t k = 0; k < groups; ++k) a.out[1].as<int64_t>()[k] = first_rows[size_t(k)];
    (*shapes)[1] = {groups};
  }
  if (a.out.size() > 2 && present(a.out[2])) {
    for (int64_t r = 0; r < rows; ++r)
      a.out[2].as<int64_t>()[r] = position[size_t(group[size_t(r)])];
    (*shapes)[2] = {rows};
  }
  if (a.out.size() > 3 && present(a.out[3])) {
    for (int64_t k = 0; k < groups; ++k)
      a.out[3].as<int64_t>()[k] = count[size_t(out_order[size_t(k)])];
    (*shapes)[3] = {groups};
  }
  return ok_status();
}

// Whether box j suppresses box i (IoU above the threshold), in float32 as ONNX's reference does.
bool suppresses(const float* bi, const float* bj, bool center, float iou_threshold) {
  float x1a, x1b, y1a, y1b, x2a, x2b, y2a, y2b;
  if (!center) {
    y1a = std::min(bi[0], bi[2]), y1b = std::max(bi[0], bi[2]);
    x1a = std::min(bi[1], bi[3]), x1b = std::max(bi[1], bi[3]);
    y2a = std::min(bj[0], bj[2]), y2b = std::max(bj[0], bj[2]);
    x2a = std::min(bj[1], bj[3]), x2b = std::max(bj[1], bj[3]);
  } else {
    x1a = bi[0] - bi[2] / 2, x1b = bi[0] + bi[2] / 2, y1a = bi[1] - bi[3] / 2,
    y1b = bi[1] + bi[3] / 2;
    x2a = bj[0] - bj[2] / 2, x2b = bj[0] + bj[2] / 2, y2a = bj[1] - bj[3] / 2,
    y2b = bj[1] + bj[3] / 2;
  }
  const float ix0 = std::max(x1a, x2a), ix1 = std::min(x1b, x2b);
  if (ix1 <= ix0) return false;
  const float iy0 = std::max(y1a, y2a), iy1 = std::min(y1b, y2b);
  if (iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  if (inter <= 0) return false;
  const float area1 = (x1b - x1a) * (y1b - y1a), area2 = (x2b - x2a) * (y2b - y2a);
  const float uni = area1 + area2 - inter;
  if (area1 <= 0 || area2 <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

Status nms_kernel(const KernelArgs& a, std::vector<Shape>* shapes) {
  const TensorView& boxes = a.in[0];
  const TensorView& scores = a.in[1];
  const TensorView& y = a.out[0];
  KILN_ASSIGN_OR_RETURN(int64_t center, a.attrs.get_int("center_point_box", 0));
  auto given = [&](size_t i) { return a.in.size() > i && present(a.in[i]) && a.in[i].numel() > 0; };
  const int64_t max_per_class = given(2) ? std::max<int64_t>(a.in[2].as<const int64_t>()[0], 0) : 0;
  const float iou = given(3) ? a.in[3].as<const float>()[0] : 0.f;
  const bool has_score = given(4);
  const float score_threshold = has_score ? a.in[4].as<const float>()[0] : 0.f;
  const int64_t batches = boxes.shape[0], n = boxes.shape[1], classes = scores.shape[1];
  if (scores.shape[0] != batches || scores.shape[2] != n || boxes.shape[2] != 4) {
    return invalid_argument(
        "NonMaxSuppression: boxes " +
        shape_to_string(Shape(boxes.shape.begin(), boxes.shape.end())) + " and scores " +
        shape_to_string(Shape(scores.shape.begin(), scores.shape.end())) + " do not agree");
  }
  int64_t* out = y.as<int64_t>();
  const int64_t bound = y.shape[0];
  int64_t total = 0;
  std::vector<int64_t> cand, kept;
  for (int64_t b = 0; b < batches; ++b) {
    const float* bx = boxes.as<const float>() + b * n * 4;
    for (int64_t c = 0; c < classes; ++c) {
      const float* sc = scores.as<const float>() + (b * classes + c) * n;
      cand.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (!has_score || sc[i] > score_threshold) cand.push_back(i);
      }
      // Highest score first; equal scores, lower index first (NaN last, a strict order).
      auto key = [&](int64_t i) {
        return std::isnan(sc[i]) ? -std::numeric_limits<float>::infinity() : sc[i];
      };
      std::stable_sort(cand.begin(), cand.end(),
                       [&](int64_t i, int64_t j) { return key(i) > key(j); });
      kept.clear();
      for (int64_t i : cand) {
        if (int64_t(kept.size()) >= max_per_class) break;
        bool keep = true;
        for (int64_t j : kept) {
          if (suppresses(bx + i * 4, bx + j * 4, center != 0, iou)) {
            keep = false;
            break;
          }
        }
        if (!keep) continue;
        kept.push_back(i);
        if (total >= bound) return past_bound("NonMaxSuppression", total + 1, bound);
        out[total * 3] = b, out[total * 3 + 1] = c, out[total * 3 + 2] = i;
        ++total;
      }
    }
  }
  (*shapes)[0] = {total, 3};
  return ok_status();
}

// kiln::SelectBranch: output j is a copy of then_j or else_j, as the condition says; its shape is
// the chosen one's (the other branch did not run, so its views hold nothing).
Status select_branch_kernel(const KernelArgs& a, std::vector<Shape>* shapes) {
  const size_t k = a.out.size();
  if (a.in.size() != 1 + 2 * k || !present(a.in[0]) || a.in[0].numel() != 1) {
    return internal_error("SelectBranch: needs a condition and two inputs per output");
  }
  const bool cond = *static_cast<const uint8_t*>(a.in[0].data) != 0;
  for (size_t j = 0; j < k; ++j) {
    if (!present(a.out[j])) continue;
    const TensorView& src = a.in[1 + (cond ? 0 : k) + j];
    const size_t bytes = size_t(src.numel()) * dtype_size(src.dtype);
    if (src.dtype != a.out[j].dtype || bytes > a.out[j].nbytes()) {
      return past_bound("SelectBranch", src.numel(), a.out[j].numel());
    }
    if (bytes) std::memmove(a.out[j].data, src.data, bytes);
    (*shapes)[j] = Shape(src.shape.begin(), src.shape.end());
  }
  return ok_status();
}

}  // namespace

std::unique_ptr<Kernel> make_sized_kernel(OpKind op, const ir::Attributes& attrs, SizedFn fn) {
  return std::unique_ptr<Kernel>(new SizedKernel("cpu." + name_of(op), attrs, fn));
}

void add_sized_kernel(KernelRegistry& r, OpKind op, SizedFn fn) {
  r.add_factory(op, [op, fn](const KernelQuery& q) -> StatusOr<std::unique_ptr<Kernel>> {
    return make_sized_kernel(op, q.node.attrs, fn);
  });
}

void register_data_dependent_kernels(KernelRegistry& r) {
  add_sized_kernel(r, OpKind::kNonZero, &nonzero_kernel);
  add_sized_kernel(r, OpKind::kCompress, &compress_kernel);
  add_sized_kernel(r, OpKind::kUnique, &unique_kernel);
  add_sized_kernel(r, OpKind::kNonMaxSuppression, &nms_kernel);
  add_sized_kernel(r, OpKind::kSelectBranch, &select_branch_kernel);
}

}  // namespace kiln::backends::cpu

// kiln::Relayout (made by fuse_relayout): shape inference, and the kernels on every backend against
// a naive loop and against the unfused Cast, Transpose and Pad run by their CPU references: images
// of rank 3 to 5 going channels last between float32, float16 and bfloat16, padded to 4 and 8
// channels (the vector stores of the CUDA kernel) and to other counts (its element path), and a
// permutation CUDA refuses.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::f32;
using testing::infer_node;
using testing::op;
using testing::OpNode;
using testing::run_case;

OpNode relayout(std::vector<int64_t> perm, DType to, int64_t pad) {
  OpNode n = op("Relayout", 1, "kiln").ints("perm", std::move(perm)).i("to", int64_t(to));
  if (pad > 0) n.i("pad_last", pad);
  return n;
}

std::vector<int64_t> channels_last(int rank) {
  std::vector<int64_t> p = {0};
  for (int d = 2; d < rank; ++d) p.push_back(d);
  p.push_back(1);
  return p;
}

TEST(RelayoutInfer, PermutesConvertsAndPadsTheLastAxis) {
  const Dim n = Dim::symbol("n"), h = Dim::symbol("h");
  auto r = infer_node(relayout({0, 2, 3, 1}, DType::kFloat16, 1), {f32({n, 3, h, 224})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[n, h, 224, 4]");
  EXPECT_EQ(r.dtype(), DType::kFloat16);
  auto same = infer_node(relayout({1, 0}, DType::kFloat32, 0), {f32({n, 5})});
  ASSERT_TRUE(same.ok()) << same.status.to_string();
  EXPECT_EQ(same.shape(), "[5, n]");
  // perm of the wrong length or no permutation, an unknown dtype, a negative pad, rank 0, an
  // unknown attribute.
  EXPECT_FALSE(infer_node(relayout({0, 2, 1}, DType::kFloat16, 0), {f32({1, 3, 4, 4})}).ok());
  EXPECT_FALSE(infer_node(relayout({0, 1, 1, 2}, DType::kFloat16, 0), {f32({1, 3, 4, 4})}).ok());
  EXPECT_FALSE(
      infer_node(op("Relayout", 1, "kiln").ints("perm", {0, 1}).i("to", 999), {f32({2, 3})}).ok());
  EXPECT_FALSE(
      infer_node(relayout({0, 1}, DType::kFloat16, 0).i("pad_last", -1), {f32({2, 3})}).ok());
  EXPECT_FALSE(infer_node(relayout({}, DType::kFloat16, 0), {f32({})}).ok());
  EXPECT_FALSE(infer_node(relayout({0, 1}, DType::kFloat16, 0).i("axis", 1), {f32({2, 3})}).ok());
  EXPECT_FALSE(infer_node(op("Relayout", 1, "kiln").i("to", 10), {f32({2, 3})}).ok());
}

// Values every dtype here holds exactly (eighths in [-8, 8]), so the conversion is exact and the
// expected tensor is the same numbers moved.
std::vector<double> exact_values(int64_t n) {
  std::vector<double> v(size_t(n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double((i * 37) % 129 - 64) * 0.125;
  return v;
}

// Y = X's values at perm, pad zeros after each row of Y's last axis.
std::vector<double> moved(const std::vector<double>& x, const Shape& xs,
                          const std::vector<int64_t>& perm, int64_t pad, Shape* ys) {
  const size_t r = xs.size();
  Shape ts(r), stride(r, 1);
  for (size_t d = r - 1; d > 0; --d) stride[d - 1] = stride[d] * xs[d];
  for (size_t d = 0; d < r; ++d) ts[d] = xs[size_t(perm[d])];
  *ys = ts;
  ys->back() += pad;
  std::vector<double> y;
  std::vector<int64_t> idx(r, 0);
  const int64_t rows = shape_numel(ts) / ts.back();
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < ts.back(); ++j) {
      idx[r - 1] = j;
      int64_t src = 0;
      for (size_t d = 0; d < r; ++d) src += idx[d] * stride[size_t(perm[d])];
      y.push_back(x[size_t(src)]);
    }
    for (int64_t j = 0; j < pad; ++j) y.push_back(0.0);
    for (int d = int(r) - 2; d >= 0; --d) {
      if (++idx[size_t(d)] < ts[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return y;
}

// The unfused chain on the CPU references: Cast, Transpose, Pad of the last axis.
Tensor unfused(const Tensor& x, const std::vector<int64_t>& perm, DType to, int64_t pad) {
  auto c =
      testing::run_cpu_kernel(op("Cast", 19).i("to", int64_t(to)).node, {x}, {{to, x.shape()}});
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return Tensor();
  Shape ts;
  for (int64_t p : perm) ts.push_back(x.shape()[size_t(p)]);
  auto t =
      testing::run_cpu_kernel(op("Transpose", 13).ints("perm", perm).node, {(*c)[0]}, {{to, ts}});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return Tensor();
  std::vector<int64_t> pads(2 * ts.size(), 0);
  pads.back() = pad;
  Shape ps = ts;
  ps.back() += pad;
  Tensor pv = *Tensor::zeros(DType::kInt64, {int64_t(pads.size())});
  std::memcpy(pv.data(), pads.data(), pads.size() * sizeof(int64_t));
  auto p = testing::run_cpu_kernel(op("Pad", 18).node, {(*t)[0], pv}, {{to, ps}});
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? (*p)[0] : Tensor();
}

TEST(RelayoutKernel, ImagesGoChannelsLastConvertedAndPadded) {
  struct Case {
    Shape shape;
    int64_t pad;
  };
  const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (const Case& c :
       {Case{{2, 3, 5, 7}, 1}, Case{{3, 3, 4, 6}, 5}, Case{{1, 3, 224, 224}, 1}, Case{{2, 2, 9}, 2},
        Case{{2, 3, 2, 3, 4}, 0}, Case{{2, 6, 3, 5}, 2}, Case{{2, 5, 4, 4}, 11}}) {
    const std::vector<int64_t> perm = channels_last(int(c.shape.size()));
    const std::vector<double> xv = exact_values(shape_numel(c.shape));
    Shape ys;
    const std::vector<double> yv = moved(xv, c.shape, perm, c.pad, &ys);
    for (DType from : kTypes) {
      for (DType to : kTypes) {
        const std::string label = shape_to_string(c.shape) + " " + std::string(dtype_name(from)) +
                                  " to " + std::string(dtype_name(to)) + " pad " +
                                  std::to_string(c.pad);
        const Tensor x = testing::make_typed(from, c.shape, xv);
        const Tensor want = testing::make_typed(to, ys, yv);
        const Tensor chain = unfused(x, perm, to, c.pad);
        ASSERT_EQ(chain.nbytes(), want.nbytes()) << label;
        EXPECT_EQ(std::memcmp(chain.data(), want.data(), want.nbytes()), 0)
            << label << ": the unfused chain gives other bits";
        auto r = run_case({.node = relayout(perm, to, c.pad),
                           .inputs = {x},
                           .expected = {want},
                           .expect_support = true,
                           .label = label});
        ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
        EXPECT_EQ(std::memcmp((*r)[0].data(), want.data(), want.nbytes()), 0) << label;
      }
    }
  }
}

TEST(RelayoutKernel, OtherPermutationsRunOnTheReference) {
  // NHWC -> NCHW (CUDA's kernel moves axis 1 last only: it refuses, the CPU runs it).
  const Shape xs = {2, 4, 5, 3};
  const std::vector<int64_t> perm = {0, 3, 1, 2};
  const std::vector<double> xv = exact_values(shape_numel(xs));
  Shape ys;
  const std::vector<double> yv = moved(xv, xs, perm, 1, &ys);
  auto r = run_case({.node = relayout(perm, DType::kFloat16, 1),
                     .inputs = {testing::make_typed(DType::kFloat32, xs, xv)},
                     .expected = {testing::make_typed(DType::kFloat16, ys, yv)},
                     .label = "NHWC to NCHW"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

}  // namespace
}  // namespace kiln

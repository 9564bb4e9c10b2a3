// Ops whose output sizes their data decides (issue 15, item 1): NonZero, Compress, Unique,
// NonMaxSuppression, and TopK with K from data. Inference gives each such size a data-dependent dim
// bounded by the input shapes; the kernel cases run the CPU reference and one-node engines on every
// device present (CUDA's cuda.host.* kernels on the GPU host), against values written out by hand
// from the ONNX spec's examples.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "typed_values.h"

namespace kiln {
namespace {

using ir::Dim;
using testing::const_scalar;
using testing::f32;
using testing::infer_node;
using testing::initializer;
using testing::KernelCase;
using testing::make_f32;
using testing::make_i64;
using testing::op;
using testing::run_case;
using testing::typed;

const Dim b = Dim::symbol("b");
const Dim n = Dim::symbol("n");

Tensor make_bool(Shape shape, const std::vector<uint8_t>& v) {
  return Tensor::from_vector(DType::kBool, std::move(shape), v);
}

// ---- shape inference ----

TEST(DataDependentInfer, NonZeroCountsUpToTheElements) {
  auto r = infer_node(op("NonZero", 13), {f32({b, 3})});
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(), "[2, nonzero]");
  EXPECT_EQ(r.dtype(), DType::kInt64);
  ASSERT_EQ(r.data_dependent.size(), 1u);
  EXPECT_EQ(r.data_dependent[0].symbol, "nonzero");
  EXPECT_EQ(r.data_dependent[0].bound.to_string(), "3*b");
  // Outside a build (no list of data-dependent dims) the size has no name: an error, not a guess.
  ir::Graph g;
  int x = g.add_value("x");
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<Dim>{Dim(4)};
  ir::Node node = op("NonZero", 13).node;
  node.inputs = {x};
  node.outputs = {g.add_value("y")};
  g.nodes.push_back(node);
  std::vector<ops::Constraint> constraints;
  ops::InferContext ctx(g, g.nodes[0], 0, &constraints);
  Status st = ops::find_schema(g.nodes[0])->infer(ctx);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("a size only its data decides"), std::string::npos) << st.message();
}

TEST(DataDependentInfer, CompressUniqueAndNmsBounds) {
  auto c =
      infer_node(op("Compress", 11).i("axis", 1), {f32({b, n}), typed(DType::kBool, {Dim(5)})});
  ASSERT_TRUE(c.ok()) << c.status.to_string();
  EXPECT_EQ(c.shape(), "[b, compressed]");
  EXPECT_EQ(c.data_dependent[0].bound.to_string(), "min(5, n)");
  auto bad = infer_node(op("Compress", 11), {f32({b}), typed(DType::kInt64, {Dim(5)})});
  EXPECT_FALSE(bad.ok());

  auto u = infer_node(op("Unique", 11).i("axis", 0), {f32({n, 3})}, 4);
  ASSERT_TRUE(u.ok()) << u.status.to_string();
  EXPECT_EQ(u.shape(0), "[unique, 3]");
  EXPECT_EQ(u.shape(1), "[unique]");
  EXPECT_EQ(u.shape(2), "[n]");
  EXPECT_EQ(u.shape(3), "[unique]");

  auto nms = infer_node(op("NonMaxSuppression", 11),
                        {f32({b, n, 4}), f32({b, 2, n}), testing::constant(make_i64({1}, {3}))});
  ASSERT_TRUE(nms.ok()) << nms.status.to_string();
  EXPECT_EQ(nms.shape(), "[nms_selected, 3]");
  EXPECT_EQ(nms.data_dependent[0].bound.to_string(), "2*b*min(3, n)");
}

// ---- kernels (CPU reference, then every device present) ----

TEST(DataDependentKernels, NonZero) {
  KernelCase c;
  c.node = op("NonZero", 13);
  c.inputs = {make_f32({2, 2}, {1, 0, 1, 1})};
  c.expected = {make_i64({2, 3}, {0, 1, 1, 0, 0, 1})};
  c.expect_support = true;
  ASSERT_TRUE(run_case(c).ok());
  // -0.0 is zero; none nonzero gives [rank, 0].
  c.inputs = {make_f32({3}, {-0.0f, 0, 0})};
  c.expected = {make_i64({1, 0}, {})};
  ASSERT_TRUE(run_case(c).ok());
  c.inputs = {
      Tensor::from_vector(DType::kInt32, {2, 1, 3}, std::vector<int32_t>{0, 7, 0, -1, 0, 2})};
  c.expected = {make_i64({3, 3}, {0, 1, 1, 0, 0, 0, 1, 0, 2})};
  ASSERT_TRUE(run_case(c).ok());
}

// kiln::SelectBranch (an If on data, after its branches): the chosen branch's values, at their
// own size where the branches' sizes differ.
TEST(DataDependentKernels, SelectBranch) {
  const Tensor t = make_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor e = make_f32({2, 3}, {-1, -2, -3, -4, -5, -6});
  for (bool cond : {true, false}) {
    KernelCase c;
    c.expect_support = true;
    c.node = op("SelectBranch", 1, "kiln");
    c.num_outputs = 2;
    c.inputs = {make_bool({}, {uint8_t(cond)}), t, make_i64({2}, {7, 8}), e,
                make_i64({3}, {9, 10, 11})};
    c.expected = {cond ? t : e, cond ? make_i64({2}, {7, 8}) : make_i64({3}, {9, 10, 11})};
    ASSERT_TRUE(run_case(c).ok()) << cond;
  }
}

TEST(DataDependentKernels, Compress) {
  const Tensor x = make_f32({3, 2}, {1, 2, 3, 4, 5, 6});
  KernelCase c;
  c.expect_support = true;
  c.node = op("Compress", 11).i("axis", 0);
  c.inputs = {x, make_bool({3}, {0, 1, 1})};
  c.expected = {make_f32({2, 2}, {3, 4, 5, 6})};
  ASSERT_TRUE(run_case(c).ok());
  c.node = op("Compress", 11).i("axis", 1);
  c.inputs = {x, make_bool({2}, {0, 1})};
  c.expected = {make_f32({3, 1}, {2, 4, 6})};
  ASSERT_TRUE(run_case(c).ok());
  c.node = op("Compress", 11);  // flattened; a condition shorter than the input
  c.inputs = {x, make_bool({5}, {0, 1, 0, 0, 1})};
  c.expected = {make_f32({2}, {2, 5})};
  ASSERT_TRUE(run_case(c).ok());
  // A true entry past the axis is an error naming it, never a read past the input.
  auto past = run_case(op("Compress", 11).i("axis", 1), {x, make_bool({3}, {0, 0, 1})});
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("condition entry 2 is true, past the 2 slices"),
            std::string::npos)
      << past.status().message();
}

TEST(DataDependentKernels, UniqueSortedUnsortedAndAlongAnAxis) {
  KernelCase c;
  c.expect_support = true;
  c.num_outputs = 4;
  c.node = op("Unique", 11);
  c.inputs = {make_f32({6}, {2, 1, 1, 3, 4, 3})};
  c.expected = {make_f32({4}, {1, 2, 3, 4}), make_i64({4}, {1, 0, 3, 4}),
                make_i64({6}, {1, 0, 0, 2, 3, 2}), make_i64({4}, {2, 1, 2, 1})};
  ASSERT_TRUE(run_case(c).ok());
  c.node = op("Unique", 11).i("sorted", 0);
  c.expected = {make_f32({4}, {2, 1, 3, 4}), make_i64({4}, {0, 1, 3, 4}),
                make_i64({6}, {0, 1, 1, 2, 3, 2}), make_i64({4}, {1, 2, 2, 1})};
  ASSERT_TRUE(run_case(c).ok());
  c.node = op("Unique", 11).i("axis", 0);
  c.inputs = {make_f32({3, 3}, {2, 3, 4, 1, 0, 0, 2, 3, 4})};
  c.expected = {make_f32({2, 3}, {1, 0, 0, 2, 3, 4}), make_i64({2}, {1, 0}),
                make_i64({3}, {1, 0, 1}), make_i64({2}, {1, 2})};
  ASSERT_TRUE(run_case(c).ok());
  // Along the last axis of a [2, 3] input: columns 0 and 2 are equal.
  c.node = op("Unique", 11).i("axis", -1).i("sorted", 0);
  c.inputs = {make_f32({2, 3}, {1, 5, 1, 2, 0, 2})};
  c.expected = {make_f32({2, 2}, {1, 5, 2, 0}), make_i64({2}, {0, 1}), make_i64({3}, {0, 1, 0}),
                make_i64({2}, {2, 1})};
  ASSERT_TRUE(run_case(c).ok());
}

TEST(DataDependentKernels, NonMaxSuppression) {
  // ONNX's suppress_by_IOU example: boxes 0-2 overlap, 3-4 overlap, 5 stands alone.
  const Tensor boxes = make_f32({1, 6, 4}, {0, 0,  1, 1,  0, 0.1f,  1, 1.1f,  0, -0.1f, 1, 0.9f,
                                            0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100,   1, 101});
  const Tensor scores = make_f32({1, 1, 6}, {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f});
  KernelCase c;
  c.expect_support = true;
  c.node = op("NonMaxSuppression", 11);
  c.inputs = {boxes, scores, initializer(make_i64({1}, {3})), initializer(make_f32({1}, {0.5f})),
              initializer(make_f32({1}, {0.0f}))};
  c.expected = {make_i64({3, 3}, {0, 0, 3, 0, 0, 0, 0, 0, 5})};
  ASSERT_TRUE(run_case(c).ok());
  // The same with every threshold given at run time (the bound is then every box), and a score
  // threshold that leaves two boxes.
  c.inputs = {boxes, scores, make_i64({1}, {3}), make_f32({1}, {0.5f}), make_f32({1}, {0.8f})};
  c.expected = {make_i64({2, 3}, {0, 0, 3, 0, 0, 0})};
  ASSERT_TRUE(run_case(c).ok());
  // Center-point boxes, two classes, two batches.
  const Tensor centers = make_f32({2, 3, 4}, {0.5f, 0.5f, 1, 1, 0.5f, 0.6f, 1, 1, 5, 5, 1, 1,
                                              0.5f, 0.5f, 1, 1, 0.5f, 0.6f, 1, 1, 5, 5, 1, 1});
  const Tensor two =
      make_f32({2, 2, 3}, {0.9f, 0.8f, 0.7f, 0.1f, 0.2f, 0.3f, 0.9f, 0.8f, 0.7f, 0.1f, 0.2f, 0.3f});
  c.node = op("NonMaxSuppression", 11).i("center_point_box", 1);
  c.inputs = {centers, two, initializer(make_i64({1}, {2})), initializer(make_f32({1}, {0.5f})),
              Tensor()};
  c.expected = {
      make_i64({8, 3}, {0, 0, 0, 0, 0, 2, 0, 1, 2, 0, 1, 1, 1, 0, 0, 1, 0, 2, 1, 1, 2, 1, 1, 1})};
  ASSERT_TRUE(run_case(c).ok());
}

TEST(DataDependentKernels, TopKWithKFromData) {
  // K is an engine input: the outputs' axis is a data-dependent dim bounded by input 0's.
  auto r = infer_node(op("TopK", 11), {f32({b, n}), typed(DType::kInt64, {Dim(1)})}, 2);
  ASSERT_TRUE(r.ok()) << r.status.to_string();
  EXPECT_EQ(r.shape(0), "[b, topk]");
  EXPECT_EQ(r.shape(1), "[b, topk]");
  EXPECT_EQ(r.data_dependent[0].bound.to_string(), "n");
  KernelCase c;
  c.expect_support = true;
  c.num_outputs = 2;
  c.node = op("TopK", 11).i("axis", 1);
  c.inputs = {make_f32({2, 5}, {1, 5, 2, 4, 3, 9, 7, 8, 6, 0}), make_i64({1}, {3})};
  c.expected = {make_f32({2, 3}, {5, 4, 3, 9, 8, 7}), make_i64({2, 3}, {1, 3, 4, 0, 2, 1})};
  ASSERT_TRUE(run_case(c).ok());
  c.inputs = {make_f32({2, 5}, {1, 5, 2, 4, 3, 9, 7, 8, 6, 0}), make_i64({1}, {0})};
  c.expected = {make_f32({2, 0}, {}), make_i64({2, 0}, {})};
  ASSERT_TRUE(run_case(c).ok());
  auto past = run_case(op("TopK", 11), {make_f32({1, 4}, {1, 2, 3, 4}), make_i64({1}, {5})}, 2);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("K = 5 is out of range [0, 4]"), std::string::npos)
      << past.status().message();
}

}  // namespace
}  // namespace kiln

// The op-test harness every tests/ops_*_test.cc uses: shape inference of one node (infer_node),
// and kernel cases (run_case) that run the CPU reference and then a one-node engine on every
// device present, compared with the tolerance of what the node computed in. It records which ops
// ran a case on which device; tests/op_coverage_test.cc checks that record.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "ops/schema.h"
#include "test_util.h"

namespace kiln::testing {

// One node: op, domain, opset and attributes. The setters chain:
//   op("Conv", 17).ints("strides", {2, 2}).i("group", 2)
struct OpNode {
  ir::Node node;

  OpNode& i(const std::string& name, int64_t v);
  OpNode& f(const std::string& name, float v);
  OpNode& s(const std::string& name, std::string v);
  OpNode& ints(const std::string& name, std::vector<int64_t> v);
  OpNode& floats(const std::string& name, std::vector<float> v);
  OpNode& tensor(const std::string& name, Tensor v);
  OpNode& graph(const std::string& name, std::shared_ptr<ir::Graph> g);
  OpNode& named(std::string name);  // the node name errors quote ("n0" unless set)
};
OpNode op(std::string op_type, int opset, std::string domain = "");

// ---- shape inference ----

// An input of infer_node: dtype and (symbolic) shape, and what is known of its elements at build
// time. A default-constructed one (kOmitted) is an omitted optional input.
struct NodeInput {
  DType dtype = DType::kUndefined;
  std::vector<ir::Dim> shape;
  std::optional<Tensor> constant;             // an initializer's data
  std::optional<std::vector<ir::Dim>> value;  // a shape tensor's elements as symbolic dims
};
inline const NodeInput kOmitted{};
NodeInput typed(DType dtype, std::vector<ir::Dim> shape);
inline NodeInput f32(std::vector<ir::Dim> shape) {
  return typed(DType::kFloat32, std::move(shape));
}
NodeInput with_value(DType dtype, std::vector<ir::Dim> shape, std::vector<ir::Dim> value);
NodeInput constant(Tensor t);
NodeInput const_ints(std::vector<int64_t> v);  // int64, 1-D
NodeInput const_scalar(int64_t v);             // int64, rank 0

// What the op's schema inferred for the node, or why it refused it.
struct Inferred {
  Status status;
  std::vector<ops::InferContext::Output> outputs;
  std::vector<ops::Constraint> constraints;          // recorded for the profile checker
  std::vector<ir::DataDependentDim> data_dependent;  // dims only the data decides (NonZero's count)

  bool ok() const { return status.ok(); }
  StatusCode code() const { return status.code(); }
  const std::vector<ir::Dim>& dims(size_t i = 0) const { return outputs.at(i).shape; }
  std::string shape(size_t i = 0) const { return ir::dims_to_string(dims(i)); }  // "[b, 16, 2*h]"
  DType dtype(size_t i = 0) const { return outputs.at(i).dtype; }
  std::string value(size_t i = 0) const;  // the symbolic value, "[s, 3]", or "unknown"
};
Inferred infer_node(const OpNode& node, const std::vector<NodeInput>& inputs, int num_outputs = 1);

// ---- kernel cases ----

// An input of a kernel case. A tensor converts to an engine input (data known only at run time);
// initializer() makes it a constant of the graph; shape_of() gives an int64 1-D tensor holding
// `dims` that the engine computes with Shape of a runtime tensor whose dims range over a profile,
// so the consumer sees symbolic values (Range, ConstantOfShape run only then); an empty Tensor()
// or kNoInput omits an optional input.
struct CaseInput {
  enum class Kind { kOmitted, kRuntime, kInitializer, kShapeOf };
  Kind kind = Kind::kOmitted;
  Tensor tensor;

  CaseInput() = default;
  CaseInput(Tensor t) : kind(t.empty() ? Kind::kOmitted : Kind::kRuntime), tensor(std::move(t)) {}
};
inline const CaseInput kNoInput{};
CaseInput initializer(Tensor t);
CaseInput shape_of(Shape dims);

// What the engines are built with; the tolerance follows what each node then computed in
// (op_tolerance in test_util.h), so a device that keeps FP32 is held to FP32.
enum class BuildPrecision { kFp32, kTf32, kFp16, kBf16 };
const char* build_precision_name(BuildPrecision p);

struct KernelCase {
  OpNode node;
  std::vector<CaseInput> inputs;
  int num_outputs = 1;
  // When given, the reference must match these (op_tolerance of their dtype, strict FP32).
  std::vector<Tensor> expected;
  BuildPrecision precision = BuildPrecision::kFp32;  // strict: TF32 cleared
  // A device present that refuses the node fails the case instead of skipping it.
  bool expect_support = false;
  std::string label;  // names the case in messages
  // Where the implementation `tactics_of`, or one of `tactics_over` (others the builder may weigh
  // faster, select_kernels), ran the node: the engine again with `tactics_of` and each of these
  // tactics forced on the node (whatever the builder's timing chose), each checked as the first.
  std::string tactics_of;
  std::vector<std::string> tactics;
  std::vector<std::string> tactics_over;
};

// Runs the CPU reference (output types and shapes from the op's schema), then, for every device
// built and present, a one-node engine through the public API (Builder, profile, run) compared
// with the reference. A device whose build refuses the node (kUnsupported) prints
// "[ skipped ] <device>: <why>" and does not fail. Mismatches are test failures. Returns the
// reference outputs, or the reference's (or shape inference's) error, in which case no device
// runs: error cases check the reference alone.
StatusOr<std::vector<Tensor>> run_case(const KernelCase& c);
StatusOr<std::vector<Tensor>> run_case(const OpNode& node, std::vector<CaseInput> inputs,
                                       int num_outputs = 1);

// A float16/bfloat16 case, as the precision pass leaves a layer: `c` with its float32 inputs
// rounded to dt (those in keep_float32 stay float32; other dtypes are left as they are), run as
// run_case does, after the float32 node on the same rounded values. The reference's outputs must
// match the float32 node's (rounded to dt where the reduced node's output is dt) within dt's
// tolerance, so the reduced reference cannot drift from the float32 one. Returns the reduced
// case's reference outputs.
StatusOr<std::vector<Tensor>> run_reduced_case(const KernelCase& c, DType dt,
                                               std::set<size_t> keep_float32 = {});

// ---- coverage ----

// Per op: cases whose reference ran, and per device what its cases did. `with_kernel` counts
// cases that passed with a kernel of that device running the node; `without_kernel` those that
// passed with nothing to run (the builder computed the output: a folded constant or shape
// arithmetic such as Shape and Size).
struct DeviceCoverage {
  int with_kernel = 0, without_kernel = 0, skipped = 0, failed = 0;
  std::set<std::string> impls;  // implementation ids that ran
  std::string why_not;          // the first skip or failure reason
};
struct OpCoverage {
  int cases = 0;
  std::map<Device, DeviceCoverage> devices;
};
using CoverageMap = std::map<ops::OpKind, OpCoverage>;
// What run_case recorded in this process.
const CoverageMap& recorded_coverage();
// Text form, so that a child process can hand its record to the coverage test.
std::string coverage_to_text(const CoverageMap& m);
StatusOr<CoverageMap> coverage_from_text(const std::string& text);

}  // namespace kiln::testing

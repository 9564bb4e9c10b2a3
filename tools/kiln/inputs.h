// Input tensors for kiln run, bench and compare: shapes from --shapes (else the profile's opt
// shapes, as trtexec does), data from --loadInputs (else seeded random values); and the one-line
// value summaries the CLI prints for tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "flags.h"
#include "kiln.h"

namespace kiln::cli {

// --shapes, --loadInputs, --seed, --useProfile: the flags every command that runs an engine takes.
struct InputOptions {
  std::vector<ShapeSpec> shapes;
  std::vector<std::pair<std::string, std::string>> files;  // (input name, path)
  uint64_t seed = 1;
  int profile = -1;  // --useProfile; -1: the profile the shapes choose
};
Result<InputOptions> parse_input_options(const Args& args);

struct PreparedInputs {
  int profile = 0;
  bool profile_chosen = false;  // chosen by the shapes (nearest opt), not by --profile
  std::map<std::string, Tensor> tensors;
  std::vector<std::string> order;  // engine input order
  // Where each input came from: "from x.npy", "random values (seed 1), opt shape of profile 0".
  std::map<std::string, std::string> from;
};

// Picks the profile, sets every input shape on `ctx` (so a shape outside the profile fails here,
// as a usage error naming the input, dim and range) and fills the tensors. Random values: floats
// uniform in [-1, 1), integers in [0, 100), bools 0/1; input i uses seed + i.
Result<PreparedInputs> prepare_inputs(const Engine& engine, ExecutionContext& ctx,
                                      const InputOptions& options);

StatusOr<Tensor> random_tensor(DType dtype, const Shape& shape, uint64_t seed);
// An input of this shape and dtype fits in the machine's physical memory; the error names the
// input, its shape and the bytes it needs.
Status fits_in_memory(const std::string& name, DType dtype, const Shape& shape);
// A shape-value input's tensor holding `values` (its dtype and static shape), and the one value a
// non-integer shape-value input was built for.
StatusOr<Tensor> shape_value_tensor(const Engine& engine, const std::string& name,
                                    const std::vector<int64_t>& values);
StatusOr<Tensor> fixed_shape_value(const Engine& engine, const std::string& name);

// "shape 4x1000 float32  min -2.9 max 3.0 mean 0.012 std 0.98  first [..]" plus argmax per row
// for (batch, classes) outputs and a count of NaN/Inf when there are any.
std::string tensor_summary(const Tensor& t);

// Whether an output looks like class scores: float, rank 2, more than one class.
bool looks_like_class_scores(const Tensor& t);

}  // namespace kiln::cli

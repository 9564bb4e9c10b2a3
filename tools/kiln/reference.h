// Reference outputs for kiln compare: ONNX Runtime (CPUExecutionProvider, FP32) through
// scripts/ort_reference.py, or, where onnxruntime cannot be imported, kiln's CPU kernels in FP32.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flags.h"
#include "kiln.h"

namespace kiln::cli {

struct Reference {
  std::string description;  // says what computed it and in which precision
  std::map<std::string, Tensor> outputs;
};

// nullopt (with `why` set) when python or onnxruntime is unavailable; an error when ORT ran and
// failed. KILN_PYTHON and KILN_ORT_REFERENCE override the interpreter and the script's path.
Result<std::optional<Reference>> ort_reference(const std::string& model,
                                               const std::vector<std::string>& order,
                                               const std::map<std::string, Tensor>& inputs,
                                               std::string* why);

// Builds a strict-FP32 CPU engine for exactly these input shapes and runs it.
Result<Reference> kiln_cpu_reference(const Network& network,
                                     const std::map<std::string, Tensor>& inputs);

}  // namespace kiln::cli

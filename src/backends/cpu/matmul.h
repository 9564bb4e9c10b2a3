// What kiln::MatMulBias's CPU kernel (kiln_ops.cc) takes from MatMul's (matmul.cc): the packing of
// a constant B once per engine, and the product that starts from its bias.
#pragma once

#include <memory>

#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

// A float32 constant B packed for sgemm_packed (input 1 of the node), or nothing to prepare.
StatusOr<std::shared_ptr<const PreparedNode>> prepare_matmul(const KernelQuery& q);

// Y = bias + MatMul(A, B) for float32 A, B, Y and a bias of Y's last dim n (numel n, its last dim
// n): Y's rows are filled with the bias and the GEMM accumulates onto them, so the bias costs no
// pass of its own (it replaces the zero fill). False, with nothing written, for any other operands
// (the caller adds the bias after MatMul's kernel). args: A and B in, Y out, MatMul's prepared B.
StatusOr<bool> matmul_onto_row_bias(const KernelArgs& args, const TensorView& bias);

}  // namespace kiln::backends::cpu

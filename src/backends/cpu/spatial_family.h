// Internal to the CPU backend: what the spatial family's two files share (spatial.cc registers
// the family and checks inputs; spectral.cc holds DFT, STFT and MelWeightMatrix).
#pragma once

#include <cstddef>

#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {

// Ok when the first `num_in` inputs and output 0 are present; else which is missing, under `op`.
Status check_present(const KernelArgs& a, size_t num_in, const char* op);

// DFT, STFT and MelWeightMatrix; called by register_spatial_kernels.
void register_spectral_kernels(KernelRegistry& r);

}  // namespace kiln::backends::cpu

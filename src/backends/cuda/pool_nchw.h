// MaxPool without Indices and AveragePool over 1-D and 2-D NCHW inputs in 32-bit arithmetic
// (pool_nchw.cu): the CUDA pools' (pool.cu) path for the pools of CNNs.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

// A pool over `planes` planes of [ih, iw] into [oh, ow] (a 1-D pool has ih = oh = kh = 1), with
// the pads resolved: (ph, pw) before, (peh, pew) after, the latter as ceil_mode and auto_pad make
// them (count_include_pad counts positions up to there).
struct Pool2dWindow {
  int64_t planes, ih, iw, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw, peh, pew;
  bool include_pad;
};

// Enqueues the max (is_max) or average pool of X into Y, both of dtype dt (float32, float16 or
// bfloat16), when every index and window coordinate fits 32 bits and dt is one of those; returns
// false, with nothing enqueued, otherwise.
bool pool2d_nchw(bool is_max, DType dt, const void* x, void* y, const Pool2dWindow& w,
                 cudaStream_t stream);

}  // namespace kiln::backends::cuda

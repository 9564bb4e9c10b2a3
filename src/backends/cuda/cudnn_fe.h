// What the users of the cuDNN frontend's graph API (conv_graph.cc, attention_sdpa.cc) share. Only
// those files have the frontend's headers on their include path (src/CMakeLists.txt).
#pragma once

#include <cudnn_frontend.h>

#include <string>

#include "backends/cuda/cuda_common.h"

namespace kiln::backends::cuda {

namespace fe = cudnn_frontend;

// kUnsupported naming `what` and the frontend's message where `e` is an error.
inline Status fe_status(const fe::error_t& e, const std::string& what) {
  if (e.is_good()) return ok_status();
  return unsupported(what + ": cuDNN frontend: " + e.err_msg);
}

}  // namespace kiln::backends::cuda

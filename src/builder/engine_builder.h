// kiln::Builder, the public builder: a parsed Network, a BuilderConfig and a device in, an Engine
// out. It sits above the runtime (TensorRT's IBuilder over its runtime), which never includes it.
#pragma once

#include "builder/config.h"
#include "core/device.h"
#include "core/status.h"
#include "frontend/onnx/parse.h"
#include "runtime/engine.h"

namespace kiln {

class Builder {
 public:
  explicit Builder(Device device = Device::kCPU) : device_(device) {}
  StatusOr<Engine> build(const Network& network, const BuilderConfig& config) const;
  // The build's first check alone: every node whose op kiln does not support (or whose arity is
  // wrong), listed in one error; ok when the whole model is supported. Needs no profile.
  Status check_supported(const Network& network) const;

 private:
  Device device_;
};

}  // namespace kiln

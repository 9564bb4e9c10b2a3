// kiln's public C++ API: parse an ONNX model, build an engine for optimization profiles, run it.
#pragma once

#include "builder/config.h"          // BuilderConfig, BuilderFlag, OptimizationProfile, TimingCache
#include "builder/engine_builder.h"  // Builder
#include "core/status.h"             // Status, StatusOr
#include "core/tensor.h"             // Tensor
#include "frontend/onnx/parse.h"     // kiln::onnx::parse_file, Network
#include "runtime/engine.h"          // Engine, ExecutionContext (alone: kiln_runtime.h)

// kiln's public C++ API: parse an ONNX model, build an engine for optimization profiles, run it.
#pragma once

#include "builder/config.h"       // BuilderConfig, BuilderFlag, OptimizationProfile, TimingCache
#include "core/status.h"          // Status, StatusOr
#include "core/tensor.h"          // Tensor
#include "frontend/onnx/parse.h"  // kiln::onnx::parse_file, Network
#include "runtime/engine.h"       // Builder, Engine, ExecutionContext

// The attributes of the recurrent ops RNN, GRU and LSTM, parsed once for the schema (shape
// inference) and the CPU kernel: direction, hidden_size, layout, clip, the per-direction
// activation functions with their alpha/beta, GRU's linear_before_reset and LSTM's input_forget.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "ops/schema.h"

namespace kiln::ops {

// The activation functions ONNX lists for the recurrent ops.
enum class RnnActivationKind {
  kRelu,
  kTanh,
  kSigmoid,
  kAffine,
  kLeakyRelu,
  kThresholdedRelu,
  kScaledTanh,
  kHardSigmoid,
  kElu,
  kSoftsign,
  kSoftplus,
};

struct RnnActivation {
  RnnActivationKind kind = RnnActivationKind::kTanh;
  double alpha = 0, beta = 0;

  double operator()(double x) const {
    switch (kind) {
      case RnnActivationKind::kRelu:
        return x > 0 ? x : 0;
      case RnnActivationKind::kTanh:
        return std::tanh(x);
      case RnnActivationKind::kSigmoid:
        return 1.0 / (1.0 + std::exp(-x));
      case RnnActivationKind::kAffine:
        return alpha * x + beta;
      case RnnActivationKind::kLeakyRelu:
        return x >= 0 ? x : alpha * x;
      case RnnActivationKind::kThresholdedRelu:
        return x >= alpha ? x : 0;  // the recurrent ops' text says >=
      case RnnActivationKind::kScaledTanh:
        return alpha * std::tanh(beta * x);
      case RnnActivationKind::kHardSigmoid:
        return std::fmin(std::fmax(alpha * x + beta, 0.0), 1.0);
      case RnnActivationKind::kElu:
        return x >= 0 ? x : alpha * (std::exp(x) - 1);
      case RnnActivationKind::kSoftsign:
        return x / (1 + std::fabs(x));
      case RnnActivationKind::kSoftplus:
        return std::log1p(std::exp(-std::fabs(x))) + std::fmax(x, 0.0);
    }
    return x;
  }
};

struct RecurrentAttrs {
  int gates = 1;  // weight blocks per direction: RNN 1, GRU 3 (zrh), LSTM 4 (iofc)
  int activations_per_direction = 1;  // RNN f; GRU f, g; LSTM f, g, h
  int num_directions = 1;
  bool reverse = false;  // direction "reverse" (a bidirectional node's second direction is)
  std::optional<int64_t> hidden_size;  // the attribute; otherwise R's last dim
  int layout = 0;                      // 0: [seq, batch, ...]; 1: [batch, seq, ...]
  std::optional<double> clip;          // bound of the gates' pre-activations, when given
  bool linear_before_reset = false;    // GRU
  bool input_forget = false;           // LSTM
  // activations_per_direction entries per direction, forward's first.
  std::vector<RnnActivation> activations;

  const RnnActivation& activation(int direction, int i) const {
    return activations[size_t(direction * activations_per_direction + i)];
  }
};

// Parses and validates a RNN, GRU or LSTM node's attributes (`op` says which). Errors are
// kInvalidModel and name the attribute, without the node (callers add it).
StatusOr<RecurrentAttrs> parse_recurrent_attrs(OpKind op, const ir::Node& node);

}  // namespace kiln::ops

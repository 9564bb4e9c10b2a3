// Where a kiln::LoopEnd (ops/kiln_ops.cc) keeps each of its inputs and outputs:
//   (cond_out?, trips?, next_0..next_{k-1}, scan_0..scan_{q-1}, i, cond_in, v_0..v_{k-1})
//     -> (final_0..final_{k-1}, stacked_0..stacked_{q-1})
// k carried values, q scan outputs; i, cond_in and the v_j are its kiln::LoopBegin's outputs, in
// that order, which pairs the two (plan/loops.h).
#pragma once

#include <cstddef>
#include <optional>

namespace kiln::ops {

struct LoopEndLayout {
  size_t k = 0, q = 0;
  // The layout of a LoopEnd with these counts, or nullopt when no k and q give them.
  static std::optional<LoopEndLayout> of(size_t num_inputs, size_t num_outputs) {
    if (num_inputs < 4 + num_outputs) return std::nullopt;
    LoopEndLayout l;
    l.k = num_inputs - 4 - num_outputs;
    if (l.k > num_outputs) return std::nullopt;
    l.q = num_outputs - l.k;
    return l;
  }
  static constexpr size_t cond_out = 0, trips = 1;
  size_t next(size_t j) const { return 2 + j; }
  size_t scan(size_t j) const { return 2 + k + j; }
  size_t begin_outputs() const { return 2 + k + q; }  // i, then cond_in, then the carried values
  size_t carried(size_t j) const { return 4 + k + q + j; }
  size_t stacked(size_t j) const { return k + j; }  // an output index
};

}  // namespace kiln::ops

// The IR text form: what pass tests, bug reports and `kiln inspect` read and write. The printer
// (text_print.cc) and the parser (text_parse.cc) agree exactly: print(parse(print(g))) == print(g).
//
//   graph main(%x: float32[batch, 16], %ids: int64[batch, seq]) -> (%y: float32[batch, 8]) {
//     opset ai.onnx 17                           // graph.opsets, one line per domain
//     %w: float32[16, 8] = dense<...>            // data elided: TextParseOptions::elided gives it
//     %b: float32[8] = dense<[0.5, -1.0, ...]>   // small constants inline, flat, row-major
//     %z: float32[8] = dense<0.0>                // a splat: every element equal
//     %s: int64[2] = [batch, 16] = Shape(%x)  # shape_0     // `= [dims]`: the symbolic value
//     %y: float32[batch, 8] = kiln::MatMulBias(%x, %w, %b) {activation="relu"}  # fc_0
//     %p: float32[?], _ = Dropout(%y, _, _) {seed=3}  # drop   // `_`: an omitted input/output
//   }
//
// Types are dtype[dims] with symbolic dims in ir::Dim's syntax, or dtype[?] when the rank is not
// known. Names that are not plain ([A-Za-z0-9_.:/-]) are quoted: %"a b". `# name` is the node's
// name (optional when writing by hand: op_type + "_" + index). An op whose opset differs from its
// domain's import is written `Op@11`. Attributes: 3, 1.5 (a float always shows a '.' or an
// exponent), "s", [1, 2], [1.0], ["a"], ints[] / floats[] / strings[] / tensors[] / graphs[] when
// empty, dense<...> : int64[2] for a tensor, and a nested `graph name(...) -> (...) { ... }`.
// Only constants that something reads are printed; a folded node output prints as its node.
// `//` starts a comment (the printer writes none).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::ir {

struct TextPrintOptions {
  // Constants and tensor attributes with more elements are printed `dense<...>` unless all their
  // elements are equal (a splat). Negative: print every element.
  int64_t max_inline_elements = 16;
};

std::string to_text(const Graph& graph, const TextPrintOptions& options);

// Supplies the data of an elided `dense<...>`: `key` is the value's name for a constant, or
// "node_name/attr_name" ("node_name/attr_name[i]" inside a tensors list) for an attribute.
using ElidedTensorFn =
    std::function<StatusOr<Tensor>(std::string_view key, DType dtype, const Shape& shape)>;

struct TextParseOptions {
  // nullptr: an elided constant is an error naming it.
  ElidedTensorFn elided;
};

// Parses the text form. Errors are kInvalidArgument and start with "line L, column C: ". Checks
// that every value is defined once and every use names a defined value (a nested graph may use
// its enclosing graphs' values); node order is kept as written: call verify() or
// sort_topologically() for order. Node opsets come from the graph's `opset` lines (0 if absent).
StatusOr<Graph> parse_text(std::string_view text, const TextParseOptions& options = {});

// An ElidedTensorFn that returns the constants of `source` by value name (for round trips).
ElidedTensorFn elided_from(const Graph& source);

}  // namespace kiln::ir

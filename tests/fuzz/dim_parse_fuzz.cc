// libFuzzer target: bytes as a symbolic dim expression (ir::Dim::parse, the text of ONNX dim_params
// and of engine files' formulas). A parsed dim must print to text that parses back to itself, since
// engine files store formulas as text; it is then evaluated and bounded over a few symbol values.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "ir/dim.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kiln::ir::Dim;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<Dim> dim = Dim::parse(text);
  if (!dim) return 0;
  const std::string printed = dim->to_string();
  std::optional<Dim> again = Dim::parse(printed);
  if (!again || *again != *dim) __builtin_trap();
  std::set<std::string> symbols;
  dim->collect_symbols(&symbols);
  kiln::ir::SymbolValues values;
  kiln::ir::SymbolRanges ranges;
  // Values 1, 4, 13, ... start over once past 2^32, so a text of many symbols (40 passed int64
  // here) gets no overflow from the harness itself.
  int64_t v = 1;
  for (const std::string& s : symbols) {
    values[s] = v;
    ranges[s] = {1, v * 7};
    v = v < (int64_t(1) << 32) ? v * 3 + 1 : 1;
  }
  std::optional<int64_t> at = dim->eval(values);
  kiln::ir::Interval box = dim->bounds(ranges);
  // Bounds hold for every point in the ranges; the point evaluated is one of them.
  // kInf stands for unbounded, so a value past it is inside an open end.
  constexpr int64_t kInf = kiln::ir::Interval::kInf;
  if (at && ((box.lo > -kInf && *at < box.lo) || (box.hi<kInf&& * at> box.hi))) __builtin_trap();
  Dim simple = dim->simplify(ranges);
  std::optional<int64_t> simple_at = simple.eval(values);
  if (at && simple_at && *at != *simple_at) __builtin_trap();
  return 0;
}

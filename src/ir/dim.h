// Dim: a tensor dimension, either an int64 or an expression over named symbols
// (+, -, *, floor-div, ceil-div, mod, min, max) kept in a canonical simplified form.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::ir {

struct Atom;
using AtomPtr = std::shared_ptr<const Atom>;

// Values bound to symbols when a shape is resolved.
using SymbolValues = std::map<std::string, int64_t, std::less<>>;

// A closed integer interval; kInf stands for "unbounded" and saturates arithmetic.
struct Interval {
  static constexpr int64_t kInf = int64_t(1) << 62;
  int64_t lo = -kInf;
  int64_t hi = kInf;
  bool contains(int64_t v) const { return lo <= v && v <= hi; }
  bool is_point() const { return lo == hi; }
};
using SymbolRanges = std::map<std::string, Interval, std::less<>>;

class Dim {
 public:
  Dim(int64_t value = 0) : constant_(value) {}  // NOLINT: ints convert implicitly, as in shapes
  static Dim symbol(std::string name);
  // Parses exporter spellings: "batch", "4*h", "seq_len + 1", "8*s39", "floor(h/2)", "s0//2",
  // "Mod(a, 4)", "min(a, b)". nullopt when the text is not an expression.
  static std::optional<Dim> parse(std::string_view text);

  bool is_const() const { return terms_.empty(); }
  int64_t value() const { return constant_; }  // only meaningful when is_const()
  bool is_symbol() const;                      // exactly one symbol, coefficient 1, no constant
  // For c*s + k with a single symbol s (c != 0): returns true and fills the parts.
  bool as_linear(std::string* symbol, int64_t* coeff, int64_t* offset) const;

  friend Dim operator+(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a, const Dim& b);
  friend Dim operator*(const Dim& a, const Dim& b);
  Dim operator-() const;
  // The sum of every part, n log n in their monomials (adding them one by one moves n^2).
  static Dim sum(const std::vector<Dim>& parts);
  static Dim floor_div(const Dim& a, const Dim& b);
  static Dim ceil_div(const Dim& a, const Dim& b);
  static Dim mod(const Dim& a, const Dim& b);
  static Dim min(const Dim& a, const Dim& b);
  static Dim max(const Dim& a, const Dim& b);

  friend bool operator==(const Dim& a, const Dim& b);
  friend bool operator!=(const Dim& a, const Dim& b) { return !(a == b); }

  // nullopt when a symbol is unbound, on division by zero, or on overflow.
  std::optional<int64_t> eval(const SymbolValues& values) const;
  Interval bounds(const SymbolRanges& ranges) const;
  // Rewrites min, max, floor-div and mod wherever the symbol ranges decide them:
  // min(1, seq_len) is 1 when seq_len >= 1. Exact for every point inside the ranges.
  Dim simplify(const SymbolRanges& ranges) const;
  void collect_symbols(std::set<std::string>* out) const;
  std::string to_string() const;

 private:
  struct Term {
    int64_t coeff;
    std::vector<AtomPtr> factors;  // sorted by key
    std::string key;
  };
  static Dim from_atom(AtomPtr atom);
  static Dim simplify_atom(const AtomPtr& atom, const SymbolRanges& ranges);
  static Dim wrap_floor_div(const Dim& a, const Dim& b, bool ceil);
  static Dim min_max(const Dim& a, const Dim& b, bool is_max);
  void add_term(Term t);
  // Replaces the terms with these, sorted by key, equal keys added, zero coefficients dropped.
  void set_terms(std::vector<Term> terms);
  int64_t content_gcd() const;  // gcd of all coefficients and the constant (0 for zero)

  int64_t constant_ = 0;
  std::vector<Term> terms_;  // sorted by key, coefficients nonzero
  friend struct Atom;
};

enum class AtomKind { kSymbol, kFloorDiv, kMod, kMin, kMax };

struct Atom {
  AtomKind kind;
  std::string name;  // for kSymbol
  Dim a, b;
  std::string key;  // canonical printed form, used for ordering and equality
};

std::string dims_to_string(const std::vector<Dim>& dims);

// A dim only tensor data decides (NonZero's count, the boxes NonMaxSuppression keeps): a symbol
// the runtime binds once the node that makes it has run, between 0 and `bound`, a formula over the
// input symbols (and earlier data-dependent ones) that the arena is sized by.
// `lower`, where the node's inputs prove one (a resize's sizes computed from the input's shape),
// is a formula it is at least: the profile proof takes the dim from there, and the run refuses a
// smaller size.
struct DataDependentDim {
  std::string symbol;
  Dim bound;
  Dim lower = 0;
};
// The range a profile gives data-dependent dim `dd` (its symbols in `ranges`): from its lower
// bound's least value (at least 0) to its bound's greatest (an empty bound gives [0, 0]).
Interval data_dependent_range(const DataDependentDim& dd, const SymbolRanges& ranges);
// Whether any of `dims` names one of the data-dependent dims `dd`.
bool names_data_dependent(const std::vector<Dim>& dims, const std::vector<DataDependentDim>& dd);

}  // namespace kiln::ir

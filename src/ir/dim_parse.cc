// Parser for symbolic dimension text: ONNX dim_param strings as exporters write them, and the
// printed form of Dim itself (so engine files round-trip through text).
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "ir/dim.h"

namespace kiln::ir {
namespace {

// The longest text parsed; a Dim whose printed form is longer cannot read back.
constexpr size_t kMaxTextBytes = size_t(1) << 20;
// The most monomials a product may make: Dim keeps them in a sorted vector, so building one of n
// costs n^2 (exporters write a handful).
constexpr size_t kMaxProductTerms = 4096;

class Parser {
 public:
  // pieces(d): d's monomials, its constant counted as one when nonzero.
  Parser(std::string_view s, size_t (*pieces)(const Dim&)) : s_(s), pieces_(pieces) {}

  std::optional<Dim> parse_all() {
    auto d = expr();
    skip();
    if (!d || pos_ != s_.size()) return std::nullopt;
    return d;
  }

 private:
  // A parsed operand remembers whether it was a bare division, so ceil(a/b) becomes a ceil-div.
  struct Operand {
    Dim value;
    bool is_div = false;
    Dim num, den;
  };

  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(std::string_view tok) {
    skip();
    if (s_.substr(pos_, tok.size()) == tok) {
      pos_ += tok.size();
      return true;
    }
    return false;
  }

  std::optional<Dim> expr() {
    auto o = sum();
    if (!o) return std::nullopt;
    return o->value;
  }

  // The summands are added at once: a printed Dim of thousands of monomials reads back in
  // n log n, where adding them one by one moved n^2 terms (seconds under ASan).
  std::optional<Operand> sum() {
    auto first = product();
    if (!first) return std::nullopt;
    std::vector<Dim> parts;
    while (true) {
      const bool plus = eat("+");
      if (!plus && !eat("-")) break;
      auto rhs = product();
      if (!rhs) return std::nullopt;
      if (parts.empty()) parts.push_back(first->value);
      parts.push_back(plus ? rhs->value : -rhs->value);
    }
    if (parts.empty()) return first;
    return Operand{Dim::sum(parts)};
  }

  std::optional<Operand> product() {
    auto lhs = unary();
    if (!lhs) return std::nullopt;
    while (true) {
      if (eat("*")) {
        auto rhs = unary();
        if (!rhs || !fits_product(lhs->value, rhs->value)) return std::nullopt;
        lhs = Operand{lhs->value * rhs->value};
      } else if (eat("//") || eat("/")) {
        auto rhs = unary();
        if (!rhs) return std::nullopt;
        lhs = Operand{Dim::floor_div(lhs->value, rhs->value), true, lhs->value, rhs->value};
      } else if (eat("%")) {
        auto rhs = unary();
        if (!rhs) return std::nullopt;
        lhs = Operand{Dim::mod(lhs->value, rhs->value)};
      } else {
        return lhs;
      }
    }
  }

  // A product of sums distributes, every monomial of one times every monomial of the other, so a
  // chain of them grows exponentially: 30 binomials are 2^30 terms, and fuzzed text of a dozen
  // took seconds and printed past what the parser reads back. A product whose printed form would
  // pass kMaxTextBytes, or that makes more than kMaxProductTerms monomials, is refused; a
  // constant factor only scales, and a monomial times a monomial grows by the text it was written
  // with.
  bool fits_product(const Dim& a, const Dim& b) const {
    if (a.is_const() || b.is_const()) return true;
    const size_t pa = pieces_(a), pb = pieces_(b);
    if (pa <= 1 && pb <= 1) return true;
    if (pa * pb > kMaxProductTerms) return false;
    return pa * b.to_string().size() + pb * a.to_string().size() <= kMaxTextBytes;
  }

  std::optional<Operand> unary() {
    if (eat("-")) {
      auto o = unary();
      if (!o) return std::nullopt;
      return Operand{-o->value};
    }
    return primary();
  }

  std::optional<Operand> primary() {
    skip();
    if (pos_ >= s_.size()) return std::nullopt;
    char c = s_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      // Up to 2^63, the magnitude Dim::to_string prints for INT64_MIN: Dim arithmetic wraps, so
      // every constant it can hold must read back (engine files store formulas as text).
      constexpr uint64_t kMaxLiteral = uint64_t(1) << 63;
      uint64_t v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        const uint64_t digit = uint64_t(s_[pos_++] - '0');
        if (v > (kMaxLiteral - digit) / 10) return std::nullopt;  // beyond 2^63
        v = v * 10 + digit;
      }
      return Operand{Dim(int64_t(v))};
    }
    if (c == '(') {
      ++pos_;
      auto o = sum();
      if (!o || !eat(")")) return std::nullopt;
      return o;
    }
    if (!(std::isalpha(static_cast<unsigned char>(c)) || c == '_')) return std::nullopt;
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '_' || s_[pos_] == '.')) {
      ++pos_;
    }
    std::string name(s_.substr(start, pos_ - start));
    size_t save = pos_;
    if (!eat("(")) return Operand{Dim::symbol(name)};
    std::string fn;
    for (char ch : name) fn += char(std::tolower(static_cast<unsigned char>(ch)));
    auto first = sum();
    if (!first) return std::nullopt;
    if (fn == "floor" || fn == "floortoint" || fn == "ceil" || fn == "ceiling" ||
        fn == "ceiltoint") {
      if (!eat(")")) return std::nullopt;
      bool ceil = fn[0] == 'c';
      if (ceil && first->is_div) return Operand{Dim::ceil_div(first->num, first->den)};
      return Operand{first->value};
    }
    if (fn == "mod" || fn == "min" || fn == "max") {
      if (!eat(",")) return std::nullopt;
      auto second = sum();
      if (!second || !eat(")")) return std::nullopt;
      if (fn == "mod") return Operand{Dim::mod(first->value, second->value)};
      if (fn == "min") return Operand{Dim::min(first->value, second->value)};
      return Operand{Dim::max(first->value, second->value)};
    }
    pos_ = save;
    return std::nullopt;
  }

  std::string_view s_;
  size_t (*pieces_)(const Dim&);
  size_t pos_ = 0;
};

}  // namespace

std::optional<Dim> Dim::parse(std::string_view text) {
  // The parser recurses per parenthesis and per unary minus: bounding the nesting depth and the
  // runs of minus signs (not the length) keeps hostile text from exhausting a thread's stack,
  // while an arena slot's size over a large dynamic-H/W graph (a max over every value the slot
  // holds, each with nested floors) still reads back.
  if (text.size() > kMaxTextBytes) return std::nullopt;
  int depth = 0, run = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == '-') {
      ++run;
    } else if (c != ' ') {
      run = 0;
    }
    if (depth > 1024 || run > 16) return std::nullopt;
  }
  // A lambda in a member of Dim may read its representation; the parser gets only this count.
  auto pieces = [](const Dim& d) -> size_t { return d.terms_.size() + (d.constant_ != 0 ? 1 : 0); };
  return Parser(text, pieces).parse_all();
}

}  // namespace kiln::ir

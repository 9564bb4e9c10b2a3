// Parser for symbolic dimension text: ONNX dim_param strings as exporters write them, and the
// printed form of Dim itself (so engine files round-trip through text).
#include <cctype>
#include <optional>
#include <string>

#include "ir/dim.h"

namespace kiln::ir {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

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

  std::optional<Operand> sum() {
    auto lhs = product();
    if (!lhs) return std::nullopt;
    while (true) {
      if (eat("+")) {
        auto rhs = product();
        if (!rhs) return std::nullopt;
        lhs = Operand{lhs->value + rhs->value};
      } else if (eat("-")) {
        auto rhs = product();
        if (!rhs) return std::nullopt;
        lhs = Operand{lhs->value - rhs->value};
      } else {
        return lhs;
      }
    }
  }

  std::optional<Operand> product() {
    auto lhs = unary();
    if (!lhs) return std::nullopt;
    while (true) {
      if (eat("*")) {
        auto rhs = unary();
        if (!rhs) return std::nullopt;
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
    while (pos_ < s_.size() &&
           (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' || s_[pos_] == '.')) {
      ++pos_;
    }
    std::string name(s_.substr(start, pos_ - start));
    size_t save = pos_;
    if (!eat("(")) return Operand{Dim::symbol(name)};
    std::string fn;
    for (char ch : name) fn += char(std::tolower(static_cast<unsigned char>(ch)));
    auto first = sum();
    if (!first) return std::nullopt;
    if (fn == "floor" || fn == "floortoint" || fn == "ceil" || fn == "ceiling" || fn == "ceiltoint") {
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
  size_t pos_ = 0;
};

}  // namespace

std::optional<Dim> Dim::parse(std::string_view text) {
  // The parser recurses per parenthesis and per unary minus: bounding the nesting depth and the
  // runs of minus signs (not the length) keeps hostile text from exhausting a thread's stack,
  // while an arena slot's size over a large dynamic-H/W graph (a max over every value the slot
  // holds, each with nested floors) still reads back.
  if (text.size() > (size_t(1) << 20)) return std::nullopt;
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
  return Parser(text).parse_all();
}

}  // namespace kiln::ir

// The tokens of the IR text form, for its parser (text_parse.cc): positions and errors that name
// the line and column, names (bare or quoted), keywords, numbers, and tensor elements by dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln::ir::text {

// An element of a dense<...> literal, kept as text until the dtype is known.
struct Element {
  std::string text;
  size_t pos;
};

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

 protected:
  // kInvalidArgument "line L, column C: message" for the byte offset `pos`.
  Status error(size_t pos, const std::string& message) const;
  // Skips whitespace and `//` comments.
  void skip();
  bool peek(char c);
  bool eat(std::string_view tok);
  Status expect(std::string_view tok);
  // ", found '<the next few characters>'", for error messages.
  std::string found() const;
  static bool is_ident_char(char c, bool allow_dot);
  // A bare word equal to `kw` (not the prefix of a longer word).
  bool keyword(std::string_view kw);
  // At a '"': the string with its escapes (\" \\ \n \t \xHH) decoded.
  StatusOr<std::string> quoted();
  // A value, node or graph name: bare (is_name_char; ':' only inside) or quoted.
  StatusOr<std::string> name(const char* what);
  // An op type, domain or attribute name: [A-Za-z0-9_] (and '.' for domains) or quoted.
  StatusOr<std::string> ident(const char* what, bool allow_dot);
  // A number or nan/inf token, as text; empty when there is none.
  std::string number_token();
  static bool looks_float(std::string_view t);
  StatusOr<int64_t> parse_int(const std::string& t, size_t pos) const;
  // float or double; accepts nan, inf and -inf.
  template <typename F>
  StatusOr<F> parse_float(const std::string& t, size_t pos) const;
  // Converts e to t's dtype and stores it at element i; range errors name the element.
  Status store(const Tensor& t, int64_t i, const Element& e) const;

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace kiln::ir::text

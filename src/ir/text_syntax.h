// Lexical rules the IR text printer and parser share: which names print bare, dtype spellings,
// and the float and tensor-element spellings that round-trip exactly.
#pragma once

#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace kiln::ir::text {

inline bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '/' || c == '-';
}

// A name prints bare when every character is a name character and it does not end in ':' (so
// "%x: float32[]" stays unambiguous); otherwise quoted with C escapes.
inline bool is_bare_name(std::string_view s) {
  if (s.empty() || s.back() == ':') return false;
  for (char c : s) {
    if (!is_name_char(c)) return false;
  }
  return true;
}

inline std::string quote(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string name_text(std::string_view s) {
  return is_bare_name(s) ? std::string(s) : quote(s);
}

inline std::optional<DType> dtype_from_name(std::string_view name) {
#define KILN_DTYPE_FROM_NAME(e, code, str, size) \
  if (name == str) return DType::e;
  KILN_DTYPES(KILN_DTYPE_FROM_NAME)
#undef KILN_DTYPE_FROM_NAME
  if (name == "undefined") return DType::kUndefined;
  return std::nullopt;
}

// The shortest spelling that reads back to the same float (or double), always with a '.' or an
// exponent so that it cannot be mistaken for an integer. NaN's sign and payload are not kept.
inline std::string format_float(double v, bool is_double) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = is_double ? std::to_chars(buf, buf + sizeof(buf), v)
                     : std::to_chars(buf, buf + sizeof(buf), float(v));
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace kiln::ir::text

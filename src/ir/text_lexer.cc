// The IR text lexer (ir/text_lexer.h).
#include "ir/text_lexer.h"

#include <charconv>
#include <limits>

#include "ir/text_syntax.h"

namespace kiln::ir::text {

Status Lexer::error(size_t pos, const std::string& message) const {
  int line = 1, col = 1;
  for (size_t i = 0; i < pos && i < s_.size(); ++i) {
    if (s_[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return invalid_argument("line " + std::to_string(line) + ", column " + std::to_string(col) +
                          ": " + message);
}

void Lexer::skip() {
  while (pos_ < s_.size()) {
    char c = s_[pos_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++pos_;
    } else if (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/') {
      while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
    } else {
      break;
    }
  }
}
bool Lexer::peek(char c) {
  skip();
  return pos_ < s_.size() && s_[pos_] == c;
}
bool Lexer::eat(std::string_view tok) {
  skip();
  if (s_.substr(pos_, tok.size()) != tok) return false;
  pos_ += tok.size();
  return true;
}
Status Lexer::expect(std::string_view tok) {
  if (eat(tok)) return ok_status();
  return error(pos_, "expected '" + std::string(tok) + "'" + found());
}
std::string Lexer::found() const {
  if (pos_ >= s_.size()) return ", found the end of the text";
  size_t end = pos_;
  while (end < s_.size() && end - pos_ < 16 && s_[end] != '\n') ++end;
  return ", found '" + std::string(s_.substr(pos_, end - pos_)) + "'";
}
bool Lexer::is_ident_char(char c, bool allow_dot) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         (allow_dot && c == '.');
}
bool Lexer::keyword(std::string_view kw) {
  skip();
  if (s_.substr(pos_, kw.size()) != kw) return false;
  size_t end = pos_ + kw.size();
  if (end < s_.size() && is_ident_char(s_[end], true)) return false;
  pos_ = end;
  return true;
}

StatusOr<std::string> Lexer::quoted() {
  size_t start = pos_;
  ++pos_;  // the opening quote
  std::string out;
  while (pos_ < s_.size() && s_[pos_] != '"') {
    char c = s_[pos_++];
    if (c == '\n') return error(start, "unterminated string");
    if (c != '\\') {
      out += c;
      continue;
    }
    if (pos_ >= s_.size()) break;
    char e = s_[pos_++];
    if (e == 'n') {
      out += '\n';
    } else if (e == 't') {
      out += '\t';
    } else if (e == 'x' && pos_ + 2 <= s_.size()) {
      int v = 0;
      auto r = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 2, v, 16);
      if (r.ptr != s_.data() + pos_ + 2) return error(pos_ - 2, "bad \\x escape");
      out += char(v);
      pos_ += 2;
    } else if (e == '"' || e == '\\') {
      out += e;
    } else {
      return error(pos_ - 2, std::string("unknown escape '\\") + e + "'");
    }
  }
  if (pos_ >= s_.size()) return error(start, "unterminated string");
  ++pos_;
  return out;
}

StatusOr<std::string> Lexer::name(const char* what) {
  skip();
  if (peek('"')) return quoted();
  size_t start = pos_;
  while (pos_ < s_.size() && is_name_char(s_[pos_])) {
    if (s_[pos_] == ':' && !(pos_ + 1 < s_.size() && is_name_char(s_[pos_ + 1]))) break;
    ++pos_;
  }
  if (pos_ == start) return error(pos_, std::string("expected ") + what + found());
  return std::string(s_.substr(start, pos_ - start));
}

StatusOr<std::string> Lexer::ident(const char* what, bool allow_dot) {
  skip();
  if (peek('"')) return quoted();
  size_t start = pos_;
  while (pos_ < s_.size() && is_ident_char(s_[pos_], allow_dot)) ++pos_;
  if (pos_ == start) return error(pos_, std::string("expected ") + what + found());
  return std::string(s_.substr(start, pos_ - start));
}

std::string Lexer::number_token() {
  skip();
  size_t start = pos_;
  while (pos_ < s_.size()) {
    char c = s_[pos_];
    bool exp_sign =
        (c == '+' || c == '-') && pos_ > start && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E');
    if (!(is_ident_char(c, true) || exp_sign || (pos_ == start && (c == '-' || c == '+')))) break;
    ++pos_;
  }
  return std::string(s_.substr(start, pos_ - start));
}

bool Lexer::looks_float(std::string_view t) {
  return t.find_first_of(".eE") != std::string_view::npos ||
         t.find("nan") != std::string_view::npos || t.find("inf") != std::string_view::npos;
}

StatusOr<int64_t> Lexer::parse_int(const std::string& t, size_t pos) const {
  int64_t v = 0;
  std::string_view sv = t;
  if (!sv.empty() && sv[0] == '+') sv.remove_prefix(1);
  auto r = std::from_chars(sv.data(), sv.data() + sv.size(), v);
  if (r.ec != std::errc() || r.ptr != sv.data() + sv.size()) {
    return error(pos, "'" + t + "' is not an integer");
  }
  return v;
}

template <typename F>
StatusOr<F> Lexer::parse_float(const std::string& t, size_t pos) const {
  std::string_view sv = t;
  bool neg = false;
  if (!sv.empty() && (sv[0] == '-' || sv[0] == '+')) {
    neg = sv[0] == '-';
    sv.remove_prefix(1);
  }
  F v = 0;
  if (sv == "nan") {
    v = std::numeric_limits<F>::quiet_NaN();
  } else if (sv == "inf") {
    v = std::numeric_limits<F>::infinity();
  } else {
    auto r = std::from_chars(sv.data(), sv.data() + sv.size(), v);
    if (r.ec == std::errc::result_out_of_range) return error(pos, "'" + t + "' is out of range");
    if (r.ec != std::errc() || r.ptr != sv.data() + sv.size()) {
      return error(pos, "'" + t + "' is not a number");
    }
  }
  return neg ? -v : v;
}

Status Lexer::store(const Tensor& t, int64_t i, const Element& e) const {
  void* p = t.data();
  switch (t.dtype()) {
    case DType::kFloat32: {
      KILN_ASSIGN_OR_RETURN(float f, parse_float<float>(e.text, e.pos));
      static_cast<float*>(p)[i] = f;
      return ok_status();
    }
    case DType::kFloat64: {
      KILN_ASSIGN_OR_RETURN(double f, parse_float<double>(e.text, e.pos));
      static_cast<double*>(p)[i] = f;
      return ok_status();
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      KILN_ASSIGN_OR_RETURN(float f, parse_float<float>(e.text, e.pos));
      static_cast<uint16_t*>(p)[i] =
          t.dtype() == DType::kFloat16 ? float_to_half(f) : float_to_bf16(f);
      return ok_status();
    }
    case DType::kBool:
      if (e.text != "true" && e.text != "false" && e.text != "0" && e.text != "1") {
        return error(e.pos, "'" + e.text + "' is not a bool (true or false)");
      }
      static_cast<uint8_t*>(p)[i] = e.text == "true" || e.text == "1";
      return ok_status();
    case DType::kUInt64: {
      uint64_t v = 0;
      auto r = std::from_chars(e.text.data(), e.text.data() + e.text.size(), v);
      if (r.ec != std::errc() || r.ptr != e.text.data() + e.text.size()) {
        return error(e.pos, "'" + e.text + "' is not a uint64");
      }
      static_cast<uint64_t*>(p)[i] = v;
      return ok_status();
    }
    default:
      break;
  }
  KILN_ASSIGN_OR_RETURN(int64_t v, parse_int(e.text, e.pos));
  auto put = [&]<typename T>(T*) -> Status {
    if (v < int64_t(std::numeric_limits<T>::min()) ||
        (v > 0 && uint64_t(v) > uint64_t(std::numeric_limits<T>::max()))) {
      return error(e.pos, e.text + " is out of range for " + std::string(dtype_name(t.dtype())));
    }
    static_cast<T*>(p)[i] = T(v);
    return ok_status();
  };
  switch (t.dtype()) {
    case DType::kInt64:
      return put(static_cast<int64_t*>(nullptr));
    case DType::kInt32:
      return put(static_cast<int32_t*>(nullptr));
    case DType::kInt16:
      return put(static_cast<int16_t*>(nullptr));
    case DType::kInt8:
      return put(static_cast<int8_t*>(nullptr));
    case DType::kUInt32:
      return put(static_cast<uint32_t*>(nullptr));
    case DType::kUInt16:
      return put(static_cast<uint16_t*>(nullptr));
    case DType::kUInt8:
      return put(static_cast<uint8_t*>(nullptr));
    default:
      return error(e.pos,
                   "tensors of dtype " + std::string(dtype_name(t.dtype())) + " have no text form");
  }
}

template StatusOr<float> Lexer::parse_float<float>(const std::string&, size_t) const;
template StatusOr<double> Lexer::parse_float<double>(const std::string&, size_t) const;

}  // namespace kiln::ir::text

// Flag and shape-spec parsing for the kiln CLI. Every malformed input is a usage error that quotes
// what was typed and says what was expected.
#include "flags.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "core/checked.h"

namespace kiln::cli {
namespace {

// Case-insensitive edit distance, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                  std::tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const FlagDef* find_flag(const CommandSpec& spec, std::string_view name) {
  for (const FlagDef* f : spec.flags) {
    if (f->name == name) return f;
  }
  return nullptr;
}

std::string suggestion(const CommandSpec& spec, std::string_view name) {
  const FlagDef* best = nullptr;
  size_t best_d = 0;
  for (const FlagDef* f : spec.flags) {
    size_t d = edit_distance(name, f->name);
    if (!best || d < best_d) best = f, best_d = d;
  }
  if (best && best_d <= std::max<size_t>(2, name.size() / 3))
    return "; did you mean --" + std::string(best->name) + "?";
  return "";
}

// Words of `text` in lines of at most `width` columns, the lines after the first indented by
// `indent` (the first continues a line already `indent` wide).
std::string wrap(const std::string& text, size_t indent, size_t width) {
  std::string out;
  size_t col = indent, start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(start, end - start);
    if (col > indent && col + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      col = indent;
    } else if (col > indent) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    start = end + 1;
  }
  return out;
}

std::string see_help(const CommandSpec& spec) { return " (see: kiln " + spec.name + " --help)"; }

}  // namespace

std::vector<std::string> split_entries(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char c : text) {
    if (c == '\'') quoted = !quoted;
    if (c == ',' && !quoted) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

namespace {

// Splits "name:rest" at the last ':' outside quotes; strips quotes around the name.
Result<std::pair<std::string, std::string>> split_name(std::string_view flag,
                                                       const std::string& entry,
                                                       const std::string& expected) {
  size_t colon = std::string::npos;
  bool quoted = false;
  for (size_t i = 0; i < entry.size(); ++i) {
    if (entry[i] == '\'') quoted = !quoted;
    if (entry[i] == ':' && !quoted) colon = i;
  }
  if (quoted)
    return usage_error("--" + std::string(flag) + ": unbalanced quote in '" + entry + "'");
  if (colon == std::string::npos) {
    return usage_error("--" + std::string(flag) + ": '" + entry + "' has no ':'; expected " +
                       expected);
  }
  std::string name = entry.substr(0, colon);
  if (name.size() >= 2 && name.front() == '\'' && name.back() == '\'')
    name = name.substr(1, name.size() - 2);
  if (name.empty()) {
    return usage_error("--" + std::string(flag) + ": '" + entry +
                       "' has no input name before ':'; expected " + expected);
  }
  return std::pair<std::string, std::string>{name, entry.substr(colon + 1)};
}

}  // namespace

std::string help_text(const CommandSpec& spec) {
  std::string s =
      "usage: kiln " + spec.name + " " + spec.synopsis + "\n\n" + spec.summary + "\n\nflags:\n";
  bool any_warns = false;
  for (const FlagDef* f : spec.flags) {
    std::string left =
        "  --" + std::string(f->name) + (f->value.empty() ? "" : "=" + std::string(f->value));
    if (left.size() < 30)
      left.resize(30, ' ');
    else
      left += "\n" + std::string(30, ' ');
    bool warns = f->status == FlagStatus::kWarns;
    any_warns |= warns;
    s += left + wrap((warns ? "(warns) " : "") + std::string(f->text), 30, 100) + "\n";
  }
  s += "  -h, --help                  this text\n";
  if (any_warns) {
    s += "\n(warns): accepted for trtexec's sake, with a warning saying why it changes nothing.\n";
  }
  s += "kiln help-flags lists every trtexec flag and what kiln does with it.\n";
  s += "\nexit status: 0 ok, 1 failure";
  s += spec.name == "compare" ? " or outputs out of tolerance" : "";
  s += ", 2 bad command line (flag, value or shape), 3 internal error\n";
  return s;
}

namespace {

// Why a flag this command does not take is not taken: the table's refusal, the commands that do
// take it, or the nearest spelling.
std::string unknown_flag_message(const CommandSpec& spec, const std::string& name) {
  if (const FlagDef* def = find_flag_def(name, spec.id)) {
    return "--" + name + " is not supported: " + std::string(def->text);
  }
  uint32_t elsewhere = 0;
  for (const FlagDef& f : flag_table()) {
    if (f.name == name && f.status != FlagStatus::kRefused) elsewhere |= f.commands;
  }
  if (elsewhere) {
    return "--" + name + " is a flag of kiln " + command_names(elsewhere) + ", not of kiln " +
           spec.name + see_help(spec);
  }
  return "unknown flag --" + name + " for 'kiln " + spec.name + "'" + suggestion(spec, name) +
         see_help(spec);
}

// A switch given as "--x" reads as "--x=true", so "--x --x=true" is one value given twice.
std::string normalized(const Args::Flag& f) { return f.has_value ? f.value : "true"; }

}  // namespace

Result<Args> Args::parse(const CommandSpec& spec, const std::vector<std::string>& argv) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-h" || a == "--help" || a == "-help") {
      args.help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      if (a.size() > 1 && a[0] == '-') {
        return usage_error("unknown flag '" + a + "'; flags are spelled --name=value" +
                           see_help(spec));
      }
      if (spec.positional.empty() || !args.positional_.empty()) {
        return usage_error("unexpected argument '" + a + "'" + see_help(spec));
      }
      args.positional_.push_back(a);
      continue;
    }
    std::string body = a.substr(2);
    Flag f;
    size_t eq = body.find('=');
    f.name = body.substr(0, eq);
    if (eq != std::string::npos) {
      f.value = body.substr(eq + 1);
      f.has_value = true;
    }
    const FlagDef* fs = find_flag(spec, f.name);
    if (!fs) return usage_error(unknown_flag_message(spec, f.name));
    if (!fs->value.empty() && !f.has_value) {
      // "--atol 1e-3", polygraphy's spelling, next to trtexec's "--atol=1e-3".
      if (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) {
        f.value = argv[++i];
        f.has_value = true;
      } else {
        return usage_error("--" + f.name + " needs a value: --" + f.name + "=" +
                           std::string(fs->value) + see_help(spec));
      }
    }
    if (!fs->value.empty() && f.value.empty()) {
      return usage_error("--" + f.name + " has an empty value; expected --" + f.name + "=" +
                         std::string(fs->value));
    }
    args.flags_.push_back(std::move(f));
  }
  if (args.help_) return args;

  // A single-valued flag given twice: the same value is harmless, different values are ambiguous.
  std::vector<std::string> warnings;
  for (const FlagDef* def : spec.flags) {
    if (def->traits & kRepeatable) continue;
    std::vector<const Flag*> given;
    for (const Flag& f : args.flags_) {
      if (f.name == def->name) given.push_back(&f);
    }
    if (given.size() < 2) continue;
    for (const Flag* g : given) {
      if (normalized(*g) != normalized(*given[0])) {
        return usage_error("--" + g->name + " is given twice, as --" + g->name + "=" +
                           normalized(*given[0]) + " and --" + g->name + "=" + normalized(*g) +
                           "; give it once");
      }
    }
    warnings.push_back("--" + std::string(def->name) + " is given " + std::to_string(given.size()) +
                       " times with the same value; once is enough");
  }
  // The table's warnings, once per flag: a build flag next to --loadEngine changes nothing (the
  // engine is built already); a kWarns flag says why it changes nothing.
  const bool loaded = (spec.id & kCmdLoadsEngines) && args.has("loadEngine");
  for (const FlagDef* def : spec.flags) {
    if (!args.has(def->name)) continue;
    std::string flag = "--" + std::string(def->name);
    if (loaded && (def->traits & kBuildFlag)) {
      std::string hint = def->name == "profile" ? "; --useProfile=N picks the profile to run" : "";
      warnings.push_back(flag + " has no effect with --loadEngine: it applies while an engine is " +
                         "built, and this one is built already" + hint);
    } else if (def->status == FlagStatus::kWarns) {
      warnings.push_back(flag + ": " + std::string(def->text));
    }
  }
  for (const auto& w : warnings) warn(spec.name, w);
  return args;
}

bool Args::has(std::string_view name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return true;
  }
  return false;
}

std::optional<std::string> Args::get(std::string_view name) const {
  std::optional<std::string> v;
  for (const auto& f : flags_) {
    if (f.name == name) v = f.value;
  }
  return v;
}

Result<bool> Args::get_bool(std::string_view name) const {
  bool v = false;
  for (const auto& f : flags_) {
    if (f.name != name) continue;
    if (!f.has_value || f.value == "true" || f.value == "1") {
      v = true;
    } else if (f.value == "false" || f.value == "0") {
      v = false;
    } else {
      return usage_error("--" + f.name + " is a switch; '" + f.value +
                         "' is not true, false, 1 or 0");
    }
  }
  return v;
}

namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

}  // namespace

Result<double> Args::get_double(std::string_view name, double fallback, double min,
                                double max) const {
  auto v = get(name);
  if (!v) return fallback;
  const std::string flag = "--" + std::string(name) + "=" + *v;
  const std::string range = "[" + number_text(min) + ", " + number_text(max) + "]";
  // from_chars, not strtod: no locale, no leading spaces, and "inf"/"nan" parse so they can be
  // refused by the range check below with the same message as any other value outside it.
  double d = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
  if (p != v->data() + v->size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return usage_error(flag + " is not a number; expected a number in " + range);
  }
  if (ec == std::errc::result_out_of_range || !(d >= min && d <= max)) {
    return usage_error(flag + " is outside " + range);
  }
  return d;
}

Result<int64_t> parse_int_flag(std::string_view flag, std::string_view text, int64_t min,
                               int64_t max) {
  const std::string given = "--" + std::string(flag) + "=" + std::string(text);
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  int64_t x = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (p != text.data() + text.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return usage_error(given + " is not an integer; expected an integer in " + range);
  }
  if (ec == std::errc::result_out_of_range || x < min || x > max) {
    return usage_error(given + " is outside " + range);
  }
  return x;
}

Result<int64_t> Args::get_int(std::string_view name, int64_t fallback, int64_t min,
                              int64_t max) const {
  auto v = get(name);
  if (!v) return fallback;
  return parse_int_flag(name, *v, min, max);
}

Result<std::vector<ShapeSpec>> parse_shape_specs(std::string_view flag, std::string_view text) {
  const std::string expected = "NAME:D0xD1x... such as x:1x3x224x224 (several separated by ',')";
  const std::string f = "--" + std::string(flag);
  std::vector<ShapeSpec> out;
  for (const std::string& entry : split_entries(text)) {
    if (entry.empty())
      return usage_error(f + ": empty entry in '" + std::string(text) + "'; expected " + expected);
    KILN_CLI_ASSIGN(auto parts, split_name(flag, entry, expected));
    ShapeSpec spec{parts.first, {}};
    const std::string& dims = parts.second;
    if (dims.empty()) {
      return usage_error(f + ": '" + entry + "' gives no dims after ':'; expected " + expected);
    }
    size_t start = 0;
    for (int d = 0;; ++d) {
      size_t x = dims.find('x', start);
      std::string tok = dims.substr(start, x == std::string::npos ? std::string::npos : x - start);
      std::string where = f + ": malformed shape '" + entry + "': dim " + std::to_string(d);
      if (tok.empty()) return usage_error(where + " is empty; expected " + expected);
      int64_t v = 0;
      auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
      if (tok[0] == '-' || tok[0] == '+') {
        return usage_error(where + " is '" + tok +
                           "'; dims must be non-negative integers (a shape spec "
                           "gives concrete sizes, not -1 for dynamic)");
      }
      if (ec == std::errc::result_out_of_range)
        return usage_error(where + " '" + tok + "' is too large");
      if (ec != std::errc() || p != tok.data() + tok.size()) {
        return usage_error(where + " is '" + tok + "', not an integer; expected " + expected);
      }
      // 0 stays: an empty tensor is a valid input (ONNX and TensorRT allow zero-size dims), and
      // the profile's ranges decide whether this engine takes one.
      spec.dims.push_back(v);
      if (x == std::string::npos) break;
      start = x + 1;
    }
    // Every size computed from the shape (elements, bytes at up to 8 an element) must not wrap.
    auto numel = checked_numel(spec.dims);
    if (!numel || !checked_mul(*numel, 8)) {
      return usage_error(f + ": shape '" + entry + "' has more elements than a tensor can hold " +
                         "(the product of its dims overflows)");
    }
    for (const auto& prev : out) {
      if (prev.name == spec.name)
        return usage_error(f + ": input '" + spec.name + "' appears twice");
    }
    out.push_back(std::move(spec));
  }
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> parse_named_files(std::string_view flag,
                                                                           std::string_view text) {
  const std::string expected =
      "NAME:FILE such as x:input.npy or x:input_0.pb (several separated by ',')";
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& entry : split_entries(text)) {
    KILN_CLI_ASSIGN(auto parts, split_name(flag, entry, expected));
    if (parts.second.empty()) {
      return usage_error("--" + std::string(flag) + ": '" + entry +
                         "' gives no file after ':'; expected " + expected);
    }
    for (const auto& prev : out) {
      if (prev.first == parts.first) {
        return usage_error("--" + std::string(flag) + ": input '" + parts.first +
                           "' appears twice");
      }
    }
    out.push_back(std::move(parts));
  }
  return out;
}

std::string dims_to_spec(const Shape& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "x" : "") + std::to_string(dims[i]);
  return s;
}

}  // namespace kiln::cli

// Command-line parsing for kiln's subcommands: declared flags (--name=value, trtexec's spelling),
// shape specs (x:1x3x224x224,y:...), named file lists (x:in.npy,...), and the CLI's error values.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFail = 1;   // the work failed, or compare found outputs out of tolerance
inline constexpr int kExitUsage = 2;  // the command line is wrong: a flag, a value, a shape
inline constexpr int kExitInternal = 3;  // an exception reached main: a bug in kiln

// A failure with the exit code it maps to. The CLI uses this instead of Status so that a usage
// mistake (exit 2) is never confused with a failure while doing the work (exit 1).
struct Error {
  int exit_code = kExitFail;
  std::string message;
};
inline Error usage_error(std::string message) { return {kExitUsage, std::move(message)}; }
inline Error failure(std::string message) { return {kExitFail, std::move(message)}; }
// A library error; `what` says what was being done ("building the engine").
inline Error failure(const Status& st, const std::string& what) {
  return {kExitFail, what + ": " + st.to_string()};
}

struct Void {};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design, like StatusOr
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const Error& error() const { return std::get<1>(v_); }
  T& operator*() & { return value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, Error> v_;
};
using Check = Result<Void>;
inline Check ok() { return Void{}; }

#define KILN_CLI_TRY(expr)                             \
  do {                                                 \
    auto kiln_cli_r_ = (expr);                         \
    if (!kiln_cli_r_.ok()) return kiln_cli_r_.error(); \
  } while (0)

#define KILN_CLI_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                         \
  if (!tmp.ok()) return tmp.error();         \
  lhs = std::move(tmp).value()

#define KILN_CLI_ASSIGN(lhs, expr) \
  KILN_CLI_ASSIGN_IMPL(KILN_CONCAT(kiln_cli_r_, __LINE__), lhs, expr)

// The subcommands, as bits, so one flag definition can serve several of them.
inline constexpr uint32_t kCmdBuild = 1u << 0;
inline constexpr uint32_t kCmdRun = 1u << 1;
inline constexpr uint32_t kCmdBench = 1u << 2;
inline constexpr uint32_t kCmdInspect = 1u << 3;
inline constexpr uint32_t kCmdCompare = 1u << 4;
inline constexpr uint32_t kCmdAll = kCmdBuild | kCmdRun | kCmdBench | kCmdInspect | kCmdCompare;
inline constexpr uint32_t kCmdLoadsEngines = kCmdRun | kCmdBench | kCmdCompare;  // --loadEngine

// What kiln does with a flag: takes it; takes it and always warns (it changes nothing yet, or is a
// deprecated spelling); or refuses it with exit 2 and a sentence saying why and what to use.
enum class FlagStatus { kAccepted, kWarns, kRefused };

// Flag traits. kTrtexec: trtexec spells it so (docs/trtexec_flags.md lists it). kBuildFlag: it
// applies while an engine is built, so next to --loadEngine it has no effect. kRepeatable: it may
// be given several times, and the order matters (the shape flags, --profile).
inline constexpr uint32_t kTrtexec = 1u << 0;
inline constexpr uint32_t kBuildFlag = 1u << 1;
inline constexpr uint32_t kRepeatable = 1u << 2;

// One flag definition: a row of the table in flag_table.cc, which every command's flags, --help,
// the refusals and warnings, and docs/trtexec_flags.md are read from. A name may have several rows
// with disjoint `commands` when its meaning differs by command.
struct FlagDef {
  std::string_view name;   // without the leading "--"
  std::string_view value;  // a hint such as "FILE"; empty for a switch
  uint32_t commands;       // kCmd* bits
  FlagStatus status;
  uint32_t traits;        // kTrtexec | kBuildFlag | kRepeatable
  std::string_view text;  // accepted: what it does; warns: the warning; refused: why, what to use
};

// Every row, in --help order.
std::span<const FlagDef> flag_table();
// The row for `name` in `command` (any status), or null.
const FlagDef* find_flag_def(std::string_view name, uint32_t command);
// "build", "run", ... for one kCmd* bit; "build, bench" for several; "every command" for all.
std::string command_names(uint32_t commands);
// docs/trtexec_flags.md: every trtexec flag kiln accepts, warns about or refuses.
std::string trtexec_flags_markdown();
// What is wrong with the table ("" when nothing): rows of one name whose commands overlap, rows
// with no command or no text. kiln help-flags refuses to print a table that fails this.
std::string check_flag_table();

// Prints "kiln COMMAND: warning: MESSAGE" to stderr.
void warn(std::string_view command, const std::string& message);

struct CommandSpec {
  uint32_t id;                        // kCmdBuild, ...
  std::string name;                   // "build"
  std::string synopsis;               // the usage line after "kiln NAME "
  std::string summary;                // one paragraph
  std::string positional;             // e.g. "MODEL_OR_ENGINE"; empty when the command takes none
  std::vector<const FlagDef*> flags;  // what the command takes (accepted or warns), from the table
};

// A command's spec with its flags read from the table.
CommandSpec command_spec(uint32_t id, std::string name, std::string synopsis, std::string summary,
                         std::string positional = "");

std::string help_text(const CommandSpec& spec);

// Parsed flags, in command-line order (order matters: --profile=N starts a profile).
class Args {
 public:
  struct Flag {
    std::string name, value;
    bool has_value = false;
  };
  // Accepts --name=value, --name value (for flags that take a value) and --name (switches).
  // -h/--help sets help(). A refused flag is a usage error with the table's reason; an unknown
  // one suggests the nearest spelling, or names the commands that take it. A single-valued flag
  // given twice warns (same value) or is a usage error (different values). Prints the warnings
  // of the table: kWarns flags, and build flags next to --loadEngine, which have no effect.
  static Result<Args> parse(const CommandSpec& spec, const std::vector<std::string>& argv);

  bool help() const { return help_; }
  bool has(std::string_view name) const;
  std::optional<std::string> get(std::string_view name) const;  // the last occurrence
  // Switches: "--fp16" or "--fp16=true|1|false|0".
  Result<bool> get_bool(std::string_view name) const;
  // Numbers in [min, max]; text, NaN, infinity or a value outside the range is a usage error
  // naming the flag and the range. `fallback` (not checked) when the flag is absent.
  Result<double> get_double(std::string_view name, double fallback, double min, double max) const;
  Result<int64_t> get_int(std::string_view name, int64_t fallback, int64_t min, int64_t max) const;
  const std::vector<Flag>& flags() const { return flags_; }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// Bounds the commands give numeric flags. A day bounds every duration: longer is a typo (a unit
// mistaken, an exponent), and a run that never ends is what the bound prevents.
inline constexpr double kMaxSeconds = 24 * 60 * 60;
inline constexpr double kMaxMilliseconds = kMaxSeconds * 1000;
// Counts (iterations, profiles) are ints in the library, so a larger value cannot be honoured.
inline constexpr int64_t kMaxCount = 2147483647;

// All of `text` as an integer in [min, max] for --FLAG; a value past int64 is refused, never
// wrapped, and the range is checked before the caller narrows it.
Result<int64_t> parse_int_flag(std::string_view flag, std::string_view text, int64_t min,
                               int64_t max);

// One entry of a shape spec: an input name and its concrete dims.
struct ShapeSpec {
  std::string name;
  Shape dims;
};

// Parses "x:1x3x224x224,mask:1x128". A name may contain ':' (the dims follow the last one) or be
// quoted ('a,b':1x2). Dims are positive integers joined by 'x', whose product (at 8 bytes an
// element) fits in int64. `flag` names the flag in errors.
Result<std::vector<ShapeSpec>> parse_shape_specs(std::string_view flag, std::string_view text);

// Splits a flag's list on commas outside single quotes ("a,'b,c'" is "a" and "'b,c'").
std::vector<std::string> split_entries(std::string_view text);

// Parses "x:in.npy,y:dir/in.pb" into (name, path) pairs; the path follows the last ':'.
Result<std::vector<std::pair<std::string, std::string>>> parse_named_files(std::string_view flag,
                                                                           std::string_view text);

// "1x3x224x224", the spelling shape specs use.
std::string dims_to_spec(const Shape& dims);

}  // namespace kiln::cli

// Pass check_profiles: proves, for every profile, that every constraint shape inference recorded
// holds over the whole box of input shapes, not just at min/opt/max. Interval analysis settles
// most constraints; the rest are decided by enumerating the symbols they involve. A failure names
// the node, its input shapes, the failing values, and the largest range that would work.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "builder/build_state.h"

namespace kiln::builder {
namespace {

// 2nd, 3rd, 11th, 32nd.
std::string ordinal(int64_t n) {
  const int64_t tens = n % 100, ones = n % 10;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : ones == 1                ? "st"
                       : ones == 2                ? "nd"
                       : ones == 3                ? "rd"
                                                  : "th";
  return std::to_string(n) + suffix;
}

using ops::Constraint;

// nullopt when the constraint cannot be evaluated at this point (e.g. division by zero).
std::optional<bool> holds_at(const Constraint& c, const ir::SymbolValues& at) {
  auto a = c.a.eval(at);
  auto b = c.b.eval(at);
  if (!a || !b) return std::nullopt;
  switch (c.kind) {
    case Constraint::Kind::kEqual:
      return *a == *b;
    case Constraint::Kind::kGreaterEqual:
      return *a >= *b;
    case Constraint::Kind::kBroadcast:
      return *a == *b || *a == 1 || *b == 1;
    case Constraint::Kind::kDivisible:
      return *b != 0 && *a % *b == 0;
  }
  return std::nullopt;
}

bool proven_by_intervals(const Constraint& c, const ir::SymbolRanges& r) {
  auto point = [](const ir::Interval& i, int64_t v) { return i.lo == v && i.hi == v; };
  switch (c.kind) {
    case Constraint::Kind::kEqual:
      return point((c.a - c.b).bounds(r), 0);
    case Constraint::Kind::kGreaterEqual:
      return (c.a - c.b).bounds(r).lo >= 0;
    case Constraint::Kind::kBroadcast:
      return point((c.a - c.b).bounds(r), 0) || point(c.a.bounds(r), 1) || point(c.b.bounds(r), 1);
    case Constraint::Kind::kDivisible:
      return point(ir::Dim::mod(c.a, c.b).bounds(r), 0);
  }
  return false;
}

const char* relation(const Constraint& c) {
  switch (c.kind) {
    case Constraint::Kind::kEqual:
      return "must equal";
    case Constraint::Kind::kGreaterEqual:
      return "must be >=";
    case Constraint::Kind::kBroadcast:
      return "must broadcast with";
    case Constraint::Kind::kDivisible:
      return "must be divisible by";
  }
  return "";
}

// "{1, 3, 5, ..., 31}" or "[1, 4], [9, 12]".
std::string describe_values(const std::vector<int64_t>& v) {
  if (v.size() >= 4) {
    int64_t step = v[1] - v[0];
    bool progression = step > 1;
    for (size_t i = 2; i < v.size() && progression; ++i) progression = v[i] - v[i - 1] == step;
    if (progression) {
      return "{" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", ..., " +
             std::to_string(v.back()) + "} (every " + ordinal(step) + " value)";
    }
  }
  std::string s;
  int shown = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (shown++ == 6) {
      s += ", ...";
      break;
    }
    s += (s.empty() ? "" : ", ");
    s += i == j ? std::to_string(v[i])
                : "[" + std::to_string(v[i]) + ", " + std::to_string(v[j]) + "]";
    i = j + 1;
  }
  return s;
}

std::string profile_ranges(const plan::Profile& p, const std::vector<std::string>& syms) {
  std::string s;
  for (const auto& name : syms) {
    auto it = p.symbols.find(name);
    if (it == p.symbols.end()) continue;
    s += (s.empty() ? "" : ", ") + name + " in [" + std::to_string(it->second.lo) + ", " +
         std::to_string(it->second.hi) + "]";
  }
  return s;
}

// `how`, when given, says how the constraint was settled.
Status check_one(const BuildState& s, size_t profile_index, const Constraint& c, std::string* how) {
  const plan::Profile& p = s.profiles[profile_index];
  if (proven_by_intervals(c, p.symbols)) {
    if (how) *how = "by intervals";
    return ok_status();
  }
  std::set<std::string> sym_set;
  c.a.collect_symbols(&sym_set);
  c.b.collect_symbols(&sym_set);
  std::vector<std::string> syms(sym_set.begin(), sym_set.end());
  std::vector<ir::Interval> ranges;
  double points = 1;
  for (const auto& name : syms) {
    auto it = p.symbols.find(name);
    if (it == p.symbols.end()) {
      return internal_error("constraint uses symbol '" + name + "', which no profile input binds");
    }
    ranges.push_back(it->second);
    points *= double(it->second.hi - it->second.lo + 1);
  }
  // Enumerate the symbols the constraint involves; with more than ~4M points, walk a lattice that
  // always includes each range's ends and the values next to them.
  constexpr double kMaxPoints = 4e6;
  std::vector<std::vector<int64_t>> axes(syms.size());
  for (size_t i = 0; i < syms.size(); ++i) {
    int64_t lo = ranges[i].lo, hi = ranges[i].hi;
    int64_t n = hi - lo + 1;
    int64_t per_axis = points <= kMaxPoints
                           ? n
                           : std::max<int64_t>(3, int64_t(std::pow(kMaxPoints, 1.0 / syms.size())));
    if (n <= per_axis) {
      for (int64_t v = lo; v <= hi; ++v) axes[i].push_back(v);
    } else {
      for (int64_t k = 0; k < per_axis; ++k) axes[i].push_back(lo + (hi - lo) * k / (per_axis - 1));
      axes[i].push_back(lo + 1);
      axes[i].push_back(hi - 1);
      std::sort(axes[i].begin(), axes[i].end());
      axes[i].erase(std::unique(axes[i].begin(), axes[i].end()), axes[i].end());
    }
  }
  std::vector<size_t> idx(syms.size(), 0);
  ir::SymbolValues at;
  std::vector<std::vector<int64_t>> failing(syms.size());
  int64_t n_fail = 0, n_total = 0;
  std::string first_failure;
  while (true) {
    for (size_t i = 0; i < syms.size(); ++i) at[syms[i]] = axes[i][idx[i]];
    ++n_total;
    auto ok = holds_at(c, at);
    if (!ok || !*ok) {
      if (n_fail++ == 0) {
        for (size_t i = 0; i < syms.size(); ++i) {
          first_failure += (i ? ", " : "") + syms[i] + "=" + std::to_string(at[syms[i]]);
        }
        auto a = c.a.eval(at), b = c.b.eval(at);
        first_failure += " gives " + (a ? std::to_string(*a) : std::string("undefined")) + " vs " +
                         (b ? std::to_string(*b) : std::string("undefined"));
      }
      for (size_t i = 0; i < syms.size(); ++i) failing[i].push_back(at[syms[i]]);
    }
    size_t k = 0;
    while (k < syms.size() && ++idx[k] == axes[k].size()) idx[k++] = 0;
    if (k == syms.size()) break;
  }
  if (how) {
    std::string names;
    for (const auto& name : syms) names += (names.empty() ? "" : ", ") + name;
    *how = "by enumerating " + std::to_string(n_total) + " points of " + names +
           (points > kMaxPoints ? " (a lattice with each range's ends)" : "") +
           (n_fail == 0 ? "" : ": fails at " + std::to_string(n_fail));
  }
  if (n_fail == 0) return ok_status();

  const std::string& inputs = c.node_inputs;
  std::string msg = c.node_desc + ": " + c.what + ": " + c.a.to_string() + " " + relation(c) + " " +
                    c.b.to_string() + ", which fails in profile " + std::to_string(profile_index) +
                    " (" + profile_ranges(p, syms) + ") for " + std::to_string(n_fail) + " of " +
                    std::to_string(n_total) + " checked points, first at " + first_failure +
                    "; node input shapes: " + inputs;
  if (syms.size() == 1) {
    std::vector<int64_t> bad = failing[0];
    std::sort(bad.begin(), bad.end());
    bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
    msg += "; failing values: " + syms[0] + " in " + describe_values(bad);
    // The largest run of values that pass, to suggest a profile that builds.
    int64_t best_lo = 0, best_len = 0, run_lo = 0, run_len = 0;
    size_t j = 0;
    for (int64_t v : axes[0]) {
      bool bad_v = j < bad.size() && bad[j] == v;
      if (bad_v) {
        ++j;
        run_len = 0;
      } else {
        if (run_len == 0) run_lo = v;
        if (++run_len > best_len) {
          best_len = run_len;
          best_lo = run_lo;
        }
      }
    }
    if (best_len > 0) {
      msg += "; a profile with " + syms[0] + " in [" + std::to_string(best_lo) + ", " +
             std::to_string(best_lo + best_len - 1) + "] would build";
    } else {
      msg += "; no value of " + syms[0] + " in the profile works";
    }
    // Where every value was checked and which values pass repeats with a period (an FPN's
    // 2*ceil(h/32) = ceil(h/16) holds for h mod 32 in {0, 17, ..., 31}), a profile stepping by
    // that period from a passing value builds this node: say so (the smallest such period).
    const int64_t n = int64_t(axes[0].size());
    const bool complete = n == ranges[0].hi - ranges[0].lo + 1;
    if (complete && n >= 4 && best_len < n) {
      std::vector<char> ok_at(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        ok_at[size_t(i)] = !std::binary_search(bad.begin(), bad.end(), axes[0][size_t(i)]);
      int64_t anchor = -1;
      for (int64_t i = 0; i < n && anchor < 0; ++i) {
        if (ok_at[size_t(i)]) anchor = i;
      }
      for (int64_t period = 2; anchor >= 0 && period <= std::min<int64_t>(n / 2, 4096); ++period) {
        bool periodic = true;
        for (int64_t i = 0; i + period < n && periodic; ++i)
          periodic = ok_at[size_t(i)] == ok_at[size_t(i + period)];
        if (!periodic) continue;
        msg += "; which values pass repeats every " + std::to_string(period) +
               ": a profile that steps " + syms[0] + " by " + std::to_string(period) + " from " +
               std::to_string(axes[0][size_t(anchor)]) +
               " would build this node (OptimizationProfile::set_dimensions with steps; kiln "
               "--shapeSteps)";
        break;
      }
    }
  }
  return invalid_argument(msg);
}

}  // namespace

Status check_profiles(BuildState& s) {
  const auto& log = s.config.shape_log();
  if (log)
    log("profile proof: " + std::to_string(s.constraints.size()) + " constraint(s) per profile");
  for (size_t p = 0; p < s.profiles.size(); ++p) {
    for (const Constraint& c : s.constraints) {
      std::string how;
      Status st = check_one(s, p, c, log ? &how : nullptr);
      if (log) {
        log("  profile " + std::to_string(p) + ": " + c.node_desc + ": " + c.what + ": " +
            c.a.to_string() + " " + relation(c) + " " + c.b.to_string() + ": " + how);
      }
      KILN_RETURN_IF_ERROR(st);
    }
  }
  return ok_status();
}

}  // namespace kiln::builder

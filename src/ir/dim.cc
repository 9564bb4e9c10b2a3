// Dim arithmetic and simplification. Expressions are polynomials (sum of coefficient * monomial)
// whose factors are symbols or opaque atoms (floor-div, mod, min, max); every constructor keeps
// that form canonical, so structurally equal expressions are equal dims.
#include "ir/dim.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace kiln::ir {
namespace {

// Wrapping arithmetic: build-time expressions never overflow UB; evaluation is checked.
int64_t wadd(int64_t a, int64_t b) { return int64_t(uint64_t(a) + uint64_t(b)); }
int64_t wmul(int64_t a, int64_t b) { return int64_t(uint64_t(a) * uint64_t(b)); }

int64_t floor_div_int(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// a - floor(a/b)*b, the remainder with b's sign. It always fits, but floor(a/b)*b alone may not
// (a near INT64_MIN), so the subtraction wraps; b = -1 would overflow the division itself.
int64_t floor_mod_int(int64_t a, int64_t b) {
  if (b == -1) return 0;
  return int64_t(uint64_t(a) - uint64_t(floor_div_int(a, b)) * uint64_t(b));
}

int64_t sat(int64_t v) { return std::clamp(v, -Interval::kInf, Interval::kInf); }
int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return ((a < 0) != (b < 0)) ? -Interval::kInf : Interval::kInf;
  return sat(r);
}
int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return a < 0 ? -Interval::kInf : Interval::kInf;
  return sat(r);
}
Interval imul(Interval x, Interval y) {
  int64_t c[4] = {sat_mul(x.lo, y.lo), sat_mul(x.lo, y.hi), sat_mul(x.hi, y.lo),
                  sat_mul(x.hi, y.hi)};
  return {*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
}

std::string monomial_key(const std::vector<AtomPtr>& factors) {
  std::string k;
  for (size_t i = 0; i < factors.size(); ++i) {
    if (i) k += "*";
    k += factors[i]->key;
  }
  return k;
}

bool needs_parens(const Dim& d) {
  std::string s = d.to_string();
  return s.find(' ') != std::string::npos || s[0] == '-';
}

std::string paren(const Dim& d) {
  return needs_parens(d) ? "(" + d.to_string() + ")" : d.to_string();
}

// A divisor also needs them around a product: "a/4*h" reads as floor(a/4)*h.
std::string paren_divisor(const Dim& d) {
  std::string s = d.to_string();
  return needs_parens(d) || s.find('*') != std::string::npos ? "(" + s + ")" : s;
}

// For a term that is exactly floor(X/e) (coefficient 1, e a constant above 1): X and e.
bool single_floor_term(const AtomPtr& f, int64_t coeff, size_t nfactors, const Dim** x,
                       int64_t* e) {
  if (coeff != 1 || nfactors != 1 || f->kind != AtomKind::kFloorDiv || !f->b.is_const() ||
      f->b.value() <= 1) {
    return false;
  }
  *x = &f->a;
  *e = f->b.value();
  return true;
}

}  // namespace

Dim Dim::symbol(std::string name) {
  auto atom = std::make_shared<Atom>();
  atom->kind = AtomKind::kSymbol;
  atom->name = name;
  atom->key = std::move(name);
  return from_atom(atom);
}

Dim Dim::from_atom(AtomPtr atom) {
  Dim d;
  Term t{1, {atom}, atom->key};
  d.terms_.push_back(std::move(t));
  return d;
}

bool Dim::is_symbol() const {
  return constant_ == 0 && terms_.size() == 1 && terms_[0].coeff == 1 &&
         terms_[0].factors.size() == 1 && terms_[0].factors[0]->kind == AtomKind::kSymbol;
}

bool Dim::as_linear(std::string* symbol, int64_t* coeff, int64_t* offset) const {
  if (terms_.size() != 1 || terms_[0].factors.size() != 1 ||
      terms_[0].factors[0]->kind != AtomKind::kSymbol) {
    return false;
  }
  *symbol = terms_[0].factors[0]->name;
  *coeff = terms_[0].coeff;
  *offset = constant_;
  return true;
}

void Dim::add_term(Term t) {
  auto it = std::lower_bound(terms_.begin(), terms_.end(), t.key,
                             [](const Term& x, const std::string& k) { return x.key < k; });
  if (it != terms_.end() && it->key == t.key) {
    it->coeff = wadd(it->coeff, t.coeff);
    if (it->coeff == 0) terms_.erase(it);
  } else if (t.coeff != 0) {
    terms_.insert(it, std::move(t));
  }
}

void Dim::set_terms(std::vector<Term> terms) {
  std::stable_sort(terms.begin(), terms.end(),
                   [](const Term& x, const Term& y) { return x.key < y.key; });
  terms_.clear();
  terms_.reserve(terms.size());
  for (auto& t : terms) {
    if (!terms_.empty() && terms_.back().key == t.key) {
      terms_.back().coeff = wadd(terms_.back().coeff, t.coeff);
    } else {
      terms_.push_back(std::move(t));
    }
  }
  std::erase_if(terms_, [](const Term& t) { return t.coeff == 0; });
}

Dim operator+(const Dim& a, const Dim& b) {
  // One monomial goes in by binary search; more are merged, so a long sum is not quadratic.
  Dim r = a;
  r.constant_ = wadd(a.constant_, b.constant_);
  if (b.terms_.size() <= 1) {
    for (const auto& t : b.terms_) r.add_term(t);
    return r;
  }
  std::vector<Dim::Term> all = std::move(r.terms_);
  all.insert(all.end(), b.terms_.begin(), b.terms_.end());
  r.set_terms(std::move(all));
  return r;
}

Dim Dim::sum(const std::vector<Dim>& parts) {
  Dim r;
  size_t n = 0;
  for (const Dim& p : parts) n += p.terms_.size();
  std::vector<Term> all;
  all.reserve(n);
  for (const Dim& p : parts) {
    r.constant_ = wadd(r.constant_, p.constant_);
    all.insert(all.end(), p.terms_.begin(), p.terms_.end());
  }
  r.set_terms(std::move(all));
  return r;
}

Dim Dim::operator-() const {
  Dim r = *this;
  r.constant_ = wmul(constant_, -1);
  for (auto& t : r.terms_) t.coeff = wmul(t.coeff, -1);
  return r;
}

Dim operator-(const Dim& a, const Dim& b) { return a + (-b); }

Dim operator*(const Dim& a, const Dim& b) {
  Dim r(wmul(a.constant_, b.constant_));
  std::vector<Dim::Term> all;
  all.reserve((a.terms_.size() + 1) * (b.terms_.size() + 1));
  if (b.constant_ != 0) {
    for (const auto& t : a.terms_) all.push_back({wmul(t.coeff, b.constant_), t.factors, t.key});
  }
  if (a.constant_ != 0) {
    for (const auto& t : b.terms_) all.push_back({wmul(t.coeff, a.constant_), t.factors, t.key});
  }
  for (const auto& x : a.terms_) {
    for (const auto& y : b.terms_) {
      std::vector<AtomPtr> f = x.factors;
      f.insert(f.end(), y.factors.begin(), y.factors.end());
      std::sort(f.begin(), f.end(),
                [](const AtomPtr& p, const AtomPtr& q) { return p->key < q->key; });
      std::string key = monomial_key(f);
      all.push_back({wmul(x.coeff, y.coeff), std::move(f), std::move(key)});
    }
  }
  r.set_terms(std::move(all));
  return r;
}

int64_t Dim::content_gcd() const {
  auto magnitude = [](int64_t v) { return v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v); };
  uint64_t g = magnitude(constant_);
  for (const auto& t : terms_) g = std::gcd(g, magnitude(t.coeff));
  // 2^63 (every part INT64_MIN or 0) is no int64: 1 claims no common factor, which only forgoes
  // a simplification (found by onnx_build_fuzz: a Range whose delta is INT64_MIN).
  return g > uint64_t(INT64_MAX) ? 1 : int64_t(g);
}

Dim Dim::wrap_floor_div(const Dim& a, const Dim& b, bool /*ceil*/) {
  auto atom = std::make_shared<Atom>();
  atom->kind = AtomKind::kFloorDiv;
  atom->a = a;
  atom->b = b;
  atom->key = "floor(" + paren(a) + "/" + paren_divisor(b) + ")";
  // floor((A + d - 1)/d) is ceil(A/d), as a person writes it. Printed so only where ceil_div(A, d)
  // reads back to this very atom (A's coefficients share no factor with d), so the text form of a
  // plan's formulas still parses to the same dims.
  if (b.is_const() && b.constant_ > 1 && !a.terms_.empty() && a.constant_ == b.constant_ - 1) {
    Dim num = a;
    num.constant_ = 0;
    if (std::gcd(num.content_gcd(), b.constant_) == 1) {
      atom->key = "ceil(" + paren(num) + "/" + std::to_string(b.constant_) + ")";
    }
  }
  return from_atom(atom);
}

Dim Dim::floor_div(const Dim& a, const Dim& b) {
  if (b.is_const()) {
    int64_t d = b.constant_;
    if (d == 0) return wrap_floor_div(a, b, false);  // evaluates to an error
    if (d == INT64_MIN) return wrap_floor_div(a, b, false);
    if (d < 0) return floor_div(-a, Dim(-d));
    if (d == 1) return a;
    // Nested divisions: floor((floor(X/e) + R)/d) = floor((X + e*R)/(e*d)) for integers X, R and
    // positive e, d (floor(X/e) + R = floor((X + e*R)/e)), so ceil(ceil(h/2)/2) reads ceil(h/4).
    for (const auto& t : a.terms_) {
      const Dim* x = nullptr;
      int64_t e = 0, ed = 0;
      if (!single_floor_term(t.factors[0], t.coeff, t.factors.size(), &x, &e) ||
          __builtin_mul_overflow(e, d, &ed)) {
        continue;
      }
      Dim rest = a;
      rest.set_terms([&] {
        std::vector<Term> others;
        for (const auto& u : a.terms_) {
          if (u.key != t.key) others.push_back(u);
        }
        return others;
      }());
      bool fits = true;
      int64_t scaled = 0;
      fits = fits && !__builtin_mul_overflow(rest.constant_, e, &scaled);
      for (const auto& u : rest.terms_) {
        int64_t c = 0;
        fits = fits && !__builtin_mul_overflow(u.coeff, e, &c);
      }
      if (!fits) continue;
      return floor_div(*x + Dim(e) * rest, Dim(ed));
    }
    // floor((d*A + B) / d) = A + floor(B / d) for integer A: pull out the divisible part.
    Dim quotient;
    Dim rest;
    for (const auto& t : a.terms_) {
      if (t.coeff % d == 0) {
        quotient.add_term({t.coeff / d, t.factors, t.key});
      } else {
        rest.add_term(t);
      }
    }
    int64_t q = floor_div_int(a.constant_, d);
    quotient.constant_ = q;
    rest.constant_ = floor_mod_int(a.constant_, d);  // in [0, d)
    if (rest.is_const()) return quotient;            // rest in [0, d) floors to 0
    int64_t g = std::gcd(rest.content_gcd(), d);
    if (g > 1) {
      Dim reduced = rest;
      reduced.constant_ /= g;
      for (auto& t : reduced.terms_) t.coeff /= g;
      // Divided again: the reduced form may be a nested division that combines (4*floor(h/8)/5844
      // is floor(floor(h/8)/1461), which is floor(h/11688)), so every spelling has one form and
      // the printed text parses back to it (found by dim_parse_fuzz).
      return quotient + floor_div(reduced, Dim(d / g));
    }
    return quotient + wrap_floor_div(rest, b, false);
  }
  // Exact division by a single monomial, as Reshape's -1 needs: (6*batch*h) / (2*h) = 3*batch.
  if (b.terms_.size() == 1 && b.constant_ == 0 && a.constant_ == 0 && !a.terms_.empty()) {
    const Term& den = b.terms_[0];
    Dim r;
    bool exact = den.coeff != 0;
    for (const auto& t : a.terms_) {
      if (!exact || t.coeff % den.coeff != 0) {
        exact = false;
        break;
      }
      std::vector<AtomPtr> f = t.factors;
      for (const auto& df : den.factors) {
        auto it =
            std::find_if(f.begin(), f.end(), [&](const AtomPtr& p) { return p->key == df->key; });
        if (it == f.end()) {
          exact = false;
          break;
        }
        f.erase(it);
      }
      if (!exact) break;
      std::string key = monomial_key(f);
      if (f.empty()) {
        r.constant_ = wadd(r.constant_, t.coeff / den.coeff);
      } else {
        r.add_term({t.coeff / den.coeff, std::move(f), std::move(key)});
      }
    }
    if (exact) return r;
  }
  if (a == b) return Dim(1);
  // A numerator that is k times the divisor, k an integer: (120*a + 60*b)/(30*a + 15*b) is 4, as
  // a Reshape's -1 computes it. Exact for every value of the symbols where the divisor is nonzero.
  if (!b.is_const() && !a.is_const() && a.terms_.size() == b.terms_.size() &&
      b.terms_[0].coeff != 0 && a.terms_[0].key == b.terms_[0].key &&
      a.terms_[0].coeff % b.terms_[0].coeff == 0) {
    const Dim k(a.terms_[0].coeff / b.terms_[0].coeff);
    if (b * k == a) return k;
  }
  return wrap_floor_div(a, b, false);
}

// ceil(A/d) for a constant d > 0 is floor((A + d - 1)/d) after dividing out the factor A's
// coefficients share with d: one canonical form, so ceil(h/4) and floor((h + 3)/4) are one dim
// and nested ceilings combine (see floor_div).
Dim Dim::ceil_div(const Dim& a, const Dim& b) {
  if (b.is_const() && b.constant_ > 1 && !a.is_const()) {
    const int64_t g = std::gcd(a.content_gcd(), b.constant_);
    Dim num = a;
    int64_t d = b.constant_;
    if (g > 1) {
      num.constant_ /= g;
      for (auto& t : num.terms_) t.coeff /= g;
      d /= g;
    }
    if (d == 1) return num;
    if (num.constant_ <= INT64_MAX - (d - 1)) return floor_div(num + Dim(d - 1), Dim(d));
  }
  return -floor_div(-a, b);
}

Dim Dim::mod(const Dim& a, const Dim& b) {
  if (a.is_const() && b.is_const()) {
    if (b.constant_ != 0) return Dim(floor_mod_int(a.constant_, b.constant_));
  }
  Dim rest = a;
  if (b.is_const() && b.constant_ > 0) {
    int64_t d = b.constant_;
    rest = Dim();
    for (const auto& t : a.terms_) {
      if (t.coeff % d != 0) rest.add_term(t);
    }
    rest.constant_ = floor_mod_int(a.constant_, d);
    if (rest.is_const()) return rest;
  }
  if (a == b) return Dim(0);
  if (!b.is_const()) {
    // a mod b = a - b*floor(a/b), which simplifies whenever the division does. Otherwise it stays
    // an atom: the expansion holds a twice, so nested mods ("a % b % c % ...", a hostile
    // dim_param) would double the expression per level.
    Dim q = floor_div(a, b);
    bool divided =
        !(q.constant_ == 0 && q.terms_.size() == 1 && q.terms_[0].coeff == 1 &&
          q.terms_[0].factors.size() == 1 && q.terms_[0].factors[0]->kind == AtomKind::kFloorDiv);
    if (divided) return a - b * q;
  }
  auto atom = std::make_shared<Atom>();
  atom->kind = AtomKind::kMod;
  atom->a = rest;
  atom->b = b;
  atom->key = "mod(" + rest.to_string() + ", " + b.to_string() + ")";
  return from_atom(atom);  // a constant 0 divisor stays here and evaluates to an error
}

Dim Dim::min(const Dim& a, const Dim& b) { return min_max(a, b, false); }
Dim Dim::max(const Dim& a, const Dim& b) { return min_max(a, b, true); }

Dim Dim::min_max(const Dim& a, const Dim& b, bool is_max) {
  Dim diff = a - b;
  if (diff.is_const()) return (diff.value() >= 0) == is_max ? a : b;
  // Symbols are dims, never negative: max(16*b, 32*b) is 32*b.
  Interval d = diff.bounds({});
  if (d.lo >= 0) return is_max ? a : b;
  if (d.hi <= 0) return is_max ? b : a;
  bool a_first = a.to_string() < b.to_string();
  const Dim& x = a_first ? a : b;
  const Dim& y = a_first ? b : a;
  auto atom = std::make_shared<Atom>();
  atom->kind = is_max ? AtomKind::kMax : AtomKind::kMin;
  atom->a = x;
  atom->b = y;
  atom->key = std::string(is_max ? "max(" : "min(") + x.to_string() + ", " + y.to_string() + ")";
  return from_atom(atom);
}

bool operator==(const Dim& a, const Dim& b) {
  if (a.constant_ != b.constant_ || a.terms_.size() != b.terms_.size()) return false;
  for (size_t i = 0; i < a.terms_.size(); ++i) {
    if (a.terms_[i].coeff != b.terms_[i].coeff || a.terms_[i].key != b.terms_[i].key) return false;
  }
  return true;
}

static std::optional<int64_t> eval_atom(const Atom& atom, const SymbolValues& values) {
  if (atom.kind == AtomKind::kSymbol) {
    auto it = values.find(atom.name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
  auto x = atom.a.eval(values);
  auto y = atom.b.eval(values);
  if (!x || !y) return std::nullopt;
  switch (atom.kind) {
    case AtomKind::kFloorDiv:
      if (*y == 0 || (*x == INT64_MIN && *y == -1)) return std::nullopt;
      return floor_div_int(*x, *y);
    case AtomKind::kMod:
      if (*y == 0 || (*x == INT64_MIN && *y == -1)) return std::nullopt;
      return floor_mod_int(*x, *y);
    case AtomKind::kMin:
      return std::min(*x, *y);
    case AtomKind::kMax:
      return std::max(*x, *y);
    default:
      return std::nullopt;
  }
}

std::optional<int64_t> Dim::eval(const SymbolValues& values) const {
  int64_t sum = constant_;
  for (const auto& t : terms_) {
    int64_t prod = t.coeff;
    for (const auto& f : t.factors) {
      auto v = eval_atom(*f, values);
      if (!v || __builtin_mul_overflow(prod, *v, &prod)) return std::nullopt;
    }
    if (__builtin_add_overflow(sum, prod, &sum)) return std::nullopt;
  }
  return sum;
}

static Interval atom_bounds(const Atom& atom, const SymbolRanges& ranges) {
  if (atom.kind == AtomKind::kSymbol) {
    auto it = ranges.find(atom.name);
    // A symbol without a range is a dimension: never negative.
    return it == ranges.end() ? Interval{0, Interval::kInf} : it->second;
  }
  Interval x = atom.a.bounds(ranges);
  Interval y = atom.b.bounds(ranges);
  switch (atom.kind) {
    case AtomKind::kFloorDiv:
      if (y.is_point() && y.lo > 0) {
        return {x.lo <= -Interval::kInf ? -Interval::kInf : floor_div_int(x.lo, y.lo),
                x.hi >= Interval::kInf ? Interval::kInf : floor_div_int(x.hi, y.lo)};
      }
      if (y.lo > 0 && x.lo >= 0) return {0, x.hi};
      return {};
    case AtomKind::kMod:
      if (y.lo > 0 && y.hi < Interval::kInf) {
        if (x.lo >= 0) return {0, std::min(x.hi, y.hi - 1)};
        return {0, y.hi - 1};
      }
      return {};
    case AtomKind::kMin:
      return {std::min(x.lo, y.lo), std::min(x.hi, y.hi)};
    case AtomKind::kMax:
      return {std::max(x.lo, y.lo), std::max(x.hi, y.hi)};
    default:
      return {};
  }
}

Interval Dim::bounds(const SymbolRanges& ranges) const {
  // An unbounded end stays unbounded: -kInf + 1 would read as a finite bound that a value past
  // 2^62 (which int64 still holds) lies outside of (found by dim_parse_fuzz).
  auto add_lo = [](int64_t a, int64_t b) {
    return a <= -Interval::kInf || b <= -Interval::kInf ? -Interval::kInf : sat_add(a, b);
  };
  auto add_hi = [](int64_t a, int64_t b) {
    return a >= Interval::kInf || b >= Interval::kInf ? Interval::kInf : sat_add(a, b);
  };
  Interval sum{constant_, constant_};
  for (const auto& t : terms_) {
    Interval prod{t.coeff, t.coeff};
    for (const auto& f : t.factors) prod = imul(prod, atom_bounds(*f, ranges));
    sum = {add_lo(sum.lo, prod.lo), add_hi(sum.hi, prod.hi)};
  }
  return sum;
}

Dim Dim::simplify_atom(const AtomPtr& atom, const SymbolRanges& r) {
  if (atom->kind == AtomKind::kSymbol) return from_atom(atom);
  Dim x = atom->a.simplify(r);
  Dim y = atom->b.simplify(r);
  switch (atom->kind) {
    case AtomKind::kFloorDiv: {
      Dim q = floor_div(x, y);
      Interval xb = x.bounds(r), yb = y.bounds(r);
      if (!q.is_const() && yb.is_point() && yb.lo > 0 && xb.lo > -Interval::kInf &&
          xb.hi < Interval::kInf && floor_div_int(xb.lo, yb.lo) == floor_div_int(xb.hi, yb.lo)) {
        return Dim(floor_div_int(xb.lo, yb.lo));
      }
      return q;
    }
    case AtomKind::kMod: {
      Interval xb = x.bounds(r), yb = y.bounds(r);
      if (yb.is_point() && yb.lo > 0 && xb.lo >= 0 && xb.hi < yb.lo) return x;
      return mod(x, y);
    }
    case AtomKind::kMin:
    case AtomKind::kMax: {
      Interval d = (x - y).bounds(r);
      bool is_max = atom->kind == AtomKind::kMax;
      if (d.lo >= 0) return is_max ? x : y;
      if (d.hi <= 0) return is_max ? y : x;
      return is_max ? max(x, y) : min(x, y);
    }
    default:
      return from_atom(atom);
  }
}

Dim Dim::simplify(const SymbolRanges& ranges) const {
  bool opaque = false;
  for (const auto& t : terms_) {
    for (const auto& f : t.factors) opaque |= f->kind != AtomKind::kSymbol;
  }
  if (!opaque) return *this;
  std::vector<Dim> parts{Dim(constant_)};
  parts.reserve(terms_.size() + 1);
  for (const auto& t : terms_) {
    Dim prod(t.coeff);
    for (const auto& f : t.factors) prod = prod * simplify_atom(f, ranges);
    parts.push_back(std::move(prod));
  }
  return sum(parts);
}

void Dim::collect_symbols(std::set<std::string>* out) const {
  for (const auto& t : terms_) {
    for (const auto& f : t.factors) {
      if (f->kind == AtomKind::kSymbol) {
        out->insert(f->name);
      } else {
        f->a.collect_symbols(out);
        f->b.collect_symbols(out);
      }
    }
  }
}

std::string Dim::to_string() const {
  if (terms_.empty()) return std::to_string(constant_);
  std::string s;
  // Higher-degree monomials first, then by key: "batch*seq + 2*seq + 1".
  std::vector<const Term*> order;
  for (const auto& t : terms_) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const Term* x, const Term* y) {
    return x->factors.size() > y->factors.size();
  });
  for (size_t i = 0; i < order.size(); ++i) {
    const Term& t = *order[i];
    int64_t c = t.coeff;
    if (i == 0) {
      if (c < 0) s += "-";
    } else {
      s += c < 0 ? " - " : " + ";
    }
    uint64_t mag = c < 0 ? uint64_t(0) - uint64_t(c) : uint64_t(c);
    if (mag != 1) s += std::to_string(mag) + "*";
    s += t.key;
  }
  if (constant_ > 0) s += " + " + std::to_string(constant_);
  if (constant_ < 0) s += " - " + std::to_string(uint64_t(0) - uint64_t(constant_));
  return s;
}

Interval data_dependent_range(const DataDependentDim& dd, const SymbolRanges& ranges) {
  const int64_t hi = std::max<int64_t>(dd.bound.bounds(ranges).hi, 0);
  const int64_t lo = std::clamp<int64_t>(dd.lower.bounds(ranges).lo, 0, hi);
  return Interval{lo, hi};
}

bool names_data_dependent(const std::vector<Dim>& dims, const std::vector<DataDependentDim>& dd) {
  if (dd.empty()) return false;
  std::set<std::string> syms;
  for (const Dim& d : dims) d.collect_symbols(&syms);
  for (const DataDependentDim& d : dd) {
    if (syms.count(d.symbol)) return true;
  }
  return false;
}

std::string dims_to_string(const std::vector<Dim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].to_string();
  }
  return s + "]";
}

}  // namespace kiln::ir

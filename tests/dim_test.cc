// Symbolic dims: simplification, printing, parsing, evaluation and bounds.
#include "ir/dim.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <set>
#include <string>

namespace kiln::ir {
namespace {

TEST(Dim, LinearArithmeticSimplifies) {
  Dim s = Dim::symbol("seq_len");
  EXPECT_EQ((s + 1).to_string(), "seq_len + 1");
  EXPECT_EQ((s + 1 - s).to_string(), "1");
  EXPECT_EQ((Dim(4) * Dim::symbol("h")).to_string(), "4*h");
  EXPECT_EQ((Dim::symbol("h") * 2 - 1).to_string(), "2*h - 1");
}

TEST(Dim, FloorDivPullsOutDivisibleTerms) {
  Dim h = Dim::symbol("h");
  // A stride-2 conv over 4*h rows with pad 1, kernel 3: floor((4h + 2 - 3)/2) + 1 = 2h.
  Dim out = Dim::floor_div(h * 4 + 2 - 3, Dim(2)) + 1;
  EXPECT_EQ(out, h * 2);
  Dim odd = Dim::floor_div(h + 1, Dim(2));
  EXPECT_FALSE(odd.is_const());
  EXPECT_EQ(odd.eval({{"h", 5}}), 3);
  EXPECT_EQ(Dim::ceil_div(h, Dim(2)).eval({{"h", 5}}), 3);
}

TEST(Dim, ExactMonomialDivision) {
  Dim b = Dim::symbol("batch"), h = Dim::symbol("h");
  EXPECT_EQ(Dim::floor_div(b * h * 6, h * 2), b * 3);
}

TEST(Dim, ModAndMinMax) {
  Dim b = Dim::symbol("b");
  EXPECT_EQ(Dim::mod(b * 4 + 6, Dim(2)), Dim(0));
  EXPECT_EQ(Dim::mod(b * 6, Dim(12)).eval({{"b", 3}}), 6);
  EXPECT_EQ(Dim::max(b + 1, b), b + 1);
  EXPECT_EQ(Dim::min(b, Dim::symbol("c")).eval({{"b", 3}, {"c", 2}}), 2);
}

// A symbolic mod whose division does not simplify stays one atom: expanded as a - b*floor(a/b) it
// holds a twice, and the fuzzer's "d%of%oo%of%od..." (16 nested mods) grew past the parser's 1 MiB
// limit, so its printed text no longer parsed back.
TEST(Dim, NestedSymbolicModStaysLinearAndRoundTrips) {
  std::string text = "a";
  SymbolValues values{{"a", 1000}};
  int64_t expected = 1000;
  for (int i = 0; i < 40; ++i) {
    std::string sym = "s" + std::to_string(i);
    text += " % " + sym;
    values[sym] = 997 - 7 * i;
    expected %= 997 - 7 * i;
  }
  auto d = Dim::parse(text);
  ASSERT_TRUE(d.has_value());
  EXPECT_LT(d->to_string().size(), 4 * text.size()) << d->to_string().substr(0, 200);
  auto again = Dim::parse(d->to_string());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, *d);
  EXPECT_EQ(d->eval(values), expected);
  // Where the division is exact the expansion still simplifies: (6*b*h) mod (2*h) = 0.
  Dim b = Dim::symbol("b"), h = Dim::symbol("h");
  EXPECT_EQ(Dim::mod(b * h * 6, h * 2), Dim(0));
  EXPECT_EQ(Dim::mod(b, b), Dim(0));
}

// A product divisor prints in parentheses: "floor(a/4*h)" read back as floor(a/4)*h (found by
// dim_parse_fuzz from "douuu/(ho4444*4)").
TEST(Dim, ProductDivisorRoundTrips) {
  for (const char* text : {"douuu/(ho4444*4)", "a/(b*c)", "(a + 1)/(2*b)", "floor(a/(h*w))"}) {
    auto d = Dim::parse(text);
    ASSERT_TRUE(d.has_value()) << text;
    auto again = Dim::parse(d->to_string());
    ASSERT_TRUE(again.has_value()) << d->to_string();
    EXPECT_EQ(*again, *d) << text << " printed as " << d->to_string();
    const SymbolValues at{{"douuu", 100}, {"ho4444", 3}, {"a", 100}, {"b", 3},
                          {"c", 2},       {"h", 3},      {"w", 2}};
    EXPECT_EQ(again->eval(at), d->eval(at));
  }
  EXPECT_EQ(Dim::parse("a/(b*c)")->eval({{"a", 100}, {"b", 3}, {"c", 2}}), 16);
}

// A product of sums distributes: a chain of binomials doubles its terms per factor. Text whose
// product would print past what the parser reads back is refused, quickly (the fuzzer's dozen
// binomials took 13 s and did not read back); small products still expand.
TEST(Dim, ProductOfManySumsIsRefused) {
  std::string text;
  for (int i = 0; i < 30; ++i) {
    text += std::string(i ? "*" : "") + "(a" + std::to_string(i) + " + 1)";
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(Dim::parse(text).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  auto small = Dim::parse("(a + 1)*(b + 1)*(c + 2)");
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->eval({{"a", 2}, {"b", 3}, {"c", 4}}), 3 * 4 * 6);
  auto again = Dim::parse(small->to_string());
  ASSERT_TRUE(again.has_value()) << small->to_string();
  EXPECT_EQ(*again, *small);
  // Monomials of long atoms, as arena slot formulas print, are not distributed and still read.
  std::string big = "h";
  for (int i = 0; i < 200; ++i) big = "max(" + big + ", w" + std::to_string(i) + ")";
  EXPECT_TRUE(Dim::parse("4*" + big + "*" + big).has_value());
}

// floor(a/d)*d can leave int64 where the remainder a - floor(a/d)*d does not: a constant near
// INT64_MIN divided by a large d (found by onnx_build_fuzz through a Range's ceil_div, a UBSan
// report), and INT64_MIN mod -1.
TEST(Dim, RemainderOfAConstantNearInt64MinIsExact) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  Dim h = Dim::symbol("h");
  Dim q = Dim::floor_div(h * 3 + (kMin + 5), Dim(10));
  EXPECT_EQ(q.eval({{"h", 1}}), (kMin + 8) / 10);  // exact: kMin + 8 is divisible by 10
  EXPECT_EQ(Dim::mod(h * 3 + (kMin + 5), Dim(10)).eval({{"h", 1}}), 0);
  EXPECT_EQ(Dim::mod(Dim(kMin + 5), Dim(10)), Dim(7));
  EXPECT_EQ(Dim::mod(Dim(kMin), Dim(-1)), Dim(0));
  EXPECT_EQ(Dim::mod(Dim(kMin + 5), h).eval({{"h", 10}}), 7);
}

// Nested floor and ceil divisions by constants combine, so an FPN's five stride-2 stages read
// ceil(h/32) instead of five nested floors (issue 15), and each form agrees with the nested
// integer arithmetic at every h.
TEST(Dim, NestedDivisionsCombine) {
  const Dim h = Dim::symbol("h"), w = Dim::symbol("w");
  auto floor_int = [](int64_t a, int64_t b) {
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
  };
  auto ceil_int = [&](int64_t a, int64_t b) { return -floor_int(-a, b); };
  // A 3x3 stride-2 convolution with pad 1 maps h to floor((h + 2 - 3)/2) + 1 = ceil(h/2).
  Dim x = h;
  for (int stage = 0; stage < 5; ++stage) x = Dim::floor_div(x + 2 - 3, Dim(2)) + 1;
  EXPECT_EQ(x.to_string(), "ceil(h/32)");
  EXPECT_EQ(x, Dim::ceil_div(h, Dim(32)));
  EXPECT_EQ(Dim::ceil_div(Dim::ceil_div(h, Dim(2)), Dim(2)), Dim::ceil_div(h, Dim(4)));
  EXPECT_EQ(Dim::floor_div(Dim::floor_div(h, Dim(2)), Dim(3)), Dim::floor_div(h, Dim(6)));
  EXPECT_EQ(Dim::floor_div(h, Dim(6)).to_string(), "floor(h/6)");
  EXPECT_EQ(Dim::ceil_div(h * 2, Dim(4)), Dim::ceil_div(h, Dim(2)));  // common factors divide out
  EXPECT_EQ(Dim::ceil_div(h * 4, Dim(4)), h);
  const Dim mixed = Dim::floor_div(Dim::floor_div(h, Dim(2)) + w, Dim(3));  // = floor((h + 2w)/6)
  EXPECT_EQ(mixed, Dim::floor_div(h + w * 2, Dim(6)));
  const Dim ceil_floor = Dim::ceil_div(Dim::floor_div(h + 1, Dim(3)), Dim(5));
  // A common factor divided out first still combines: 4*floor(h/8)/5844 = floor(floor(h/8)/1461)
  // is floor(h/11688), the form its printed text parses to (found by dim_parse_fuzz).
  const Dim scaled = Dim::floor_div(Dim::floor_div(h, Dim(8)) * 4, Dim(5844));
  EXPECT_EQ(scaled, Dim::floor_div(h, Dim(11688)));
  for (int64_t v = -70; v <= 200; ++v) {
    ASSERT_EQ(x.eval({{"h", v}}), [&] {
      int64_t r = v;
      for (int stage = 0; stage < 5; ++stage) r = floor_int(r - 1, 2) + 1;
      return r;
    }()) << v;
    ASSERT_EQ(Dim::ceil_div(h, Dim(32)).eval({{"h", v}}), ceil_int(v, 32)) << v;
    ASSERT_EQ(mixed.eval({{"h", v}, {"w", 7 - v}}), floor_int(floor_int(v, 2) + 7 - v, 3)) << v;
    ASSERT_EQ(ceil_floor.eval({{"h", v}}), ceil_int(floor_int(v + 1, 3), 5)) << v;
  }
  // The ceil spelling reads back to the same dim (plans store formulas as text).
  for (const Dim& d : {x, mixed, ceil_floor, scaled, Dim::ceil_div(h * 3 + w, Dim(4)),
                       Dim::ceil_div(h * 2 + 1, Dim(4))}) {
    auto again = Dim::parse(d.to_string());
    ASSERT_TRUE(again.has_value()) << d.to_string();
    EXPECT_EQ(*again, d) << d.to_string();
  }
}

// Two fuzz findings (onnx_build_fuzz, dim_parse_fuzz): a coefficient of INT64_MIN has no int64
// magnitude, and an unbounded end of an interval must stay unbounded after adding a finite one.
TEST(Dim, Int64MinCoefficientsAndUnboundedEnds) {
  const Dim h = Dim::symbol("h");
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const Dim low = Dim::ceil_div(h + kMin, Dim(4));
  EXPECT_EQ(low.eval({{"h", 4}}), -((int64_t(1) << 61) - 1));  // ceil((4 - 2^63)/4)
  EXPECT_EQ(Dim::ceil_div(h * kMin, Dim(6)).eval({{"h", 0}}), 0);
  auto wide = Dim::parse("toin-hrtt8*sfI*8*sfI*lt*h2hoInt*h*nt*ttoIn8*ois");
  ASSERT_TRUE(wide.has_value());
  SymbolRanges ranges;
  std::set<std::string> symbols;
  wide->collect_symbols(&symbols);
  int64_t v = 1;
  for (const std::string& s : symbols) ranges[s] = {1, 7 * v}, v = v * 3 + 1;
  EXPECT_EQ(wide->bounds(ranges).lo, -Interval::kInf);
}

TEST(Dim, ParsesExporterSpellingsAndRoundTrips) {
  for (const char* text : {"batch", "4*h", "seq_len + 1", "8*s39", "floor(h/2)", "s0//2",
                           "Mod(a, 4)", "min(a, b)", "ceil(h/3)", "2*(h + 1)"}) {
    auto d = Dim::parse(text);
    ASSERT_TRUE(d.has_value()) << text;
    auto again = Dim::parse(d->to_string());
    ASSERT_TRUE(again.has_value()) << d->to_string();
    EXPECT_EQ(*again, *d) << text << " printed as " << d->to_string();
  }
  EXPECT_EQ(Dim::parse("seq_len + 1")->eval({{"seq_len", 10}}), 11);
  EXPECT_EQ(Dim::parse("ceil(h/3)")->eval({{"h", 7}}), 3);
  EXPECT_FALSE(Dim::parse("batch size").has_value());
  EXPECT_FALSE(Dim::parse("4*").has_value());
  EXPECT_FALSE(Dim::parse("(((").has_value());
}

TEST(Dim, EvalFailsOnUnboundOverflowAndZeroDivision) {
  Dim a = Dim::symbol("a");
  EXPECT_FALSE(a.eval({}).has_value());
  EXPECT_FALSE((a * a).eval({{"a", int64_t(1) << 40}}).has_value());
  EXPECT_FALSE(Dim::floor_div(Dim(4), a).eval({{"a", 0}}).has_value());
}

TEST(Dim, Bounds) {
  Dim b = Dim::symbol("b");
  SymbolRanges r{{"b", {1, 32}}};
  Interval i = (b * 3 + 1).bounds(r);
  EXPECT_EQ(i.lo, 4);
  EXPECT_EQ(i.hi, 97);
  Interval m = Dim::mod(b, Dim(4)).bounds(r);
  EXPECT_EQ(m.lo, 0);
  EXPECT_EQ(m.hi, 3);
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {

TEST(Dim, SimplifyUsesSymbolRanges) {
  Dim s = Dim::symbol("seq_len");
  SymbolRanges r{{"seq_len", {1, 10}}};
  EXPECT_EQ((Dim::min(Dim(1), s) + s).simplify(r), s + 1);
  EXPECT_EQ(Dim::max(Dim(1), s).simplify(r), s);
  EXPECT_EQ(Dim::floor_div(s, Dim(16)).simplify(r), Dim(0));
  EXPECT_EQ(Dim::mod(s, Dim(16)).simplify(r), s);
  // Not decided by the ranges: stays symbolic.
  EXPECT_FALSE(Dim::min(Dim(4), s).simplify(r).is_const());
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {

// A Reshape's -1 divides the element count by the other dims: where the count is an integer
// multiple of them, the quotient is that integer (detection heads reshape [boxes * 4] to [boxes,
// 4]).
TEST(Dim, AnExactMultipleOfTheDivisorDividesToItsFactor) {
  const Dim a = Dim::symbol("a"), b = Dim::symbol("b");
  const Dim den = Dim(30) * a * b + Dim(15) * Dim::ceil_div(a, Dim(2));
  EXPECT_EQ(Dim::floor_div(Dim(4) * den, den), Dim(4));
  EXPECT_EQ(Dim::floor_div(Dim(120) * a * b + Dim(60) * Dim::ceil_div(a, Dim(2)), den), Dim(4));
  // Not a multiple: stays a division, exact where evaluated.
  const Dim q = Dim::floor_div(Dim(120) * a * b + Dim(61) * Dim::ceil_div(a, Dim(2)), den);
  EXPECT_FALSE(q.is_const());
  EXPECT_EQ(q.eval({{"a", 3}, {"b", 2}}), (120 * 6 + 61 * 2) / (30 * 6 + 15 * 2));
}

TEST(Dim, MinMaxUseThatDimsAreNonNegative) {
  Dim b = Dim::symbol("batch");
  EXPECT_EQ(Dim::max(b * 16, b * 32), b * 32);
  EXPECT_EQ(Dim::min(b * 16, b * 32 + 1), b * 16);
  EXPECT_FALSE(Dim::max(b, Dim(4)).is_const());
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {

// An arena slot's size over a dynamic-H/W network is a max over every value the slot holds, each
// with nested floors (fcn_resnet50 through the TorchScript exporter): it must read back from its
// text, while text nested past the parser's bounds is refused without recursing into it.
TEST(DimText, LongMaxChainsRoundTripAndDeepNestingIsRefused) {
  Dim b = Dim::symbol("batch"), h = Dim::symbol("h"), w = Dim::symbol("w");
  Dim slot = 0;
  Dim hh = h, ww = w;
  for (int i = 0; i < 300; ++i) {
    if (i % 40 == 0) hh = Dim::floor_div(hh + 1, 2), ww = Dim::floor_div(ww + 1, 2);
    slot = Dim::max(slot, int64_t(4 * (i + 1)) * b * hh * ww);
  }
  std::string text = slot.to_string();
  EXPECT_GT(text.size(), 4096u);
  auto again = Dim::parse(text);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, slot);

  std::string deep = std::string(1025, '(') + "h" + std::string(1025, ')');
  EXPECT_FALSE(Dim::parse(deep).has_value());
  std::string ok_deep = std::string(1000, '(') + "h" + std::string(1000, ')');
  ASSERT_TRUE(Dim::parse(ok_deep).has_value());
  EXPECT_EQ(*Dim::parse(ok_deep), h);
  EXPECT_FALSE(Dim::parse(std::string(40, '-') + "h").has_value());
  EXPECT_FALSE(Dim::parse(std::string((size_t(1) << 20) + 1, ' ')).has_value());
}

// Found by tests/fuzz/dim_parse_fuzz (corpus/dim_parse_fuzz/regress_wrapped_constant): products
// wrap, and a wrapped constant printed to a literal above 2^56 the parser refused, so the dim did
// not read back. Every constant Dim holds, INT64_MIN included, now survives its text form.
TEST(DimText, ConstantsOfEveryMagnitudeReadBack) {
  auto wrapped = Dim::parse("444444444444444448*3978");
  ASSERT_TRUE(wrapped.has_value());
  for (Dim d : {*wrapped, Dim(INT64_MIN), Dim(INT64_MAX), Dim(INT64_MIN) + Dim::symbol("n"),
                Dim(INT64_MIN) * Dim::symbol("n") - 1}) {
    auto again = Dim::parse(d.to_string());
    ASSERT_TRUE(again.has_value()) << d.to_string();
    EXPECT_EQ(*again, d) << d.to_string();
  }
  EXPECT_EQ(Dim::parse("9223372036854775807")->value(), INT64_MAX);
  EXPECT_FALSE(Dim::parse("9223372036854775809").has_value());  // beyond 2^63
  EXPECT_FALSE(Dim::parse("99999999999999999999").has_value());
}

}  // namespace
}  // namespace kiln::ir

// Schemas of the spatial op family: GridSample, AffineGrid, CenterCropPad, Einsum, DFT, STFT,
// MelWeightMatrix, BitCast and RoiAlign, plus the Einsum equation parser the CPU kernel shares
// (ops/spatial.h).
#include "ops/spatial.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/schema.h"

namespace kiln::ops {

using ir::Dim;

namespace {

int label_of(char c) {
  if (c >= 'a' && c <= 'z') return c - 'a';
  if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
  return -1;
}

std::string trim(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != ' ' && c != '\t') out.push_back(c);
  }
  return out;
}

// One term's letters and where its ellipsis sits (-1 when none).
struct Term {
  std::vector<int> letters;
  int ellipsis_at = -1;
};

StatusOr<Term> parse_term(const std::string& t, const std::string& what) {
  Term term;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '.') {
      if (t.compare(i, 3, "...") != 0 || term.ellipsis_at >= 0) {
        return invalid_argument("einsum " + what + " '" + t + "' has a malformed ellipsis");
      }
      term.ellipsis_at = int(term.letters.size());
      i += 2;
      continue;
    }
    int l = label_of(t[i]);
    if (l < 0) {
      return invalid_argument("einsum " + what + " '" + t + "' has character '" +
                              std::string(1, t[i]) + "', which is not a letter");
    }
    term.letters.push_back(l);
  }
  return term;
}

std::vector<int> expand(const Term& term, int ell_rank, int total_ell) {
  std::vector<int> out;
  for (int i = 0; i <= int(term.letters.size()); ++i) {
    if (i == term.ellipsis_at) {
      for (int k = total_ell - ell_rank; k < total_ell; ++k) {
        out.push_back(kEinsumEllipsisLabel + k);
      }
    }
    if (i < int(term.letters.size())) out.push_back(term.letters[size_t(i)]);
  }
  return out;
}

}  // namespace

StatusOr<EinsumSpec> parse_einsum(std::string_view equation, const std::vector<int>& ranks) {
  std::string eq = trim(equation);
  std::string lhs = eq, rhs;
  bool has_arrow = false;
  if (size_t p = eq.find("->"); p != std::string::npos) {
    lhs = eq.substr(0, p);
    rhs = eq.substr(p + 2);
    has_arrow = true;
  }
  std::vector<std::string> terms;
  size_t start = 0;
  while (true) {
    size_t c = lhs.find(',', start);
    terms.push_back(lhs.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  if (terms.size() != ranks.size()) {
    return invalid_argument("einsum equation '" + std::string(equation) + "' has " +
                            std::to_string(terms.size()) + " operand terms but the node has " +
                            std::to_string(ranks.size()) + " inputs");
  }
  EinsumSpec spec;
  std::vector<Term> parsed;
  std::vector<int> ell_ranks;
  for (size_t i = 0; i < terms.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Term t, parse_term(terms[i], "term " + std::to_string(i)));
    int letters = int(t.letters.size());
    int ell = 0;
    if (t.ellipsis_at >= 0) {
      ell = ranks[i] - letters;
      if (ell < 0) {
        return invalid_argument("einsum term '" + terms[i] + "' names more dims than input " +
                                std::to_string(i) + " has (rank " + std::to_string(ranks[i]) + ")");
      }
    } else if (letters != ranks[i]) {
      return invalid_argument("einsum term '" + terms[i] + "' names " + std::to_string(letters) +
                              " dims but input " + std::to_string(i) + " has rank " +
                              std::to_string(ranks[i]));
    }
    spec.ellipsis_rank = std::max(spec.ellipsis_rank, ell);
    ell_ranks.push_back(ell);
    parsed.push_back(std::move(t));
  }
  for (size_t i = 0; i < parsed.size(); ++i) {
    spec.inputs.push_back(expand(parsed[i], ell_ranks[i], spec.ellipsis_rank));
  }
  if (has_arrow) {
    KILN_ASSIGN_OR_RETURN(Term out, parse_term(rhs, "output"));
    std::vector<int> seen(size_t(kEinsumEllipsisLabel), 0);
    for (int l : out.letters) {
      if (seen[size_t(l)]++) return invalid_argument("einsum output '" + rhs + "' repeats a label");
      bool found = false;
      for (const Term& t : parsed) {
        found = found || std::find(t.letters.begin(), t.letters.end(), l) != t.letters.end();
      }
      if (!found) {
        return invalid_argument("einsum output '" + rhs + "' has a label no operand has");
      }
    }
    spec.output = expand(out, out.ellipsis_at >= 0 ? spec.ellipsis_rank : 0, spec.ellipsis_rank);
    // Ellipsis dims absent from the output are summed over, like any other missing label.
  } else {
    // Implicit output: the ellipsis dims, then the letters used exactly once, in alphabetical
    // (ASCII: upper case first) order.
    for (int k = 0; k < spec.ellipsis_rank; ++k) spec.output.push_back(kEinsumEllipsisLabel + k);
    std::vector<int> count(size_t(kEinsumEllipsisLabel), 0);
    for (const Term& t : parsed) {
      for (int l : t.letters) ++count[size_t(l)];
    }
    for (int l = 26; l < 52; ++l) {
      if (count[size_t(l)] == 1) spec.output.push_back(l);
    }
    for (int l = 0; l < 26; ++l) {
      if (count[size_t(l)] == 1) spec.output.push_back(l);
    }
  }
  return spec;
}

namespace {

std::string input_label(const InferContext& ctx, int i) {
  return "input " + std::to_string(i) + " ('" + ctx.input(i).name + "')";
}

Status attr_error(const InferContext& ctx, const Status& s) {
  return ctx.error(s.code(), s.message());
}

bool is_numeric(DType d) { return is_float(d) || is_integer(d); }

Status require_float(const InferContext& ctx, int i) {
  if (is_float(ctx.input_dtype(i))) return ok_status();
  return ctx.error(StatusCode::kInvalidModel, input_label(ctx, i) + " has dtype " +
                                                  std::string(dtype_name(ctx.input_dtype(i))) +
                                                  "; " + ctx.node().op_type +
                                                  " takes float tensors");
}

// ---- GridSample ----

Status infer_grid_sample(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float(ctx, 1));
  DType dt = ctx.input_dtype(0);
  if (!is_numeric(dt)) {
    return ctx.error(StatusCode::kInvalidModel, input_label(ctx, 0) + " must be numeric");
  }
  auto mode = ctx.attrs().get_string("mode", "linear");
  if (!mode.ok()) return attr_error(ctx, mode.status());
  const std::vector<std::string> modes = {"linear", "bilinear", "nearest", "cubic", "bicubic"};
  if (std::find(modes.begin(), modes.end(), *mode) == modes.end()) {
    return ctx.error(StatusCode::kInvalidModel, "attribute mode '" + *mode +
                                                    "' is not one of "
                                                    "linear, bilinear, nearest, cubic, bicubic");
  }
  auto pad = ctx.attrs().get_string("padding_mode", "zeros");
  if (!pad.ok()) return attr_error(ctx, pad.status());
  if (*pad != "zeros" && *pad != "border" && *pad != "reflection") {
    return ctx.error(StatusCode::kInvalidModel, "attribute padding_mode '" + *pad +
                                                    "' is not one of zeros, border, reflection");
  }
  auto ac = ctx.attrs().get_int("align_corners", 0);
  if (!ac.ok()) return attr_error(ctx, ac.status());
  const auto& x = ctx.input_shape(0);
  const auto& g = ctx.input_shape(1);
  if (x.size() < 3) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "X must have rank 3 or more (N, C, spatial...), got " + std::to_string(x.size()));
  }
  if (g.size() != x.size()) {
    return ctx.error(StatusCode::kInvalidModel, "grid has rank " + std::to_string(g.size()) +
                                                    " but X has rank " + std::to_string(x.size()) +
                                                    "; they must match");
  }
  int r = int(x.size()) - 2;
  KILN_RETURN_IF_ERROR(ctx.require_equal(g[0], x[0], "grid dim 0 matches X's batch"));
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(g.back(), Dim(r), "grid's last dim equals the number of spatial dims"));
  std::vector<Dim> out = {x[0], x[1]};
  for (size_t d = 1; d + 1 < g.size(); ++d) out.push_back(g[d]);
  ctx.set_output(0, dt, out);
  return ok_status();
}

// ---- AffineGrid ----

Status infer_affine_grid(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float(ctx, 0));
  auto ac = ctx.attrs().get_int("align_corners", 0);
  if (!ac.ok()) return attr_error(ctx, ac.status());
  const auto& theta = ctx.input_shape(0);
  if (theta.size() != 3) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "theta must have rank 3 (N, 2, 3) or (N, 3, 4), got rank " + std::to_string(theta.size()));
  }
  KILN_ASSIGN_OR_RETURN(auto size, ctx.require_value(1, "size"));
  if (size.size() != 4 && size.size() != 5) {
    return ctx.error(StatusCode::kInvalidModel,
                     "size must have 4 (N, C, H, W) or 5 (N, C, D, H, W) elements, got " +
                         std::to_string(size.size()));
  }
  int r = int(size.size()) - 2;
  KILN_RETURN_IF_ERROR(ctx.require_equal(theta[0], size[0], "theta's batch equals size[0]"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(theta[1], Dim(r), "theta dim 1 is the spatial rank"));
  KILN_RETURN_IF_ERROR(ctx.require_equal(theta[2], Dim(r + 1), "theta dim 2 is spatial rank + 1"));
  std::vector<Dim> out = {size[0]};
  for (size_t d = 2; d < size.size(); ++d) out.push_back(size[d]);
  out.push_back(Dim(r));
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

// ---- CenterCropPad ----

Status infer_center_crop_pad(InferContext& ctx) {
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  KILN_ASSIGN_OR_RETURN(auto shape, ctx.require_value(1, "shape"));
  std::vector<int64_t> axes;
  if (ctx.attrs().has("axes")) {
    auto a = ctx.attrs().get_ints("axes", std::nullopt);
    if (!a.ok()) return attr_error(ctx, a.status());
    for (int64_t v : *a) {
      KILN_ASSIGN_OR_RETURN(int ax, ctx.normalize_axis(v, rank, "axes"));
      if (std::find(axes.begin(), axes.end(), ax) != axes.end()) {
        return ctx.error(StatusCode::kInvalidModel,
                         "attribute axes repeats axis " + std::to_string(ax));
      }
      axes.push_back(ax);
    }
  } else {
    for (int d = 0; d < rank; ++d) axes.push_back(d);
  }
  if (shape.size() != axes.size()) {
    return ctx.error(StatusCode::kInvalidModel, "shape has " + std::to_string(shape.size()) +
                                                    " elements but there are " +
                                                    std::to_string(axes.size()) + " axes");
  }
  std::vector<Dim> out = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    KILN_RETURN_IF_ERROR(ctx.require_ge(shape[i], Dim(0), "shape[" + std::to_string(i) + "] >= 0"));
    out[size_t(axes[i])] = shape[i];
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

// ---- Einsum ----

Status infer_einsum(InferContext& ctx) {
  auto eq = ctx.attrs().get_string("equation", std::nullopt);
  if (!eq.ok()) return attr_error(ctx, eq.status());
  std::vector<int> ranks;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) {
      return ctx.error(StatusCode::kInvalidModel, "input " + std::to_string(i) + " is missing");
    }
    if (ctx.input_dtype(i) != ctx.input_dtype(0) || !is_numeric(ctx.input_dtype(i))) {
      return ctx.error(StatusCode::kInvalidModel, input_label(ctx, i) + " has dtype " +
                                                      std::string(dtype_name(ctx.input_dtype(i))) +
                                                      "; Einsum takes numeric inputs of one dtype");
    }
    ranks.push_back(ctx.input_rank(i));
  }
  auto spec = parse_einsum(*eq, ranks);
  if (!spec.ok()) return attr_error(ctx, spec.status());
  std::vector<std::optional<Dim>> dims(size_t(spec->num_labels()));
  for (size_t i = 0; i < spec->inputs.size(); ++i) {
    const auto& shape = ctx.input_shape(int(i));
    for (size_t d = 0; d < shape.size(); ++d) {
      int l = spec->inputs[i][d];
      auto& slot = dims[size_t(l)];
      std::string what = "Einsum input " + std::to_string(i) + " dim " + std::to_string(d);
      if (!slot) {
        slot = shape[d];
      } else if (l >= kEinsumEllipsisLabel) {
        KILN_ASSIGN_OR_RETURN(*slot, ctx.broadcast_dim(*slot, shape[d], what + " broadcasts"));
      } else {
        KILN_RETURN_IF_ERROR(ctx.require_equal(shape[d], *slot, what + " matches its label"));
      }
    }
  }
  std::vector<Dim> out;
  for (int l : spec->output) out.push_back(dims[size_t(l)].value_or(Dim(1)));
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

// ---- DFT ----

Status infer_dft(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float(ctx, 0));
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  if (rank < 2) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "input must have rank 2 or more ([..., signal, 1 or 2]), got " + std::to_string(rank));
  }
  KILN_RETURN_IF_ERROR(ctx.require_ge(Dim(2), x.back(), "input's last dim is 1 or 2"));
  auto onesided = ctx.attrs().get_int("onesided", 0);
  if (!onesided.ok()) return attr_error(ctx, onesided.status());
  auto inverse = ctx.attrs().get_int("inverse", 0);
  if (!inverse.ok()) return attr_error(ctx, inverse.status());
  int64_t axis = 1;
  if (ctx.opset() >= 20) {
    axis = -2;
    if (ctx.has_input(2)) {
      KILN_ASSIGN_OR_RETURN(auto v, ctx.require_value(2, "axis"));
      if (v.size() != 1 || !v[0].is_const()) {
        return ctx.error(StatusCode::kInvalidModel, "input 2 (axis) must be one integer");
      }
      axis = v[0].value();
    }
  } else {
    auto a = ctx.attrs().get_int("axis", 1);
    if (!a.ok()) return attr_error(ctx, a.status());
    axis = *a;
  }
  if (axis < -rank || axis > rank - 2 || axis == -1) {
    return ctx.error(StatusCode::kInvalidModel, "axis " + std::to_string(axis) + " is outside [-" +
                                                    std::to_string(rank) + ", -2] and [0, " +
                                                    std::to_string(rank - 2) + "]");
  }
  if (axis < 0) axis += rank;
  // Inverse and onesided is the inverse real FFT: n/2+1 bins in, n real samples out.
  const bool irfft = *inverse && *onesided;
  Dim n = irfft ? Dim(2) * (x[size_t(axis)] - Dim(1)) : x[size_t(axis)];
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(auto len, ctx.require_value(1, "dft_length"));
    if (len.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel, "input 1 (dft_length) must be one integer");
    }
    KILN_RETURN_IF_ERROR(ctx.require_ge(len[0], Dim(1), "dft_length >= 1"));
    n = len[0];
  }
  std::vector<Dim> out = x;
  out[size_t(axis)] = (*onesided && !irfft) ? Dim::floor_div(n, Dim(2)) + Dim(1) : n;
  out.back() = Dim(irfft ? 1 : 2);
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

// ---- STFT ----

// A scalar integer input known at build time (STFT's frame_step and frame_length).
StatusOr<Dim> scalar_int_input(const InferContext& ctx, int i, const char* what) {
  if (!is_integer(ctx.input_dtype(i)) || ctx.input_rank(i) > 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     input_label(ctx, i) + " (" + what + ") must be an integer scalar, got " +
                         std::string(dtype_name(ctx.input_dtype(i))) + " of rank " +
                         std::to_string(ctx.input_rank(i)));
  }
  KILN_ASSIGN_OR_RETURN(auto v, ctx.require_value(i, what));
  if (v.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     input_label(ctx, i) + " (" + what + ") must hold one integer");
  }
  return v[0];
}

// Signal [batch, length, 1 or 2] framed every frame_step samples into frames of frame_length
// (the window's length, or the signal's when neither is given, as the ONNX reference does), each
// weighted by the window and transformed: [batch, frames, bins, 2].
Status infer_stft(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float(ctx, 0));
  const auto& x = ctx.input_shape(0);
  if (x.size() != 3) {
    return ctx.error(
        StatusCode::kInvalidModel,
        "signal must have rank 3 ([batch, length, 1 or 2]), got " + std::to_string(x.size()));
  }
  KILN_RETURN_IF_ERROR(ctx.require_ge(Dim(2), x[2], "signal's last dim is 1 or 2"));
  KILN_RETURN_IF_ERROR(ctx.require_ge(x[2], Dim(1), "signal's last dim is 1 or 2"));
  auto onesided = ctx.attrs().get_int("onesided", 1);
  if (!onesided.ok()) return attr_error(ctx, onesided.status());
  if (*onesided != 0 && *onesided != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute onesided is " + std::to_string(*onesided) + ", expected 0 or 1");
  }
  KILN_ASSIGN_OR_RETURN(Dim step, scalar_int_input(ctx, 1, "frame_step"));
  KILN_RETURN_IF_ERROR(ctx.require_ge(step, Dim(1), "frame_step >= 1"));
  std::optional<Dim> length;
  if (ctx.has_input(2)) {
    if (ctx.input_dtype(2) != ctx.input_dtype(0) || ctx.input_rank(2) != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       input_label(ctx, 2) + " (window) must be 1-D of the signal's dtype " +
                           std::string(dtype_name(ctx.input_dtype(0))));
    }
    length = ctx.input_shape(2)[0];
  }
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(Dim fl, scalar_int_input(ctx, 3, "frame_length"));
    if (length) {
      KILN_RETURN_IF_ERROR(
          ctx.require_equal(fl, *length, "frame_length equals the window's length"));
    }
    length = fl;
  }
  const Dim n = length.value_or(x[1]);
  KILN_RETURN_IF_ERROR(ctx.require_ge(n, Dim(1), "the frame length is at least 1"));
  KILN_RETURN_IF_ERROR(ctx.require_ge(x[1], n, "the signal is at least one frame long"));
  const Dim frames = Dim::floor_div(x[1] - n, step) + Dim(1);
  const Dim bins = *onesided ? Dim::floor_div(n, Dim(2)) + Dim(1) : n;
  ctx.set_output(0, ctx.input_dtype(0), {x[0], frames, bins, Dim(2)});
  return ok_status();
}

// ---- MelWeightMatrix ----

// A scalar input whose data must be known at build time: the op then always folds (the ONNX
// node tests feed these as graph inputs, which the profile gives as shape values).
StatusOr<double> scalar_constant(const InferContext& ctx, int i, const char* what) {
  const Tensor* t = ctx.input_constant(i);
  if (t && t->numel() == 1 && (is_float(t->dtype()) || is_integer(t->dtype()))) {
    return is_float(t->dtype()) ? t->float_at(0) : double(t->int_at(0));
  }
  if (!t && is_integer(ctx.input_dtype(i))) {
    auto v = ctx.input_value(i);
    if (v && v->size() == 1 && (*v)[0].is_const()) return double((*v)[0].value());
  }
  if (t && t->numel() != 1) {
    return ctx.error(StatusCode::kInvalidModel, input_label(ctx, i) + " (" + what +
                                                    ") must hold one element, not " +
                                                    std::to_string(t->numel()));
  }
  return ctx.error(StatusCode::kUnsupported,
                   input_label(ctx, i) + " (" + what +
                       ") of MelWeightMatrix must be a scalar constant at build time");
}

Status infer_mel_weight_matrix(InferContext& ctx) {
  const char* names[] = {"num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
                         "upper_edge_hertz"};
  for (int i = 0; i < 5; ++i) {
    const bool want_float = i >= 3;
    const DType dt = ctx.input_dtype(i);
    if (want_float ? !is_float(dt) : !is_integer(dt)) {
      return ctx.error(StatusCode::kInvalidModel,
                       input_label(ctx, i) + " (" + names[i] + ") has dtype " +
                           std::string(dtype_name(dt)) + "; expected " +
                           (want_float ? "a float" : "an integer") + " scalar");
    }
  }
  double v[5];
  for (int i = 0; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(v[i], scalar_constant(ctx, i, names[i]));
  }
  auto odt = ctx.attrs().get_int("output_datatype", 1);
  if (!odt.ok()) return attr_error(ctx, odt.status());
  const DType dt =
      *odt >= INT32_MIN && *odt <= INT32_MAX ? dtype_from_onnx(int32_t(*odt)) : DType::kUndefined;
  if (dt != DType::kFloat32 && dt != DType::kFloat64 && dt != DType::kFloat16 &&
      dt != DType::kBFloat16) {
    return ctx.error(StatusCode::kUnsupported,
                     "output_datatype " + std::to_string(*odt) + " is not a supported float dtype");
  }
  constexpr double kMaxBins = double(int64_t(1) << 24);
  if (!(v[0] >= 1 && v[0] <= kMaxBins) || !(v[1] >= 1 && v[1] <= 2 * kMaxBins)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "num_mel_bins (" + std::to_string(int64_t(v[0])) + ") and dft_length (" +
                         std::to_string(int64_t(v[1])) + ") must be in [1, 2^24] and [1, 2^25]");
  }
  if (!(v[2] >= 1)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "sample_rate is " + std::to_string(int64_t(v[2])) + ", expected > 0");
  }
  // Edges past the Nyquist frequency land past the last bin: the kernel refuses those, with
  // the bin they map to.
  if (!std::isfinite(v[3]) || !std::isfinite(v[4]) || !(v[3] >= 0) || !(v[4] >= v[3])) {
    return ctx.error(StatusCode::kInvalidModel,
                     "lower_edge_hertz (" + std::to_string(v[3]) + ") and upper_edge_hertz (" +
                         std::to_string(v[4]) + ") must satisfy 0 <= lower <= upper");
  }
  ctx.set_output(0, dt, {Dim(int64_t(v[1]) / 2 + 1), Dim(int64_t(v[0]))});
  return ok_status();
}

// ---- BitCast ----

Status infer_bitcast(InferContext& ctx) {
  auto to = ctx.attrs().get_int("to", std::nullopt);
  if (!to.ok()) return attr_error(ctx, to.status());
  DType dt =
      (*to < INT32_MIN || *to > INT32_MAX) ? DType::kUndefined : dtype_from_onnx(int32_t(*to));
  DType src = ctx.input_dtype(0);
  if (dt == DType::kUndefined || !(is_numeric(dt) || dt == DType::kBool)) {
    return ctx.error(StatusCode::kUnsupported,
                     "BitCast to ONNX dtype " + std::to_string(*to) + " is not supported");
  }
  if (dtype_size(dt) != dtype_size(src)) {
    return ctx.error(StatusCode::kUnsupported,
                     "BitCast from " + std::string(dtype_name(src)) + " to " +
                         std::string(dtype_name(dt)) +
                         " changes the element size; kiln supports same-size casts only");
  }
  ctx.set_output(0, dt, ctx.input_shape(0));
  return ok_status();
}

// ---- RoiAlign ----

Status infer_roi_align(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_float(ctx, 0));
  if (ctx.input_dtype(1) != ctx.input_dtype(0)) {
    return ctx.error(StatusCode::kInvalidModel,
                     input_label(ctx, 1) + " (rois) has dtype " +
                         std::string(dtype_name(ctx.input_dtype(1))) + " but X has " +
                         std::string(dtype_name(ctx.input_dtype(0))) + "; they must match");
  }
  if (ctx.input_dtype(2) != DType::kInt64) {
    return ctx.error(StatusCode::kInvalidModel,
                     input_label(ctx, 2) + " (batch_indices) has dtype " +
                         std::string(dtype_name(ctx.input_dtype(2))) + ", expected int64");
  }
  // Opset 10 has no coordinate_transformation_mode: it behaves as output_half_pixel.
  auto ctm = ctx.attrs().get_string("coordinate_transformation_mode",
                                    ctx.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  if (!ctm.ok()) return attr_error(ctx, ctm.status());
  if (*ctm != "half_pixel" && *ctm != "output_half_pixel") {
    return ctx.error(StatusCode::kInvalidModel, "attribute coordinate_transformation_mode '" +
                                                    *ctm +
                                                    "' is not half_pixel or output_half_pixel");
  }
  auto mode = ctx.attrs().get_string("mode", "avg");
  if (!mode.ok()) return attr_error(ctx, mode.status());
  if (*mode != "avg" && *mode != "max") {
    return ctx.error(StatusCode::kInvalidModel, "attribute mode '" + *mode + "' is not avg or max");
  }
  std::vector<Dim> out_hw;
  for (const char* name : {"output_height", "output_width"}) {
    auto v = ctx.attrs().get_int(name, 1);
    if (!v.ok()) return attr_error(ctx, v.status());
    if (*v < 1 || *v > (int64_t(1) << 31)) {
      return ctx.error(StatusCode::kInvalidModel, "attribute " + std::string(name) + " is " +
                                                      std::to_string(*v) + ", expected 1 to 2^31");
    }
    out_hw.push_back(Dim(*v));
  }
  auto ratio = ctx.attrs().get_int("sampling_ratio", 0);
  if (!ratio.ok()) return attr_error(ctx, ratio.status());
  if (*ratio < 0) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute sampling_ratio is " + std::to_string(*ratio) + ", expected >= 0");
  }
  auto scale = ctx.attrs().get_float("spatial_scale", 1.0f);
  if (!scale.ok()) return attr_error(ctx, scale.status());
  if (!std::isfinite(*scale)) {
    return ctx.error(StatusCode::kInvalidModel, "attribute spatial_scale is not finite");
  }
  const auto& x = ctx.input_shape(0);
  const auto& rois = ctx.input_shape(1);
  const auto& idx = ctx.input_shape(2);
  if (x.size() != 4) {
    return ctx.error(StatusCode::kInvalidModel,
                     "X must have rank 4 (N, C, H, W), got " + std::to_string(x.size()));
  }
  if (rois.size() != 2) {
    return ctx.error(StatusCode::kInvalidModel,
                     "rois must have rank 2 (num_rois, 4), got " + std::to_string(rois.size()));
  }
  if (idx.size() != 1) {
    return ctx.error(StatusCode::kInvalidModel, "batch_indices must have rank 1 (num_rois), got " +
                                                    std::to_string(idx.size()));
  }
  KILN_RETURN_IF_ERROR(ctx.require_equal(rois[1], Dim(4), "rois dim 1 is 4 (x1, y1, x2, y2)"));
  KILN_RETURN_IF_ERROR(
      ctx.require_equal(idx[0], rois[0], "batch_indices dim 0 equals rois dim 0 (num_rois)"));
  ctx.set_output(0, ctx.input_dtype(0), {rois[0], x[1], out_hw[0], out_hw[1]});
  return ok_status();
}

}  // namespace

void register_spatial_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kGridSample, 2, 2, 1, 1, &infer_grid_sample, false, false});
  r.add(OpSchema{OpKind::kAffineGrid, 2, 2, 1, 1, &infer_affine_grid, false, false});
  r.add(OpSchema{OpKind::kCenterCropPad, 2, 2, 1, 1, &infer_center_crop_pad, false, false});
  r.add(OpSchema{OpKind::kEinsum, 1, 1 << 30, 1, 1, &infer_einsum,
                 OpTraits{.inputs_required = true}});
  r.add(OpSchema{OpKind::kDFT, 1, 3, 1, 1, &infer_dft, false, false});
  r.add(OpSchema{OpKind::kSTFT, 2, 4, 1, 1, &infer_stft, false, false});
  r.add(OpSchema{OpKind::kMelWeightMatrix, 5, 5, 1, 1, &infer_mel_weight_matrix, false, false});
  r.add(OpSchema{OpKind::kBitCast, 1, 1, 1, 1, &infer_bitcast, false, false});
  r.add(OpSchema{OpKind::kRoiAlign, 3, 3, 1, 1, &infer_roi_align, false, false});
}

}  // namespace kiln::ops

// Schemas of the resize op family: Resize (opset 10..19, scales or sizes, axes, aspect-ratio
// policies), DepthToSpace (DCR/CRD) and SpaceToDepth.
#include <algorithm>
#include <cmath>

#include "ops/schema.h"
#include "ops/value_range.h"

namespace kiln::ops {
namespace {

bool one_of(const std::string& s, std::initializer_list<const char*> options) {
  for (const char* o : options) {
    if (s == o) return true;
  }
  return false;
}

// True when an input is omitted or is an empty 1-D tensor (opset 11-12 pass "" or [] for the
// unused one of scales/sizes).
bool input_empty(const InferContext& ctx, int i) {
  if (!ctx.has_input(i)) return true;
  const auto& s = ctx.input_shape(i);
  return s.size() == 1 && s[0].is_const() && s[0].value() == 0;
}

// floor(in * f), kept symbolic where it can be exact: an integer f multiplies, a dyadic f = p/2^k
// (0.5, 1.5, 0.25...) is floor_div(in*p, 2^k), and any other f needs a constant dim.
StatusOr<ir::Dim> scaled_dim(InferContext& ctx, const ir::Dim& in, double f, int axis) {
  constexpr double kLimit = double(int64_t(1) << 31);
  if (f >= 0 && f < kLimit) {
    for (int64_t q = 1; q <= (int64_t(1) << 16); q *= 2) {
      double p = f * double(q);
      if (p == std::floor(p) && p < kLimit) {
        const std::string what =
            "output dim " + std::to_string(axis) + " scaled by " + std::to_string(f);
        KILN_ASSIGN_OR_RETURN(ir::Dim scaled, ctx.mul_dims(in, ir::Dim(int64_t(p)), what));
        if (q == 1) return scaled;
        return ir::Dim::floor_div(scaled, ir::Dim(q));
      }
    }
  }
  if (in.is_const()) {
    double v = std::floor(double(in.value()) * f);
    if (!(v >= 0 && v < double(int64_t(1) << 62))) {
      return ctx.error(StatusCode::kInvalidModel, "output dim " + std::to_string(axis) + " floor(" +
                                                      in.to_string() + " * " + std::to_string(f) +
                                                      ") is out of range");
    }
    return ir::Dim(int64_t(v));
  }
  return ctx.error(StatusCode::kUnsupported,
                   "scale " + std::to_string(f) + " on axis " + std::to_string(axis) +
                       " of symbolic dim " + in.to_string() +
                       " has no exact symbolic form (use an integer or dyadic scale, or sizes)");
}

StatusOr<std::vector<float>> constant_floats(InferContext& ctx, int i, std::string_view what) {
  const Tensor* t = ctx.input_constant(i);
  if (!t) {
    return ctx.error(StatusCode::kUnsupported,
                     "input " + std::to_string(i) + " ('" + ctx.input(i).name + "', the " +
                         std::string(what) +
                         ") is computed at run time; kiln needs it known at build time");
  }
  if (!is_float(t->dtype())) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input " + std::to_string(i) + " (" + std::string(what) + ") must be float");
  }
  std::vector<float> out(size_t(t->numel()));
  for (int64_t k = 0; k < t->numel(); ++k) out[k] = float(t->float_at(k));
  return out;
}

// The value ranges of the sizes or scales input (`n` elements), computed at run time.
StatusOr<std::vector<ElementRange>> input_ranges(InferContext& ctx, int i, std::string_view what,
                                                 size_t n) {
  auto ranges = value_range(ctx.graph(), ctx.node().inputs[i], ctx.symbol_ranges());
  if (!ranges) {
    // Not a small tensor of known shape: the refusal of old says why.
    KILN_RETURN_IF_ERROR(ctx.require_value(i, what).status());
    return ctx.error(StatusCode::kInternal, std::string(what) + " has no value range");
  }
  if (ranges->size() != n) {
    return ctx.error(StatusCode::kInvalidModel, std::string(what) + " has " +
                                                    std::to_string(ranges->size()) +
                                                    " elements; expected " + std::to_string(n));
  }
  return *ranges;
}

// floor(in * s) for a scale s computed at run time: exact where s is a known integer, else a
// data-dependent dim bounded by floor(in * N / D) with N / D (D = 1024) at or above the scale's
// upper bound, a formula over the input's dims that the run evaluates for its shapes.
StatusOr<ir::Dim> scaled_by_data(InferContext& ctx, const ir::Dim& in, const ElementRange& s,
                                 int axis, const std::string& scales_name) {
  const std::string what = "output dim " + std::to_string(axis) + " scaled by data";
  if (s.exact) {
    // An integer scale: floor(in * s) is in * s.
    KILN_RETURN_IF_ERROR(
        ctx.require_ge(*s.exact, 1, "the integer scale of axis " + std::to_string(axis) + " > 0"));
    return ctx.mul_dims(in, *s.exact, what);
  }
  constexpr int64_t kDenominator = 1024;
  std::optional<ir::Dim> bound;
  if (s.hi < double(int64_t(1) << 31)) {
    const int64_t num = std::max<int64_t>(int64_t(std::ceil(s.hi * double(kDenominator))) + 1, 0);
    KILN_ASSIGN_OR_RETURN(ir::Dim scaled, ctx.mul_dims(in, ir::Dim(num), what));
    bound = ir::Dim::floor_div(scaled, ir::Dim(kDenominator));
  }
  // The least size: floor(in * M / D) with M / D at or below the scale's lower bound.
  ir::Dim lower = 0;
  if (s.lo > 0 && s.lo < s.hi && s.lo < double(int64_t(1) << 31)) {
    const int64_t num = std::max<int64_t>(int64_t(std::floor(s.lo * double(kDenominator))) - 1, 0);
    if (num > 0) {
      KILN_ASSIGN_OR_RETURN(ir::Dim scaled, ctx.mul_dims(in, ir::Dim(num), what));
      lower = ir::Dim::floor_div(scaled, ir::Dim(kDenominator));
    }
  }
  return ctx.range_bounded_dim(
      0, axis, "resized", bound,
      "the scale of axis " + std::to_string(axis) + " (in '" + scales_name +
          "') is computed from tensor data at run time and has no upper bound kiln can "
          "prove from the profile's shapes; kiln sizes memory by such a bound",
      lower);
}

Status infer_resize(InferContext& ctx) {
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank >= 1");
  bool opset10 = ctx.opset() > 0 && ctx.opset() < 11;
  int roi_in = opset10 ? -1 : 1, scales_in = opset10 ? 1 : 2, sizes_in = opset10 ? -1 : 3;
  if (ctx.num_inputs() > (opset10 ? 2 : 4)) {
    return ctx.error(StatusCode::kInvalidModel, "too many inputs for this opset");
  }
  const ir::Attributes& at = ctx.attrs();
  KILN_ASSIGN_OR_RETURN(std::string mode, at.get_string("mode", "nearest"));
  KILN_ASSIGN_OR_RETURN(std::string ctm,
                        at.get_string("coordinate_transformation_mode", "half_pixel"));
  KILN_ASSIGN_OR_RETURN(std::string nearest_mode,
                        at.get_string("nearest_mode", "round_prefer_floor"));
  KILN_ASSIGN_OR_RETURN(std::string policy, at.get_string("keep_aspect_ratio_policy", "stretch"));
  KILN_ASSIGN_OR_RETURN(int64_t antialias, at.get_int("antialias", 0));
  if (antialias != 0 && antialias != 1) {
    return ctx.error(StatusCode::kInvalidModel,
                     "attribute antialias is " + std::to_string(antialias) + ", expected 0 or 1");
  }
  KILN_ASSIGN_OR_RETURN(int64_t exclude_outside, at.get_int("exclude_outside", 0));
  KILN_RETURN_IF_ERROR(at.get_float("cubic_coeff_a", -0.75f).status());
  KILN_RETURN_IF_ERROR(at.get_float("extrapolation_value", 0.f).status());
  (void)exclude_outside;
  if (!one_of(mode, {"nearest", "linear", "cubic"})) {
    return ctx.error(StatusCode::kInvalidModel, "unknown mode '" + mode + "'");
  }
  if (opset10) ctm = "asymmetric";
  if (!one_of(ctm, {"half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners",
                    "tf_crop_and_resize", "half_pixel_symmetric"})) {
    return ctx.error(StatusCode::kInvalidModel,
                     "unknown coordinate_transformation_mode '" + ctm + "'");
  }
  if (!one_of(nearest_mode, {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})) {
    return ctx.error(StatusCode::kInvalidModel, "unknown nearest_mode '" + nearest_mode + "'");
  }
  if (!one_of(policy, {"stretch", "not_larger", "not_smaller"})) {
    return ctx.error(StatusCode::kInvalidModel,
                     "unknown keep_aspect_ratio_policy '" + policy + "'");
  }
  if (opset10 && mode == "cubic") {
    return ctx.error(StatusCode::kInvalidModel, "mode 'cubic' needs opset 11");
  }
  if (is_integer(ctx.input_dtype(0)) && mode != "nearest") {
    return ctx.error(StatusCode::kUnsupported, "mode '" + mode + "' on integer input " +
                                                   std::string(dtype_name(ctx.input_dtype(0))));
  }
  if (!is_float(ctx.input_dtype(0)) && !is_integer(ctx.input_dtype(0))) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 dtype is not numeric");
  }

  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> raw_axes, at.get_ints("axes", std::vector<int64_t>{}));
  std::vector<int> axes;
  for (int64_t a : raw_axes) {
    KILN_ASSIGN_OR_RETURN(int d, ctx.normalize_axis(a, rank, "attribute 'axes' element"));
    if (std::find(axes.begin(), axes.end(), d) != axes.end()) {
      return ctx.error(StatusCode::kInvalidModel,
                       "attribute 'axes' repeats axis " + std::to_string(a));
    }
    axes.push_back(d);
  }
  if (axes.empty()) {
    for (int d = 0; d < rank; ++d) axes.push_back(d);
  }
  size_t n = axes.size();

  bool has_scales = !input_empty(ctx, scales_in);
  bool has_sizes = sizes_in >= 0 && !input_empty(ctx, sizes_in);
  if (has_scales == has_sizes) {
    return ctx.error(StatusCode::kInvalidModel,
                     has_scales ? "both scales and sizes are given; exactly one must be"
                                : "neither scales nor sizes is given; exactly one must be");
  }
  std::vector<ir::Dim> out(x.begin(), x.end());
  // Scales or sizes a node computes at run time; a model input is refused below by require_value,
  // which tells how the profile can give its values.
  if (has_scales && !ctx.input_constant(scales_in) && ctx.input(scales_in).producer >= 0) {
    if (ctm == "tf_crop_and_resize") {
      return ctx.error(StatusCode::kUnsupported,
                       "scales computed at run time with tf_crop_and_resize: kiln needs the scales "
                       "known at build "
                       "time to size the crop");
    }
    KILN_ASSIGN_OR_RETURN(auto ranges, input_ranges(ctx, scales_in, "scales", n));
    for (size_t k = 0; k < n; ++k) {
      KILN_ASSIGN_OR_RETURN(out[axes[k]], scaled_by_data(ctx, x[axes[k]], ranges[k], axes[k],
                                                         ctx.input(scales_in).name));
    }
  } else if (has_sizes && !ctx.input_value(sizes_in) && ctx.input(sizes_in).producer >= 0) {
    if (policy != "stretch") {
      return ctx.error(StatusCode::kUnsupported,
                       "keep_aspect_ratio_policy '" + policy +
                           "' with sizes computed at run time: kiln needs constant "
                           "sizes and input dims for it");
    }
    KILN_ASSIGN_OR_RETURN(auto ranges, input_ranges(ctx, sizes_in, "sizes", n));
    for (size_t k = 0; k < n; ++k) {
      const int axis = axes[k];
      const ElementRange& r = ranges[k];
      if (r.exact) {
        KILN_RETURN_IF_ERROR(
            ctx.require_ge(*r.exact, 0, "sizes element " + std::to_string(k) + " >= 0"));
        out[axis] = *r.exact;
        continue;
      }
      std::optional<ir::Dim> bound;
      if (r.hi < double(ir::Interval::kInf))
        bound = ir::Dim(std::max<int64_t>(int64_t(std::floor(r.hi)), 0));
      // The least size, where the analysis proves one: the profile proof starts the dim there.
      int64_t lower = r.lo > 0 && r.lo < double(ir::Interval::kInf) ? int64_t(std::ceil(r.lo)) : 0;
      if (bound) lower = std::min(lower, bound->value());
      KILN_ASSIGN_OR_RETURN(
          out[axis], ctx.range_bounded_dim(
                         0, axis, "resized", bound,
                         "sizes element " + std::to_string(k) + " ('" + ctx.input(sizes_in).name +
                             "') is computed from tensor data at run time and has no upper "
                             "bound kiln can prove from the profile's shapes; kiln sizes "
                             "memory by such a bound",
                         ir::Dim(lower)));
    }
  } else if (has_scales) {
    KILN_ASSIGN_OR_RETURN(std::vector<float> scales, constant_floats(ctx, scales_in, "scales"));
    if (scales.size() != n) {
      return ctx.error(StatusCode::kInvalidModel, "scales has " + std::to_string(scales.size()) +
                                                      " elements; expected " + std::to_string(n));
    }
    std::vector<float> roi;
    if (ctm == "tf_crop_and_resize") {
      if (!ctx.has_input(roi_in)) {
        return ctx.error(StatusCode::kInvalidModel, "tf_crop_and_resize needs the roi input");
      }
      KILN_ASSIGN_OR_RETURN(roi, constant_floats(ctx, roi_in, "roi"));
      if (roi.size() != 2 * n) {
        return ctx.error(StatusCode::kInvalidModel, "roi has " + std::to_string(roi.size()) +
                                                        " elements; expected " +
                                                        std::to_string(2 * n));
      }
    }
    for (size_t k = 0; k < n; ++k) {
      if (!(scales[k] > 0) || !std::isfinite(scales[k])) {
        return ctx.error(StatusCode::kInvalidModel,
                         "scale " + std::to_string(scales[k]) + " must be finite and > 0");
      }
      double f = double(scales[k]);
      if (!roi.empty()) f *= double(roi[n + k]) - double(roi[k]);
      KILN_ASSIGN_OR_RETURN(out[axes[k]], scaled_dim(ctx, x[axes[k]], f, axes[k]));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(std::vector<ir::Dim> sizes, ctx.require_value(sizes_in, "sizes"));
    if (sizes.size() != n) {
      return ctx.error(StatusCode::kInvalidModel, "sizes has " + std::to_string(sizes.size()) +
                                                      " elements; expected " + std::to_string(n));
    }
    if (policy == "stretch") {
      for (size_t k = 0; k < n; ++k) {
        KILN_RETURN_IF_ERROR(
            ctx.require_ge(sizes[k], 0, "sizes element " + std::to_string(k) + " >= 0"));
        out[axes[k]] = sizes[k];
      }
    } else {
      // One scale for all axes keeps the aspect ratio; it depends on the numbers themselves.
      double scale = policy == "not_larger" ? INFINITY : 0;
      for (size_t k = 0; k < n; ++k) {
        const ir::Dim& in = x[axes[k]];
        if (!sizes[k].is_const() || !in.is_const() || in.value() <= 0 || sizes[k].value() < 0) {
          return ctx.error(StatusCode::kUnsupported,
                           "keep_aspect_ratio_policy '" + policy +
                               "' needs constant positive input dims and sizes");
        }
        double s = double(sizes[k].value()) / double(in.value());
        scale = policy == "not_larger" ? std::min(scale, s) : std::max(scale, s);
      }
      for (size_t k = 0; k < n; ++k) {
        // A huge size on one axis scales the others past int64 (the cast would be undefined).
        double v = std::floor(scale * double(x[axes[k]].value()) + 0.5);
        if (!(v >= 0 && v <= double(ir::Interval::kInf))) {
          return ctx.error(StatusCode::kInvalidModel,
                           "output dim " + std::to_string(axes[k]) + " (" + x[axes[k]].to_string() +
                               " scaled by " + std::to_string(scale) +
                               " under keep_aspect_ratio_policy '" + policy +
                               "') overflows the largest axis length 2^62");
        }
        out[axes[k]] = int64_t(v);
      }
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
  return ok_status();
}

StatusOr<int64_t> blocksize(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t b, ctx.attrs().get_int("blocksize", std::nullopt));
  if (b <= 0 || b > (int64_t(1) << 20)) {
    return ctx.error(StatusCode::kInvalidModel,
                     "blocksize " + std::to_string(b) + " must be in [1, 2^20]");
  }
  return b;
}

// DepthToSpace's mode is DCR or CRD; SpaceToDepth has the same attribute from opset 28.
Status check_mode(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrs().get_string("mode", "DCR"));
  if (mode != "DCR" && mode != "CRD") {
    return ctx.error(StatusCode::kInvalidModel, "mode '" + mode + "' must be DCR or CRD");
  }
  const bool to_depth = find_op(ctx.node().domain, ctx.node().op_type) == OpKind::kSpaceToDepth;
  if (to_depth && ctx.attrs().has("mode") && ctx.opset() > 0 && ctx.opset() < 28) {
    return ctx.error(StatusCode::kInvalidModel, "SpaceToDepth has a mode attribute from opset 28");
  }
  return ok_status();
}

Status infer_depth_to_space(InferContext& ctx) {
  const auto& x = ctx.input_shape(0);
  if (x.size() != 4)
    return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank 4 (N, C, H, W)");
  KILN_ASSIGN_OR_RETURN(int64_t b, blocksize(ctx));
  KILN_RETURN_IF_ERROR(check_mode(ctx));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(
      x[1], b * b, "channels divisible by blocksize^2 (" + std::to_string(b * b) + ")"));
  KILN_ASSIGN_OR_RETURN(ir::Dim h, ctx.mul_dims(x[2], b, "height times blocksize"));
  KILN_ASSIGN_OR_RETURN(ir::Dim w, ctx.mul_dims(x[3], b, "width times blocksize"));
  ctx.set_output(0, ctx.input_dtype(0), {x[0], ir::Dim::floor_div(x[1], b * b), h, w});
  return ok_status();
}

Status infer_space_to_depth(InferContext& ctx) {
  const auto& x = ctx.input_shape(0);
  if (x.size() != 4)
    return ctx.error(StatusCode::kInvalidModel, "input 0 must have rank 4 (N, C, H, W)");
  KILN_ASSIGN_OR_RETURN(int64_t b, blocksize(ctx));
  KILN_RETURN_IF_ERROR(check_mode(ctx));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(x[2], b, "height divisible by blocksize"));
  KILN_RETURN_IF_ERROR(ctx.require_divisible(x[3], b, "width divisible by blocksize"));
  KILN_ASSIGN_OR_RETURN(ir::Dim c, ctx.mul_dims(x[1], b * b, "channels times blocksize^2"));
  ctx.set_output(0, ctx.input_dtype(0),
                 {x[0], c, ir::Dim::floor_div(x[2], b), ir::Dim::floor_div(x[3], b)});
  return ok_status();
}

}  // namespace

void register_resize_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kResize, 1, 4, 1, 1, &infer_resize});
  r.add(OpSchema{OpKind::kDepthToSpace, 1, 1, 1, 1, &infer_depth_to_space});
  r.add(OpSchema{OpKind::kSpaceToDepth, 1, 1, 1, 1, &infer_space_to_depth});
}

}  // namespace kiln::ops

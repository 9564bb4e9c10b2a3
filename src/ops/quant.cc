// Schemas of the quant op family: QuantizeLinear and DequantizeLinear (per tensor, per axis and
// blocked), DynamicQuantizeLinear, QLinearMatMul and MatMulInteger. (QLinearConv and
// ConvInteger share Conv's shape inference in conv.cc.)
#include <algorithm>
#include <string>
#include <vector>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

using ir::Dim;

bool is_quant_dtype(DType t) {
  return t == DType::kInt8 || t == DType::kUInt8 || t == DType::kInt16 || t == DType::kUInt16 ||
         t == DType::kInt32;
}

// The scale (input 1) and zero point (input 2) of a (de)quantization of input 0: a scalar or
// one-element tensor (per tensor), a 1-D tensor along `axis` (per axis), or, with block_size, a
// tensor of input 0's rank whose `axis` dim is ceil(dim / block_size).
Status check_quant_params(InferContext& ctx) {
  const auto& x = ctx.input_shape(0);
  int rank = int(x.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, ctx.attrs().get_int("axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t block, ctx.attrs().get_int("block_size", 0));
  if (block < 0) return ctx.error(StatusCode::kInvalidModel, "attribute block_size must be >= 0");
  const auto& s = ctx.input_shape(1);
  auto one_element = [](const std::vector<ir::Dim>& d) {
    return std::all_of(d.begin(), d.end(),
                       [](const ir::Dim& x) { return x.is_const() && x.value() == 1; });
  };
  // ONNX Runtime's quantization tool writes per-tensor scales as [1] beside scalar zero points
  // (and ORT runs them): one element each is per tensor whatever the ranks.
  const bool per_tensor_pair =
      block == 0 && ctx.has_input(2) && one_element(s) && one_element(ctx.input_shape(2));
  if (ctx.has_input(2) && !per_tensor_pair) {
    const auto& z = ctx.input_shape(2);
    if (z.size() != s.size()) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 2 (zero point) must have the shape of input 1 (scale)");
    }
    for (size_t d = 0; d < z.size(); ++d) {
      KILN_RETURN_IF_ERROR(ctx.require_equal(
          z[d], s[d],
          "input 2 (zero point) dim " + std::to_string(d) + " matches input 1 (scale)"));
    }
  }
  bool scalar = s.empty() || (s.size() == 1 && s[0].is_const() && s[0].value() == 1 && block == 0);
  if (scalar) return ok_status();
  if (rank == 0) return ctx.error(StatusCode::kInvalidModel, "a scalar input needs a scalar scale");
  KILN_ASSIGN_OR_RETURN(int axis, ctx.normalize_axis(axis_attr, rank, "attribute 'axis'"));
  if (block == 0) {
    if (s.size() != 1) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input 1 (scale) must be a scalar or 1-D without block_size, got rank " +
                           std::to_string(s.size()));
    }
    return ctx.require_equal(s[0], x[axis],
                             "input 1 (scale) length matches input 0 dim " + std::to_string(axis));
  }
  if (int(s.size()) != rank) {
    return ctx.error(StatusCode::kInvalidModel,
                     "input 1 (scale) of a blocked quantization must have input 0's rank");
  }
  for (int d = 0; d < rank; ++d) {
    Dim want = d == axis ? Dim::ceil_div(x[d], Dim(block)) : x[d];
    KILN_RETURN_IF_ERROR(ctx.require_equal(s[d], want,
                                           "input 1 (scale) dim " + std::to_string(d) +
                                               " matches input 0 dim " + std::to_string(d) +
                                               (d == axis ? " / block_size" : "")));
  }
  return ok_status();
}

Status infer_quantize(InferContext& ctx) {
  if (!is_float(ctx.input_dtype(0)) && ctx.input_dtype(0) != DType::kInt32) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 must be a float type (or int32)");
  }
  if (!is_float(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (scale) must be a float type");
  }
  KILN_RETURN_IF_ERROR(check_quant_params(ctx));
  KILN_ASSIGN_OR_RETURN(int64_t out_code, ctx.attrs().get_int("output_dtype", 0));
  DType out = DType::kUInt8;
  if (ctx.has_input(2)) {
    out = ctx.input_dtype(2);
    if (out_code != 0 && dtype_from_onnx(int32_t(out_code)) != out) {
      return ctx.error(StatusCode::kInvalidModel,
                       "attribute output_dtype differs from input 2 (zero point)'s dtype");
    }
  } else if (out_code != 0) {
    out = dtype_from_onnx(int32_t(out_code));
  }
  if (!is_quant_dtype(out)) {
    return ctx.error(StatusCode::kUnsupported,
                     "quantized dtype " +
                         (out == DType::kUndefined ? "code " + std::to_string(out_code)
                                                   : std::string(dtype_name(out))) +
                         " is not supported (int8/uint8/int16/uint16 are)");
  }
  ctx.set_output(0, out, ctx.input_shape(0));
  return ok_status();
}

Status infer_dequantize(InferContext& ctx) {
  DType in = ctx.input_dtype(0);
  if (!is_quant_dtype(in)) {
    return ctx.error(StatusCode::kUnsupported,
                     "input 0 dtype " + std::string(dtype_name(in)) +
                         " is not supported (int8/uint8/int16/uint16/int32 are)");
  }
  if (ctx.has_input(2) && ctx.input_dtype(2) != in) {
    return ctx.error(StatusCode::kInvalidModel, "input 2 (zero point) must have input 0's dtype");
  }
  if (!is_float(ctx.input_dtype(1))) {
    return ctx.error(StatusCode::kInvalidModel, "input 1 (scale) must be a float type");
  }
  KILN_RETURN_IF_ERROR(check_quant_params(ctx));
  KILN_ASSIGN_OR_RETURN(int64_t out_code, ctx.attrs().get_int("output_dtype", 0));
  DType out = out_code != 0 ? dtype_from_onnx(int32_t(out_code)) : ctx.input_dtype(1);
  if (!is_float(out)) {
    return ctx.error(StatusCode::kInvalidModel, "attribute output_dtype must be a float type");
  }
  ctx.set_output(0, out, ctx.input_shape(0));
  return ok_status();
}

Status infer_dynamic_quantize(InferContext& ctx) {
  if (ctx.input_dtype(0) != DType::kFloat32) {
    return ctx.error(StatusCode::kInvalidModel, "input 0 must be float32");
  }
  ctx.set_output(0, DType::kUInt8, ctx.input_shape(0));
  ctx.set_output(1, DType::kFloat32, {});
  ctx.set_output(2, DType::kUInt8, {});
  return ok_status();
}

// numpy matmul shapes of inputs ai and bi.
StatusOr<std::vector<Dim>> matmul_shape(InferContext& ctx, int ai, int bi) {
  int ra = ctx.input_rank(ai), rb = ctx.input_rank(bi);
  if (ra == 0 || rb == 0) {
    return ctx.error(StatusCode::kInvalidModel, "matrix inputs must have rank >= 1");
  }
  std::vector<Dim> a = ctx.input_shape(ai), b = ctx.input_shape(bi);
  if (ra == 1) a.insert(a.begin(), Dim(1));
  if (rb == 1) b.push_back(Dim(1));
  KILN_RETURN_IF_ERROR(ctx.require_equal(b[b.size() - 2], a[a.size() - 1],
                                         "input " + std::to_string(bi) + " rows (K) match input " +
                                             std::to_string(ai) + " columns (K)"));
  std::vector<std::vector<Dim>> batches = {std::vector<Dim>(a.begin(), a.end() - 2),
                                           std::vector<Dim>(b.begin(), b.end() - 2)};
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, ctx.broadcast_shapes(batches));
  if (ra > 1) out.push_back(a[a.size() - 2]);
  if (rb > 1) out.push_back(b[b.size() - 1]);
  return out;
}

bool is_8bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

Status infer_matmul_integer(InferContext& ctx) {
  for (int i = 0; i < 4; ++i) {
    if (ctx.has_input(i) && !is_8bit(ctx.input_dtype(i))) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " must be int8 or uint8");
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, matmul_shape(ctx, 0, 1));
  ctx.set_output(0, DType::kInt32, std::move(out));
  return ok_status();
}

// QLinearMatMul: a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp.
Status infer_qlinear_matmul(InferContext& ctx) {
  for (int i : {0, 2, 3, 5, 7}) {
    if (ctx.has_input(i) && !is_8bit(ctx.input_dtype(i))) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " must be int8 or uint8");
    }
  }
  for (int i : {1, 4, 6}) {
    if (!is_float(ctx.input_dtype(i))) {
      return ctx.error(StatusCode::kInvalidModel,
                       "input " + std::to_string(i) + " (a scale) must be a float type");
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, matmul_shape(ctx, 0, 3));
  ctx.set_output(0, ctx.input_dtype(ctx.has_input(7) ? 7 : 0), std::move(out));
  return ok_status();
}

}  // namespace

void register_quant_ops(OpRegistry& r) {
  r.add(OpSchema{OpKind::kQuantizeLinear, 2, 3, 1, 1, &infer_quantize});
  r.add(OpSchema{OpKind::kDequantizeLinear, 2, 3, 1, 1, &infer_dequantize});
  r.add(OpSchema{OpKind::kDynamicQuantizeLinear, 1, 1, 3, 3, &infer_dynamic_quantize});
  r.add(OpSchema{OpKind::kMatMulInteger, 2, 4, 1, 1, &infer_matmul_integer});
  r.add(OpSchema{OpKind::kQLinearMatMul, 8, 8, 1, 1, &infer_qlinear_matmul});
}

}  // namespace kiln::ops

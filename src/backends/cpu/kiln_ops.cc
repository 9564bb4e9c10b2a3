// CPU references of kiln's own ops (schemas: ops/kiln_ops.cc). Each runs the reference kernels of
// the ONNX ops it fuses, in the unfused order and rounding, so a fused node matches its subgraph
// exactly and each op's meaning stays in one place.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/attention_f32.h"
#include "backends/cpu/conv_nhwc.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/dtype_dispatch.h"
#include "backends/cpu/matmul.h"
#include "backends/cpu/numeric.h"
#include "backends/cpu/vector_math.h"
#include "ops/conv_activation.h"
#include "ops/elementwise_program.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

// The family kernels the fused ops are made of, looked up once.
struct Parts {
  KernelFn matmul = nullptr, add = nullptr, relu = nullptr, gelu = nullptr, transpose = nullptr;
  KernelFn max_pool = nullptr, average_pool = nullptr, cast = nullptr;
};

const Parts& parts() {
  static const Parts p = [] {
    KernelRegistry r;
    register_matmul_kernels(r);
    register_elementwise_kernels(r);
    register_shape_kernels(r);
    register_conv_kernels(r);
    auto fn = [&](OpKind k) {
      return size_t(k) < r.entries().size() ? r.entries()[size_t(k)].fn : nullptr;
    };
    return Parts{fn(OpKind::kMatMul),      fn(OpKind::kAdd),       fn(OpKind::kRelu),
                 fn(OpKind::kGelu),        fn(OpKind::kTranspose), fn(OpKind::kMaxPool),
                 fn(OpKind::kAveragePool), fn(OpKind::kCast)};
  }();
  return p;
}

ir::Attributes perm_attrs(std::vector<int64_t> perm) {
  ir::Attributes attrs;
  ir::Attribute a;
  a.type = ir::AttrType::kInts;
  a.ints = std::move(perm);
  attrs.set("perm", a);
  return attrs;
}

ir::Attributes gelu_attrs(const char* approximate) {
  ir::Attributes attrs;
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = approximate;
  attrs.set("approximate", a);
  return attrs;
}

// MatMul into Y, then Y += bias, then the activation in place, then Y += residual: the ONNX
// kernels on Y's buffer, so nothing is allocated and every intermediate is rounded to Y's dtype
// as unfused. A float32 bias of Y's last dim is where the GEMM starts instead (its rows fill Y
// and the product accumulates onto them: no pass of its own); the constant B is packed once, as
// MatMul's is.
Status matmul_bias_kernel(const KernelArgs& args) {
  static const ir::Attributes kNone;
  static const ir::Attributes kGeluErf = gelu_attrs("none");
  static const ir::Attributes kGeluTanh = gelu_attrs("tanh");
  const Parts& p = parts();
  if (!p.matmul || !p.add || !p.relu || !p.gelu) {
    return internal_error("MatMulBias: a CPU kernel it is made of is not registered");
  }
  if (args.in.size() < 2 || args.out.size() != 1) {
    return invalid_argument("MatMulBias: needs A, B (and bias) and one output");
  }
  KILN_ASSIGN_OR_RETURN(std::string act, args.attrs.get_string("activation", "none"));
  const KernelArgs product{kNone, args.in.first(2), args.out, args.prepared};
  const bool has_bias = args.in.size() > 2 && present(args.in[2]);
  bool biased = false;
  if (has_bias) {
    KILN_ASSIGN_OR_RETURN(biased, matmul_onto_row_bias(product, args.in[2]));
  }
  if (!biased) KILN_RETURN_IF_ERROR(p.matmul(product));
  if (has_bias && !biased) {
    std::array<TensorView, 2> in{args.out[0], args.in[2]};
    KILN_RETURN_IF_ERROR(p.add(KernelArgs{kNone, in, args.out}));
  }
  std::array<TensorView, 1> y{args.out[0]};
  if (act == "relu") {
    KILN_RETURN_IF_ERROR(p.relu(KernelArgs{kNone, y, args.out}));
  } else if (act == "gelu_erf") {
    KILN_RETURN_IF_ERROR(p.gelu(KernelArgs{kGeluErf, y, args.out}));
  } else if (act == "gelu_tanh") {
    KILN_RETURN_IF_ERROR(p.gelu(KernelArgs{kGeluTanh, y, args.out}));
  } else if (act != "none") {
    return invalid_argument("MatMulBias: unknown activation '" + act + "'");
  }
  if (args.in.size() > 3 && present(args.in[3])) {
    std::array<TensorView, 2> in{args.out[0], args.in[3]};
    KILN_RETURN_IF_ERROR(p.add(KernelArgs{kNone, in, args.out}));
  }
  return ok_status();
}

// The activation of kiln::FusedConv and kiln::SqueezeExcite, decoded once from its attribute (the
// schema checked the name and the parameter count). Each value is computed in double and stored
// once, as the unfused ops' reference would round it.
struct Activation {
  using Kind = ops::ConvActivation;
  Kind kind = Kind::kNone;
  double p0 = 0, p1 = 0;

  static StatusOr<Activation> parse(const std::string& act, const std::vector<float>& p) {
    if (const ops::ConvActivationInfo* a = ops::find_conv_activation(act)) {
      return Activation{a->kind, p.size() > 0 ? double(p[0]) : 0.0,
                        p.size() > 1 ? double(p[1]) : 0.0};
    }
    return invalid_argument("activation '" + act + "' has no CPU kernel");
  }

  double operator()(double y) const {
    switch (kind) {
      case Kind::kNone:
        return y;
      case Kind::kRelu:
        return y > 0 ? y : 0;
      case Kind::kClip:
        return std::min(std::max(y, p0), p1);
      case Kind::kHardSwish:
        return y * std::max(0.0, std::min(1.0, (y + 3) * (1.0 / 6)));
      case Kind::kHardSigmoid:
        return std::max(0.0, std::min(1.0, p0 * y + p1));
      case Kind::kSigmoid:
        return 1 / (1 + std::exp(-y));
      case Kind::kSilu:
        return y / (1 + std::exp(-y));
      case Kind::kLeakyRelu:
        return y >= 0 ? y : p0 * y;
      case Kind::kGelu:
        return 0.5 * y * (1 + std::erf(y * 0.70710678118654752440));
      case Kind::kGeluTanh:
        return 0.5 * y * (1 + std::tanh(0.79788456080286535588 * (y + 0.044715 * y * y * y)));
    }
    return y;
  }

  // In place over y: one loop per kind, so the choice is made once per tensor, not per element.
  // Float32 tensors go through vector_math's loops (vectorized for the running CPU: the scalar
  // loops below ran at two doubles an instruction in the baseline build, 13% of MobileNetV3-small
  // at batch 1), whose Sigmoid and Gelu are the unfused ops' own.
  void apply(const TensorView& y) const {
    if (y.dtype == DType::kFloat32 && apply_f32(y.as<float>(), y.numel())) return;
    switch (kind) {
      case Kind::kNone:
        return;
      case Kind::kRelu:
        return each(y, [](double v) { return v > 0 ? v : 0.0; });
      case Kind::kClip:
        return each(y, [a = p0, b = p1](double v) { return std::min(std::max(v, a), b); });
      case Kind::kHardSwish:
        return each(y,
                    [](double v) { return v * std::max(0.0, std::min(1.0, (v + 3) * (1.0 / 6))); });
      default:
        return each(y, [this](double v) { return (*this)(v); });
    }
  }

 private:
  // The vectorized float32 forms; false for the kinds that have none (the scalar loop then runs).
  bool apply_f32(float* y, int64_t n) const {
    switch (kind) {
      case Kind::kNone:
        return true;
      case Kind::kRelu:
        relu_f32(y, n);
        return true;
      case Kind::kClip:
        clip_f32(y, n, p0, p1);
        return true;
      case Kind::kHardSwish:
        hardswish_f32(y, n);
        return true;
      case Kind::kHardSigmoid:
        hardsigmoid_f32(y, n, p0, p1);
        return true;
      case Kind::kLeakyRelu:
        leaky_relu_f32(y, n, p0);
        return true;
      case Kind::kSigmoid:
        sigmoid_f32(y, y, n);
        return true;
      case Kind::kGelu:
        gelu_erf_f32(y, y, n);
        return true;
      default:
        return false;
    }
  }

  template <typename F>
  static void each(const TensorView& y, F f) {
    const int64_t n = y.numel();
    if (y.dtype == DType::kFloat32) {
      float* p = y.as<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = float(f(double(p[i])));
      return;
    }
    for (int64_t i = 0; i < n; ++i) store_f64(y, i, f(load_f64(y, i)));
  }
};

// kiln::FusedConv: the input activation over a copy of X, the Conv reference kernel into Y, then
// Y += Z with the Add kernel, then the activation over Y. Layout NHWC runs the same Conv on X and W
// transposed to NCHW, into an NCHW scratch Y transposed back (exact: only the order of the
// elements changes); the activations and Z are elementwise, so the input activation applies to the
// transposed X, and Z and the activation to the NHWC Y, as they are. The activated X is rounded
// once to X's dtype, as a producer's epilogue would have stored it, and the Conv's zero padding
// then pads it.
class FusedConvKernel final : public Kernel {
 public:
  FusedConvKernel(std::unique_ptr<Kernel> conv, Activation act, Activation in_act, bool nhwc,
                  const NhwcConvWeights* fast)
      : conv_(std::move(conv)), act_(act), in_act_(in_act), nhwc_(nhwc), fast_(fast) {}
  std::string name() const override { return "cpu.FusedConv"; }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    static const ir::Attributes kNone;
    if (in.size() < 2 || out.size() != 1)
      return invalid_argument("FusedConv: needs X, W and one output");
    if (fast_ && fast_path(in, out[0])) {
      const TensorView* z = in.size() > 3 && present(in[3]) ? &in[3] : nullptr;
      const float* bias = in.size() > 2 && present(in[2]) ? in[2].as<const float>() : nullptr;
      const Epilogue epi{act_, z ? z->as<const float>() : nullptr, out[0].shape[3]};
      return conv_nhwc_f32(*fast_, in[0], in[1], bias, out[0], epi);
    }
    std::array<TensorView, 3> xwb{in[0], in[1], TensorView{}};
    if (in.size() > 2) xwb[2] = in[2];
    const std::span<const TensorView> conv_in =
        std::span<const TensorView>(xwb).first(std::min<size_t>(in.size(), 3));
    if (nhwc_) {
      KILN_RETURN_IF_ERROR(conv_nhwc(conv_in, out[0]));
    } else {
      if (in_act_.kind != Activation::Kind::kNone) {
        xwb[0] = scratch(x_, x_shape_, in[0].dtype, in[0].shape, {});
        if (in[0].nbytes() > 0) std::memcpy(xwb[0].data, in[0].data, in[0].nbytes());
        in_act_.apply(xwb[0]);
      }
      KILN_RETURN_IF_ERROR(conv_->execute(conv_in, out));
    }
    if (in.size() > 3 && present(in[3])) {
      std::array<TensorView, 2> sum{out[0], in[3]};
      KILN_RETURN_IF_ERROR(parts().add(KernelArgs{kNone, sum, out}));
    }
    act_.apply(out[0]);
    return ok_status();
  }

 private:
  // A scratch tensor of `shape` (an NHWC shape permuted by `perm`; as it is when perm is empty) in
  // `buf`, which grows to the largest shape seen and is reused, so steady state does not allocate.
  static TensorView scratch(std::vector<std::byte>& buf, std::vector<int64_t>& shape, DType dtype,
                            std::span<const int64_t> from, std::span<const int64_t> perm) {
    shape.clear();
    if (perm.empty()) shape.assign(from.begin(), from.end());
    for (int64_t p : perm) shape.push_back(from[size_t(p)]);
    const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
    if (buf.size() < bytes) buf.resize(bytes);
    return TensorView{buf.data(), dtype, shape};
  }

  Status conv_nhwc(std::span<const TensorView> in, const TensorView& y) {
    static const ir::Attributes kToNchw = perm_attrs({0, 3, 1, 2});
    static const ir::Attributes kToNhwc = perm_attrs({0, 2, 3, 1});
    static constexpr int64_t kNchw[] = {0, 3, 1, 2};
    if (in[0].rank() != 4 || in[1].rank() != 4 || y.rank() != 4) {
      return invalid_argument("FusedConv: layout NHWC needs X, W and Y of rank 4");
    }
    std::array<TensorView, 3> nchw{scratch(x_, x_shape_, in[0].dtype, in[0].shape, kNchw),
                                   scratch(w_, w_shape_, in[1].dtype, in[1].shape, kNchw),
                                   TensorView{}};
    if (in.size() > 2) nchw[2] = in[2];
    std::array<TensorView, 1> y_nchw{scratch(y_, y_shape_, y.dtype, y.shape, kNchw)};
    for (int i = 0; i < 2; ++i) {
      KILN_RETURN_IF_ERROR(
          parts().transpose(KernelArgs{kToNchw, in.subspan(size_t(i), 1), {&nchw[size_t(i)], 1}}));
    }
    in_act_.apply(nchw[0]);  // on the transposed copy: no buffer of its own
    KILN_RETURN_IF_ERROR(
        conv_->execute(std::span<const TensorView>(nchw).first(in.size()), y_nchw));
    return parts().transpose(KernelArgs{kToNhwc, y_nchw, {&y, 1}});
  }

  // The channels-last float32 path's epilogue: Z (same shape as Y) added, then the activation,
  // over each tile of output pixels while it is in cache.
  struct Epilogue final : NhwcEpilogue {
    Epilogue(const Activation& act, const float* z, int64_t m) : act(act), z(z), m(m) {}
    void apply(float* y, int64_t first, int64_t pixels) const override {
      const int64_t n = pixels * m;
      if (z) {
        const float* zt = z + first * m;
        for (int64_t i = 0; i < n; ++i) y[i] += zt[i];
      }
      const int64_t shape[1] = {n};
      act.apply(TensorView{y, DType::kFloat32, shape});
    }
    const Activation& act;
    const float* z;
    int64_t m;
  };

  // Whether the prepared channels-last path runs this call: float32 throughout (the prepare
  // checked X, W and Y's types at build), a float32 bias, and a Z of Y's own shape.
  bool fast_path(std::span<const TensorView> in, const TensorView& y) const {
    if (in[0].dtype != DType::kFloat32 || y.dtype != DType::kFloat32) return false;
    if (in.size() > 2 && present(in[2]) &&
        (in[2].dtype != DType::kFloat32 || in[2].numel() != fast_->m)) {
      return false;
    }
    if (in.size() > 3 && present(in[3]) &&
        (in[3].dtype != DType::kFloat32 ||
         !std::equal(in[3].shape.begin(), in[3].shape.end(), y.shape.begin(), y.shape.end()))) {
      return false;
    }
    return y.rank() == 4;
  }

  std::unique_ptr<Kernel> conv_;
  Activation act_, in_act_;
  bool nhwc_;
  const NhwcConvWeights* fast_;  // the engine's prepared filter, or null
  // NCHW scratch of layout NHWC; x_ also holds layout NCHW's activated X.
  std::vector<std::byte> x_, w_, y_;
  std::vector<int64_t> x_shape_, w_shape_, y_shape_;
};

StatusOr<std::unique_ptr<Kernel>> create_fused_conv(const KernelQuery& q) {
  static const KernelFactory conv_factory = [] {
    KernelRegistry r;
    register_conv_kernels(r);
    return r.entries()[size_t(OpKind::kConv)].factory;
  }();
  if (!conv_factory || !parts().add || !parts().transpose) {
    return internal_error("FusedConv: a CPU kernel it is made of is not registered");
  }
  KILN_ASSIGN_OR_RETURN(std::string act, q.node.attrs.get_string("activation", "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> params,
                        q.node.attrs.get_floats("activation_params", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(std::string in_act, q.node.attrs.get_string("input_activation", "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> in_params,
                        q.node.attrs.get_floats("input_activation_params", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(std::string layout, q.node.attrs.get_string("layout", "NCHW"));
  if (layout != "NCHW" && layout != "NHWC") {
    return invalid_argument(q.node.describe() + ": layout '" + layout +
                            "' is not one of NCHW, NHWC");
  }
  // The Conv part sees a Conv node: the same attributes without the activations' and the layout.
  static constexpr std::string_view kFusedOnly[] = {
      "activation", "activation_params", "input_activation", "input_activation_params", "layout"};
  ir::Node conv = q.node;
  conv.op_type = "Conv";
  conv.domain = "";
  ir::Attributes attrs;
  for (const auto& [name, a] : q.node.attrs.all()) {
    if (std::find(std::begin(kFusedOnly), std::end(kFusedOnly), name) == std::end(kFusedOnly))
      attrs.set(name, a);
  }
  conv.attrs = attrs;
  KernelQuery cq{conv, q.inputs, q.outputs, q.policy};
  if (cq.inputs.size() > 3) cq.inputs.resize(3);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> k, conv_factory(cq));
  KILN_ASSIGN_OR_RETURN(Activation activation, Activation::parse(act, params));
  KILN_ASSIGN_OR_RETURN(Activation in_activation, Activation::parse(in_act, in_params));
  return std::unique_ptr<Kernel>(
      new FusedConvKernel(std::move(k), activation, in_activation, layout == "NHWC",
                          dynamic_cast<const NhwcConvWeights*>(q.prepared)));
}

StatusOr<std::shared_ptr<const PreparedNode>> prepare_fused_conv(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const NhwcConvWeights> w, prepare_nhwc_conv(q));
  return std::shared_ptr<const PreparedNode>(std::move(w));
}

// kiln::Pool (layout NHWC): the ONNX MaxPool or AveragePool reference on X transposed to NCHW,
// into an NCHW scratch Y transposed back, so the pool's meaning stays in backends/cpu/conv.cc.
class PoolKernel final : public Kernel {
 public:
  PoolKernel(KernelFn pool, ir::Attributes attrs) : pool_(pool), attrs_(std::move(attrs)) {}
  std::string name() const override { return "cpu.Pool"; }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    static const ir::Attributes kToNchw = perm_attrs({0, 3, 1, 2});
    static const ir::Attributes kToNhwc = perm_attrs({0, 2, 3, 1});
    if (in.size() != 1 || out.size() != 1 || in[0].rank() != 4 || out[0].rank() != 4) {
      return invalid_argument("Pool: layout NHWC needs one X and one Y of rank 4");
    }
    std::array<TensorView, 1> x{scratch(x_, x_shape_, in[0])};
    std::array<TensorView, 1> y{scratch(y_, y_shape_, out[0])};
    KILN_RETURN_IF_ERROR(parts().transpose(KernelArgs{kToNchw, in, x}));
    KILN_RETURN_IF_ERROR(pool_(KernelArgs{attrs_, x, y}));
    return parts().transpose(KernelArgs{kToNhwc, y, out});
  }

 private:
  // The NCHW view of an NHWC tensor's shape in `buf`, which grows to the largest seen.
  static TensorView scratch(std::vector<std::byte>& buf, std::vector<int64_t>& shape,
                            const TensorView& nhwc) {
    shape = {nhwc.shape[0], nhwc.shape[3], nhwc.shape[1], nhwc.shape[2]};
    const size_t bytes = size_t(nhwc.numel()) * dtype_size(nhwc.dtype);
    if (buf.size() < bytes) buf.resize(bytes);
    return TensorView{buf.data(), nhwc.dtype, shape};
  }

  KernelFn pool_;
  ir::Attributes attrs_;  // the ONNX pool's: without mode and layout
  std::vector<std::byte> x_, y_;
  std::vector<int64_t> x_shape_, y_shape_;
};

StatusOr<std::unique_ptr<Kernel>> create_pool(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::string mode, q.node.attrs.get_string("mode", ""));
  KILN_ASSIGN_OR_RETURN(std::string layout, q.node.attrs.get_string("layout", "NHWC"));
  if (mode != "max" && mode != "average") {
    return invalid_argument(q.node.describe() + ": mode '" + mode + "' is not one of max, average");
  }
  if (layout != "NHWC") {
    return invalid_argument(q.node.describe() + ": layout '" + layout + "' is not NHWC");
  }
  const KernelFn pool = mode == "max" ? parts().max_pool : parts().average_pool;
  if (!pool || !parts().transpose) {
    return internal_error("Pool: a CPU kernel it is made of is not registered");
  }
  ir::Attributes attrs;
  for (const auto& [name, a] : q.node.attrs.all()) {
    if (name != "mode" && name != "layout") attrs.set(name, a);
  }
  return std::unique_ptr<Kernel>(new PoolKernel(pool, std::move(attrs)));
}

// kiln::Relayout: Cast's reference into a scratch of X's shape, Transpose's into one of Y's
// unpadded shape, then each row copied into Y with pad_last zero elements after it.
class RelayoutKernel final : public Kernel {
 public:
  RelayoutKernel(std::vector<int64_t> perm, int64_t pad)
      : perm_(std::move(perm)), attrs_(perm_attrs(perm_)), pad_(pad) {}
  std::string name() const override { return "cpu.Relayout"; }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    static const ir::Attributes kNone;
    if (in.size() != 1 || out.size() != 1) return invalid_argument("Relayout: needs X and Y");
    const TensorView& x = in[0];
    const TensorView& y = out[0];
    const int r = x.rank();
    if (y.rank() != r || int(perm_.size()) != r) {
      return invalid_argument("Relayout: X and Y differ in rank from perm");
    }
    std::vector<int64_t> tshape(static_cast<size_t>(r));
    for (int d = 0; d < r; ++d) tshape[size_t(d)] = x.shape[size_t(perm_[size_t(d)])];
    const int64_t w = tshape.back(), yw = y.shape.back();
    for (int d = 0; d < r; ++d) {
      if (tshape[size_t(d)] + (d == r - 1 ? pad_ : 0) != y.shape[size_t(d)]) {
        return invalid_argument("Relayout: Y's shape is not X's permuted and padded");
      }
    }
    const size_t es = dtype_size(y.dtype);
    const size_t bytes = size_t(x.numel()) * es;
    if (cast_.size() < bytes) cast_.resize(bytes);
    if (moved_.size() < bytes) moved_.resize(bytes);
    const TensorView c{cast_.data(), y.dtype, x.shape};
    const TensorView t{moved_.data(), y.dtype, tshape};
    KILN_RETURN_IF_ERROR(parts().cast(KernelArgs{kNone, in, {&c, 1}}));
    KILN_RETURN_IF_ERROR(parts().transpose(KernelArgs{attrs_, {&c, 1}, {&t, 1}}));
    const int64_t rows = yw == 0 ? 0 : y.numel() / yw;
    auto* dst = static_cast<std::byte*>(y.data);
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(dst + size_t(i * yw) * es, moved_.data() + size_t(i * w) * es, size_t(w) * es);
      std::memset(dst + size_t(i * yw + w) * es, 0, size_t(pad_) * es);
    }
    return ok_status();
  }

 private:
  std::vector<int64_t> perm_;
  ir::Attributes attrs_;  // Transpose's: perm
  int64_t pad_;
  std::vector<std::byte> cast_, moved_;
};

StatusOr<std::unique_ptr<Kernel>> create_relayout(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, q.node.attrs.get_ints("perm", std::nullopt));
  KILN_ASSIGN_OR_RETURN(int64_t pad, q.node.attrs.get_int("pad_last", 0));
  if (pad < 0) return invalid_argument(q.node.describe() + ": pad_last is negative");
  if (!parts().cast || !parts().transpose) {
    return internal_error("Relayout: a CPU kernel it is made of is not registered");
  }
  return std::unique_ptr<Kernel>(new RelayoutKernel(std::move(perm), pad));
}

// kiln::Elementwise: float32 programs through run_float32_program (a chunk at a time, each
// instruction with its op's reference arithmetic); any other program runs each instruction's
// reference kernel into a tensor of its own dtype and broadcast shape, so the fused node rounds
// as the unfused chain.
class ElementwiseKernel final : public Kernel {
 public:
  ElementwiseKernel(ops::ElementwiseProgram p, std::vector<KernelFn> fns)
      : p_(std::move(p)), fns_(std::move(fns)) {
    for (const ops::EwInstruction& i : p_.code) attrs_.push_back(ops::ew_onnx_attributes(i));
  }
  std::string name() const override { return "cpu.Elementwise"; }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (int(in.size()) != p_.num_inputs || out.size() != 1) {
      return invalid_argument("Elementwise: needs " + std::to_string(p_.num_inputs) +
                              " inputs and one output");
    }
    KILN_ASSIGN_OR_RETURN(bool ran, run_float32_program(p_, in, out[0]));
    if (ran) return ok_status();
    std::vector<Tensor> results;  // instruction j's result
    results.reserve(p_.code.size());
    auto reg = [&](int r) {
      return r < p_.num_inputs ? in[size_t(r)] : results[size_t(r - p_.num_inputs)].view();
    };
    for (size_t j = 0; j < p_.code.size(); ++j) {
      const ops::EwInstruction& ins = p_.code[j];
      std::vector<TensorView> operands{reg(ins.a)};
      if (ins.b >= 0) operands.push_back(reg(ins.b));
      // The broadcast shape of the operands (numpy rules; the kernel checks they broadcast).
      Shape shape;
      for (const TensorView& v : operands) {
        if (v.shape.size() > shape.size())
          shape.insert(shape.begin(), v.shape.size() - shape.size(), 1);
        for (size_t d = 0; d < v.shape.size(); ++d) {
          int64_t& o = shape[shape.size() - v.shape.size() + d];
          if (o == 1) o = v.shape[d];
        }
      }
      const bool last = j + 1 == p_.code.size();
      if (last &&
          (out[0].dtype != ins.to ||
           !std::equal(shape.begin(), shape.end(), out[0].shape.begin(), out[0].shape.end()))) {
        return invalid_argument("Elementwise: output is " + std::string(dtype_name(out[0].dtype)) +
                                shape_to_string(out[0].shape) + ", the program computes " +
                                std::string(dtype_name(ins.to)) + shape_to_string(shape));
      }
      TensorView dst = out[0];
      if (!last) {
        KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(ins.to, shape));
        results.push_back(std::move(t));
        dst = results.back().view();
      }
      Status st = fns_[j](KernelArgs{attrs_[j], operands, std::span<const TensorView>(&dst, 1)});
      if (!st.ok())
        return Status(st.code(), "Elementwise instruction " + std::to_string(j) + " (" + ins.name +
                                     "): " + st.message());
    }
    return ok_status();
  }

 private:
  ops::ElementwiseProgram p_;
  std::vector<KernelFn> fns_;
  std::vector<ir::Attributes> attrs_;
};

StatusOr<std::unique_ptr<Kernel>> create_elementwise(const KernelQuery& q) {
  KILN_ASSIGN_OR_RETURN(ops::ElementwiseProgram p, ops::elementwise_program_of(q.node, q.inputs));
  static const std::vector<KernelRegistry::Entry> entries = [] {
    KernelRegistry r;
    register_elementwise_kernels(r);
    register_math_kernels(r);
    return r.entries();
  }();
  std::vector<KernelFn> fns;
  for (const ops::EwInstruction& i : p.code) {
    const size_t k = size_t(ops::ew_onnx_kind(i.op));
    if (k >= entries.size() || !entries[k].fn) {
      return internal_error(q.node.describe() + ": no CPU kernel function for " + i.name);
    }
    fns.push_back(entries[k].fn);
  }
  return std::unique_ptr<Kernel>(new ElementwiseKernel(std::move(p), std::move(fns)));
}

// kiln::PackedAttention in float32: attention_f32 reads the heads where the packed projections
// hold them (row (b, s) of a [X0, X1, n] input at s * batch + b sequence first, else b * seq + s;
// head h from its offset + h * head size) and writes Y's rows in place. The caller has checked
// that each input is 3-D and holds its heads. False where it cannot (another dtype, shapes that
// disagree, a mask it does not take): the reference form below runs.
bool packed_attention_f32(const KernelArgs& args, int64_t hq, int64_t hk, int64_t d, int64_t dv,
                          int64_t seq_first, const int64_t offset[3]) {
  const TensorView& y = args.out[0];
  if (y.dtype != DType::kFloat32 || y.rank() != 3 || hq <= 0 || hk <= 0 || hq % hk != 0) {
    return false;
  }
  const int64_t batch = args.in[0].shape[size_t(seq_first)];
  const int64_t seq = args.in[0].shape[size_t(1 - seq_first)];
  const int64_t size[3] = {d, d, dv};
  AttentionF32 f;
  HeadsF32* views[3] = {&f.q, &f.k, &f.v};
  int64_t keys = 0;
  for (size_t i = 0; i < 3; ++i) {
    const TensorView& x = args.in[i];
    if (x.dtype != DType::kFloat32) return false;
    const int64_t b = x.shape[size_t(seq_first)], s = x.shape[size_t(1 - seq_first)],
                  n = x.shape[2];
    if (b != batch || (i == 0 && s != seq) || (i == 2 && s != keys)) return false;
    if (i == 1) keys = s;
    *views[i] = HeadsF32{x.as<const float>() + offset[i], seq_first ? n : s * n, size[i],
                         seq_first ? b * n : n};
  }
  if (y.numel() != batch * seq * hq * dv) return false;
  const int64_t n = hq * dv;  // Y's rows, in the inputs' row order
  f.y = y.as<float>();
  f.ysb = seq_first ? n : seq * n, f.ysh = dv, f.yss = seq_first ? batch * n : n;
  f.batch = batch, f.hq = hq, f.hk = hk, f.s = seq, f.l = keys, f.d = d, f.dv = dv;
  const StatusOr<double> scale = attention_scale(args.attrs, d);
  if (!scale.ok()) return false;
  f.scale = float(*scale);
  auto causal = args.attrs.get_int("is_causal", 0);
  if (!causal.ok()) return false;
  f.causal = *causal != 0;
  if (args.in.size() > 3 && present(args.in[3]) && !set_attention_mask(args.in[3], &f))
    return false;
  attention_f32(f);
  return true;
}

// kiln::PackedAttention: Q, K and V gathered into ONNX Attention's 4-D [B, heads, seq, head]
// tensors, ONNX Attention's reference kernel, its output scattered into Y's layout: the op's
// definition, executed (float32 runs packed_attention_f32 above instead).
Status packed_attention_kernel(const KernelArgs& args) {
  static const KernelFn attention = [] {
    KernelRegistry r;
    register_attention_kernels(r);
    const size_t k = size_t(OpKind::kAttention);
    return k < r.entries().size() ? r.entries()[k].fn : nullptr;
  }();
  if (!attention)
    return internal_error("PackedAttention: the CPU Attention kernel is not registered");
  if (args.in.size() < 3 || args.out.size() != 1) {
    return invalid_argument("PackedAttention: needs Q, K, V (and attn_mask) and one output");
  }
  const ir::Attributes& at = args.attrs;
  KILN_ASSIGN_OR_RETURN(int64_t hq, at.get_int("q_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t hk, at.get_int("kv_num_heads", 0));
  KILN_ASSIGN_OR_RETURN(int64_t d, at.get_int("head_size", 0));
  KILN_ASSIGN_OR_RETURN(int64_t dv, at.get_int("v_head_size", 0));
  KILN_ASSIGN_OR_RETURN(int64_t seq_first, at.get_int("seq_first", 0));
  int64_t offset[3];
  KILN_ASSIGN_OR_RETURN(offset[0], at.get_int("q_offset", 0));
  KILN_ASSIGN_OR_RETURN(offset[1], at.get_int("k_offset", 0));
  KILN_ASSIGN_OR_RETURN(offset[2], at.get_int("v_offset", 0));
  const int64_t heads[3] = {hq, hk, hk}, size[3] = {d, d, dv};
  for (size_t i = 0; i < 3; ++i) {  // what both forms below rely on
    const TensorView& x = args.in[i];
    if (x.rank() != 3) return invalid_argument("PackedAttention: Q, K and V must be 3-D");
    if (offset[i] < 0 || heads[i] * size[i] > x.shape[2] - offset[i]) {
      return invalid_argument("PackedAttention: input " + std::to_string(i) +
                              "'s heads do not fit its last dim");
    }
  }
  if (packed_attention_f32(args, hq, hk, d, dv, seq_first, offset)) return ok_status();
  const size_t es = dtype_size(args.in[0].dtype);
  // [B, heads, seq, head] copies of Q, K and V.
  std::vector<std::vector<unsigned char>> buf(3);
  std::vector<Shape> shapes(3);
  std::vector<TensorView> in;
  for (size_t i = 0; i < 3; ++i) {
    const TensorView& x = args.in[i];
    const int64_t batch = x.shape[size_t(seq_first)], seq = x.shape[size_t(1 - seq_first)],
                  n = x.shape[2];
    shapes[i] = {batch, heads[i], seq, size[i]};
    buf[i].resize(size_t(batch * heads[i] * seq * size[i]) * es);
    const auto* src = static_cast<const unsigned char*>(x.data);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t s = 0; s < seq; ++s) {
        const int64_t row = seq_first ? s * batch + b : b * seq + s;
        for (int64_t h = 0; h < heads[i]; ++h) {
          std::memcpy(buf[i].data() + size_t(((b * heads[i] + h) * seq + s) * size[i]) * es,
                      src + size_t(row * n + offset[i] + h * size[i]) * es, size_t(size[i]) * es);
        }
      }
    }
    in.push_back(TensorView{buf[i].data(), x.dtype, shapes[i]});
  }
  if (args.in.size() > 3) in.push_back(args.in[3]);
  const int64_t batch = shapes[0][0], seq = shapes[0][2];
  const Shape yshape = {batch, hq, seq, dv};
  if (args.out[0].numel() != batch * hq * seq * dv)
    return invalid_argument("PackedAttention: Y has the wrong size");
  std::vector<unsigned char> ybuf(size_t(batch * hq * seq * dv) * es);
  std::array<TensorView, 1> yv{TensorView{ybuf.data(), args.out[0].dtype, yshape}};
  ir::Attributes attrs;
  for (const char* name : {"scale", "is_causal"}) {
    if (at.has(name)) attrs.set(name, *at.find(name));
  }
  KILN_RETURN_IF_ERROR(attention(KernelArgs{attrs, in, yv}));
  auto* dst = static_cast<unsigned char*>(args.out[0].data);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t row = seq_first ? s * batch + b : b * seq + s;
      for (int64_t h = 0; h < hq; ++h) {
        std::memcpy(dst + size_t((row * hq + h) * dv) * es,
                    ybuf.data() + size_t(((b * hq + h) * seq + s) * dv) * es, size_t(dv) * es);
      }
    }
  }
  return ok_status();
}

// kiln::SqueezeExcite: the channel means, the two 1x1 products and their activations in double,
// each gate rounded once to the output's type.
class SqueezeExciteKernel final : public Kernel {
 public:
  SqueezeExciteKernel(bool nhwc, Activation act1, Activation act2)
      : nhwc_(nhwc), act1_(act1), act2_(act2) {}
  std::string name() const override { return "cpu.SqueezeExcite"; }
  Status execute(std::span<const TensorView> in, std::span<const TensorView> out) override {
    if (in.size() != 5 || out.size() != 1 || in[0].rank() != 4) {
      return invalid_argument("SqueezeExcite: needs X of rank 4, W1, B1, W2, B2 and one output");
    }
    const TensorView& x = in[0];
    const int64_t n = x.shape[0], c = nhwc_ ? x.shape[3] : x.shape[1];
    const int64_t hw = nhwc_ ? x.shape[1] * x.shape[2] : x.shape[2] * x.shape[3];
    const int64_t cs = in[2].numel();
    if (in[1].numel() != cs * c || in[3].numel() != c * cs || in[4].numel() != c ||
        out[0].numel() != n * c) {
      return invalid_argument("SqueezeExcite: the operands' sizes disagree with X " +
                              shape_to_string(x.shape));
    }
    for (const TensorView& v : in) {
      if (v.dtype != x.dtype)
        return invalid_argument("SqueezeExcite: every operand must have X's dtype");
    }
    return dispatch<kF32 | kF16 | kBF16>(x.dtype, OpKind::kSqueezeExcite, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto at = [](const TensorView& v, int64_t i) {
        return double(Num<T>::load(v.as<const T>()[i]));
      };
      std::vector<double> mean(static_cast<size_t>(c)), hidden(static_cast<size_t>(cs));
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t ch = 0; ch < c; ++ch) {
          double sum = 0;
          for (int64_t p = 0; p < hw; ++p)
            sum += at(x, nhwc_ ? (b * hw + p) * c + ch : (b * c + ch) * hw + p);
          mean[size_t(ch)] = hw > 0 ? sum / double(hw) : 0.0;
        }
        for (int64_t j = 0; j < cs; ++j) {
          double y = at(in[2], j);
          for (int64_t ch = 0; ch < c; ++ch) y += at(in[1], j * c + ch) * mean[size_t(ch)];
          hidden[size_t(j)] = act1_(y);
        }
        for (int64_t ch = 0; ch < c; ++ch) {
          double y = at(in[4], ch);
          for (int64_t j = 0; j < cs; ++j) y += at(in[3], ch * cs + j) * hidden[size_t(j)];
          out[0].as<T>()[b * c + ch] = Num<T>::store(static_cast<typename Num<T>::C>(act2_(y)));
        }
      }
      return ok_status();
    });
  }

 private:
  bool nhwc_;
  Activation act1_, act2_;
};

StatusOr<std::unique_ptr<Kernel>> create_squeeze_excite(const KernelQuery& q) {
  const ir::Attributes& a = q.node.attrs;
  KILN_ASSIGN_OR_RETURN(std::string layout, a.get_string("layout", "NCHW"));
  KILN_ASSIGN_OR_RETURN(std::string act1, a.get_string("activation1", "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> p1,
                        a.get_floats("activation1_params", std::vector<float>{}));
  KILN_ASSIGN_OR_RETURN(std::string act2, a.get_string("activation2", "none"));
  KILN_ASSIGN_OR_RETURN(std::vector<float> p2,
                        a.get_floats("activation2_params", std::vector<float>{}));
  if (layout != "NCHW" && layout != "NHWC") {
    return invalid_argument(q.node.describe() + ": layout '" + layout +
                            "' is not one of NCHW, NHWC");
  }
  KILN_ASSIGN_OR_RETURN(Activation a1, Activation::parse(act1, p1));
  KILN_ASSIGN_OR_RETURN(Activation a2, Activation::parse(act2, p2));
  return std::unique_ptr<Kernel>(new SqueezeExciteKernel(layout == "NHWC", a1, a2));
}

}  // namespace

void register_kiln_kernels(KernelRegistry& r) {
  r.add(OpKind::kMatMulBias, &matmul_bias_kernel, &prepare_matmul);
  r.add_factory(OpKind::kFusedConv, &create_fused_conv, &prepare_fused_conv);
  r.add_factory(OpKind::kPool, &create_pool);
  r.add_factory(OpKind::kElementwise, &create_elementwise);
  r.add(OpKind::kPackedAttention, &packed_attention_kernel);
  r.add_factory(OpKind::kSqueezeExcite, &create_squeeze_excite);
  r.add_factory(OpKind::kRelayout, &create_relayout);
}

}  // namespace kiln::backends::cpu

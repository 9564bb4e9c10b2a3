// CPU references of kiln's own ops (schemas: ops/kiln_ops.cc). Each runs the reference kernels of
// the ONNX ops it fuses, in the unfused order and rounding, so a fused node matches its subgraph
// exactly and each op's meaning stays in one place.
#include <array>
#include <string>

#include "backends/cpu/cpu_backend.h"

namespace kiln::backends::cpu {
namespace {

using ops::OpKind;

// The family kernels the fused ops are made of, looked up once.
struct Parts {
  KernelFn matmul = nullptr, add = nullptr, relu = nullptr, gelu = nullptr;
};

const Parts& parts() {
  static const Parts p = [] {
    KernelRegistry r;
    register_matmul_kernels(r);
    register_elementwise_kernels(r);
    auto fn = [&](OpKind k) { return size_t(k) < r.entries().size() ? r.entries()[size_t(k)].fn : nullptr; };
    return Parts{fn(OpKind::kMatMul), fn(OpKind::kAdd), fn(OpKind::kRelu), fn(OpKind::kGelu)};
  }();
  return p;
}

ir::Attributes gelu_attrs(const char* approximate) {
  ir::Attributes attrs;
  ir::Attribute a;
  a.type = ir::AttrType::kString;
  a.s = approximate;
  attrs.set("approximate", a);
  return attrs;
}

// MatMul into Y, then Y += bias, then the activation in place: the three ONNX kernels on Y's
// buffer, so nothing is allocated and every intermediate is rounded to Y's dtype as unfused.
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
  KILN_RETURN_IF_ERROR(p.matmul(KernelArgs{kNone, args.in.first(2), args.out}));
  if (args.in.size() > 2 && present(args.in[2])) {
    std::array<TensorView, 2> in{args.out[0], args.in[2]};
    KILN_RETURN_IF_ERROR(p.add(KernelArgs{kNone, in, args.out}));
  }
  if (act == "none") return ok_status();
  std::array<TensorView, 1> y{args.out[0]};
  if (act == "relu") return p.relu(KernelArgs{kNone, y, args.out});
  if (act == "gelu_erf") return p.gelu(KernelArgs{kGeluErf, y, args.out});
  if (act == "gelu_tanh") return p.gelu(KernelArgs{kGeluTanh, y, args.out});
  return invalid_argument("MatMulBias: unknown activation '" + act + "'");
}

}  // namespace

void register_kiln_kernels(KernelRegistry& r) { r.add(OpKind::kMatMulBias, &matmul_bias_kernel); }

}  // namespace kiln::backends::cpu

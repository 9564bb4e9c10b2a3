// Pass assign_layout: half-precision convolutions compute channels last (NHWC), the layout
// cuDNN's fast FP16/BF16 convolutions read and write (on NCHW tensors it transposes each input and
// output internally), with layout changes only where a convolution stack meets NCHW-only nodes.
//   0. A 1-D Conv -> Reshape(X, [N, C, 1, L]) -> the 2-D Conv with H = 1 -> Reshape back.
//   1. Conv or NCHW kiln::FusedConv -> Transpose(X) -> FusedConv{layout="NHWC"} -> Transpose(Y),
//      the filter reordered to KRSC at build; readers of Y are untouched.
//   2. To a fixed point: Transpose pairs that cancel are bypassed and duplicate transposes of one
//      value merged; a transpose to NCHW moves down through nodes that compute the same in either
//      layout (elementwise ops, global pools as ReduceMean/ReduceMax, 2-D MaxPool and AveragePool
//      as kiln::Pool{layout="NHWC"}), where it meets the next stack's transpose and cancels; a
//      transpose moving only dims of size 1 becomes a Reshape (a view, run as an alias).
// Runs after assign_precision (the dtypes it tests are final). On the CPU it converts float32
// stacks too, and keeps the result only where the stacks are long enough
// (assign_layout(BuildState&)).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "builder/build_state.h"
#include "builder/graph_match.h"
#include "ir/rewrite.h"

namespace kiln::builder {
namespace {

using ir::Dim;

constexpr int64_t kToNhwc[] = {0, 2, 3, 1};
constexpr int64_t kToNchw[] = {0, 3, 1, 2};

// Ops whose output element depends only on the input elements at the same broadcast index, so a
// permutation of every input permutes the output the same way. Their other inputs are scalars
// (Clip's bounds) or attributes.
const std::set<std::string>& layout_free_unary() {
  static const std::set<std::string> ops = {
      "Relu",  "Clip",     "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh",
      "Cast",  "Identity", "Erf",     "Elu",         "Selu",      "Gelu",      "Softplus",
      "Mish",  "Neg",      "Abs",     "Sqrt",        "Exp",       "Log",       "Reciprocal",
      "Floor", "Ceil",     "Round",   "Sign",        "Sin",       "Cos",       "ThresholdedRelu",
      "Celu"};
  return ops;
}
const std::set<std::string>& layout_free_broadcast() {
  static const std::set<std::string> ops = {"Add", "Sub", "Mul",  "Div",  "Sum",
                                            "Max", "Min", "Mean", "PRelu"};
  return ops;
}

bool has_readers(const ir::Graph& g, int v) {
  for (const ir::Node& n : g.nodes) {
    if (std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end()) return true;
  }
  return false;
}

std::vector<Dim> permuted(const std::vector<Dim>& shape, std::span<const int64_t> perm) {
  std::vector<Dim> out;
  for (int64_t p : perm) out.push_back(shape[size_t(p)]);
  return out;
}

bool is_perm(std::span<const int64_t> a, std::span<const int64_t> b) {
  return std::ranges::equal(a, b);
}

// The value `v` is Transpose(a, perm) of: a, or -1.
int transposed_from(const ir::Graph& g, int v, std::span<const int64_t> perm) {
  if (v < 0 || g.values[size_t(v)].producer < 0) return -1;
  const ir::Node& t = g.nodes[size_t(g.values[size_t(v)].producer)];
  if (!is_onnx(t, "Transpose")) return -1;
  auto p = perm_of(g, t);
  return p && is_perm(*p, perm) ? t.inputs[0] : -1;
}

// `t` unsqueezed to rank 4 with leading 1s (ONNX broadcasting) and permuted by `perm`: the bytes
// moved, so every dtype works.
StatusOr<Tensor> permute_constant(const Tensor& t, std::span<const int64_t> perm) {
  Shape in(4 - size_t(t.rank()), 1);
  in.insert(in.end(), t.shape().begin(), t.shape().end());
  Shape out;
  for (int64_t p : perm) out.push_back(in[size_t(p)]);
  KILN_ASSIGN_OR_RETURN(Tensor r, Tensor::zeros(t.dtype(), out));
  const size_t es = dtype_size(t.dtype());
  int64_t stride[4] = {in[1] * in[2] * in[3], in[2] * in[3], in[3], 1};
  const auto* src = static_cast<const std::byte*>(t.data());
  auto* dst = static_cast<std::byte*>(r.data());
  int64_t i = 0;
  for (int64_t a = 0; a < out[0]; ++a) {
    for (int64_t b = 0; b < out[1]; ++b) {
      for (int64_t c = 0; c < out[2]; ++c) {
        for (int64_t d = 0; d < out[3]; ++d, ++i) {
          int64_t s =
              a * stride[perm[0]] + b * stride[perm[1]] + c * stride[perm[2]] + d * stride[perm[3]];
          std::memcpy(dst + size_t(i) * es, src + size_t(s) * es, es);
        }
      }
    }
  }
  return r;
}

// A [K, kh, kw, C] filter with zero channels appended up to `c`.
StatusOr<Tensor> pad_last_axis(const Tensor& t, int64_t c) {
  Shape shape(t.shape().begin(), t.shape().end());
  const int64_t from = shape.back(), rows = t.numel() / std::max<int64_t>(from, 1);
  shape.back() = c;
  KILN_ASSIGN_OR_RETURN(Tensor r, Tensor::zeros(t.dtype(), shape));
  const size_t es = dtype_size(t.dtype());
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(static_cast<std::byte*>(r.data()) + size_t(i * c) * es,
                static_cast<const std::byte*>(t.data()) + size_t(i * from) * es, size_t(from) * es);
  }
  return r;
}

ir::Node onnx_node(const ir::Graph& g, std::string op_type, std::string name,
                   std::vector<int> inputs, std::vector<int> outputs) {
  ir::Node n;
  n.op_type = std::move(op_type);
  n.name = std::move(name);
  auto it = g.opsets.find("");
  n.opset = it != g.opsets.end() ? it->second : 0;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

// Transpose(in, perm) -> a new value named after `in`, its node named after that value.
ir::Node transpose_to_new(ir::Graph* g, int in, std::span<const int64_t> perm, const char* suffix) {
  const ir::Value& v = g->values[size_t(in)];
  int out = ir::add_unique_value(g, v.name + suffix, v.dtype, permuted(*v.shape, perm));
  ir::Node t = onnx_node(*g, "Transpose", "", {in}, {out});
  set_ints(&t, "perm", {perm.begin(), perm.end()});
  return t;
}

// Transpose(in, kToNchw) -> out, an existing value whose producer this becomes.
ir::Node transpose_back(const ir::Graph& g, int in, int out) {
  ir::Node t = onnx_node(g, "Transpose", "", {in}, {out});
  set_ints(&t, "perm", {std::begin(kToNchw), std::end(kToNchw)});
  return t;
}

// Puts `nodes` where node `at` was (in this order, which keeps the graph topologically sorted:
// their inputs come from before `at`, their outputs are read after it), naming unnamed ones
// after their first output.
Status splice(ir::Graph* g, int at, std::vector<ir::Node> nodes) {
  g->nodes.erase(g->nodes.begin() + at);
  for (ir::Node& n : nodes) {
    if (n.name.empty()) {
      n.name = ir::unique_node_name(*g, g->values[size_t(n.outputs[0])].name + "_" + n.op_type);
    }
    g->nodes.insert(g->nodes.begin() + at++, std::move(n));
  }
  return ir::sort_topologically(g);  // recomputes the producers; fails only on a broken edit
}

std::vector<const ir::Value*> typed(const ir::Graph& g, const std::vector<int>& vs) {
  std::vector<const ir::Value*> out;
  for (int v : vs) out.push_back(v >= 0 ? &g.values[size_t(v)] : nullptr);
  return out;
}

// Step 1 at node n. `weights` maps a filter to its KRSC copy, made once however many convolutions
// share it.
StatusOr<bool> convert_conv(ir::Graph* g, int n, const SupportsFn& supports,
                            const LayoutOptions& options, std::map<int, int>* weights) {
  const ir::Node& conv = g->nodes[size_t(n)];
  const bool fused = conv.domain == "kiln" && conv.op_type == "FusedConv";
  if (!is_onnx(conv, "Conv") && !fused) return false;
  if (fused) {
    auto layout = conv.attrs.get_string("layout", "NCHW");
    if (!layout.ok() || *layout != "NCHW") return false;
  }
  if (conv.inputs.size() < 2 || conv.inputs[0] < 0 || conv.inputs[1] < 0 ||
      conv.outputs.size() != 1 || conv.outputs[0] < 0) {
    return false;
  }
  const int x = conv.inputs[0], w = conv.inputs[1], y = conv.outputs[0];
  const int z = fused && conv.inputs.size() > 3 ? conv.inputs[3] : -1;
  for (int v : {x, y, z}) {
    if (v >= 0 && (!g->values[size_t(v)].shape || g->values[size_t(v)].shape->size() != 4)) {
      return false;
    }
  }
  const DType t = g->values[size_t(x)].dtype;
  if (!(t == DType::kFloat16 || t == DType::kBFloat16 ||
        (options.convert_float32 && t == DType::kFloat32))) {
    return false;
  }
  const ir::Value& wv = g->values[size_t(w)];
  if (!wv.constant || wv.constant->rank() != 4) return false;

  // The node as it would be, typed on values outside the graph: nothing is added if it is refused.
  ir::Node f = conv;
  f.domain = "kiln";
  f.op_type = "FusedConv";
  f.opset = 1;
  if (!fused) set_string(&f, "activation", "none");
  set_string(&f, "layout", "NHWC");
  auto nhwc = [&](int v) {
    const ir::Value& src = g->values[size_t(v)];
    return ir::Value{.name = src.name, .dtype = src.dtype, .shape = permuted(*src.shape, kToNhwc)};
  };
  ir::Value xn = nhwc(x), yn = nhwc(y), zn = z >= 0 ? nhwc(z) : ir::Value{};
  // An input channel count that is no multiple of 8 keeps cuDNN off its tensor-core kernels:
  // ResNet-50's 7x7 stem (3 channels) took 780 us of its 3.2 ms at batch 64 on the pre-tensor-core
  // NHWC engine. Zero channels (a Pad of X after its transpose, zero filter channels) compute the
  // same sums: up to 4 for 1 to 3 channels, where cuDNN has first-layer kernels for 4 (the stem at
  // batch 64 on an H100: 121 us with 4 channels, 309 us with 8, 168 us with 3 on PyTorch's choice
  // of engine), else up to the multiple of 8.
  const Dim channels = (*xn.shape)[3];
  auto group = conv.attrs.get_int("group", 1);
  auto opset = g->opsets.find("");
  const bool pad = options.pad_channels && channels.is_const() && channels.value() != 4 &&
                   channels.value() % 8 != 0 && group.ok() && *group == 1 &&
                   opset != g->opsets.end() && opset->second >= 11;
  const int64_t pad_to = !pad ? 0 : channels.value() < 4 ? 4 : (channels.value() + 7) / 8 * 8;
  if (pad_to) (*xn.shape)[3] = Dim(pad_to);
  std::optional<ir::Value> wn;
  auto cached = pad_to ? weights->end() : weights->find(w);
  if (cached == weights->end()) {
    KILN_ASSIGN_OR_RETURN(Tensor krsc, permute_constant(*wv.constant, kToNhwc));
    if (pad_to) {
      KILN_ASSIGN_OR_RETURN(krsc, pad_last_axis(krsc, pad_to));
    }
    wn = nhwc(w);
    (*wn->shape)[3] = Dim(krsc.shape()[3]);
    wn->constant = std::move(krsc);
  }
  const ir::Value* wq = wn ? &*wn : &g->values[size_t(cached->second)];
  std::vector<const ir::Value*> in = {&xn, wq};
  if (conv.inputs.size() > 2) {
    in.push_back(conv.inputs[2] >= 0 ? &g->values[size_t(conv.inputs[2])] : nullptr);
  }
  if (z >= 0) in.push_back(&zn);
  if (!supports(f, in, {&yn})) return false;

  int krsc = cached == weights->end() ? -1 : cached->second;
  if (wn) {
    krsc = add_constant(g, wn->name + "_krsc", std::move(*wn->constant));
    if (!pad_to) (*weights)[w] = krsc;
  }
  std::vector<ir::Node> nodes;
  nodes.push_back(transpose_to_new(g, x, kToNhwc, "_nhwc"));
  f.inputs[0] = nodes.back().outputs[0];
  if (pad_to) {
    Tensor pads = *Tensor::zeros(DType::kInt64, {8});
    static_cast<int64_t*>(pads.data())[7] = pad_to - channels.value();
    const int pv = add_constant(g, xn.name + "_channel_pads", std::move(pads));
    const int padded = ir::add_unique_value(g, xn.name + "_nhwc_padded", xn.dtype, xn.shape);
    nodes.push_back(onnx_node(*g, "Pad", "", {f.inputs[0], pv}, {padded}));
    f.inputs[0] = padded;
  }
  f.inputs[1] = krsc;
  if (z >= 0) {
    nodes.push_back(transpose_to_new(g, z, kToNhwc, "_nhwc"));
    f.inputs[3] = nodes.back().outputs[0];
  }
  const int y_nhwc = ir::add_unique_value(g, yn.name + "_nhwc", yn.dtype, yn.shape);
  f.outputs = {y_nhwc};
  nodes.push_back(std::move(f));
  nodes.push_back(transpose_back(*g, y_nhwc, y));
  g->opsets.emplace("kiln", 1);
  KILN_RETURN_IF_ERROR(splice(g, n, std::move(nodes)));
  return true;
}

// Step 0 at node n: a 1-D Conv or NCHW kiln::FusedConv (X [N, C, L], W [K, C/g, k]) becomes the 2-D
// one it is with H = 1 between two Reshapes (views, run as aliases), so step 1 takes it
// channels-last too. cuDNN runs an NCW float16 convolution on its pre-tensor-core
// implicit_convolve_sgemm: Whisper's two stem convolutions ([32, 80, 3000] and [32, 384, 3000] in,
// kernel 3) took 2.24 of 5.88 ms at batch 32 on an H200. Taken where step 1 would take the 2-D one
// (its dtype, a constant filter).
StatusOr<bool> lift_conv1d(ir::Graph* g, int n, const LayoutOptions& options) {
  const ir::Node& conv = g->nodes[size_t(n)];
  const bool fused = conv.domain == "kiln" && conv.op_type == "FusedConv";
  if (fused) {
    auto layout = conv.attrs.get_string("layout", "NCHW");
    if (!layout.ok() || *layout != "NCHW") return false;
  }
  if ((!is_onnx(conv, "Conv") && !fused) || conv.inputs.size() < 2 || conv.outputs.size() != 1 ||
      conv.outputs[0] < 0) {
    return false;
  }
  const int x = conv.inputs[0], w = conv.inputs[1], y = conv.outputs[0];
  const int z =
      fused && conv.inputs.size() > 3 ? conv.inputs[3] : -1;  // FusedConv's residual, as Y
  if (x < 0 || w < 0) return false;
  const ir::Value &xv = g->values[size_t(x)], &wv = g->values[size_t(w)],
                  &yv = g->values[size_t(y)];
  if (!xv.shape || xv.shape->size() != 3 || !yv.shape || yv.shape->size() != 3 || !wv.constant ||
      wv.constant->rank() != 3) {
    return false;
  }
  const DType t = xv.dtype;
  if (!(t == DType::kFloat16 || t == DType::kBFloat16 ||
        (options.convert_float32 && t == DType::kFloat32))) {
    return false;
  }
  // Attributes with a leading H entry: kernel 1, stride 1, dilation 1, no padding.
  ir::Node c2 = conv;
  c2.replaced.clear();
  auto lift = [&](const char* name, std::vector<int64_t> head) -> Status {
    if (!conv.attrs.has(name)) return ok_status();
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v,
                          conv.attrs.get_ints(name, std::vector<int64_t>{}));
    if (std::string(name) == "pads") {
      if (v.size() != 2) return invalid_argument("pads");
      set_ints(&c2, name, {0, v[0], 0, v[1]});
      return ok_status();
    }
    if (v.size() != 1) return invalid_argument(name);
    head.push_back(v[0]);
    set_ints(&c2, name, std::move(head));
    return ok_status();
  };
  for (auto [name, head] : {std::pair{"kernel_shape", 1}, std::pair{"strides", 1},
                            std::pair{"dilations", 1}, std::pair{"pads", 0}}) {
    if (!lift(name, {head}).ok()) return false;
  }
  const Shape& ws = wv.constant->shape();
  KILN_ASSIGN_OR_RETURN(Tensor w4, Tensor::zeros(wv.constant->dtype(), {ws[0], ws[1], 1, ws[2]}));
  std::memcpy(w4.data(), wv.constant->data(), wv.constant->nbytes());
  // Copies: adding values moves g->values.
  const std::vector<Dim> xs = *xv.shape, ys = *yv.shape;
  const std::string xname = xv.name, yname = yv.name, wname = wv.name;
  const DType yt = yv.dtype;
  const std::string base = conv.name.empty() ? yname : conv.name;
  const int x4 =
      ir::add_unique_value(g, xname + "_2d", t, std::vector<Dim>{xs[0], xs[1], Dim(1), xs[2]});
  const int y4 =
      ir::add_unique_value(g, yname + "_2d", yt, std::vector<Dim>{ys[0], ys[1], Dim(1), ys[2]});
  const int to4 = add_constant(g, base + "_as_2d",
                               Tensor::from_vector<int64_t>(DType::kInt64, {4}, {0, 0, 1, -1}));
  const int to3 = add_constant(g, base + "_as_1d",
                               Tensor::from_vector<int64_t>(DType::kInt64, {3}, {0, 0, -1}));
  c2.inputs[0] = x4;
  c2.inputs[1] = add_constant(g, wname + "_2d", std::move(w4));
  c2.outputs = {y4};
  std::vector<ir::Node> nodes;
  nodes.push_back(onnx_node(*g, "Reshape", "", {x, to4}, {x4}));
  if (z >= 0) {
    const int z4 =
        ir::add_unique_value(g, g->values[size_t(z)].name + "_2d", g->values[size_t(z)].dtype,
                             std::vector<Dim>{ys[0], ys[1], Dim(1), ys[2]});
    nodes.push_back(onnx_node(*g, "Reshape", "", {z, to4}, {z4}));
    c2.inputs[3] = z4;
  }
  nodes.push_back(std::move(c2));
  nodes.push_back(onnx_node(*g, "Reshape", "", {y4, to3}, {y}));
  KILN_RETURN_IF_ERROR(splice(g, n, std::move(nodes)));
  return true;
}

// Transpose(Transpose(a, p), q) with q after p the identity: its readers read a. The outer one
// stays only where it produces an engine output (whose value keeps its name).
bool cancel_pair(ir::Graph* g, int n) {
  const ir::Node& t2 = g->nodes[size_t(n)];
  if (!is_onnx(t2, "Transpose") || t2.outputs.size() != 1 || t2.outputs[0] < 0) return false;
  auto q = perm_of(*g, t2);
  int mid = t2.inputs.empty() ? -1 : t2.inputs[0];
  if (!q || mid < 0 || g->values[size_t(mid)].producer < 0) return false;
  const ir::Node& t1 = g->nodes[size_t(g->values[size_t(mid)].producer)];
  if (!is_onnx(t1, "Transpose")) return false;
  auto p = perm_of(*g, t1);
  if (!p || p->size() != q->size()) return false;
  for (size_t i = 0; i < q->size(); ++i) {
    if ((*p)[size_t((*q)[i])] != int64_t(i)) return false;
  }
  const int out = t2.outputs[0];
  if (!has_readers(*g, out)) return false;
  return ir::replace_all_uses(g, out, t1.inputs[0]).ok();
}

// A second Transpose of the same value by the same perm (one per convolution reading a shared
// input, or per node reading a shared gate): its readers read the first one's output.
bool merge_duplicate(ir::Graph* g, int n) {
  const ir::Node& t = g->nodes[size_t(n)];
  if (!is_onnx(t, "Transpose") || t.outputs.size() != 1 || t.outputs[0] < 0 ||
      !has_readers(*g, t.outputs[0])) {
    return false;
  }
  auto perm = perm_of(*g, t);
  if (!perm) return false;
  for (int m = 0; m < n; ++m) {
    const ir::Node& first = g->nodes[size_t(m)];
    if (is_onnx(first, "Transpose") && first.outputs.size() == 1 && first.outputs[0] >= 0 &&
        first.inputs[0] == t.inputs[0] && perm_of(*g, first) == perm) {
      return ir::replace_all_uses(g, t.outputs[0], first.outputs[0]).ok();
    }
  }
  return false;
}

// An elementwise node reading NCHW values made from NHWC ones: it computes in NHWC and one
// transpose after it makes its output. Every input must be available in NHWC at no cost: the
// input of a transpose to NCHW, a constant (permuted at build), or an [N, C, 1, 1] value (whose
// transpose becomes a Reshape).
StatusOr<bool> push_through_elementwise(ir::Graph* g, int n) {
  const ir::Node& e = g->nodes[size_t(n)];
  if (!e.domain.empty() || e.outputs.size() != 1 || e.outputs[0] < 0) return false;
  const bool unary = layout_free_unary().count(e.op_type) != 0;
  if (!unary && !layout_free_broadcast().count(e.op_type)) return false;
  const int out = e.outputs[0];
  if (!g->values[size_t(out)].shape || g->values[size_t(out)].shape->size() != 4) return false;
  // What each input becomes, decided before anything is added to the graph.
  enum class Kind { kAsIs, kFromNhwc, kConstant, kUnitSpatial };
  std::vector<Kind> kinds(e.inputs.size(), Kind::kAsIs);
  bool from_nhwc = false;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const int v = e.inputs[i];
    if (v < 0) continue;
    const ir::Value& val = g->values[size_t(v)];
    const bool parameter = unary && i > 0;  // Clip's bounds: scalars, the same in either layout
    if (transposed_from(*g, v, kToNchw) >= 0 && !parameter) {
      kinds[i] = Kind::kFromNhwc;
      from_nhwc = true;
    } else if (val.constant && (val.constant->rank() == 0 || parameter)) {
      kinds[i] = Kind::kAsIs;
    } else if (val.constant && val.constant->rank() <= 4) {
      kinds[i] = Kind::kConstant;
    } else if (!parameter && val.shape && val.shape->size() == 4 && (*val.shape)[2] == Dim(1) &&
               (*val.shape)[3] == Dim(1)) {
      kinds[i] = Kind::kUnitSpatial;
    } else {
      return false;
    }
  }
  // Only reading the input of a transpose to NCHW is a gain; the other kinds just follow.
  if (!from_nhwc) return false;
  ir::Node moved = e;
  std::vector<ir::Node> nodes;
  std::map<int, int> converted;  // an [N, C, 1, 1] input -> its NHWC copy, once per value
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const int v = e.inputs[i];
    if (kinds[i] == Kind::kFromNhwc) {
      moved.inputs[i] = transposed_from(*g, v, kToNchw);
    } else if (kinds[i] == Kind::kConstant) {
      KILN_ASSIGN_OR_RETURN(Tensor c, permute_constant(*g->values[size_t(v)].constant, kToNhwc));
      moved.inputs[i] = add_constant(g, g->values[size_t(v)].name + "_nhwc", std::move(c));
    } else if (kinds[i] == Kind::kUnitSpatial) {
      if (!converted.count(v)) {
        nodes.push_back(transpose_to_new(g, v, kToNhwc, "_nhwc"));
        converted[v] = nodes.back().outputs[0];
      }
      moved.inputs[i] = converted[v];
    }
  }
  const ir::Value& o = g->values[size_t(out)];
  const int o_nhwc =
      ir::add_unique_value(g, o.name + "_nhwc", o.dtype, permuted(*o.shape, kToNhwc));
  moved.outputs = {o_nhwc};
  nodes.push_back(std::move(moved));
  nodes.push_back(transpose_back(*g, o_nhwc, out));
  KILN_RETURN_IF_ERROR(splice(g, n, std::move(nodes)));
  return true;
}

// Whether ReduceMean/ReduceMax node r reduces exactly the two spatial axes of a 4-D tensor and
// keeps them (axes from the attribute before opset 18, from a constant input after).
bool is_global_reduce(const ir::Graph& g, const ir::Node& r) {
  auto keep = r.attrs.get_int("keepdims", 1);
  if (!keep.ok() || *keep != 1 || r.inputs.empty() || r.inputs[0] < 0) return false;
  const auto& shape = g.values[size_t(r.inputs[0])].shape;
  if (!shape || shape->size() != 4) return false;
  std::optional<std::vector<int64_t>> axes;
  if (r.inputs.size() > 1) {
    axes = ints_of(g, r, 1);
  } else if (auto a = r.attrs.get_ints("axes", std::vector<int64_t>{}); a.ok()) {
    axes = *a;
  }
  if (!axes || axes->size() != 2) return false;
  std::set<int64_t> norm;
  for (int64_t a : *axes) norm.insert(a < 0 ? a + 4 : a);
  return norm == std::set<int64_t>{2, 3};
}

// GlobalAveragePool / GlobalMaxPool (or a ReduceMean / ReduceMax over H and W) of a transpose to
// NCHW: the same reduction over H and W of the NHWC tensor (ReduceMean / ReduceMax, keepdims),
// whose [N, 1, 1, C] result goes back by a transpose that becomes a Reshape.
StatusOr<bool> push_through_global_pool(ir::Graph* g, int n, const SupportsFn& supports) {
  const ir::Node& pool = g->nodes[size_t(n)];
  const bool reduce_op = is_onnx(pool, "ReduceMean") || is_onnx(pool, "ReduceMax");
  const bool avg = is_onnx(pool, "GlobalAveragePool") || is_onnx(pool, "ReduceMean");
  if ((!avg && !is_onnx(pool, "GlobalMaxPool") && !reduce_op) || pool.outputs.size() != 1 ||
      pool.outputs[0] < 0) {
    return false;
  }
  // torch.onnx's dynamo exporter writes x.mean((2, 3), keepdim=True) as ReduceMean over axes
  // [2, 3] (or [-2, -1]) with keepdims, the same global pool.
  if (reduce_op && !is_global_reduce(*g, pool)) return false;
  const int a = transposed_from(*g, pool.inputs.empty() ? -1 : pool.inputs[0], kToNchw);
  const int out = pool.outputs[0];
  if (a < 0 || !g->values[size_t(out)].shape || g->values[size_t(out)].shape->size() != 4) {
    return false;
  }
  const size_t num_values = g->values.size();
  const std::string name = g->values[size_t(out)].name;
  const int r = ir::add_unique_value(g, name + "_nhwc", g->values[size_t(out)].dtype,
                                     permuted(*g->values[size_t(out)].shape, kToNhwc));
  ir::Node reduce = onnx_node(*g, avg ? "ReduceMean" : "ReduceMax", pool.name, {a}, {r});
  set_int(&reduce, "keepdims", 1);
  // ReduceMean and ReduceMax take their axes as an input from opset 18, as an attribute before.
  if (reduce.opset >= 18) {
    reduce.inputs.push_back(
        add_constant(g, name + "_axes", Tensor::from_vector<int64_t>(DType::kInt64, {2}, {1, 2})));
  } else {
    set_ints(&reduce, "axes", {1, 2});
  }
  if (!supports(reduce, typed(*g, reduce.inputs), typed(*g, reduce.outputs))) {
    g->values.resize(num_values);
    return false;
  }
  std::vector<ir::Node> nodes;
  nodes.push_back(std::move(reduce));
  nodes.push_back(transpose_back(*g, r, out));
  KILN_RETURN_IF_ERROR(splice(g, n, std::move(nodes)));
  return true;
}

// MaxPool (without Indices, which number NCHW positions) or AveragePool of a transpose to NCHW:
// kiln::Pool computes the same pool on the NHWC tensor, and a transpose after it makes its output.
// A CNN's stem pool then sits inside the convolution stack instead of costing two transposes.
StatusOr<bool> push_through_pool(ir::Graph* g, int n, const SupportsFn& supports) {
  const ir::Node& pool = g->nodes[size_t(n)];
  const bool max = is_onnx(pool, "MaxPool");
  if ((!max && !is_onnx(pool, "AveragePool")) || pool.outputs.empty() || pool.outputs[0] < 0 ||
      (pool.outputs.size() > 1 && pool.outputs[1] >= 0)) {
    return false;
  }
  const int a = transposed_from(*g, pool.inputs.empty() ? -1 : pool.inputs[0], kToNchw);
  const int out = pool.outputs[0];
  if (a < 0 || !g->values[size_t(out)].shape || g->values[size_t(out)].shape->size() != 4) {
    return false;
  }
  ir::Node moved = pool;
  moved.domain = "kiln";
  moved.op_type = "Pool";
  moved.opset = 1;
  moved.attrs = ir::Attributes{};
  for (const auto& [name, attr] : pool.attrs.all()) {
    // storage_order only orders Indices, which kiln::Pool does not have.
    if (name != "storage_order") moved.attrs.set(name, attr);
  }
  set_string(&moved, "mode", max ? "max" : "average");
  set_string(&moved, "layout", "NHWC");
  const ir::Value& o = g->values[size_t(out)];
  const ir::Value yn{.name = o.name, .dtype = o.dtype, .shape = permuted(*o.shape, kToNhwc)};
  if (!supports(moved, {&g->values[size_t(a)]}, {&yn})) return false;
  const int y = ir::add_unique_value(g, yn.name + "_nhwc", yn.dtype, yn.shape);
  moved.inputs = {a};
  moved.outputs = {y};
  std::vector<ir::Node> nodes;
  nodes.push_back(std::move(moved));
  nodes.push_back(transpose_back(*g, y, out));
  g->opsets.emplace("kiln", 1);
  KILN_RETURN_IF_ERROR(splice(g, n, std::move(nodes)));
  return true;
}

// Reshape(Reshape(a)) back to a's own shape: its readers read a. Two lifted 1-D convolutions in a
// row (Whisper's stem) meet so: the first one's view back to [N, C, L], the second's to [N, C, 1,
// L]; the transposes around them then cancel.
bool cancel_reshape_pair(ir::Graph* g, int n) {
  const ir::Node& r2 = g->nodes[size_t(n)];
  if (!is_onnx(r2, "Reshape") || r2.outputs.size() != 1 || r2.outputs[0] < 0 || r2.inputs.empty())
    return false;
  const int mid = r2.inputs[0];
  if (mid < 0 || g->values[size_t(mid)].producer < 0) return false;
  const ir::Node& r1 = g->nodes[size_t(g->values[size_t(mid)].producer)];
  if (!is_onnx(r1, "Reshape") || r1.inputs.empty() || r1.inputs[0] < 0) return false;
  const ir::Value &a = g->values[size_t(r1.inputs[0])], &out = g->values[size_t(r2.outputs[0])];
  if (!a.shape || !out.shape || *a.shape != *out.shape || a.dtype != out.dtype) return false;
  if (!has_readers(*g, r2.outputs[0])) return false;
  return ir::replace_all_uses(g, r2.outputs[0], r1.inputs[0]).ok();
}

// The Reshape constant that views `from` as `to` for every value of the symbols: the number
// where a dim is constant, 0 (copy) where a symbolic dim keeps its index, -1 for at most one other
// symbolic dim; nullopt where none does.
std::optional<std::vector<int64_t>> view_shape(const std::vector<Dim>& from,
                                               const std::vector<Dim>& to) {
  std::vector<int64_t> shape;
  bool inferred = false;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i].is_const() && to[i].value() > 0) {
      shape.push_back(to[i].value());
    } else if (!to[i].is_const() && i < from.size() && from[i] == to[i]) {
      shape.push_back(0);
    } else if (!to[i].is_const() && !inferred) {
      shape.push_back(-1);
      inferred = true;
    } else {
      return std::nullopt;
    }
  }
  return shape;
}

// Transpose(Reshape(Transpose(a, p)), q) where the Reshape only drops or adds dims of size 1 and
// the dims larger than 1 come out in a's order: a view of a. Whisper's stem ends so: the NHWC
// convolution's [N, 1, L, C] back to NCHW [N, C, 1, L], viewed as [N, C, L] and permuted by the
// model to [N, L, C]; two transposes of [32, 384, 1500] float16 (73 us each on an H200) go.
bool transposes_around_a_view(ir::Graph* g, int n) {
  const ir::Node& t2 = g->nodes[size_t(n)];
  if (!is_onnx(t2, "Transpose") || t2.outputs.size() != 1 || t2.outputs[0] < 0 || t2.inputs.empty())
    return false;
  auto producer = [&](int v) -> const ir::Node* {
    return v >= 0 && g->values[size_t(v)].producer >= 0
               ? &g->nodes[size_t(g->values[size_t(v)].producer)]
               : nullptr;
  };
  const ir::Node* r = producer(t2.inputs[0]);
  if (!r || !is_onnx(*r, "Reshape") || r->inputs.empty()) return false;
  const ir::Node* t1 = producer(r->inputs[0]);
  if (!t1 || !is_onnx(*t1, "Transpose") || t1->inputs.empty() || t1->inputs[0] < 0) return false;
  auto p = perm_of(*g, *t1), q = perm_of(*g, t2);
  const int a = t1->inputs[0];
  const ir::Value &av = g->values[size_t(a)], &mid = g->values[size_t(t1->outputs[0])],
                  &rv = g->values[size_t(r->outputs[0])], &out = g->values[size_t(t2.outputs[0])];
  if (!p || !q || !av.shape || !mid.shape || !rv.shape || !out.shape) return false;
  // The dims larger than 1 (any symbolic dim counts as one), by index.
  auto big = [](const std::vector<Dim>& s) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != Dim(1)) idx.push_back(i);
    }
    return idx;
  };
  const std::vector<size_t> mid_big = big(*mid.shape), r_big = big(*rv.shape);
  if (mid_big.size() != r_big.size()) return false;
  for (size_t k = 0; k < r_big.size(); ++k) {
    if ((*mid.shape)[mid_big[k]] != (*rv.shape)[r_big[k]]) return false;  // the Reshape moves data
  }
  // Where each output dim larger than 1 comes from in a: out[j] = rv[q[j]] = mid[mid_big[k]] (k
  // the rank of q[j] among rv's big dims) = a[p[mid_big[k]]].
  int64_t last = -1;
  for (size_t j = 0; j < q->size(); ++j) {
    const size_t from = size_t((*q)[j]);
    if ((*rv.shape)[from] == Dim(1)) continue;
    const size_t k = size_t(std::find(r_big.begin(), r_big.end(), from) - r_big.begin());
    const int64_t src = (*p)[mid_big[k]];
    if (src < last) return false;  // a real permutation of a's data
    last = src;
  }
  auto shape = view_shape(*av.shape, *out.shape);
  if (!shape) return false;
  ir::Node view = onnx_node(*g, "Reshape", t2.name, {}, t2.outputs);
  const int s =
      add_constant(g, out.name + "_view_shape",
                   Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(shape->size())}, *shape));
  view.inputs = {a, s};
  g->nodes[size_t(n)] = std::move(view);
  return true;
}

// A Transpose that moves only dims of size 1 keeps the bytes in order: a Reshape to its output
// shape. The shape constant holds for every value of the symbols: 0 (copy the input's dim) where a
// symbolic dim stays in place, the number elsewhere; otherwise the Transpose stays.
bool transpose_to_reshape(ir::Graph* g, int n) {
  const ir::Node& t = g->nodes[size_t(n)];
  if (!is_onnx(t, "Transpose") || t.outputs.size() != 1 || t.outputs[0] < 0) return false;
  auto perm = perm_of(*g, t);
  if (!perm) return false;
  const std::vector<Dim>& in = *g->values[size_t(t.inputs[0])].shape;
  std::vector<int64_t> shape;
  int64_t last_moved = -1;
  for (size_t i = 0; i < perm->size(); ++i) {
    const int64_t p = (*perm)[i];
    const Dim& d = in[size_t(p)];
    if (d == Dim(1)) {
      shape.push_back(1);
      continue;
    }
    if (p < last_moved) return false;  // two dims larger than 1 change order: a real transpose
    last_moved = p;
    if (d.is_const() && d.value() > 0) {
      shape.push_back(d.value());
    } else if (!d.is_const() && p == int64_t(i)) {
      shape.push_back(0);
    } else {
      return false;  // a symbolic dim that moves, or an empty dim (0 would mean "copy")
    }
  }
  ir::Node reshape = onnx_node(*g, "Reshape", t.name, {}, t.outputs);
  const int in_value = t.inputs[0];
  const int s =
      add_constant(g, g->values[size_t(t.outputs[0])].name + "_shape",
                   Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(shape.size())}, shape));
  reshape.inputs = {in_value, s};
  g->nodes[size_t(n)] = std::move(reshape);
  return true;
}

// One rewrite of step 2, the cheapest kind first: cancelling and merging before moving (a pair that
// cancels must not be moved apart), and Reshapes last (a Reshape no longer cancels with a
// Transpose).
StatusOr<bool> simplify_once(ir::Graph* g, const SupportsFn& supports) {
  bool changed = false;
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    changed = cancel_pair(g, int(n)) || changed;
    changed = merge_duplicate(g, int(n)) || changed;
    changed = cancel_reshape_pair(g, int(n)) || changed;
    changed = transposes_around_a_view(g, int(n)) || changed;
  }
  if (changed) return true;
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    KILN_ASSIGN_OR_RETURN(bool moved, push_through_elementwise(g, int(n)));
    if (moved) return true;
    KILN_ASSIGN_OR_RETURN(moved, push_through_global_pool(g, int(n), supports));
    if (moved) return true;
    KILN_ASSIGN_OR_RETURN(moved, push_through_pool(g, int(n), supports));
    if (moved) return true;
  }
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    if (transpose_to_reshape(g, int(n))) return true;
  }
  return false;
}

}  // namespace

Status assign_layout(ir::Graph* g, const SupportsFn& supports, const LayoutOptions& options) {
  std::map<int, int> weights;
  bool converted = false;
  for (size_t n = 0; n < g->nodes.size();) {
    KILN_ASSIGN_OR_RETURN(bool lifted, lift_conv1d(g, int(n), options));
    converted = converted || lifted;
    n = lifted ? 0 : n + 1;  // splice re-sorts the graph
  }
  for (size_t n = 0; n < g->nodes.size(); ++n) {
    KILN_ASSIGN_OR_RETURN(bool c, convert_conv(g, int(n), supports, options, &weights));
    converted = converted || c;
  }
  if (!converted) return ok_status();
  // Each rewrite either removes a transpose's reader or turns an NCHW node into an NHWC one that
  // no rule matches again, so the loop ends.
  for (;;) {
    ir::remove_dead_nodes(g);
    KILN_ASSIGN_OR_RETURN(bool changed, simplify_once(g, supports));
    if (!changed) break;
  }
  ir::remove_dead_nodes(g);
  ir::compact(g);
  return ir::verify(*g);
}

Status assign_layout(BuildState& s) {
  if (s.backend.device() != Device::kCPU) {
    return assign_layout(&s.graph, backend_supports(s), LayoutOptions{});
  }
  // The CPU: float32 convolutions too (its NHWC kernels vectorize over channels and read the
  // activations as GEMM rows in place; MobileNetV3-small's depthwise convs ran 2-3x faster), and
  // no zero channels (they would only add work there). A transpose there is a pass over memory
  // that cuDNN's NCHW kernels would have made anyway but the CPU's NCHW kernels do not: the graph
  // takes the NHWC form only where its conv stacks are long enough to pay for the transposes at
  // their edges (at least four convolutions per transpose left; a lone conv stays NCHW).
  auto count = [](const ir::Graph& g, auto pred) {
    return std::count_if(g.nodes.begin(), g.nodes.end(), pred);
  };
  auto is_transpose = [](const ir::Node& n) { return is_onnx(n, "Transpose"); };
  auto is_nhwc_conv = [](const ir::Node& n) {
    if (n.domain != "kiln" || n.op_type != "FusedConv") return false;
    auto layout = n.attrs.get_string("layout", "NCHW");
    return layout.ok() && *layout == "NHWC";
  };
  ir::Graph g = s.graph;
  KILN_RETURN_IF_ERROR(assign_layout(
      &g, backend_supports(s), LayoutOptions{.convert_float32 = true, .pad_channels = false}));
  const auto added = count(g, is_transpose) - count(s.graph, is_transpose);
  const auto convs = count(g, is_nhwc_conv);
  if (convs > 0 && added * 4 <= convs) s.graph = std::move(g);
  return ok_status();
}

}  // namespace kiln::builder

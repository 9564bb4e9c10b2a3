#include "ops/attribute_domains.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <string_view>
#include <utility>

#include "ops/schema.h"

namespace kiln::ops {
namespace {

struct Domain {
  std::string_view attr;
  std::vector<int64_t> allowed;
};

// By op: the attributes ONNX's operator specification enumerates. Flags (0 or 1) unless listed.
const std::map<OpKind, std::vector<Domain>>& table() {
  static const auto* t = [] {
    const std::vector<int64_t> flag = {0, 1};
    auto flags = [&](std::initializer_list<std::string_view> names) {
      std::vector<Domain> d;
      for (std::string_view n : names) d.push_back({n, flag});
      return d;
    };
    auto* m = new std::map<OpKind, std::vector<Domain>>;
    for (OpKind k : {OpKind::kReduceMean, OpKind::kReduceSum, OpKind::kReduceMax,
                     OpKind::kReduceMin, OpKind::kReduceProd, OpKind::kReduceL1, OpKind::kReduceL2,
                     OpKind::kReduceLogSum, OpKind::kReduceLogSumExp, OpKind::kReduceSumSquare}) {
      (*m)[k] = flags({"keepdims", "noop_with_empty_axes"});
    }
    (*m)[OpKind::kArgMax] = flags({"keepdims", "select_last_index"});
    (*m)[OpKind::kArgMin] = flags({"keepdims", "select_last_index"});
    (*m)[OpKind::kTopK] = flags({"largest", "sorted"});
    (*m)[OpKind::kCumSum] = flags({"exclusive", "reverse"});
    (*m)[OpKind::kCumProd] = flags({"exclusive", "reverse"});
    (*m)[OpKind::kGemm] = flags({"transA", "transB"});
    (*m)[OpKind::kMaxPool] = flags({"ceil_mode", "storage_order"});
    (*m)[OpKind::kAveragePool] = flags({"ceil_mode", "count_include_pad"});
    (*m)[OpKind::kLpPool] = flags({"ceil_mode"});
    (*m)[OpKind::kTrilu] = flags({"upper"});
    (*m)[OpKind::kUnique] = flags({"sorted"});
    (*m)[OpKind::kIsInf] = flags({"detect_negative", "detect_positive"});
    (*m)[OpKind::kConcatFromSequence] = flags({"new_axis"});
    (*m)[OpKind::kSplitToSequence] = flags({"keepdims"});
    (*m)[OpKind::kNonMaxSuppression] = flags({"center_point_box"});
    (*m)[OpKind::kGridSample] = flags({"align_corners"});
    (*m)[OpKind::kResize] = flags({"exclude_outside"});
    (*m)[OpKind::kDFT] = flags({"inverse", "onesided"});
    (*m)[OpKind::kSTFT] = flags({"onesided"});
    (*m)[OpKind::kAttention] = flags({"is_causal"});
    (*m)[OpKind::kRotaryEmbedding] = flags({"interleaved"});
    (*m)[OpKind::kHannWindow] = flags({"periodic"});
    (*m)[OpKind::kHammingWindow] = flags({"periodic"});
    (*m)[OpKind::kBlackmanWindow] = flags({"periodic"});
    (*m)[OpKind::kGRU] = flags({"layout", "linear_before_reset"});
    (*m)[OpKind::kLSTM] = flags({"layout", "input_forget"});
    (*m)[OpKind::kRNN] = flags({"layout"});
    // Scan: 0 forward, 1 reverse (opset 8's batched form calls its input directions "directions").
    (*m)[OpKind::kScan] = flags({"scan_input_directions", "scan_output_directions", "directions"});
    return m;
  }();
  return *t;
}

}  // namespace

std::vector<std::string> attribute_domain_problems(const ir::Node& node) {
  std::vector<std::string> out;
  const OpKind kind = find_op(node.domain, node.op_type);
  auto it = table().find(kind);
  if (it == table().end()) return out;
  for (const Domain& d : it->second) {
    const ir::Attribute* a = node.attrs.find(std::string(d.attr));
    if (!a) continue;
    std::vector<int64_t> values;
    if (a->type == ir::AttrType::kInt) {
      values = {a->i};
    } else if (a->type == ir::AttrType::kInts) {
      values = a->ints;
    } else {
      out.push_back(node.describe() + " attribute " + std::string(d.attr) + " must be an integer");
      continue;
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::find(d.allowed.begin(), d.allowed.end(), values[i]) != d.allowed.end()) continue;
      std::string allowed;
      for (int64_t v : d.allowed) allowed += (allowed.empty() ? "" : " or ") + std::to_string(v);
      out.push_back(
          node.describe() + " attribute " + std::string(d.attr) +
          (a->type == ir::AttrType::kInts ? "[" + std::to_string(i) + "]" : std::string()) +
          " is " + std::to_string(values[i]) + "; ONNX allows " + allowed);
      break;
    }
  }
  return out;
}

}  // namespace kiln::ops

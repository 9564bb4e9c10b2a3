// kiln compare: polygraphy-style accuracy check of kiln against ONNX Runtime on the same inputs.
// The reference computes in FP32 and the output says so; per output it reports max abs, max rel,
// mean abs, p99 abs, cosine similarity and top-1 agreement for class scores. Exit 0 pass, 1 fail.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "commands.h"
#include "engine_source.h"
#include "inputs.h"
#include "progress.h"
#include "reference.h"

namespace kiln::cli {
namespace {

CommandSpec compare_spec() {
  return command_spec(
      kCmdCompare, "compare",
      "--onnx=MODEL [--loadEngine=ENGINE | build flags] [--shapes=..] [--atol=A --rtol=R]",
      "Runs kiln and a reference on the same inputs (seeded random, or --loadInputs) and\n"
      "compares every output: |kiln - ref| <= atol + rtol*|ref| elementwise, NaN/Inf must match.\n"
      "The reference is ONNX Runtime's CPU provider in FP32; where onnxruntime cannot be\n"
      "imported, kiln's own CPU reference kernels in FP32 (the output says which). Without\n"
      "--loadEngine the engine is built from the build flags, or from --shapes as min = opt = "
      "max.\n"
      "Default tolerances follow the lowest precision any layer computes in.");
}

struct Tolerance {
  double atol, rtol;
  std::string why;
  // --minCosine/--minTop1 (-1: absent); elementwise: whether atol/rtol must hold too (not when
  // the metrics were given alone).
  double min_cosine = -1, min_top1 = -1;
  bool elementwise = true;
};

// Defaults by the lowest precision a layer computes in. FP32 is the foundation's bound (also in
// tests/test_util.h); the others allow for the 10-bit (fp16), 7-bit (bf16) and 8-bit (int8)
// mantissas, accumulated over a network's depth.
Tolerance default_tolerance(const Engine& engine) {
  // The precision each node computes in, as the plan records it.
  // A node that computes in its own dtypes (compute undefined: the elementwise ops, norms and
  // fused kernels of an FP16 engine, whose activations are float16) counts by its outputs' dtype.
  bool f16 = false, b16 = false, i8 = false, tf32 = false;
  const plan::Plan& plan = engine.plan();
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const plan::NodePlan& n = plan.nodes[i];
    DType c = n.precision.compute;
    if (c == DType::kUndefined && n.impl != plan::kAliasImpl && i < plan.graph.nodes.size()) {
      for (int v : plan.graph.nodes[i].outputs) {
        const DType t = v >= 0 ? plan.graph.values[size_t(v)].dtype : DType::kUndefined;
        if (t == DType::kFloat16 || t == DType::kBFloat16) c = t;
        if (t == DType::kInt8) c = t;  // a Q/DQ model's QuantizeLinear
      }
    }
    f16 |= c == DType::kFloat16, b16 |= c == DType::kBFloat16;
    i8 |= c == DType::kInt8, tf32 |= n.precision.tf32;
  }
  if (i8) return {1e-1, 1e-1, "defaults for int8 layers"};
  if (b16) return {5e-2, 5e-2, "defaults for bfloat16 layers"};
  if (f16) return {1e-2, 1e-2, "defaults for float16 layers"};
  if (tf32) return {1e-3, 1e-2, "defaults for TF32 matmul/conv on a GPU"};
  return {1e-4, 1e-3, "defaults for float32 layers"};
}

// A criterion as given (0.9999999 stays that, not 1).
std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

struct Stats {
  bool shape_ok = true, pass = true;
  double max_abs = 0, max_rel = 0, mean_abs = 0, p99_abs = 0, cosine = 1;
  int64_t violations = 0, nan_mismatch = 0, top1_agree = -1, rows = 0;
  std::string note;  // why it fails beyond the counts
  std::string info;  // worth knowing, not a failure
};

Stats compare_tensors(const Tensor& a, const Tensor& e, const Tolerance& tol) {
  Stats s;
  if (a.shape() != e.shape()) {
    s.shape_ok = s.pass = false;
    s.note = "shape " + dims_to_spec(a.shape()) + " vs reference " + dims_to_spec(e.shape());
    return s;
  }
  int64_t n = a.numel();
  std::vector<double> diffs;
  diffs.reserve(size_t(n));
  double dot = 0, na = 0, ne = 0, sum = 0, max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    double x = a.float_at(i), y = e.float_at(i);
    if (std::isnan(x) || std::isnan(y) || std::isinf(x) || std::isinf(y)) {
      bool same = (std::isnan(x) && std::isnan(y)) || x == y;
      if (!same) ++s.nan_mismatch;
      continue;
    }
    double d = std::fabs(x - y);
    max_ref = std::max(max_ref, std::fabs(y));
    diffs.push_back(d);
    sum += d;
    s.max_abs = std::max(s.max_abs, d);
    s.max_rel = std::max(s.max_rel, y != 0 ? d / std::fabs(y) : d == 0 ? 0 : INFINITY);
    if (d > tol.atol + tol.rtol * std::fabs(y)) ++s.violations;
    dot += x * y, na += x * x, ne += y * y;
  }
  if (!diffs.empty()) {
    s.mean_abs = sum / double(diffs.size());
    std::sort(diffs.begin(), diffs.end());
    size_t rank = size_t(std::ceil(0.99 * double(diffs.size())));
    s.p99_abs = diffs[std::min(diffs.size() - 1, rank == 0 ? 0 : rank - 1)];
  }
  s.cosine = na == 0 && ne == 0 ? 1.0 : na == 0 || ne == 0 ? 0.0 : dot / std::sqrt(na * ne);
  if (looks_like_class_scores(e)) {
    s.rows = e.shape()[0];
    int64_t cols = e.shape()[1];
    s.top1_agree = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      int64_t ba = 0, be = 0;
      for (int64_t c = 1; c < cols; ++c) {
        if (a.float_at(r * cols + c) > a.float_at(r * cols + ba)) ba = c;
        if (e.float_at(r * cols + c) > e.float_at(r * cols + be)) be = c;
      }
      s.top1_agree += ba == be;
    }
  }
  // A kernel that writes nothing must not pass against a reference that is not all zeros.
  if (na == 0 && ne > 0 && n > 0) s.note = "kiln's output is all zeros, the reference's is not";
  if (ne == 0 && n > 0) {
    s.info = "the reference output is all zeros, so this comparison shows little";
  } else if (max_ref < tol.atol && n > 0) {
    s.info = "every reference value is below atol (max |ref| " + sci(max_ref) +
             "), so the tolerance admits anything that small; judge by cosine and top-1";
  }
  if (s.note.empty() && tol.min_cosine >= 0 && !(s.cosine >= tol.min_cosine)) {
    char why[96];
    std::snprintf(why, sizeof why, "cosine %.6f is below --minCosine=%.10g", s.cosine,
                  tol.min_cosine);
    s.note = why;
  } else if (s.note.empty() && tol.min_top1 >= 0 && s.top1_agree >= 0 &&
             double(s.top1_agree) < tol.min_top1 * double(s.rows)) {
    char why[96];
    std::snprintf(why, sizeof why, "top-1 %lld/%lld is below --minTop1=%.10g",
                  static_cast<long long>(s.top1_agree), static_cast<long long>(s.rows),
                  tol.min_top1);
    s.note = why;
  }
  s.pass = (!tol.elementwise || s.violations == 0) && s.nan_mismatch == 0 && s.note.empty();
  return s;
}

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s + " ";
}

}  // namespace

int compare_command(const Argv& argv) {
  const CommandSpec spec = compare_spec();
  auto args = Args::parse(spec, argv);
  if (!args.ok()) return report("compare", args.error());
  if (args->help()) {
    std::fputs(help_text(spec).c_str(), stdout);
    return kExitOk;
  }
  auto build = parse_build_options(*args);
  if (!build.ok()) return report("compare", build.error());
  if (build->onnx.empty())
    return report("compare", usage_error("--onnx=MODEL is required: the reference runs the model"));
  auto inputs_opt = parse_input_options(*args);
  if (!inputs_opt.ok()) return report("compare", inputs_opt.error());
  // Any finite tolerance is meaningful; -1 (absent) picks the per-dtype default.
  auto atol_flag = args->get_double("atol", -1, 0, std::numeric_limits<double>::max());
  auto rtol_flag = args->get_double("rtol", -1, 0, std::numeric_limits<double>::max());
  if (!atol_flag.ok()) return report("compare", atol_flag.error());
  if (!rtol_flag.ok()) return report("compare", rtol_flag.error());
  // Metric criteria (-1: absent). Given without --atol/--rtol, they judge alone.
  auto min_cosine = args->get_double("minCosine", -1, 0, 1);
  auto min_top1 = args->get_double("minTop1", -1, 0, 1);
  if (!min_cosine.ok()) return report("compare", min_cosine.error());
  if (!min_top1.ok()) return report("compare", min_top1.error());
  const bool metrics = *min_cosine >= 0 || *min_top1 >= 0;
  const bool elementwise = !metrics || *atol_flag >= 0 || *rtol_flag >= 0;
  std::string which = args->get("reference").value_or("auto");
  if (which != "auto" && which != "ort" && which != "kiln") {
    return report("compare", usage_error("--reference=" + which + " is not auto, ort or kiln"));
  }
  auto load = args->get("loadEngine");

  Stages stages("compare", 4, build->verbose);
  stages.begin("parsing " + build->onnx);
  auto network = load_build_network(*build);
  if (!network.ok()) return report("compare", network.error());
  stages.end();
  stages.begin(load ? "loading " + *load : "building the engine");
  Result<Engine> engine = failure("no engine");
  if (load) {
    engine = load_engine(*load);
  } else {
    engine = build_engine(*network, *build, "compare");
    if (!engine.ok() && build->profiles.empty()) {
      Error e = engine.error();
      e.message += "\n(kiln compare also takes --shapes=NAME:DIMS,..., used as min = opt = max)";
      return report("compare", e);
    }
  }
  if (!engine.ok()) return report("compare", engine.error());
  stages.end();
  if (engine->plan().model_hash != network->model_hash) {
    std::printf(
        "warning: %s was built from a different model file (hash %016llx, this model %016llx)\n",
        load ? load->c_str() : "the engine",
        static_cast<unsigned long long>(engine->plan().model_hash),
        static_cast<unsigned long long>(network->model_hash));
  }
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return report("compare", failure(ctx.status(), "creating an execution context"));
  auto inputs = prepare_inputs(*engine, **ctx, *inputs_opt);
  if (!inputs.ok()) return report("compare", inputs.error());

  stages.begin("running kiln");
  auto actual = (*ctx)->run(inputs->tensors);
  if (!actual.ok()) return report("compare", failure(actual.status(), "running kiln"));
  stages.end();

  stages.begin("running the reference");
  Reference ref;
  std::string why;
  if (which != "kiln") {
    auto ort = ort_reference(build->onnx, inputs->order, inputs->tensors, &why);
    if (!ort.ok()) return report("compare", ort.error());
    if (ort->has_value())
      ref = std::move(**ort);
    else if (which == "ort")
      return report("compare", failure("--reference=ort, but onnxruntime is unavailable: " + why));
  }
  if (ref.description.empty()) {
    // With --int8 --calib the engine comes from the Q/DQ model calibration wrote; the reference
    // runs the FP32 model the user gave (ONNX Runtime above reads it too), else INT8 would be
    // compared with itself and always pass.
    const Network* source = &*network;
    Result<Network> fp32 = failure("unused");
    if (build->calibration) {
      fp32 = load_network(build->onnx);
      if (!fp32.ok()) return report("compare", fp32.error());
      source = &*fp32;
    }
    auto own = kiln_cpu_reference(*source, inputs->tensors);
    if (!own.ok()) return report("compare", own.error());
    ref = std::move(own).value();
    ref.description += why.empty() ? std::string(" (--reference=kiln)")
                                   : "; onnxruntime was not available (" + why + ")";
  }
  stages.end();

  Tolerance tol = default_tolerance(*engine);
  if (*atol_flag >= 0 || *rtol_flag >= 0) tol.why = "given";
  if (*atol_flag >= 0) tol.atol = *atol_flag;
  if (*rtol_flag >= 0) tol.rtol = *rtol_flag;
  tol.min_cosine = *min_cosine, tol.min_top1 = *min_top1, tol.elementwise = elementwise;

  std::printf("\nmodel: %s\n", build->onnx.c_str());
  std::printf("kiln: %s engine, profile %d; %s\n",
              std::string(device_name(engine->device())).c_str(), inputs->profile,
              precision_summary(*engine, build->requested).c_str());
  std::printf("inputs:\n");
  for (const auto& n : inputs->order) {
    std::printf("  %s: %s %s, %s\n", n.c_str(), dims_to_spec(inputs->tensors[n].shape()).c_str(),
                std::string(dtype_name(inputs->tensors[n].dtype())).c_str(),
                inputs->from[n].c_str());
  }
  std::printf("reference: %s\n", ref.description.c_str());
  std::printf("tolerance: |kiln - ref| <= atol + rtol*|ref|, atol %s, rtol %s (%s)%s\n",
              sci(tol.atol).c_str(), sci(tol.rtol).c_str(), tol.why.c_str(),
              elementwise ? "" : "; reported, not required: the criteria below judge");
  if (metrics) {
    std::string c;
    if (*min_cosine >= 0) c += "cosine >= " + shortest(*min_cosine);
    if (*min_top1 >= 0) c += (c.empty() ? "" : ", ") + ("top-1 >= " + shortest(*min_top1));
    std::printf("criteria: %s (--minCosine/--minTop1)\n", c.c_str());
  }
  std::printf("\n");

  std::vector<std::string> names;
  size_t wn = 6, ws = 5;
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string n = engine->io_tensor_name(i);
    if (engine->tensor_mode(n) != TensorIOMode::kOUTPUT) continue;
    names.push_back(n);
    wn = std::max(wn, n.size());
    if (actual->count(n)) ws = std::max(ws, dims_to_spec(actual->at(n).shape()).size());
  }
  std::printf("%s%s%s%s%s%s%s%s%s%s\n", pad("output", wn).c_str(), pad("shape", ws).c_str(),
              pad("max_abs", 9).c_str(), pad("max_rel", 9).c_str(), pad("mean_abs", 9).c_str(),
              pad("p99_abs", 9).c_str(), pad("cosine", 9).c_str(), pad("top1", 14).c_str(),
              pad("violations", 11).c_str(), "result");
  int passed = 0;
  std::string notes;
  for (const auto& n : names) {
    auto ai = actual->find(n);
    auto ri = ref.outputs.find(n);
    if (ai == actual->end() || ri == ref.outputs.end()) {
      std::printf("%s missing from %s  FAIL\n", pad(n, wn).c_str(),
                  ai == actual->end() ? "kiln" : "the reference");
      continue;
    }
    Stats s = compare_tensors(ai->second, ri->second, tol);
    std::string top1 = "-";
    if (s.top1_agree >= 0) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%lld/%lld %.0f%%", static_cast<long long>(s.top1_agree),
                    static_cast<long long>(s.rows),
                    s.rows ? 100.0 * double(s.top1_agree) / double(s.rows) : 100.0);
      top1 = buf;
    }
    char cos[32];
    std::snprintf(cos, sizeof cos, "%.6f", s.cosine);
    std::string viol = std::to_string(s.violations) +
                       (s.nan_mismatch ? "+" + std::to_string(s.nan_mismatch) + "nan" : "");
    if (!s.shape_ok) {
      std::printf("%s%s%s FAIL\n", pad(n, wn).c_str(),
                  pad(dims_to_spec(ai->second.shape()), ws).c_str(), s.note.c_str());
      continue;
    }
    std::printf("%s%s%s%s%s%s%s%s%s%s\n", pad(n, wn).c_str(),
                pad(dims_to_spec(ai->second.shape()), ws).c_str(), pad(sci(s.max_abs), 9).c_str(),
                pad(sci(s.max_rel), 9).c_str(), pad(sci(s.mean_abs), 9).c_str(),
                pad(sci(s.p99_abs), 9).c_str(), pad(cos, 9).c_str(), pad(top1, 14).c_str(),
                pad(viol, 11).c_str(), s.pass ? "PASS" : "FAIL");
    if (!s.note.empty()) notes += "  " + n + ": " + s.note + "\n";
    if (!s.info.empty()) notes += "  note: " + n + ": " + s.info + "\n";
    passed += s.pass;
  }
  std::printf("%s", notes.c_str());
  bool all = passed == int(names.size());
  std::printf("\n%s: %d of %zu outputs within tolerance\n", all ? "PASS" : "FAIL", passed,
              names.size());
  return all ? kExitOk : kExitFail;
}

}  // namespace kiln::cli

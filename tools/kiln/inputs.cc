// Input preparation and tensor summaries for the kiln CLI.
#include "inputs.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "core/checked.h"
#include "core/file.h"
#include "npy.h"
#include "plan/engine_file.h"

namespace kiln::cli {
namespace {

std::string engine_inputs_list(const Engine& engine) {
  std::string s;
  for (int i = 0; i < engine.num_io_tensors(); ++i) {
    std::string n = engine.io_tensor_name(i);
    if (engine.tensor_mode(n) != TensorIOMode::kINPUT) continue;
    auto dims = engine.tensor_symbolic_shape(n);
    s += "\n  " + n + ": " + (dims.ok() ? ir::dims_to_string(*dims) : "?") + " " +
         std::string(
             dtype_name(engine.tensor_dtype(n).ok() ? *engine.tensor_dtype(n) : DType::kUndefined));
  }
  return s;
}

// The most bytes an input file for `name` may have, so a wrong path (a huge file, a disk image) is
// refused before it is read: the input's largest shape over every profile at 8 bytes an element
// (a file may hold a wider type than the input's, converted after reading), plus room for a .npy
// header or a TensorProto's other fields. An input of no known bounded shape gets the cap of an
// engine file.
uint64_t max_input_file_bytes(const Engine& engine, const std::string& name) {
  constexpr uint64_t kHeaderBytes = uint64_t(1) << 20;
  constexpr int64_t kWidestElementBytes = 8;
  std::optional<uint64_t> most;
  for (int p = 0; p < std::max(engine.num_profiles(), 1); ++p) {
    auto shape = engine.num_profiles() > 0 ? engine.profile_shape(name, p, OptProfileSelector::kMAX)
                                           : engine.tensor_shape(name);
    if (!shape.ok()) continue;
    auto n = checked_numel(*shape);
    auto bytes = n ? checked_mul(*n, kWidestElementBytes) : std::nullopt;
    if (!bytes) continue;
    most = std::max(most.value_or(0), uint64_t(*bytes));
  }
  if (!most) return plan::kMaxEngineFileBytes;
  return std::min(*most, plan::kMaxEngineFileBytes) + kHeaderBytes;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Converts between float dtypes or between integer dtypes, so a float64 .npy feeds a float32 input.
Result<Tensor> convert(const Tensor& t, DType to, const std::string& what) {
  if (t.dtype() == to) return t;
  bool ok = (is_float(t.dtype()) && is_float(to)) || (is_integer(t.dtype()) && is_integer(to));
  if (!ok) {
    return usage_error(what + " holds " + std::string(dtype_name(t.dtype())) +
                       " but the input is " + std::string(dtype_name(to)));
  }
  auto out = Tensor::zeros(to, t.shape());
  if (!out.ok()) return failure(out.status(), what);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (to) {
      case DType::kFloat32:
        out->data_as<float>()[i] = float(t.float_at(i));
        break;
      case DType::kFloat64:
        out->data_as<double>()[i] = t.float_at(i);
        break;
      case DType::kFloat16:
        out->data_as<uint16_t>()[i] = float_to_half(float(t.float_at(i)));
        break;
      case DType::kBFloat16:
        out->data_as<uint16_t>()[i] = float_to_bf16(float(t.float_at(i)));
        break;
      case DType::kInt64:
        out->data_as<int64_t>()[i] = t.int_at(i);
        break;
      case DType::kInt32:
        out->data_as<int32_t>()[i] = int32_t(t.int_at(i));
        break;
      default:
        return usage_error(what + " holds " + std::string(dtype_name(t.dtype())) +
                           " but the input is " + std::string(dtype_name(to)) + "; save it as " +
                           std::string(dtype_name(to)));
    }
  }
  return std::move(out).value();
}

// An input file by its extension: .npy, or .pb (a serialized onnx.TensorProto), of at most
// `max_bytes`.
Result<Tensor> read_tensor_file(const std::string& path, uint64_t max_bytes) {
  auto ends_with = [&](const char* ext) {
    size_t n = std::strlen(ext);
    return path.size() >= n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (ends_with(".npy")) return read_npy(path, max_bytes, "input");
  if (ends_with(".pb")) {
    // Opened here for the cap alone: parse_tensor_file reads it again (refusing special files
    // itself), with the folder a TensorProto's external data is relative to.
    auto file = RegularFile::open(path, max_bytes, "input");
    if (!file.ok()) return failure(file.status().message());
    auto t = onnx::parse_tensor_file(path);
    if (!t.ok()) return failure(t.status(), "reading '" + path + "'");
    return std::move(t).value();
  }
  return usage_error("'" + path +
                     "': input files must be .npy or .pb (a serialized onnx.TensorProto)");
}

}  // namespace

Result<InputOptions> parse_input_options(const Args& args) {
  InputOptions o;
  if (auto s = args.get("shapes")) {
    KILN_CLI_ASSIGN(o.shapes, parse_shape_specs("shapes", *s));
  }
  if (auto s = args.get("loadInputs")) {
    KILN_CLI_ASSIGN(o.files, parse_named_files("loadInputs", *s));
  }
  KILN_CLI_ASSIGN(int64_t seed, args.get_int("seed", 1, 0, std::numeric_limits<int64_t>::max()));
  o.seed = uint64_t(seed);
  // The engine's profile count is checked once it is loaded (prepare_inputs).
  KILN_CLI_ASSIGN(int64_t profile, args.get_int("useProfile", -1, 0, kMaxCount));
  o.profile = int(profile);
  return o;
}

Result<PreparedInputs> prepare_inputs(const Engine& engine, ExecutionContext& ctx,
                                      const InputOptions& options) {
  PreparedInputs out;
  for (int i = 0; i < engine.num_io_tensors(); ++i) {
    std::string n = engine.io_tensor_name(i);
    if (engine.tensor_mode(n) == TensorIOMode::kINPUT) out.order.push_back(n);
  }
  std::set<std::string> inputs(out.order.begin(), out.order.end());
  std::map<std::string, Shape> given;
  for (const auto& s : options.shapes) {
    if (!inputs.count(s.name)) {
      return usage_error(
          "--shapes names '" + s.name +
          "', which is not an input of this engine; its inputs are:" + engine_inputs_list(engine));
    }
    if (engine.is_shape_inference_io(s.name)) {
      // A shape-value input: --shapes gives its values (trtexec's spelling for shape tensors).
      auto t = shape_value_tensor(engine, s.name, s.dims);
      if (!t.ok()) return usage_error("--shapes: " + t.status().message());
      given[s.name] = t->shape();
      out.tensors[s.name] = std::move(t).value();
      out.from[s.name] = "values from --shapes";
      continue;
    }
    given[s.name] = s.dims;
    out.from[s.name] = "shape from --shapes";
  }
  for (const auto& [name, path] : options.files) {
    if (!inputs.count(name)) {
      return usage_error(
          "--loadInputs names '" + name +
          "', which is not an input of this engine; its inputs are:" + engine_inputs_list(engine));
    }
    KILN_CLI_ASSIGN(Tensor t, read_tensor_file(path, max_input_file_bytes(engine, name)));
    auto dtype = engine.tensor_dtype(name);
    KILN_CLI_ASSIGN(t, convert(t, *dtype, "'" + path + "' (for input '" + name + "')"));
    if (given.count(name) && given[name] != t.shape()) {
      return usage_error("--shapes gives " + name + ":" + dims_to_spec(given[name]) + " but '" +
                         path + "' has shape " + dims_to_spec(t.shape()));
    }
    given[name] = t.shape();
    out.from[name] = "from " + path;
    out.tensors[name] = std::move(t);
  }
  // The shape-value inputs the user gave values for (--shapes or --loadInputs): the run uses them,
  // and the profile refuses them where they are outside its ranges. (--loadInputs' were dropped
  // for the profile's opt values once, so out-of-range values were never refused.)
  const std::set<std::string> user_values = [&] {
    std::set<std::string> names;
    for (const auto& [name, t] : out.tensors) names.insert(name);
    return names;
  }();

  // The profile: the one asked for, else the one whose ranges hold every given shape and whose opt
  // is nearest (else the first that holds them, the other inputs at its opt shapes).
  int n_profiles = std::max(engine.num_profiles(), 1);
  std::vector<int> candidates;
  if (options.profile >= 0) {
    if (options.profile >= n_profiles) {
      return usage_error("profile " + std::to_string(options.profile) +
                         " (--profile/--useProfile) does not exist; the engine has " +
                         std::to_string(n_profiles) + " profile(s)");
    }
    candidates.push_back(options.profile);
  } else {
    // Every shape given: the library's choice first (an unpinned context takes the profile whose
    // ranges hold the shapes and whose opt is nearest), then the others as before.
    int chosen = -1;
    if (n_profiles > 1 && given.size() == out.order.size()) {
      bool set = true;
      for (const auto& name : out.order) set = set && ctx.set_input_shape(name, given[name]).ok();
      if (set && ctx.infer_shapes().ok()) chosen = ctx.optimization_profile();
    }
    if (chosen >= 0) candidates.push_back(chosen);
    for (int p = 0; p < n_profiles; ++p) {
      if (p != chosen) candidates.push_back(p);
    }
    out.profile_chosen = chosen >= 0;
  }
  std::string why_not;
  for (int p : candidates) {
    Status st = ctx.set_optimization_profile(p);
    std::map<std::string, Shape> shapes;
    // Shape-value inputs the user gave no values for take the profile's opt values (or the one
    // value the engine was built for); the run reads them when shapes resolve.
    for (const auto& name : out.order) {
      if (!engine.is_shape_inference_io(name)) continue;
      if (!user_values.count(name)) {
        auto opt = engine.profile_tensor_values(name, p, OptProfileSelector::kOPT);
        StatusOr<Tensor> t =
            opt.ok() ? shape_value_tensor(engine, name, *opt) : fixed_shape_value(engine, name);
        if (!t.ok()) return failure(t.status(), "making the values of '" + name + "'");
        out.tensors[name] = std::move(t).value();
        out.from[name] = opt.ok() ? "opt values of profile " + std::to_string(p)
                                  : "the value the engine was built for";
      }
      if (st.ok()) st = ctx.set_tensor_address(name, out.tensors[name].data());
    }
    for (const auto& name : out.order) {
      if (!st.ok()) break;
      if (given.count(name)) {
        shapes[name] = given[name];
      } else {
        auto opt = engine.profile_shape(name, p, OptProfileSelector::kOPT);
        if (!opt.ok()) return failure(opt.status(), "reading profile " + std::to_string(p));
        shapes[name] = *opt;
      }
      st = ctx.set_input_shape(name, shapes[name]);
    }
    if (st.ok()) st = ctx.infer_shapes();
    if (!st.ok()) {
      why_not += "\n  " + st.message();
      continue;
    }
    out.profile = p;
    for (const auto& name : out.order) {
      if (out.tensors.count(name)) continue;
      if (!out.from.count(name)) out.from[name] = "opt shape of profile " + std::to_string(p);
      auto dtype = engine.tensor_dtype(name);
      if (!dtype.ok()) return failure(dtype.status(), "reading the dtype of '" + name + "'");
      uint64_t index = 0;
      while (out.order[index] != name) ++index;
      // Refused before the allocation, with the size it needed: a shape past the machine's memory
      // made the random input empty and a check abort the process (or the OOM killer end it
      // where the allocator overcommits).
      if (Status fits = fits_in_memory(name, *dtype, shapes[name]); !fits.ok())
        return usage_error(fits.message());
      auto made = random_tensor(*dtype, shapes[name], options.seed + index);
      if (!made.ok()) return usage_error("input '" + name + "': " + made.status().message());
      out.tensors[name] = std::move(made).value();
      out.from[name] =
          "random values (seed " + std::to_string(options.seed + index) + "), " + out.from[name];
    }
    return out;
  }
  return usage_error(std::string(candidates.size() > 1
                                     ? "no optimization profile of the engine accepts these shapes:"
                                     : "the shapes do not fit the engine:") +
                     why_not);
}

StatusOr<Tensor> shape_value_tensor(const Engine& engine, const std::string& name,
                                    const std::vector<int64_t>& values) {
  KILN_ASSIGN_OR_RETURN(Shape shape, engine.tensor_shape(name));
  KILN_ASSIGN_OR_RETURN(DType dtype, engine.tensor_dtype(name));
  if (shape_numel(shape) != int64_t(values.size())) {
    return invalid_argument("'" + name + "' is a shape-value input of " +
                            std::to_string(shape_numel(shape)) + " elements " +
                            shape_to_string(shape) + "; " + std::to_string(values.size()) +
                            " values given");
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, shape));
  for (size_t i = 0; i < values.size(); ++i) {
    if (!t.set_int_at(int64_t(i), values[i])) {
      return invalid_argument(
          "'" + name + "' is " + std::string(dtype_name(dtype)) +
          ": it takes the one value the engine was built for, not values from --shapes");
    }
  }
  return t;
}

StatusOr<Tensor> fixed_shape_value(const Engine& engine, const std::string& name) {
  for (const auto& sv : engine.plan().shape_values) {
    if (sv.name != name) continue;
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(sv.fixed.dtype(), sv.fixed.shape()));
    if (t.nbytes()) std::memcpy(t.data(), sv.fixed.data(), t.nbytes());
    return t;
  }
  return not_found("'" + name + "' is not a shape-value input");
}

Status fits_in_memory(const std::string& name, DType dtype, const Shape& shape) {
  const std::optional<int64_t> n = checked_numel(shape);
  const std::optional<int64_t> bytes =
      n ? checked_mul(*n, int64_t(dtype_size(dtype))) : std::nullopt;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const double memory = pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
  const std::string what = "input '" + name + "' of shape " + shape_to_string(shape) + " " +
                           std::string(dtype_name(dtype));
  if (!bytes) return invalid_argument(what + " has more bytes than a tensor can hold");
  if (memory > 0 && double(*bytes) > memory) {
    char size[64];
    std::snprintf(size, sizeof size, "%.1f GiB", double(*bytes) / double(1 << 30));
    char have[64];
    std::snprintf(have, sizeof have, "%.1f GiB", memory / double(1 << 30));
    return invalid_argument(what + " needs " + std::to_string(*bytes) + " bytes (" + size +
                            "), more than this machine's memory (" + have + ")");
  }
  return ok_status();
}

StatusOr<Tensor> random_tensor(DType dtype, const Shape& shape, uint64_t seed) {
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, shape));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (s >> 40) & 0xffffff;  // 24 random bits
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    float f = float(next()) / float(1 << 23) - 1.0f;  // [-1, 1)
    switch (dtype) {
      case DType::kFloat32:
        t.data_as<float>()[i] = f;
        break;
      case DType::kFloat64:
        t.data_as<double>()[i] = f;
        break;
      case DType::kFloat16:
        t.data_as<uint16_t>()[i] = float_to_half(f);
        break;
      case DType::kBFloat16:
        t.data_as<uint16_t>()[i] = float_to_bf16(f);
        break;
      case DType::kInt64:
        t.data_as<int64_t>()[i] = int64_t(next() % 100);
        break;
      case DType::kInt32:
        t.data_as<int32_t>()[i] = int32_t(next() % 100);
        break;
      case DType::kBool:
        t.data_as<uint8_t>()[i] = uint8_t(next() & 1);
        break;
      case DType::kInt8:
      case DType::kUInt8:
        t.data_as<uint8_t>()[i] = uint8_t(next() % 100);
        break;
      default:
        break;  // other dtypes stay zero
    }
  }
  return t;
}

bool looks_like_class_scores(const Tensor& t) {
  return is_float(t.dtype()) && t.rank() == 2 && t.shape()[1] > 1;
}

std::string tensor_summary(const Tensor& t) {
  std::string s = "shape " + dims_to_spec(t.shape()) + (t.rank() == 0 ? "(scalar)" : "") + " " +
                  std::string(dtype_name(t.dtype()));
  int64_t n = t.numel();
  if (n == 0) return s + "  (empty)";
  double mn = INFINITY, mx = -INFINITY, sum = 0, sq = 0;
  int64_t bad = 0, finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = t.float_at(i);
    if (!std::isfinite(v)) {
      ++bad;
      continue;
    }
    ++finite;
    mn = std::min(mn, v), mx = std::max(mx, v), sum += v, sq += v * v;
  }
  if (finite) {
    double mean = sum / double(finite), var = std::max(0.0, sq / double(finite) - mean * mean);
    s += "  min " + fmt(mn) + " max " + fmt(mx) + " mean " + fmt(mean) + " std " +
         fmt(std::sqrt(var));
  }
  if (bad) s += "  NaN/Inf: " + std::to_string(bad);
  s += "  first [";
  for (int64_t i = 0; i < std::min<int64_t>(n, 5); ++i) s += (i ? ", " : "") + fmt(t.float_at(i));
  s += n > 5 ? ", ...]" : "]";
  if (looks_like_class_scores(t)) {
    s += "  argmax per row [";
    int64_t rows = t.shape()[0], cols = t.shape()[1];
    for (int64_t r = 0; r < std::min<int64_t>(rows, 8); ++r) {
      int64_t best = 0;
      for (int64_t c = 1; c < cols; ++c) {
        if (t.float_at(r * cols + c) > t.float_at(r * cols + best)) best = c;
      }
      s += (r ? ", " : "") + std::to_string(best);
    }
    s += rows > 8 ? ", ...]" : "]";
  }
  return s;
}

}  // namespace kiln::cli

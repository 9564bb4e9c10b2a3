// kiln_node_tests: runs the ONNX backend test corpus (node, pytorch-converted, pytorch-operator,
// simple, light) on the CPU backend, each test in a forked child so a crash or hang is one failure,
// and prints a table per op and the line "N passed, M failed, K skipped" for the node tests.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/kernel_registry.h"
#include "kiln.h"
#include "ops/schema.h"

namespace fs = std::filesystem;

namespace kiln::conformance {
namespace {

struct Options {
  std::string data_dir;
  std::string filter;
  std::vector<std::string>
      manifests;  // --manifest, repeatable (the CUDA run adds exclusions_cuda.txt)
  std::string json;
  std::string list_ops;  // markdown output path, "-" for stdout
  std::string ops_tsv;   // per-op results of this run's device, for docs/ops.md's device columns
  std::string cuda_results;  // a CUDA run's --ops-tsv file, read into docs/ops.md's CUDA columns
  bool verbose = false;
  bool fork = true;
  int jobs = 1;
  int timeout_s = 120;
  int min_pass = -1;             // exit 1 when fewer node tests pass
  Device device = Device::kCPU;  // where every test's engine is built and run
};

enum class Outcome { kPass, kFail, kExcluded };

struct TestCase {
  std::string set;   // "node", "pytorch-converted", ..., "light"
  std::string name;  // "test_abs"
  fs::path path;     // the test folder, or the light model's .onnx file
  std::string op;    // the op the table groups it under
  Outcome outcome = Outcome::kFail;
  std::string reason;
  std::string note;  // a passing test's remark (inputs given as shape values)
  bool excluded = false;
  std::string exclusion_reason;
  std::vector<std::string> input_dtypes;  // of the first data set, for docs/ops.md
};

// ONNX's own defaults (onnx/backend/test/loader): rtol 1e-3, atol 1e-7.
constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-7;
// A comparison prints at most this many mismatches' worth of detail.
constexpr int kMaxReasonChars = 400;

// ---- Comparison ------------------------------------------------------------------------------

double element_as_double(const Tensor& t, int64_t i) {
  return is_float(t.dtype()) ? t.float_at(i) : double(t.int_at(i));
}

std::string format_value(const Tensor& t, int64_t i) {
  std::ostringstream s;
  if (t.dtype() == DType::kUInt64) {
    s << t.data_as<uint64_t>()[i];
  } else if (is_float(t.dtype())) {
    s.precision(9);
    s << t.float_at(i);
  } else {
    s << t.int_at(i);
  }
  return s.str();
}

// "" when `got` matches `want`: same dtype and shape, floats within atol + rtol*|want| with NaN
// matching NaN and infinities matching exactly, integers and bools exactly.
std::string compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.dtype() != want.dtype()) {
    return "dtype " + std::string(dtype_name(got.dtype())) + ", expected " +
           std::string(dtype_name(want.dtype()));
  }
  if (got.shape() != want.shape()) {
    return "shape " + shape_to_string(got.shape()) + ", expected " + shape_to_string(want.shape());
  }
  const int64_t n = want.numel();
  int64_t bad = 0, first = -1;
  if (want.dtype() == DType::kBFloat16) rtol = std::max(rtol, 1.0 / 64);  // two bf16 ulps, as ONNX
  for (int64_t i = 0; i < n; ++i) {
    bool ok;
    if (is_float(want.dtype())) {
      double g = got.float_at(i), w = want.float_at(i);
      if (std::isnan(w) || std::isnan(g)) {
        ok = std::isnan(w) && std::isnan(g);
      } else if (std::isinf(w) || std::isinf(g)) {
        ok = g == w;
      } else {
        ok = std::fabs(g - w) <= atol + rtol * std::fabs(w);
      }
    } else if (want.dtype() == DType::kUInt64) {
      ok = got.data_as<uint64_t>()[i] == want.data_as<uint64_t>()[i];
    } else {
      ok = got.int_at(i) == want.int_at(i);
    }
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::ostringstream s;
  s << bad << " of " << n << " elements differ; first at " << first << ": got "
    << format_value(got, first) << ", expected " << format_value(want, first);
  (void)element_as_double;
  return s.str();
}

// ---- Loading -----------------------------------------------------------------------------------

// A data set's values, read as the model declares each input and output (a tensor, a sequence, an
// optional).
struct DataSet {
  std::vector<onnx::DataValue> inputs, outputs;
};

StatusOr<std::vector<DataSet>> load_data_sets(const fs::path& dir, const ir::Graph& g) {
  std::vector<DataSet> sets;
  auto kind = [&](const std::vector<int>& io, int i) {
    return size_t(i) < io.size() ? g.values[size_t(io[size_t(i)])].kind : ir::ValueKind::kTensor;
  };
  for (int k = 0;; ++k) {
    fs::path d = dir / ("test_data_set_" + std::to_string(k));
    if (!fs::exists(d)) break;
    DataSet set;
    for (int i = 0;; ++i) {
      fs::path f = d / ("input_" + std::to_string(i) + ".pb");
      if (!fs::exists(f)) break;
      auto t = onnx::parse_value_file(f.string(), kind(g.inputs, i));
      if (!t.ok()) return Status(t.status()).with_context("input_" + std::to_string(i) + ".pb");
      set.inputs.push_back(std::move(*t));
    }
    for (int i = 0;; ++i) {
      fs::path f = d / ("output_" + std::to_string(i) + ".pb");
      if (!fs::exists(f)) break;
      auto t = onnx::parse_value_file(f.string(), kind(g.outputs, i));
      if (!t.ok()) return Status(t.status()).with_context("output_" + std::to_string(i) + ".pb");
      set.outputs.push_back(std::move(*t));
    }
    sets.push_back(std::move(set));
  }
  if (sets.empty()) return invalid_argument(dir.string() + " has no test_data_set_0");
  return sets;
}

onnx::DataValue tensor_value(Tensor t) {
  onnx::DataValue v;
  v.tensors.push_back(std::move(t));
  return v;
}

// The engine tensors of model input or output `name` holding `v` (builder/sequences.cc's names):
// the tensor itself, a sequence's elements "name[i]", none for an empty optional.
std::vector<std::pair<std::string, const Tensor*>> engine_tensors(const std::string& name,
                                                                  const onnx::DataValue& v) {
  std::vector<std::pair<std::string, const Tensor*>> out;
  if (!v.present) return out;
  const bool sequence =
      v.kind == ir::ValueKind::kSequence || v.kind == ir::ValueKind::kOptionalSequence;
  for (size_t i = 0; i < v.tensors.size(); ++i) {
    out.push_back({sequence ? sequence_element_name(name, int64_t(i)) : name, &v.tensors[i]});
  }
  return out;
}

// The inputs ONNX's runner feeds a light model: arange(n)/n in the input's shape, with dynamic
// dims set to 1 (onnx/backend/test/runner generate_dummy_data, random=False).
StatusOr<Tensor> light_input(const ir::Value& v) {
  if (v.dtype != DType::kFloat32) {
    return unsupported("light model input '" + v.name + "' is not float32");
  }
  if (!v.shape) return unsupported("light model input '" + v.name + "' has no shape");
  Shape shape;
  for (const ir::Dim& d : *v.shape) shape.push_back(d.is_const() ? d.value() : 1);
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(DType::kFloat32, shape));
  const int64_t n = t.numel();
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = float(double(i) / double(n));
  return t;
}

// ---- Running one test ------------------------------------------------------------------------

// Runs one test in this process; "" on pass, else the reason it failed.
std::string run_test(const TestCase& tc, double rtol, double atol, Device device,
                     std::string* note) {
  const bool light = tc.set == "light";
  const fs::path model = light ? tc.path : tc.path / "model.onnx";
  auto net = onnx::parse_file(model.string());
  if (!net.ok()) return "parse: " + net.status().to_string();
  const ir::Graph& g = net->graph;

  std::vector<DataSet> sets;
  if (light) {
    DataSet set;
    for (int v : g.inputs) {
      auto t = light_input(g.values[v]);
      if (!t.ok()) return "data: " + t.status().to_string();
      set.inputs.push_back(tensor_value(std::move(*t)));
    }
    std::string stem = tc.path.stem().string();
    for (int i = 0;; ++i) {
      fs::path f = tc.path.parent_path() / (stem + "_output_" + std::to_string(i) + ".pb");
      if (!fs::exists(f)) break;
      auto t = onnx::parse_tensor_file(f.string());
      if (!t.ok()) return "data: " + t.status().to_string();
      set.outputs.push_back(tensor_value(std::move(*t)));
    }
    if (set.outputs.empty()) return "data: no reference output beside " + model.string();
    sets.push_back(std::move(set));
  } else {
    auto loaded = load_data_sets(tc.path, g);
    if (!loaded.ok()) return "data: " + loaded.status().to_string();
    sets = std::move(*loaded);
  }

  // A profile of exactly the test's shapes for every input with a dynamic dim (or none known). A
  // sequence input has the length its data gives (the same in every set), each element a tensor
  // input of its own; an optional input is present as its data is.
  BuilderConfig structure;  // sequence lengths and optionals' presence, kept across rebuilds
  OptimizationProfile profile;
  bool any_dynamic = false;
  auto add_dims = [&](const std::string& name, const std::optional<std::vector<ir::Dim>>& declared,
                      const std::vector<const Tensor*>& per_set) -> std::string {
    bool dynamic = !declared;
    if (declared) {
      for (const ir::Dim& d : *declared) dynamic = dynamic || !d.is_const();
    }
    if (!dynamic) return "";
    Shape lo = per_set[0]->shape(), hi = lo;
    for (const Tensor* t : per_set) {
      const Shape& sh = t->shape();
      if (sh.size() != lo.size()) return "data: input '" + name + "' changes rank across sets";
      for (size_t d = 0; d < sh.size(); ++d) {
        lo[d] = std::min(lo[d], sh[d]);
        hi[d] = std::max(hi[d], sh[d]);
      }
    }
    Status st = profile.set_dimensions(name, lo, per_set[0]->shape(), hi);
    if (!st.ok()) return "profile: " + st.to_string();
    any_dynamic = true;
    return "";
  };
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ir::Value& v = g.values[g.inputs[i]];
    for (const DataSet& s : sets) {
      if (i >= s.inputs.size()) {
        return "data: the model has " + std::to_string(g.inputs.size()) + " inputs, a data set " +
               std::to_string(s.inputs.size());
      }
      if (s.inputs[i].present != sets[0].inputs[i].present ||
          s.inputs[i].tensors.size() != sets[0].inputs[i].tensors.size()) {
        return "data: input '" + v.name + "' changes its sequence length or presence across sets";
      }
    }
    const onnx::DataValue& first = sets[0].inputs[i];
    if (v.kind == ir::ValueKind::kOptionalTensor || v.kind == ir::ValueKind::kOptionalSequence) {
      structure.set_optional_present(v.name, first.present);
    }
    if (first.present &&
        (v.kind == ir::ValueKind::kSequence || v.kind == ir::ValueKind::kOptionalSequence)) {
      Status st = structure.set_sequence_length(v.name, int64_t(first.tensors.size()));
      if (!st.ok()) return "config: " + st.to_string();
    }
    const auto tensors = engine_tensors(v.name, first);
    for (size_t e = 0; e < tensors.size(); ++e) {
      std::vector<const Tensor*> per_set;
      for (const DataSet& s : sets) per_set.push_back(&s.inputs[i].tensors[e]);
      const std::string err = add_dims(tensors[e].first, v.shape, per_set);
      if (!err.empty()) return err;
    }
  }
  auto make_config = [&] {
    BuilderConfig c = structure;
    c.clear_flag(BuilderFlag::kTF32);  // strict FP32: the tests' tolerances are FP32's
    return c;
  };
  BuilderConfig config = make_config();
  if (any_dynamic) config.add_profile(profile);
  auto engine = Builder(device).build(*net, config);
  // An input whose values kiln needs at build time (axes, pads, sizes, K: ONNX node tests feed
  // them as graph inputs) becomes a shape-value input, as TensorRT's shape tensors are: the profile
  // gives each element the range of values the test's data sets give it (the same rule as for
  // dims: one data set gives one value), a float or larger input its one value, and the run is
  // given the values with the other inputs. Only inputs the builder names become one.
  std::vector<std::string> valued;
  const size_t max_rounds = g.inputs.size();
  for (size_t round = 0; !engine.ok() && round < max_rounds; ++round) {
    const std::string msg = engine.status().message();
    if (msg.find("at run time") == std::string::npos &&
        msg.find("must be a scalar constant") == std::string::npos) {
      break;
    }
    // The named value may be computed from graph inputs (CenterCropPad's expanded tests slice a
    // shape input through Sub/Div/...): then the graph inputs feeding it take values instead. The
    // walk stops at Shape and Size, whose outputs depend on an input's shape, not its values.
    std::vector<bool> wanted(g.values.size(), false);
    bool named_input = false;
    for (int in : g.inputs) {
      const std::string quoted = "'" + g.values[in].name + "'";
      named_input = named_input || msg.find(quoted) != std::string::npos;
    }
    if (!named_input) {
      std::vector<int> stack;
      for (size_t vi = 0; vi < g.values.size(); ++vi) {
        const std::string& name = g.values[vi].name;
        if (!name.empty() && msg.find("'" + name + "'") != std::string::npos)
          stack.push_back(int(vi));
      }
      // A value of an If the build inlined is named "<the If's name>/<its name>": walk from the If.
      for (const ir::Node& n : g.nodes) {
        if (n.name.empty() || msg.find("'" + n.name + "/") == std::string::npos) continue;
        for (int o : n.outputs) {
          if (o >= 0) stack.push_back(o);
        }
      }
      std::vector<int> producer(g.values.size(), -1);
      for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
        for (int o : g.nodes[ni].outputs) {
          if (o >= 0) producer[size_t(o)] = int(ni);
        }
      }
      while (!stack.empty()) {
        const int vi = stack.back();
        stack.pop_back();
        if (wanted[size_t(vi)]) continue;
        wanted[size_t(vi)] = true;
        const int p = producer[size_t(vi)];
        if (p < 0) continue;
        const ir::Node& n = g.nodes[size_t(p)];
        if (n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size")) continue;
        for (int in : n.inputs) {
          if (in >= 0) stack.push_back(in);
        }
        // A branch's nodes read values of the enclosing graph by name.
        for (const auto& [attr_name, a] : n.attrs.all()) {
          std::vector<const ir::Graph*> subgraphs;
          if (a.g) subgraphs.push_back(a.g.get());
          for (const auto& sg : a.graphs) subgraphs.push_back(sg.get());
          for (const ir::Graph* sg : subgraphs) {
            for (const ir::Node& sn : sg->nodes) {
              for (int in : sn.inputs) {
                if (in < 0) continue;
                const int outer = g.find_value(sg->values[size_t(in)].name);
                if (outer >= 0) stack.push_back(outer);
              }
            }
          }
        }
      }
    }
    bool changed = false;
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const ir::Value& v = g.values[g.inputs[i]];
      if (named_input ? msg.find("'" + v.name + "'") == std::string::npos
                      : !wanted[size_t(g.inputs[i])])
        continue;
      if (std::find(valued.begin(), valued.end(), v.name) != valued.end()) continue;
      if (v.kind != ir::ValueKind::kTensor) continue;
      const Tensor& t0 = sets[0].inputs[i].tensors[0];
      bool same = true;
      for (const DataSet& s : sets) {
        const Tensor& t = s.inputs[i].tensors[0];
        same = same && t.dtype() == t0.dtype() && t.shape() == t0.shape() &&
               std::memcmp(t.data(), t0.data(), t.nbytes()) == 0;
      }
      Status st;
      if ((is_integer(t0.dtype()) || t0.dtype() == DType::kBool) && t0.numel() <= 64) {
        std::vector<int64_t> lo(size_t(t0.numel())), opt(lo.size()), hi(lo.size());
        for (int64_t e = 0; e < t0.numel(); ++e) {
          lo[size_t(e)] = hi[size_t(e)] = opt[size_t(e)] = t0.int_at(e);
          for (const DataSet& s : sets) {
            const Tensor& t = s.inputs[i].tensors[0];
            if (t.shape() != t0.shape())
              return "build: " + msg + " (and the data sets give '" + v.name +
                     "' different shapes)";
            lo[size_t(e)] = std::min(lo[size_t(e)], t.int_at(e));
            hi[size_t(e)] = std::max(hi[size_t(e)], t.int_at(e));
          }
        }
        st = profile.set_shape_values(v.name, lo, opt, hi);
      } else if (same) {
        st = profile.set_shape_values(v.name, t0);
      } else {
        return "build: " + msg + " (and the data sets give the " +
               std::string(dtype_name(t0.dtype())) + " input '" + v.name + "' different values)";
      }
      if (!st.ok()) return "profile: " + st.to_string();
      valued.push_back(v.name);
      changed = true;
      break;
    }
    if (!changed) break;
    config = make_config();
    config.add_profile(profile);
    engine = Builder(device).build(*net, config);
  }
  if (!engine.ok()) {
    std::string given;
    for (const std::string& b : valued)
      given += (given.empty() ? " (shape-value inputs: " : ", ") + b;
    return "build: " + engine.status().to_string() + (given.empty() ? "" : given + ")");
  }
  if (!valued.empty()) {
    *note = "shape values given at run time:";
    for (const std::string& b : valued) *note += " " + b;
  }
  auto ctx = engine->create_execution_context();
  if (!ctx.ok()) return "context: " + ctx.status().to_string();

  for (size_t k = 0; k < sets.size(); ++k) {
    const DataSet& s = sets[k];
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      for (const auto& [name, t] : engine_tensors(g.values[g.inputs[i]].name, s.inputs[i]))
        feeds[name] = *t;
    }
    auto out = (*ctx)->run(feeds);
    const std::string where = sets.size() > 1 ? "set " + std::to_string(k) + ": " : "";
    if (!out.ok()) return where + "run: " + out.status().to_string();
    if (s.outputs.size() != g.outputs.size()) {
      return where + "data: " + std::to_string(s.outputs.size()) + " reference outputs for " +
             std::to_string(g.outputs.size()) + " model outputs";
    }
    size_t expected = 0;
    for (size_t o = 0; o < g.outputs.size(); ++o) {
      for (const auto& [name, want] : engine_tensors(g.values[g.outputs[o]].name, s.outputs[o])) {
        ++expected;
        auto it = out->find(name);
        if (it == out->end()) return where + "output '" + name + "' missing from the run's results";
        std::string diff = compare(it->second, *want, rtol, atol);
        if (!diff.empty())
          return where + "output " + std::to_string(o) + " '" + name + "': " + diff;
      }
    }
    // A sequence output longer than its reference, or an optional that should be empty, gives more.
    if (out->size() != expected) {
      return where + "the run gave " + std::to_string(out->size()) +
             " output tensors, the reference " + std::to_string(expected);
    }
  }
  return "";
}

// The test's tolerances: ONNX's defaults unless the test folder's data.json overrides them.
std::pair<double, double> tolerances(const TestCase& tc) {
  double rtol = kRtol, atol = kAtol;
  std::ifstream f(tc.path / "data.json");
  if (!f) return {rtol, atol};
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  auto read = [&](const char* key, double* v) {
    size_t p = s.find(std::string("\"") + key + "\"");
    if (p == std::string::npos) return;
    p = s.find(':', p);
    if (p != std::string::npos) *v = std::strtod(s.c_str() + p + 1, nullptr);
  };
  read("rtol", &rtol);
  read("atol", &atol);
  return {rtol, atol};
}

// ---- Isolation: one forked child per test ----------------------------------------------------

struct Child {
  pid_t pid = -1;
  int fd = -1;
  size_t test = 0;
  std::string buf;
  std::chrono::steady_clock::time_point start;
};

std::string signal_reason(int status) {
  if (WIFSIGNALED(status)) {
    return "crash: killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "crash: exited with status " + std::to_string(WEXITSTATUS(status)) + " without a result";
}

// result: "P" + note on pass, else the failure's reason.
void finish(TestCase& tc, const std::string& result) {
  if (!result.empty() && result[0] == 'P') {
    tc.outcome = Outcome::kPass;
    tc.note = result.substr(1);
    tc.reason.clear();
  } else {
    tc.outcome = Outcome::kFail;
    tc.reason = result;
  }
}

// The child writes 'P' or 'F' + reason to the pipe and exits without running destructors.
void run_child(const TestCase& tc, Device device, int fd) {
  auto [rtol, atol] = tolerances(tc);
  std::string note;
  std::string r = run_test(tc, rtol, atol, device, &note);
  std::string msg = r.empty() ? "P" + note : "F" + r;
  size_t off = 0;
  while (off < msg.size()) {
    ssize_t w = write(fd, msg.data() + off, msg.size() - off);
    if (w <= 0) break;
    off += size_t(w);
  }
  close(fd);
  _exit(0);
}

void run_all(std::vector<TestCase>& tests, const Options& opt) {
  if (!opt.fork) {
    for (TestCase& tc : tests) {
      auto [rtol, atol] = tolerances(tc);
      std::string note;
      std::string r = run_test(tc, rtol, atol, opt.device, &note);
      finish(tc, r.empty() ? "P" + note : r);
    }
    return;
  }
  std::vector<Child> running;
  size_t next = 0;
  while (next < tests.size() || !running.empty()) {
    while (next < tests.size() && int(running.size()) < opt.jobs) {
      int fds[2];
      if (pipe(fds) != 0) {
        finish(tests[next++], "runner: pipe() failed");
        continue;
      }
      std::cout.flush();
      pid_t pid = ::fork();
      if (pid == 0) {
        close(fds[0]);
        run_child(tests[next], opt.device, fds[1]);
      }
      close(fds[1]);
      if (pid < 0) {
        close(fds[0]);
        finish(tests[next++], "runner: fork() failed");
        continue;
      }
      running.push_back(Child{pid, fds[0], next++, "", std::chrono::steady_clock::now()});
    }
    std::vector<pollfd> pfds;
    for (const Child& c : running) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    poll(pfds.data(), pfds.size(), 200);
    for (size_t i = running.size(); i-- > 0;) {
      Child& c = running[i];
      bool done = false;
      std::string result;
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char chunk[4096];
        ssize_t n = read(c.fd, chunk, sizeof chunk);
        if (n > 0) {
          c.buf.append(chunk, size_t(n));
        } else {
          done = true;
          int status = 0;
          waitpid(c.pid, &status, 0);
          if (c.buf.empty()) {
            result = signal_reason(status);
          } else {
            result = c.buf[0] == 'P' ? c.buf : c.buf.substr(1);
          }
        }
      }
      auto elapsed = std::chrono::steady_clock::now() - c.start;
      if (!done && elapsed > std::chrono::seconds(opt.timeout_s)) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        done = true;
        result = "timeout: no result after " + std::to_string(opt.timeout_s) + " s";
      }
      if (done) {
        close(c.fd);
        finish(tests[c.test], result);
        running.erase(running.begin() + long(i));
      }
    }
  }
}

// ---- Discovery, grouping, manifest -------------------------------------------------------------

// ONNX names node tests test_<op in snake case>_<variant>; with underscores dropped the longest
// known op name that prefixes the test name is its op. Single-node models name their op directly.
std::string squash(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c != '_') out += char(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string single_node_op(const fs::path& model) {
  auto net = onnx::parse_file(model.string());
  if (!net.ok() || net->graph.nodes.size() != 1) return "";
  return net->graph.nodes[0].op_type;
}

std::vector<TestCase> discover(const fs::path& root) {
  std::vector<TestCase> tests;
  auto add_set = [&](const fs::path& dir, const std::string& set) {
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir)) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      if (set == "light") {
        if (p.extension() == ".onnx") tests.push_back(TestCase{set, p.stem().string(), p});
      } else if (fs::exists(p / "model.onnx")) {
        tests.push_back(TestCase{set, p.filename().string(), p});
      }
    }
  };
  const char* kSets[] = {"node", "pytorch-converted", "pytorch-operator", "simple", "light"};
  bool found = false;
  for (const char* set : kSets) {
    if (fs::is_directory(root / set)) {
      add_set(root / set, set);
      found = true;
    }
  }
  if (!found) add_set(root, "node");  // a folder of test folders
  return tests;
}

void assign_ops(std::vector<TestCase>& tests) {
  std::set<std::string> known;
  for (TestCase& tc : tests) {
    if (tc.set == "light") {
      tc.op = "(light model)";
      continue;
    }
    tc.op = single_node_op(tc.path / "model.onnx");
    if (!tc.op.empty()) known.insert(tc.op);
  }
  for (TestCase& tc : tests) {
    if (!tc.op.empty()) continue;
    std::string name = squash(tc.name.substr(tc.name.rfind("test_", 0) == 0 ? 5 : 0));
    std::string best;
    for (const std::string& op : known) {
      std::string s = squash(op);
      if (name.rfind(s, 0) == 0 && s.size() > squash(best).size()) best = op;
    }
    tc.op = best.empty() ? "(" + tc.set + ")" : best;
  }
}

struct ManifestEntry {
  std::string pattern;  // a test name, or a prefix ending in '*'
  std::string reason;
  std::string file;
  int line = 0;
  bool used = false;
};

StatusOr<std::vector<ManifestEntry>> read_manifest(const std::string& path) {
  std::ifstream f(path);
  if (!f) return not_found("cannot open the manifest " + path);
  std::vector<ManifestEntry> entries;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    size_t hash = line.find('#');
    std::string head = line.substr(0, hash);
    head.erase(0, head.find_first_not_of(" \t"));
    head.erase(head.find_last_not_of(" \t\r") + 1);
    if (head.empty()) continue;
    std::string reason = hash == std::string::npos ? "" : line.substr(hash + 1);
    reason.erase(0, reason.find_first_not_of(" \t"));
    reason.erase(reason.find_last_not_of(" \t\r") + 1);
    if (reason.empty()) {
      return invalid_argument(path + ":" + std::to_string(n) + ": '" + head +
                              "' has no reason (write 'test_name  # reason')");
    }
    entries.push_back(ManifestEntry{head, reason, path, n});
  }
  return entries;
}

bool matches(const std::string& pattern, const std::string& name) {
  if (!pattern.empty() && pattern.back() == '*') {
    return name.rfind(pattern.substr(0, pattern.size() - 1), 0) == 0;
  }
  return pattern == name;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// ---- docs/ops.md ------------------------------------------------------------------------------

// Input dtypes of a test's first data set, from the files (no model build needed).
std::vector<std::string> test_input_dtypes(const TestCase& tc) {
  std::vector<std::string> out;
  if (tc.set == "light") return {"float32"};
  for (int i = 0;; ++i) {
    fs::path f = tc.path / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb");
    if (!fs::exists(f)) break;
    auto t = onnx::parse_tensor_file(f.string());
    if (t.ok()) out.push_back(std::string(dtype_name(t->dtype())));
  }
  return out;
}

// The onnx version the corpus was generated from (scripts/fetch_onnx_tests.sh's marker).
std::string corpus_onnx_version(const std::string& data_dir) {
  std::ifstream f(fs::path(data_dir) / "ONNX_VERSION");
  std::string v;
  if (!f || !std::getline(f, v) || v.empty()) return "unknown";
  return v;
}

// One op's row of a device run (--ops-tsv): whether the device registers an implementation, and
// its node tests passing out of all.
struct DeviceRow {
  bool kernel = false;
  int pass = 0, total = 0;
};

// Reads an --ops-tsv file: a "# " header line naming the run, then
// "op<TAB>yes|no<TAB>pass<TAB>total".
StatusOr<std::pair<std::string, std::map<std::string, DeviceRow>>> read_ops_tsv(
    const std::string& path) {
  std::ifstream f(path);
  if (!f) return not_found("cannot read " + path);
  std::string line, header;
  std::map<std::string, DeviceRow> rows;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.rfind("# ", 0) == 0) {
      if (header.empty()) header = line.substr(2);
      continue;
    }
    std::istringstream ls(line);
    std::string op, kernel;
    DeviceRow r;
    if (!(ls >> op >> kernel >> r.pass >> r.total) || (kernel != "yes" && kernel != "no")) {
      return invalid_argument(path + ":" + std::to_string(n) + ": expected 'op yes|no pass total'");
    }
    r.kernel = kernel == "yes";
    rows[op] = r;
  }
  return std::make_pair(header, rows);
}

void write_ops_tsv(std::ostream& os, const std::vector<TestCase>& tests, Device device,
                   const std::string& what) {
  std::map<std::string, DeviceRow> rows;
  for (const TestCase& tc : tests) {
    if (tc.set != "node") continue;
    DeviceRow& r = rows[tc.op];
    ++r.total;
    r.pass += tc.outcome == Outcome::kPass;
  }
  const auto& reg = backends::kernel_registry();
  for (int k = 1;; ++k) {
    std::string_view name = ops::op_name(ops::OpKind(k));
    if (name == "Unknown") break;
    rows[std::string(name)].kernel = reg.has(ops::OpKind(k), device);
  }
  os << "# " << what << "\n";
  for (const auto& [op, r] : rows) {
    if (op.empty() || op[0] == '(') continue;
    os << op << "\t" << (r.kernel ? "yes" : "no") << "\t" << r.pass << "\t" << r.total << "\n";
  }
}

void write_ops_doc(std::ostream& os, const std::vector<TestCase>& tests, bool have_tests,
                   const std::string& onnx_version, const std::string& cuda_run,
                   const std::map<std::string, DeviceRow>& cuda) {
  // Per op, the dtypes of inputs of node tests that pass on the CPU backend.
  std::map<std::string, std::set<std::string>> passing_dtypes;
  std::map<std::string, std::pair<int, int>> counts;  // pass, total (node set)
  for (const TestCase& tc : tests) {
    if (tc.set != "node") continue;
    auto& c = counts[tc.op];
    ++c.second;
    if (tc.outcome == Outcome::kPass) {
      ++c.first;
      for (const std::string& d : tc.input_dtypes) passing_dtypes[tc.op].insert(d);
    }
  }
  os << "# Operators\n\n"
     << "Generated by `scripts/gen_ops_doc.sh` (`kiln_node_tests --list-ops`); do not edit.\n\n"
     << "Columns: whether the op has a schema (`src/ops`, shape and type inference) and a CPU "
        "kernel (`src/backends/cpu`), both read from the registries; the ONNX node tests of "
        "onnx "
     << onnx_version
     << " that pass on the CPU backend; and the input dtypes seen in those passing "
        "tests. The dtype column is evidence, not a promise: a dtype missing there may still "
        "work, and it lists every input's dtype (indices, shapes) as well as the data's. "
        "The CUDA columns come from a run of the same node tests with `--device=cuda` on the "
        "GPU host (scripts/gpu.sh writes it; `docs/ops_cuda.tsv` keeps the last one): whether "
        "the CUDA backend registers an implementation, and the tests that pass there in strict "
        "FP32";
  if (!cuda_run.empty()) os << " (" << cuda_run << ")";
  os << ". If, Loop and Scan, and the sequence and optional ops, have no kernel on either backend: "
        "the builder lays them out before anything runs (`src/builder/control_flow.cc`, "
        "`src/builder/sequences.cc`), and their tests pass through the nodes they become; a Loop "
        "or Scan "
        "the build cannot unroll becomes a `kiln::LoopBegin` and a `kiln::LoopEnd` around one copy "
        "of its "
        "body, which the run itself repeats (`src/plan/loops.h`).\n\n";
  if (!have_tests) os << "(Generated without the test corpus: the test columns are empty.)\n\n";
  if (cuda.empty()) os << "(Generated without CUDA results: the CUDA columns are empty.)\n\n";
  os << "| op | schema | CPU kernel | node tests passing | dtypes seen passing | CUDA kernel | "
        "CUDA node tests passing |\n"
     << "|---|---|---|---|---|---|---|\n";
  const ops::OpRegistry& reg = ops::op_registry();
  std::set<std::string> listed;
  for (int k = 1;; ++k) {
    std::string_view name = ops::op_name(ops::OpKind(k));
    if (name == "Unknown") break;
    std::string op(name);
    listed.insert(op);
    bool schema = reg.find(ops::OpKind(k)) != nullptr;
    bool kernel = backends::cpu::cpu_has_kernel(ops::OpKind(k));
    os << "| " << op << " | " << (schema ? "yes" : "no") << " | " << (kernel ? "yes" : "no")
       << " | ";
    auto it = counts.find(op);
    if (it != counts.end()) os << it->second.first << " / " << it->second.second;
    os << " | ";
    bool first = true;
    for (const std::string& d : passing_dtypes[op]) {
      os << (first ? "" : ", ") << d;
      first = false;
    }
    os << " | ";
    if (auto c = cuda.find(op); c != cuda.end()) {
      os << (c->second.kernel ? "yes" : "no") << " | ";
      if (c->second.total) os << c->second.pass << " / " << c->second.total;
    } else {
      os << " | ";
    }
    os << " |\n";
  }
  os << "\n## ONNX ops kiln does not know\n\n"
     << "Ops that the node tests exercise and that kiln's op list lacks, with their test "
        "counts.\n\n";
  for (const auto& [op, c] : counts) {
    if (listed.count(op) || op.empty() || op[0] == '(') continue;
    os << "- " << op << " (" << c.second << " tests)\n";
  }
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPass:
      return "pass";
    case Outcome::kFail:
      return "fail";
    case Outcome::kExcluded:
      return "excluded";
  }
  return "?";
}

bool parse_args(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      std::string f = std::string(flag) + "=";
      if (a.rfind(f, 0) == 0) return a.substr(f.size());
      return std::nullopt;
    };
    if (auto v = value("--data")) {
      opt->data_dir = *v;
    } else if (auto v = value("--filter")) {
      opt->filter = *v;
    } else if (auto v = value("--manifest")) {
      opt->manifests.push_back(*v);
    } else if (auto v = value("--json")) {
      opt->json = *v;
    } else if (auto v = value("--list-ops")) {
      opt->list_ops = *v;
    } else if (auto v = value("--jobs")) {
      opt->jobs = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--min-pass")) {
      opt->min_pass = std::atoi(v->c_str());
    } else if (auto v = value("--device")) {
      if (*v == "cpu") {
        opt->device = Device::kCPU;
      } else if (*v == "cuda") {
        opt->device = Device::kCUDA;
      } else {
        std::cerr << "kiln_node_tests: --device=" << *v << ": expected cpu or cuda\n";
        return false;
      }
    } else if (auto v = value("--timeout")) {
      opt->timeout_s = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--ops-tsv")) {
      opt->ops_tsv = *v;
    } else if (auto v = value("--cuda-results")) {
      opt->cuda_results = *v;
    } else if (a == "--list-ops") {
      opt->list_ops = "-";
    } else if (a == "--verbose") {
      opt->verbose = true;
    } else if (a == "--no-fork") {
      opt->fork = false;
    } else {
      std::cerr << "kiln_node_tests: unknown argument '" << a << "'\n"
                << "usage: kiln_node_tests --data=DIR [--filter=SUBSTR] [--manifest=FILE]... "
                   "[--device=cpu|cuda] [--verbose] [--json=FILE] [--min-pass=N] [--jobs=N] "
                   "[--timeout=S] "
                   "[--no-fork] [--list-ops[=FILE] [--cuda-results=TSV]] [--ops-tsv=FILE]\n";
      return false;
    }
  }
  return true;
}

struct Counts {
  int pass = 0, fail = 0, excluded = 0;
};

int main_impl(int argc, char** argv) {
  Options opt;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  opt.jobs = int(std::clamp<long>(cpus, 1, 8));
  if (!parse_args(argc, argv, &opt)) return 2;

  if (opt.device != Device::kCPU) {
    // Asked in a child: the parent stays free of device state before it forks.
    pid_t pid = fork();
    if (pid == 0) _exit(backends::get_backend(opt.device).ok() ? 0 : 1);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::cerr << "kiln_node_tests: --device=" << device_name(opt.device)
                << ": this build or machine has no usable device of that kind\n";
      return 2;
    }
    std::cout << "device: " << device_name(opt.device) << " (strict FP32)\n";
  }
  std::vector<TestCase> tests;
  if (!opt.data_dir.empty()) {
    if (!fs::is_directory(opt.data_dir)) {
      std::cerr << "kiln_node_tests: --data=" << opt.data_dir << " is not a folder "
                << "(run scripts/fetch_onnx_tests.sh)\n";
      return 2;
    }
    tests = discover(opt.data_dir);
    if (!opt.filter.empty()) {
      std::erase_if(
          tests, [&](const TestCase& t) { return t.name.find(opt.filter) == std::string::npos; });
    }
  } else if (opt.list_ops.empty()) {
    std::cerr << "kiln_node_tests: --data=DIR is required (scripts/fetch_onnx_tests.sh)\n";
    return 2;
  }
  std::vector<ManifestEntry> manifest;
  for (const std::string& path : opt.manifests) {
    auto m = read_manifest(path);
    if (!m.ok()) {
      std::cerr << "kiln_node_tests: " << m.status().to_string() << "\n";
      return 2;
    }
    manifest.insert(manifest.end(), m->begin(), m->end());
  }
  assign_ops(tests);
  for (TestCase& tc : tests) {
    for (ManifestEntry& e : manifest) {
      if (matches(e.pattern, tc.name)) {
        tc.excluded = true;
        tc.exclusion_reason = e.reason;
        e.used = true;
        break;
      }
    }
  }
  // Excluded tests run too, so that one that passes is reported and the manifest shrinks.
  run_all(tests, opt);

  std::vector<std::string> stale;
  for (TestCase& tc : tests) {
    if (!opt.list_ops.empty()) tc.input_dtypes = test_input_dtypes(tc);
    if (!tc.excluded) continue;
    if (tc.outcome == Outcome::kPass) stale.push_back(tc.name);
    tc.outcome = Outcome::kExcluded;
    tc.reason = tc.exclusion_reason;
  }

  if (!opt.ops_tsv.empty()) {
    std::ofstream f(opt.ops_tsv);
    write_ops_tsv(f, tests, opt.device,
                  std::string(device_name(opt.device)) + " node tests of onnx " +
                      corpus_onnx_version(opt.data_dir));
    if (!f) {
      std::cerr << "kiln_node_tests: cannot write " << opt.ops_tsv << "\n";
      return 2;
    }
  }
  if (!opt.list_ops.empty()) {
    const std::string version = corpus_onnx_version(opt.data_dir);
    std::string cuda_run;
    std::map<std::string, DeviceRow> cuda;
    if (!opt.cuda_results.empty()) {
      auto r = read_ops_tsv(opt.cuda_results);
      if (!r.ok()) {
        std::cerr << "kiln_node_tests: --cuda-results: " << r.status().to_string() << "\n";
        return 2;
      }
      cuda_run = r->first;
      cuda = std::move(r->second);
    }
    if (opt.list_ops == "-") {
      write_ops_doc(std::cout, tests, !tests.empty(), version, cuda_run, cuda);
      return 0;
    }
    std::ofstream f(opt.list_ops);
    write_ops_doc(f, tests, !tests.empty(), version, cuda_run, cuda);
    if (!f) {
      std::cerr << "kiln_node_tests: cannot write " << opt.list_ops << "\n";
      return 2;
    }
  }

  // Per op, sorted by failures, for the node tests; each other set gets one summary row.
  std::map<std::string, Counts> per_op;
  std::map<std::string, Counts> per_set;
  for (const TestCase& tc : tests) {
    Counts& c = tc.set == "node" ? per_op[tc.op] : per_op["[" + tc.set + "] " + tc.op];
    Counts& s = per_set[tc.set];
    for (Counts* x : {&c, &s}) {
      if (tc.outcome == Outcome::kPass) ++x->pass;
      if (tc.outcome == Outcome::kFail) ++x->fail;
      if (tc.outcome == Outcome::kExcluded) ++x->excluded;
    }
  }
  if (opt.verbose) {
    for (const TestCase& tc : tests) {
      if (tc.outcome == Outcome::kPass) continue;
      std::string r = tc.reason.substr(0, kMaxReasonChars * 2);
      std::replace(r.begin(), r.end(), '\n', ' ');
      std::cout << (tc.outcome == Outcome::kFail ? "FAIL " : "EXCLUDED ") << tc.set << "/"
                << tc.name << " [" << tc.op << "]: " << r << "\n";
    }
    std::cout << "\n";
  }
  std::printf("%-40s %6s %6s %9s\n", "op", "pass", "fail", "excluded");
  for (const auto& [op, c] : per_op) {
    std::printf("%-40s %6d %6d %9d\n", op.c_str(), c.pass, c.fail, c.excluded);
  }
  std::printf("\n");
  for (const std::string& name : stale) {
    std::printf("excluded but passes: remove from manifest: %s\n", name.c_str());
  }
  for (const ManifestEntry& e : manifest) {
    if (!e.used && opt.filter.empty()) {
      std::printf("manifest %s line %d matches no test: %s\n", e.file.c_str(), e.line,
                  e.pattern.c_str());
    }
  }
  for (const auto& [set, c] : per_set) {
    if (set == "node") continue;
    std::printf("%s: %d passed, %d failed, %d skipped\n", set.c_str(), c.pass, c.fail, c.excluded);
  }
  if (!opt.json.empty()) {
    std::ofstream f(opt.json);
    f << "{\"tests\": [\n";
    for (size_t i = 0; i < tests.size(); ++i) {
      const TestCase& tc = tests[i];
      f << "  {\"set\": \"" << json_escape(tc.set) << "\", \"name\": \"" << json_escape(tc.name)
        << "\", \"op\": \"" << json_escape(tc.op) << "\", \"result\": \""
        << outcome_name(tc.outcome) << "\", \"reason\": \"" << json_escape(tc.reason)
        << "\", \"note\": \"" << json_escape(tc.note) << "\"}"
        << (i + 1 < tests.size() ? ",\n" : "\n");
    }
    f << "]}\n";
  }
  int bound = 0;
  for (const TestCase& tc : tests)
    bound += tc.set == "node" && tc.outcome == Outcome::kPass && !tc.note.empty();
  if (bound > 0) {
    std::printf(
        "%d passing node tests take shape-value inputs (axes, pads, sizes, K), given at run time "
        "and ranged by the profile (see --json notes)\n",
        bound);
  }
  // The headline: the node tests when the corpus has them, else every test run.
  Counts headline = per_set.count("node") ? per_set["node"] : Counts{};
  if (!per_set.count("node")) {
    for (const auto& [set, c] : per_set) {
      headline.pass += c.pass;
      headline.fail += c.fail;
      headline.excluded += c.excluded;
    }
  }
  std::printf("%d passed, %d failed, %d skipped\n", headline.pass, headline.fail,
              headline.excluded);
  if (opt.min_pass >= 0 && headline.pass < opt.min_pass) {
    std::fprintf(stderr, "kiln_node_tests: %d tests passed, fewer than --min-pass=%d\n",
                 headline.pass, opt.min_pass);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kiln::conformance

int main(int argc, char** argv) { return kiln::conformance::main_impl(argc, argv); }

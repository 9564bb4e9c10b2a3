// kiln bench: latency and throughput of an engine (loaded, or built from --onnx with the build
// flags): warm-up, then timed runs of ExecutionContext::execute on bound buffers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "backends/backend.h"
#include "commands.h"
#include "core/file.h"
#include "engine_source.h"
#include "inputs.h"
#include "json.h"
#include "progress.h"

namespace kiln::cli {
namespace {

CommandSpec bench_spec() {
  return command_spec(
      kCmdBench, "bench",
      "(--loadEngine=ENGINE | --onnx=MODEL [build flags]) [--shapes=..] [--iterations=N | "
      "--duration=S]",
      "Times an engine: --warmUp milliseconds of untimed runs, then timed runs until both\n"
      "--iterations and --duration are reached (default: at least 10 runs and 3 s; with only\n"
      "--iterations, exactly that many). Prints latency min/mean/median/percentiles/max and\n"
      "throughput; on a GPU also host-to-device, compute and device-to-host times.");
}

// "90,99.9" to percentiles in [0, 100].
Result<std::vector<double>> parse_percentiles(const std::string& text) {
  std::vector<double> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string tok = text.substr(start, comma == std::string::npos ? comma : comma - start);
    char* end = nullptr;
    double p = std::strtod(tok.c_str(), &end);
    if (tok.empty() || *end != '\0' || !(p >= 0 && p <= 100)) {
      return usage_error("--percentile=" + text + ": '" + tok +
                         "' is not a percentile; expected numbers in [0, 100] such as 50,90,99");
    }
    out.push_back(p);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string percentile_name(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "p%g", p);
  return buf;
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  size_t rank = size_t(std::ceil(p / 100.0 * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// An output whose size its data decides has -1 dims until a run (NonZero's count).
bool sized_by_data(const Shape& s) {
  return std::any_of(s.begin(), s.end(), [](int64_t d) { return d < 0; });
}

// Device buffers for every IO tensor of a GPU engine, freed with it.
struct DeviceBuffers {
  const backends::Backend* backend = nullptr;
  std::vector<void*> ptrs;
  std::vector<std::unique_ptr<GrowingOutputAllocator>> sized;  // outputs sized by their data
  ~DeviceBuffers() {
    for (void* p : ptrs) backend->deallocate(p);
  }
};

Status bind_device_buffers(const Engine& engine, ExecutionContext& ctx,
                           const std::map<std::string, Tensor>& inputs, DeviceBuffers* out) {
  KILN_ASSIGN_OR_RETURN(out->backend, backends::get_backend(engine.device()));
  for (int i = 0; i < engine.num_io_tensors(); ++i) {
    std::string name = engine.io_tensor_name(i);
    KILN_ASSIGN_OR_RETURN(Shape shape, ctx.tensor_shape(name));
    KILN_ASSIGN_OR_RETURN(DType dtype, engine.tensor_dtype(name));
    if (sized_by_data(shape)) {
      out->sized.push_back(std::make_unique<GrowingOutputAllocator>(engine.device()));
      KILN_RETURN_IF_ERROR(ctx.set_output_allocator(name, out->sized.back().get()));
      continue;
    }
    auto in = inputs.find(name);
    if (engine.is_shape_inference_io(name) && in != inputs.end()) {
      // Shape values stay in host memory, where the run reads them.
      KILN_RETURN_IF_ERROR(ctx.set_tensor_address(name, in->second.data()));
      continue;
    }
    // The context resolved this shape inside the profile, so its size does not overflow.
    size_t bytes = std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(dtype), 1);
    KILN_ASSIGN_OR_RETURN(void* p, out->backend->allocate(bytes));
    out->ptrs.push_back(p);
    if (engine.tensor_mode(name) == TensorIOMode::kINPUT && in != inputs.end() &&
        in->second.nbytes() > 0) {
      KILN_RETURN_IF_ERROR(out->backend->copy(p, in->second.data(), in->second.nbytes(),
                                              backends::CopyKind::kHostToDevice, nullptr));
    }
    KILN_RETURN_IF_ERROR(ctx.set_tensor_address(name, p));
  }
  return out->backend->synchronize(nullptr);
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// --batchBuckets=1,2,4: positive integers.
Result<std::vector<int64_t>> parse_buckets(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    auto v = parse_int_flag("batchBuckets", std::string_view(text).substr(start, end - start), 1,
                            kMaxCount);
    if (!v.ok()) return v.error();
    out.push_back(*v);
    start = end + 1;
  }
  return out;
}

// --randomBatch=LO:HI on a GPU engine: every run draws its batch (dim 0 of every input) from
// LO..HI, seeded, on device-resident buffers sized for HI; the same draws run without buckets and
// with them (when given). Prints the latencies, what the graph cache did, and checks that every
// run's outputs have the exact shapes of its batch.
Result<int> random_batch_bench(const Engine& engine, ExecutionContext& ctx,
                               const PreparedInputs& inputs, int64_t lo, int64_t hi, int64_t runs,
                               uint64_t seed, const std::vector<int64_t>& buckets) {
  if (engine.device() == Device::kCPU) {
    return usage_error(
        "--randomBatch times CUDA graphs over changing batches: it needs a GPU engine "
        "(--device=cuda)");
  }
  auto backend = backends::get_backend(engine.device());
  if (!backend.ok()) return failure(backend.status(), "the engine's backend");
  DeviceBuffers bufs;
  bufs.backend = *backend;
  auto at = [&](const std::string& name, int64_t batch) {
    Shape s = inputs.tensors.at(name).shape();
    if (!s.empty()) s[0] = batch;
    return s;
  };
  // Inputs at HI rows (the given rows repeated), uploaded once; outputs at HI.
  for (const std::string& name : inputs.order) {
    const Tensor& t = inputs.tensors.at(name);
    if (t.rank() == 0 || t.shape()[0] < 1)
      return usage_error("--randomBatch: input '" + name + "' has no batch dim 0");
    Status st = ctx.set_input_shape(name, at(name, hi));
    if (!st.ok())
      return failure(st, "--randomBatch: input '" + name + "' at batch " + std::to_string(hi));
  }
  for (int i = 0; i < engine.num_io_tensors(); ++i) {
    const std::string name = engine.io_tensor_name(i);
    auto shape = ctx.tensor_shape(name);
    if (!shape.ok())
      return failure(shape.status(), "resolving '" + name + "' at batch " + std::to_string(hi));
    const size_t bytes =
        std::max<size_t>(size_t(shape_numel(*shape)) * dtype_size(*engine.tensor_dtype(name)), 1);
    auto p = bufs.backend->allocate(bytes);
    if (!p.ok()) return failure(p.status(), "allocating '" + name + "'");
    bufs.ptrs.push_back(*p);
    if (engine.tensor_mode(name) == TensorIOMode::kINPUT) {
      const Tensor& t = inputs.tensors.at(name);
      std::vector<uint8_t> host(bytes);
      for (size_t k = 0; k < bytes; ++k)
        host[k] = static_cast<const uint8_t*>(t.data())[k % std::max<size_t>(t.nbytes(), 1)];
      Status st =
          bufs.backend->copy(*p, host.data(), bytes, backends::CopyKind::kHostToDevice, nullptr);
      if (st.ok()) st = bufs.backend->synchronize(nullptr);
      if (!st.ok()) return failure(st, "uploading '" + name + "'");
    }
    Status st = ctx.set_tensor_address(name, *p);
    if (!st.ok()) return failure(st, "binding '" + name + "'");
  }
  Status st = ctx.execute();  // sizes the arena for HI once, so no later growth drops graphs
  if (!st.ok()) return failure(st, "running at batch " + std::to_string(hi));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<int64_t> draws;
  for (int64_t k = 0; k < runs; ++k) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
    draws.push_back(lo + int64_t(state % uint64_t(hi - lo + 1)));
  }
  std::printf(
      "random batch %lld..%lld: %lld runs (seed %llu), device-resident inputs and outputs, graph "
      "cache %zu\n",
      static_cast<long long>(lo), static_cast<long long>(hi), static_cast<long long>(runs),
      static_cast<unsigned long long>(seed), ctx.cuda_graph_cache_capacity());
  std::string first;
  for (size_t k = 0; k < std::min<size_t>(draws.size(), 8); ++k)
    first += " " + std::to_string(draws[k]);
  std::printf("  the first batches drawn:%s ...\n", first.c_str());
  int64_t checks = 0;
  for (int pass = 0; pass < (buckets.empty() ? 1 : 2); ++pass) {
    // Each pass starts with an empty cache.
    const size_t capacity = ctx.cuda_graph_cache_capacity();
    ctx.set_cuda_graph_cache_capacity(0);
    ctx.set_cuda_graph_cache_capacity(capacity);
    Status set = ctx.set_batch_buckets(pass == 0 ? std::vector<int64_t>{} : buckets);
    if (!set.ok()) return failure(set, "--batchBuckets");
    const auto before = ctx.cuda_graph_stats();
    std::vector<double> times;
    for (int64_t b : draws) {
      for (const std::string& name : inputs.order) {
        Status s2 = ctx.set_input_shape(name, at(name, b));
        if (!s2.ok()) return failure(s2, "batch " + std::to_string(b));
      }
      auto t0 = std::chrono::steady_clock::now();
      Status s3 = ctx.execute();
      times.push_back(ms_since(t0));
      if (!s3.ok()) return failure(s3, "running batch " + std::to_string(b));
      for (int i = int(inputs.order.size()); i < engine.num_io_tensors(); ++i) {
        const std::string name = engine.io_tensor_name(i);
        auto shape = ctx.tensor_shape(name);
        if (!shape.ok() || shape->empty() || (*shape)[0] != b) {
          return failure("batch " + std::to_string(b) + ": output '" + name + "' has shape " +
                         (shape.ok() ? shape_to_string(*shape) : shape.status().message()) +
                         ", not batch " + std::to_string(b));
        }
        ++checks;
      }
    }
    const auto after = ctx.cuda_graph_stats();
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    double mean = 0;
    for (double t : times) mean += t;
    mean /= double(times.size());
    std::string label = "without buckets";
    if (pass == 1) {
      label = "with buckets ";
      for (size_t k = 0; k < buckets.size(); ++k)
        label += (k ? "," : "") + std::to_string(buckets[k]);
    }
    std::printf(
        "  %s: latency (ms) median %.4g  mean %.4g  p90 %.4g  max %.4g; graphs captured %lld, "
        "replayed %lld, "
        "evicted %lld, cached at the end %zu\n",
        label.c_str(), percentile(sorted, 50), mean, percentile(sorted, 90), sorted.back(),
        static_cast<long long>(after.captures - before.captures),
        static_cast<long long>(after.replays - before.replays),
        static_cast<long long>(after.evictions - before.evictions), after.cached);
  }
  std::printf("  every run's outputs had their batch's exact shape (%lld checks)\n",
              static_cast<long long>(checks));
  return kExitOk;
}

}  // namespace

int bench_command(const Argv& argv) {
  const CommandSpec spec = bench_spec();
  auto args = Args::parse(spec, argv);
  if (!args.ok()) return report("bench", args.error());
  if (args->help()) {
    std::fputs(help_text(spec).c_str(), stdout);
    return kExitOk;
  }
  auto load = args->get("loadEngine");
  auto build = parse_build_options(*args);
  if (!build.ok()) return report("bench", build.error());
  if (!load == build->onnx.empty()) {
    return report(
        "bench",
        usage_error(
            "give exactly one of --loadEngine=ENGINE or --onnx=MODEL (see: kiln bench --help)"));
  }
  auto inputs_opt = parse_input_options(*args);
  if (!inputs_opt.ok()) return report("bench", inputs_opt.error());
  auto warmup_ms = args->get_double("warmUp", 200, 0, kMaxMilliseconds);
  auto iterations = args->get_int("iterations", 10, 1, kMaxCount);
  auto duration_s = args->get_double("duration", args->has("iterations") ? 0 : 3, 0, kMaxSeconds);
  auto cuda_graph = args->get_bool("useCudaGraph");
  auto no_transfers = args->get_bool("noDataTransfers");
  auto avg_runs = args->get_int("avgRuns", 0, 1, kMaxCount);
  auto graph_cache = args->get_int("graphCacheSize", 4, 0, 1024);
  auto threads = args->get_int("threads", 0, 0, 256);
  Result<std::vector<int64_t>> buckets = std::vector<int64_t>{};
  if (auto b = args->get("batchBuckets")) buckets = parse_buckets(*b);
  int64_t random_lo = 0, random_hi = 0;
  if (auto r = args->get("randomBatch")) {
    const size_t colon = r->find(':');
    auto a = parse_int_flag("randomBatch", std::string_view(*r).substr(0, colon), 1, kMaxCount);
    auto b =
        colon == std::string::npos
            ? a
            : parse_int_flag("randomBatch", std::string_view(*r).substr(colon + 1), 1, kMaxCount);
    if (!a.ok()) return report("bench", a.error());
    if (!b.ok()) return report("bench", b.error());
    if (*b < *a)
      return report("bench", usage_error("--randomBatch=LO:HI needs LO <= HI, got " + *r));
    random_lo = *a, random_hi = *b;
  }
  Result<std::vector<double>> percentiles = std::vector<double>{90, 99};
  if (auto p = args->get("percentile")) percentiles = parse_percentiles(*p);
  for (const Error* e :
       {warmup_ms.ok() ? nullptr : &warmup_ms.error(),
        iterations.ok() ? nullptr : &iterations.error(),
        duration_s.ok() ? nullptr : &duration_s.error(),
        cuda_graph.ok() ? nullptr : &cuda_graph.error(),
        no_transfers.ok() ? nullptr : &no_transfers.error(),
        avg_runs.ok() ? nullptr : &avg_runs.error(),
        graph_cache.ok() ? nullptr : &graph_cache.error(),
        threads.ok() ? nullptr : &threads.error(), buckets.ok() ? nullptr : &buckets.error(),
        percentiles.ok() ? nullptr : &percentiles.error()}) {
    if (e) return report("bench", *e);
  }
  const std::string save = args->get("saveEngine").value_or("");

  Result<Engine> engine = failure("no engine");
  if (load) {
    engine = load_engine(*load);
  } else {
    Stages stages("bench", save.empty() ? 2 : 3, build->verbose);
    stages.begin("parsing " + build->onnx);
    auto network = load_build_network(*build);
    if (!network.ok()) return report("bench", network.error());
    stages.end();
    stages.begin("building the engine");
    engine = build_engine(*network, *build, "bench");
    if (engine.ok()) stages.end();
    if (engine.ok() && !save.empty()) {
      stages.begin("saving " + save);
      Status st = engine->save(save);
      if (!st.ok()) return report("bench", failure(st, "saving the engine"));
      stages.end();
    }
  }
  if (!engine.ok()) return report("bench", engine.error());
  auto ctx_or = engine->create_execution_context();
  if (!ctx_or.ok())
    return report("bench", failure(ctx_or.status(), "creating an execution context"));
  ExecutionContext& ctx = **ctx_or;
  if (Status st = ctx.set_cpu_threads(int(*threads)); !st.ok())
    return report("bench", failure(st, "--threads"));
  auto inputs = prepare_inputs(*engine, ctx, *inputs_opt);
  if (!inputs.ok()) return report("bench", inputs.error());

  // On the CPU, bind every buffer once: inputs, and outputs of exactly the shapes these inputs
  // give. A GPU engine's addresses are device pointers, so there each timed run is run() on the
  // host tensors, which includes the host-device copies.
  const bool host_engine = engine->device() == Device::kCPU;
  if (!host_engine) ctx.set_use_cuda_graph(*cuda_graph || random_hi > 0);
  ctx.set_cuda_graph_cache_capacity(size_t(*graph_cache));
  if (random_hi > 0) {
    auto r = random_batch_bench(*engine, ctx, *inputs, random_lo, random_hi, *iterations,
                                inputs_opt->seed, *buckets);
    return r.ok() ? *r : report("bench", r.error());
  }
  if (!buckets->empty()) {
    Status st = ctx.set_batch_buckets(*buckets);
    if (!st.ok()) return report("bench", failure(st, "--batchBuckets"));
  }
  // --noDataTransfers on a GPU engine: every IO tensor in a device buffer bound once, as an
  // application that keeps its data on the device runs it (trtexec's flag).
  const bool device_io = !host_engine && *no_transfers;
  DeviceBuffers device_buffers;
  if (device_io) {
    Status st = bind_device_buffers(*engine, ctx, inputs->tensors, &device_buffers);
    if (!st.ok()) return report("bench", failure(st, "binding device buffers"));
  }
  auto run_once = [&]() -> Status {
    if (host_engine || device_io) return ctx.execute();
    auto r = ctx.run(inputs->tensors);
    return r.ok() ? ok_status() : r.status();
  };
  std::map<std::string, Tensor> outputs;
  std::vector<std::unique_ptr<GrowingOutputAllocator>> sized_outputs;
  std::string shapes_text;
  for (auto& [name, t] : inputs->tensors) {
    if (!host_engine) break;
    Status st = ctx.set_tensor_address(name, t.data());
    if (!st.ok()) return report("bench", failure(st, "binding input '" + name + "'"));
  }
  for (const auto& n : inputs->order)
    shapes_text +=
        (shapes_text.empty() ? "" : ",") + n + ":" + dims_to_spec(inputs->tensors[n].shape());
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    std::string n = engine->io_tensor_name(i);
    if (!host_engine || engine->tensor_mode(n) != TensorIOMode::kOUTPUT) continue;
    auto shape = ctx.tensor_shape(n);
    if (!shape.ok())
      return report("bench", failure(shape.status(), "resolving output '" + n + "'"));
    if (sized_by_data(*shape)) {
      sized_outputs.push_back(std::make_unique<GrowingOutputAllocator>(engine->device()));
      Status st = ctx.set_output_allocator(n, sized_outputs.back().get());
      if (!st.ok()) return report("bench", failure(st, "binding output '" + n + "'"));
      continue;
    }
    auto t = Tensor::zeros(*engine->tensor_dtype(n), *shape);
    if (!t.ok()) return report("bench", failure(t.status(), "allocating output '" + n + "'"));
    outputs[n] = std::move(t).value();
    Status st = ctx.set_tensor_address(n, outputs[n].data());
    if (!st.ok()) return report("bench", failure(st, "binding output '" + n + "'"));
  }

  std::printf(
      "engine: %s, device %s, profile %d, shapes %s\n", load ? load->c_str() : build->onnx.c_str(),
      std::string(device_name(engine->device())).c_str(), inputs->profile, shapes_text.c_str());
  if (host_engine) {
    std::printf("cpu threads: %d%s\n", ctx.cpu_threads(),
                args->has("threads") && *threads > 0 ? " (--threads)"
                : std::getenv("KILN_CPU_THREADS")    ? " (KILN_CPU_THREADS)"
                                                     : " (the CPUs this process may use)");
  }
  if (*cuda_graph && engine->device() == Device::kCPU) {
    std::printf("note: --useCudaGraph ignored: the cpu backend has no CUDA graphs\n");
  }

  // Warm-up: at least one run, so first-run arena allocation is never timed.
  int warm_runs = 0;
  auto w0 = std::chrono::steady_clock::now();
  {
    Progress bar("warm-up", 0, *warmup_ms / 1000.0);
    do {
      Status st = run_once();
      if (!st.ok()) return report("bench", failure(st, "running the engine"));
      bar.update(++warm_runs);
    } while (ms_since(w0) < *warmup_ms);
    bar.finish(false);
  }
  std::printf("warm-up: %d runs in %.0f ms\n", warm_runs, ms_since(w0));

  std::vector<double> times;
  auto t0 = std::chrono::steady_clock::now();
  {
    Progress bar("timing", args->has("duration") || !args->has("iterations") ? 0 : *iterations,
                 *duration_s);
    while (int64_t(times.size()) < *iterations || ms_since(t0) < *duration_s * 1000.0) {
      auto s = std::chrono::steady_clock::now();
      Status st = run_once();
      double ms = ms_since(s);
      if (!st.ok()) return report("bench", failure(st, "running the engine"));
      times.push_back(ms);
      bar.update(int64_t(times.size()));
    }
    bar.finish(false);
  }
  double wall_ms = ms_since(t0);
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double t : times) mean += t;
  mean /= double(times.size());
  double median = sorted.size() % 2
                      ? sorted[sorted.size() / 2]
                      : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  double qps = double(times.size()) / (wall_ms / 1000.0);
  const Tensor& first = inputs->tensors[inputs->order.front()];
  int64_t batch = first.rank() > 0 ? first.shape()[0] : 1;

  std::printf("timed: %zu runs in %.3f s\n", times.size(), wall_ms / 1000.0);
  std::string pcts;
  for (double p : *percentiles) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %s %.4g", percentile_name(p).c_str(), percentile(sorted, p));
    pcts += buf;
  }
  std::printf("latency (ms): min %.4g  mean %.4g  median %.4g%s  max %.4g\n", sorted.front(), mean,
              median, pcts.c_str(), sorted.back());
  if (*avg_runs > 0) {
    // trtexec's trace: the mean of each run of N consecutive timed runs, in order; a last group
    // of fewer than N is left out, as trtexec does.
    std::printf("trace averages of %lld runs (ms):", static_cast<long long>(*avg_runs));
    size_t groups = times.size() / size_t(*avg_runs);
    for (size_t g = 0; g < groups; ++g) {
      double sum = 0;
      for (size_t k = 0; k < size_t(*avg_runs); ++k) sum += times[g * size_t(*avg_runs) + k];
      std::printf(" %.4g", sum / double(*avg_runs));
    }
    if (groups == 0)
      std::printf(" none (fewer timed runs than %lld)", static_cast<long long>(*avg_runs));
    std::printf("\n");
  }
  std::printf("throughput: %.4g inferences/s (%.4g samples/s, batch %lld = dim 0 of %s)\n", qps,
              qps * double(batch), static_cast<long long>(batch), inputs->order.front().c_str());
  if (engine->device() == Device::kCPU) {
    std::printf(
        "host-to-device / device-to-host: none (the cpu backend computes on host memory; latency "
        "is compute)\n");
  }
  ExecutionContext::RunTiming phase_median;
  if (device_io) {
    std::printf("latency is execute() on device-resident inputs and outputs (--noDataTransfers)\n");
  } else if (!host_engine) {
    // A separate pass with a sync between phases, so the end-to-end figures above stay unperturbed.
    ctx.set_time_phases(true);
    std::vector<double> h2d, compute, d2h;
    for (size_t k = 0; k < std::min<size_t>(times.size(), 200); ++k) {
      Status st = run_once();
      if (!st.ok()) return report("bench", failure(st, "running the engine"));
      h2d.push_back(ctx.last_run_timing().h2d_ms);
      compute.push_back(ctx.last_run_timing().compute_ms);
      d2h.push_back(ctx.last_run_timing().d2h_ms);
    }
    ctx.set_time_phases(false);
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    phase_median = {med(h2d), med(compute), med(d2h)};
    std::printf(
        "latency includes the host-device copies of run() on host tensors; per phase (median of "
        "%zu runs, a sync between phases): host-to-device %.4g ms, compute %.4g ms, "
        "device-to-host %.4g ms\n",
        h2d.size(), phase_median.h2d_ms, phase_median.compute_ms, phase_median.d2h_ms);
  }

  // --dumpProfile / --exportProfile: per-layer times from a separate pass after the timed runs (a
  // profiled run uses no CUDA graph and synchronizes), so the latency above is never perturbed:
  // trtexec's --separateProfileRun, always.
  const auto export_profile = args->get("exportProfile");
  if (args->has("dumpProfile") || export_profile) {
    struct Collect final : Profiler {
      std::vector<std::string> names;
      std::vector<std::vector<double>> ms;  // per layer, one time per profiled run
      size_t cursor = 0;
      void report_layer_time(const std::string& layer, double t) override {
        if (cursor == names.size()) names.push_back(layer), ms.emplace_back();
        ms[cursor++].push_back(t);
      }
    } profile;
    ctx.set_profiler(&profile);
    const size_t runs = std::clamp<size_t>(times.size(), 1, 100);
    for (size_t k = 0; k < runs; ++k) {
      profile.cursor = 0;
      Status st = run_once();
      if (!st.ok()) {
        ctx.set_profiler(nullptr);
        return report("bench", failure(st, "running the engine with the layer profiler"));
      }
    }
    ctx.set_profiler(nullptr);
    double all = 0;
    std::vector<double> total(profile.names.size(), 0), med(profile.names.size(), 0);
    for (size_t l = 0; l < profile.names.size(); ++l) {
      std::vector<double> v = profile.ms[l];
      for (double t : v) total[l] += t;
      std::sort(v.begin(), v.end());
      med[l] = v.empty() ? 0 : v[v.size() / 2];
      all += total[l];
    }
    const double n_runs = double(runs);
    if (args->has("dumpProfile")) {
      std::printf(
          "layer profile (%zu runs, a sync per run, no CUDA graph; the sum of layer times is %.4g "
          "ms a "
          "run):\n",
          runs, all / n_runs);
      std::printf("  %10s %10s %10s %8s  %s\n", "Time(ms)", "Avg.(ms)", "Median(ms)", "Time(%)",
                  "Layer");
      for (size_t l = 0; l < profile.names.size(); ++l) {
        std::printf("  %10.4g %10.4g %10.4g %8.2f  %s\n", total[l], total[l] / n_runs, med[l],
                    all > 0 ? 100 * total[l] / all : 0.0, profile.names[l].c_str());
      }
    }
    if (export_profile) {
      // trtexec's --exportProfile form: a count, then one object per layer.
      JsonWriter j;
      j.begin_array();
      j.begin_object().key("count").value(int64_t(runs)).end_object();
      for (size_t l = 0; l < profile.names.size(); ++l) {
        j.begin_object().key("name").value(profile.names[l]).key("timeMs").value(total[l]);
        j.key("averageMs").value(total[l] / n_runs).key("medianMs").value(med[l]);
        j.key("percentage").value(all > 0 ? 100 * total[l] / all : 0.0).end_object();
      }
      j.end_array();
      if (Status w = write_regular_file(*export_profile, j.str() + "\n", "layer profile");
          !w.ok()) {
        return report("bench", failure(w.message()));
      }
      std::printf("layer profile written to %s\n", export_profile->c_str());
    }
  }

  if (auto path = args->get("exportTimes")) {
    JsonWriter j;
    j.begin_object();
    j.key("engine")
        .value(load ? *load : build->onnx)
        .key("device")
        .value(std::string(device_name(engine->device())));
    j.key("profile").value(inputs->profile).key("shapes").value(shapes_text);
    j.key("warmup_runs").value(warm_runs).key("iterations").value(int64_t(times.size()));
    j.key("latency_ms").begin_object();
    j.key("min").value(sorted.front()).key("mean").value(mean).key("median").value(median);
    j.key("device_io").value(device_io);
    if (!host_engine && !device_io) {
      j.key("h2d_median")
          .value(phase_median.h2d_ms)
          .key("compute_median")
          .value(phase_median.compute_ms);
      j.key("d2h_median").value(phase_median.d2h_ms);
    }
    for (double p : *percentiles) j.key(percentile_name(p)).value(percentile(sorted, p));
    j.key("max").value(sorted.back());
    j.end_object();
    j.key("throughput_qps").value(qps).key("batch").value(batch);
    j.key("times_ms").array(times);
    j.end_object();
    if (Status w = write_regular_file(*path, j.str() + "\n", "times"); !w.ok())
      return report("bench", failure(w.message()));
    std::printf("times written to %s\n", path->c_str());
  }
  return kExitOk;
}

}  // namespace kiln::cli

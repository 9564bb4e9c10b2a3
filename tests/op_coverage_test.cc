// Op coverage: every op with a CUDA implementation has a kernel case (checked on every build), and
// on a machine with CUDA each such case ran the CUDA kernel against the CPU reference. The record
// comes from the op harness (op_harness.h) as the tests of tests/ops_*_test.cc ran it: in this
// process when they all ran before this test (CMakeLists.txt links this file last, so a full run
// orders it so), otherwise from a child process that runs just them (a filtered run, a CTest run
// of this test alone, another link order), so the check never depends on test order.
#include <fcntl.h>
#include <gtest/gtest-spi.h>  // ScopedFakeTestPartResultReporter
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/kernel_registry.h"
#include "model_util.h"
#include "op_harness.h"

extern char** environ;

namespace kiln::testing {
namespace {

// Where a child process run by this test writes its record (see CoverageWriter).
constexpr const char* kCoverageOutEnv = "KILN_OP_COVERAGE_OUT";

// Ops with a CUDA implementation whose kernel the builder never selects, so no case can run it,
// each with the reason. The test checks that the reason still holds (a case passed on CUDA with no
// kernel running); once a kernel runs, the entry must go.
const std::map<std::string, std::string>& never_planned_on_cuda() {
  static const std::map<std::string, std::string> m = {
      {"Shape", "its output is always known as shape arithmetic, which the runtime evaluates"},
      {"Size", "its output is always known as shape arithmetic, which the runtime evaluates"},
  };
  return m;
}

// Writes this process's record at exit when a parent asked for it.
class CoverageWriter : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* path = std::getenv(kCoverageOutEnv);
    if (!path || !*path) return;
    std::ofstream out(path);
    out << coverage_to_text(recorded_coverage());
  }
};
[[maybe_unused]] ::testing::Environment* const kCoverageWriter =
    ::testing::AddGlobalTestEnvironment(new CoverageWriter);

bool is_op_test(const ::testing::TestInfo& t) {
  std::string file = std::filesystem::path(t.file()).filename().string();
  return file.rfind("ops_", 0) == 0 && std::string(t.name()).rfind("DISABLED_", 0) != 0 &&
         std::string(t.test_suite_name()).find("DISABLED_") == std::string::npos;
}

// The full names of the tests in tests/ops_*_test.cc, and whether all of them already ran here.
std::vector<std::string> op_tests(bool* all_ran_here) {
  std::vector<std::string> names;
  *all_ran_here = true;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int k = 0; k < suite.total_test_count(); ++k) {
      const ::testing::TestInfo& t = *suite.GetTestInfo(k);
      if (!is_op_test(t)) continue;
      names.push_back(std::string(t.test_suite_name()) + "." + t.name());
      if (!t.should_run() || t.result()->start_timestamp() == 0) *all_ran_here = false;
    }
  }
  return names;
}

// Runs this executable on `tests` with the record written to a file, and reads it back.
StatusOr<CoverageMap> child_coverage(const std::vector<std::string>& tests) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return internal_error("cannot find this executable: " + ec.message());
  fs::path dir = fs::temp_directory_path();
  std::string tag = "kiln_op_coverage_" + std::to_string(getpid());
  fs::path record = dir / (tag + ".txt"), log = dir / (tag + ".log");
  fs::remove(record, ec);

  std::string filter = "--gtest_filter=";
  for (size_t i = 0; i < tests.size(); ++i) filter += (i ? ":" : "") + tests[i];
  std::string exe_s = exe.string();
  std::vector<char*> argv = {exe_s.data(), filter.data(), nullptr};
  // The child runs every op test once, unsharded, writing no report of its own.
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("GTEST_", 0) == 0 || kv.rfind(std::string(kCoverageOutEnv) + "=", 0) == 0)
      continue;
    env_s.push_back(kv);
  }
  env_s.push_back(std::string(kCoverageOutEnv) + "=" + record.string());
  std::vector<char*> envp;
  for (auto& kv : env_s) envp.push_back(kv.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, exe_s.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return internal_error(std::string("cannot start the op tests: ") + std::strerror(rc));
  int wstatus = 0;
  if (waitpid(pid, &wstatus, 0) < 0) return internal_error("waiting for the op tests failed");
  std::ifstream in(record);
  if (!in) {
    return internal_error("the op tests (" + std::to_string(tests.size()) +
                          ") wrote no coverage record; see " + log.string());
  }
  std::stringstream text;
  text << in.rdbuf();
  in.close();
  fs::remove(record, ec);
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
    fs::remove(log, ec);
  } else {
    std::printf(
        "[ coverage ] the op tests failed in the child run (their own results say why); log: %s\n",
        log.c_str());
  }
  return coverage_from_text(text.str());
}

#define KILN_COUNT_OP(name) +1
constexpr int kNumOps = 0 KILN_OPS(KILN_COUNT_OP) KILN_INTERNAL_OPS(KILN_COUNT_OP);
#undef KILN_COUNT_OP

std::string op_label(ops::OpKind k) {
  std::string domain(ops::op_domain(k));
  return (domain.empty() ? "" : domain + "::") + std::string(ops::op_name(k));
}

// The ops the CUDA registration functions (register_* in src/backends/cuda) and register_host_run
// calls name: what this build would register with CUDA compiled in. Read from the source so that a build without CUDA still
// knows which ops need a case.
StatusOr<std::set<ops::OpKind>> cuda_ops_in_source() {
  namespace fs = std::filesystem;
  std::map<std::string, ops::OpKind> by_enum;
  for (int k = 1; k <= kNumOps; ++k) {
    std::string name = "k";
    name += ops::op_name(ops::OpKind(k));
    by_enum[name] = ops::OpKind(k);
  }
  fs::path dir = fs::path(KILN_SOURCE_DIR) / "src" / "backends" / "cuda";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("no CUDA backend sources at " + dir.string());
  std::set<ops::OpKind> out;
  const std::regex reg_fn(R"(void\s+register_\w+\s*\(\s*Registry\s*&\s*\w+\s*\)\s*\{)");
  const std::regex op_ref(R"(OpKind::(k\w+))");
  const std::regex host_run(R"(register_host_run\s*\(\s*\w+\s*,\s*(?:ops::)?OpKind::(k\w+)\s*\))");
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cc") continue;
    std::ifstream in(entry.path());
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    for (std::sregex_iterator it(text.begin(), text.end(), reg_fn), end; it != end; ++it) {
      size_t open = size_t(it->position() + it->length()), close = open;
      for (int depth = 1; close < text.size() && depth > 0; ++close) {
        depth += text[close] == '{' ? 1 : text[close] == '}' ? -1 : 0;
      }
      std::string body = text.substr(open, close - open);
      for (std::sregex_iterator m(body.begin(), body.end(), op_ref); m != std::sregex_iterator();
           ++m) {
        auto found = by_enum.find((*m)[1].str());
        if (found == by_enum.end())
          return internal_error(entry.path().string() + " names unknown " + (*m)[1].str());
        out.insert(found->second);
      }
    }
    // Ops that run on CUDA through their CPU reference, registered one call each (wherever the
    // call sits: cuda_backend.cc lists them after the families).
    for (std::sregex_iterator m(text.begin(), text.end(), host_run), end; m != end; ++m) {
      auto found = by_enum.find((*m)[1].str());
      if (found == by_enum.end())
        return internal_error(entry.path().string() + " names unknown " + (*m)[1].str());
      out.insert(found->second);
    }
  }
  if (out.empty()) return not_found("no register_* functions found in " + dir.string());
  return out;
}

// ---- the harness itself: each check here fails if the harness stops doing its job ----

const DeviceCoverage& cpu_record(ops::OpKind k) {
  static const DeviceCoverage none;
  auto it = recorded_coverage().find(k);
  if (it == recorded_coverage().end()) return none;
  auto d = it->second.devices.find(Device::kCPU);
  return d == it->second.devices.end() ? none : d->second;
}

// The gtest failures a case reports, captured instead of failing this test (one per device).
std::string failures_of(const KernelCase& c) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    (void)run_case(c);
  }
  std::string out;
  for (int i = 0; i < results.size(); ++i) {
    if (results.GetTestPartResult(i).failed())
      out += std::string(results.GetTestPartResult(i).message()) + "\n";
  }
  return out;
}

TEST(OpHarness, RunsTheCaseOnTheCpuEngineAndRecordsIt) {
  int before = cpu_record(ops::OpKind::kRelu).with_kernel;
  auto r = run_case(op("Relu", 18), {make_f32({4}, {-1, 0, 2, -3})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({4}, {0, 0, 2, 0}), 0, 0));
  EXPECT_EQ(cpu_record(ops::OpKind::kRelu).with_kernel, before + 1);
  EXPECT_EQ(cpu_record(ops::OpKind::kRelu).impls.count("cpu.Relu"), 1u);
}

TEST(OpHarness, AWrongReferenceFailsTheCase) {
  KernelCase c{.node = op("Relu", 18),
               .inputs = {make_f32({3}, {-1, 1, 2})},
               .expected = {make_f32({3}, {0, 1, 3})}};
  std::string failures = failures_of(c);
  EXPECT_NE(failures.find("against the expected values"), std::string::npos) << failures;
  // A kernel that writes nothing cannot pass against a reference that is not mostly zero.
  auto zeros = all_close(make_f32({4}, {0, 0, 0, 0}), make_f32({4}, {1, 2, 3, 4}), 10, 10);
  EXPECT_FALSE(zeros);
  EXPECT_NE(std::string(zeros.message()).find("mostly zero"), std::string::npos) << zeros.message();
  // Integers compare exactly, past 2^53 too.
  int64_t big = (int64_t(1) << 60) + 1;
  EXPECT_FALSE(all_close(make_i64({1}, {big}), make_i64({1}, {big - 1}), 0, 0));
}

TEST(OpHarness, ARefusedBuildIsASkipUnlessSupportIsExpected) {
  // Slice with starts known only at run time: the reference runs, the builder refuses the node.
  KernelCase c{
      .node = op("Slice", 18),
      .inputs = {make_f32({4}, {1, 2, 3, 4}), make_i64({1}, {1}), initializer(make_i64({1}, {3}))}};
  const DeviceCoverage& rec = cpu_record(ops::OpKind::kSlice);
  int skipped = rec.skipped, failed = rec.failed;
  auto r = run_case(c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_f32({2}, {2, 3}), 0, 0));
  EXPECT_EQ(cpu_record(ops::OpKind::kSlice).skipped, skipped + 1);
  EXPECT_EQ(cpu_record(ops::OpKind::kSlice).failed, failed);
  c.expect_support = true;
  std::string failures = failures_of(c);
  EXPECT_NE(failures.find("cpu: node 'n0' (Slice): build: "), std::string::npos) << failures;
}

TEST(OpHarness, ShapeOfInputsKeepTheNodeRunning) {
  // With every input constant the builder folds Range; with the limit from an input's dims it runs.
  const DeviceCoverage& rec = cpu_record(ops::OpKind::kRange);
  int with = rec.with_kernel, without = rec.without_kernel;
  auto i64 = [](int64_t v) { return initializer(make_i64({}, {v})); };
  ASSERT_TRUE(run_case(op("Range", 18), {i64(0), i64(3), i64(1)}).ok());
  EXPECT_EQ(cpu_record(ops::OpKind::kRange).without_kernel, without + 1);
  auto r = run_case(op("Range", 18), {i64(0), shape_of({3}), i64(1)});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(all_close((*r)[0], make_i64({3}, {0, 1, 2}), 0, 0));
  EXPECT_EQ(cpu_record(ops::OpKind::kRange).with_kernel, with + 1);
}

TEST(OpHarness, TolerancesFollowWhatTheNodeComputedIn) {
  EXPECT_EQ(op_tolerance(DType::kFloat32).rtol, kFp32Rtol);
  EXPECT_EQ(op_tolerance(DType::kFloat32, {DType::kFloat32, true}).name, kTf32OpTolerance.name);
  EXPECT_EQ(op_tolerance(DType::kFloat32, {DType::kFloat16, false}).name, kFp16OpTolerance.name);
  EXPECT_EQ(op_tolerance(DType::kFloat32, {DType::kBFloat16, false}).name, kBf16OpTolerance.name);
  EXPECT_EQ(op_tolerance(DType::kFloat16).name, kFp16DataOpTolerance.name);
  EXPECT_EQ(op_tolerance(DType::kInt64).atol, 0);
  EXPECT_EQ(op_tolerance(DType::kBool).rtol, 0);
}

TEST(OpHarness, CoverageRecordsSurviveTheirTextForm) {
  CoverageMap m;
  m[ops::OpKind::kConv].cases = 3;
  DeviceCoverage& d = m[ops::OpKind::kConv].devices[Device::kCUDA];
  d.with_kernel = 2;
  d.skipped = 1;
  d.impls = {"cuda.cudnn.Conv"};
  d.why_not = "asymmetric\tpadding";
  m[ops::OpKind::kMatMulBias].cases = 1;
  auto back = coverage_from_text(coverage_to_text(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->at(ops::OpKind::kConv).cases, 3);
  const DeviceCoverage& b = back->at(ops::OpKind::kConv).devices.at(Device::kCUDA);
  EXPECT_EQ(b.with_kernel, 2);
  EXPECT_EQ(b.skipped, 1);
  EXPECT_EQ(b.impls, std::set<std::string>{"cuda.cudnn.Conv"});
  EXPECT_EQ(b.why_not, "asymmetric padding");
  EXPECT_EQ(back->at(ops::OpKind::kMatMulBias).cases, 1);
  EXPECT_FALSE(coverage_from_text("op\t.\tNoSuchOp\t1\n").ok());
}

TEST(OpCoverage, EveryOpWithACudaKernelRanACase) {
  bool all_ran_here = false;
  std::vector<std::string> tests = op_tests(&all_ran_here);
  ASSERT_FALSE(tests.empty()) << "no tests from tests/ops_*_test.cc are registered";
  CoverageMap coverage;
  std::printf(
      "[ coverage ] the record of the %zu op tests: %s\n", tests.size(),
      all_ran_here ? "this process (they ran before this test)" : "a child process running them");
  if (all_ran_here) {
    coverage = recorded_coverage();
  } else {
    auto child = child_coverage(tests);
    ASSERT_TRUE(child.ok()) << child.status().to_string();
    coverage = std::move(*child);
  }

  // The ops with CUDA kernels: the registry's when CUDA is compiled in (which must then agree with
  // the source), else the source's.
  const backends::KernelRegistry& registry = backends::kernel_registry();
  std::set<ops::OpKind> cuda_ops;
  for (int k = 1; k <= kNumOps; ++k) {
    if (registry.has(ops::OpKind(k), Device::kCUDA)) cuda_ops.insert(ops::OpKind(k));
  }
  auto in_source = cuda_ops_in_source();
  ASSERT_TRUE(in_source.ok()) << in_source.status().to_string();
  if (cuda_ops.empty()) {
    cuda_ops = *in_source;
  } else {
    EXPECT_EQ(cuda_ops, *in_source)
        << "the registry and the register_* functions in src/backends/cuda disagree";
  }

  // The CPU, printed: how many ops with a CPU implementation passed a case on the CPU engine.
  int cpu_ops = 0, cpu_passed = 0, cpu_kernel = 0;
  for (int k = 1; k <= kNumOps; ++k) {
    ops::OpKind kind = ops::OpKind(k);
    if (!registry.has(kind, Device::kCPU)) continue;
    ++cpu_ops;
    auto it = coverage.find(kind);
    if (it == coverage.end()) continue;
    auto d = it->second.devices.find(Device::kCPU);
    if (d == it->second.devices.end()) continue;
    cpu_passed += d->second.with_kernel + d->second.without_kernel > 0;
    cpu_kernel += d->second.with_kernel > 0;
  }
  std::printf(
      "[ coverage ] cpu: %d of %d ops with a CPU implementation passed a case on the CPU engine "
      "(%d with a kernel running, %d with the output computed by the builder)\n",
      cpu_passed, cpu_ops, cpu_kernel, cpu_passed - cpu_kernel);

  // Every op with a CUDA kernel needs a case, on every build: the GPU host runs it there.
  std::string no_case;
  for (ops::OpKind k : cuda_ops) {
    auto it = coverage.find(k);
    if (it == coverage.end() || it->second.cases == 0) no_case.append(" ").append(op_label(k));
  }
  EXPECT_TRUE(no_case.empty())
      << "ops with a CUDA implementation but no kernel case (add one to the "
         "family's tests/ops_*_test.cc):"
      << no_case;

  Status cuda = device_available(Device::kCUDA);
  if (!cuda.ok()) {
    std::printf(
        "[ coverage ] cuda: %zu ops have a CUDA implementation; their kernels are not run here: "
        "%s\n",
        cuda_ops.size(), cuda.message().c_str());
    return;
  }
  std::string uncovered, stale;
  int covered = 0;
  for (ops::OpKind k : cuda_ops) {
    const DeviceCoverage* d = nullptr;
    auto it = coverage.find(k);
    if (it != coverage.end()) {
      auto dit = it->second.devices.find(Device::kCUDA);
      if (dit != it->second.devices.end()) d = &dit->second;
    }
    auto exempt = never_planned_on_cuda().find(std::string(ops::op_name(k)));
    if (exempt != never_planned_on_cuda().end()) {
      if (!d || d->with_kernel > 0 || d->without_kernel == 0) {
        stale += "\n  " + op_label(k) + " (" + exempt->second + ")";
      }
      continue;
    }
    if (d && d->with_kernel > 0) {
      ++covered;
      continue;
    }
    uncovered += "\n  " + op_label(k) + ": ";
    if (!d) {
      uncovered += "no case ran on CUDA";
    } else {
      uncovered += std::to_string(d->skipped) + " skipped, " + std::to_string(d->failed) +
                   " failed, " + std::to_string(d->without_kernel) + " ran no kernel";
      if (!d->why_not.empty()) uncovered += "; first reason: " + d->why_not;
    }
  }
  std::printf(
      "[ coverage ] cuda: %d of %zu ops with a CUDA implementation ran a case on the CUDA kernel "
      "(%zu exempt: never planned)\n",
      covered, cuda_ops.size(), never_planned_on_cuda().size());
  EXPECT_TRUE(uncovered.empty()) << "ops whose CUDA kernel no case ran against the reference:"
                                 << uncovered;
  EXPECT_TRUE(stale.empty())
      << "exemptions in never_planned_on_cuda() that no longer hold (a CUDA kernel "
         "ran, or no case passed on CUDA):"
      << stale;
}

}  // namespace
}  // namespace kiln::testing

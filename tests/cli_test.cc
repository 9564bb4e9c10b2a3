// End-to-end tests of the kiln CLI: runs the built binary (KILN_CLI_PATH) on the demo model that
// scripts/make_demo_model.py generates, on small models written here, and on ../shared/models.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "builder/timing_cache.h"
#include "core/dtype.h"
#include "frontend/onnx/parse.h"
#include "model_util.h"
#include "onnx/onnx.pb.h"
#include "onnx_model_builder.h"
#include "plan/engine_file.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

struct CliResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

#ifdef KILN_CLI_PATH
constexpr const char* kCli = KILN_CLI_PATH;
#else
constexpr const char* kCli = "";
#endif

// `env` is prepended to the command line ("KILN_PYTHON=... ").
CliResult kiln_cli(const std::string& args, const std::string& env = "") {
  std::string cmd = env + std::string(kCli) + " " + args + " 2>&1";
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) r.out.append(buf, n);
  int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The float32 payload of a .npy file kiln wrote (header length at bytes 8-9, format 1.0).
std::vector<float> npy_floats(const fs::path& p) {
  std::string s = read_file(p);
  if (s.size() < 10) return {};
  size_t header = size_t(uint8_t(s[8])) | size_t(uint8_t(s[9])) << 8;
  std::vector<float> v((s.size() - 10 - header) / 4);
  std::memcpy(v.data(), s.data() + 10 + header, v.size() * 4);
  return v;
}

// A one-node model y = x + c (c a scalar initializer), with a dynamic batch; or with `op` other
// than "Add", a model of unknown ops, for the unsupported-op listing.
void write_model(const fs::path& path, float c, const std::vector<std::string>& unknown_ops = {},
                 bool float16 = false) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("kiln_cli_test");
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(18);
  auto* g = m.mutable_graph();
  g->set_name("tiny");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  const int elem = float16 ? 10 : 1;
  tt->set_elem_type(elem);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(4);
  auto* out = g->add_output();
  out->set_name("y");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
  auto* init = g->add_initializer();
  init->set_name("c");
  init->set_data_type(elem);
  if (float16) {
    init->add_int32_data(float_to_half(c));  // ONNX keeps float16 bits in int32_data
  } else {
    init->add_float_data(c);
  }
  std::string prev = "x";
  for (size_t i = 0; i < unknown_ops.size(); ++i) {
    auto* n = g->add_node();
    n->set_op_type(unknown_ops[i]);
    n->set_name("weird_" + std::to_string(i));
    n->add_input(prev);
    prev = "u" + std::to_string(i);
    n->add_output(prev);
  }
  auto* n = g->add_node();
  n->set_op_type("Add");
  n->set_name("add");
  n->add_input(prev);
  n->add_input("c");
  n->add_output("y");
  std::ofstream f(path, std::ios::binary);
  f << m.SerializeAsString();
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("KILN_PROGRESS", "0", 1);
    dir_ = new fs::path(fs::temp_directory_path() / ("kiln_cli_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    std::string cmd = "python3 " + std::string(KILN_SOURCE_DIR) + "/scripts/make_demo_model.py " +
                      (*dir_ / "demo").string() + " >/dev/null 2>&1";
    demo_ok_ = std::system(cmd.c_str()) == 0 && fs::exists(*dir_ / "demo" / "model.onnx");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  void SetUp() override {
    if (std::string(kCli).empty()) GTEST_SKIP() << "the kiln CLI target is not part of this build";
  }
  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  static std::string demo() { return (*dir_ / "demo" / "model.onnx").string(); }
  // Builds the demo engine once per test that needs it.
  void build_demo() {
    if (!demo_ok_)
      GTEST_SKIP()
          << "scripts/make_demo_model.py failed (python3 with onnx and onnxruntime needed)";
    auto r = kiln_cli(
        "build --onnx=" + demo() + " --saveEngine=" + path("demo.kiln") +
        " --minShapes=image:1x3x32x32 --optShapes=image:4x3x32x32 --maxShapes=image:16x3x32x32");
    ASSERT_EQ(r.code, 0) << r.out;
  }

  static fs::path* dir_;
  static bool demo_ok_;
};
fs::path* CliTest::dir_ = nullptr;
bool CliTest::demo_ok_ = false;

TEST_F(CliTest, HelpForEveryCommand) {
  auto top = kiln_cli("--help");
  EXPECT_EQ(top.code, 0);
  for (const char* sub : {"build", "run", "bench", "inspect", "compare"}) {
    EXPECT_TRUE(contains(top.out, std::string("  ") + sub)) << top.out;
    auto r = kiln_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_TRUE(contains(r.out, std::string("usage: kiln ") + sub)) << r.out;
  }
  EXPECT_TRUE(contains(kiln_cli("build --help").out, "--minShapes=SPEC"));
  EXPECT_EQ(kiln_cli("").code, 2);
}

TEST_F(CliTest, BadFlagsAndMalformedShapesExitTwo) {
  auto r = kiln_cli("build --onxx=m.onnx");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "unknown flag --onxx")) << r.out;
  EXPECT_TRUE(contains(r.out, "did you mean --onnx?")) << r.out;
  r = kiln_cli("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "unknown command 'frobnicate'"));
  r = kiln_cli("--onnx=m.onnx --saveEngine=m.kiln");  // trtexec's spelling, without a command
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "kiln build --onnx=m.onnx")) << r.out;

  r = kiln_cli("build --onnx=m.onnx --minShapes=x:4x");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "malformed shape 'x:4x': dim 1 is empty")) << r.out;
  r = kiln_cli("build --onnx=m.onnx --minShapes=x:-1x3");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "dim 0 is '-1'")) << r.out;
  r = kiln_cli("run --loadEngine=e.kiln --shapes=x:1xfoo");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "dim 1 is 'foo', not an integer")) << r.out;
  r = kiln_cli("run --loadEngine=e.kiln --shapes=1x3x224x224");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "has no ':'")) << r.out;
  r = kiln_cli("build --onnx=m.onnx --minShapes=x:1x3,x:2x3");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "appears twice")) << r.out;
  r = kiln_cli("build --onnx=m.onnx --device=tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "--device=tpu is not a device")) << r.out;
  r = kiln_cli("build --onnx=m.onnx --fp16=maybe");
  EXPECT_EQ(r.code, 2);
  r = kiln_cli("bench --loadEngine=e.kiln --iterations=0");
  EXPECT_EQ(r.code, 2);
  r = kiln_cli("bench --loadEngine=e.kiln --onnx=m.onnx");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "exactly one of --loadEngine")) << r.out;
  r = kiln_cli("compare --atol=abc --onnx=m.onnx");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "--atol=abc is not a number")) << r.out;
  r = kiln_cli("build --onnx=m.onnx --minShapes=x:1x4 --profile=2");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "skips a profile")) << r.out;
  // A missing file is a failure of the work (1), not of the command line.
  r = kiln_cli("run --loadEngine=" + path("absent.kiln"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "absent.kiln")) << r.out;
}

TEST_F(CliTest, NamesAndMissingDynamicInputs) {
  write_model(path("tiny.onnx"), 1.0f);
  auto r = kiln_cli("build --onnx=" + path("tiny.onnx"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "dynamic inputs without shapes")) << r.out;
  EXPECT_TRUE(contains(r.out, "x: [batch, 4]")) << r.out;
  EXPECT_TRUE(contains(r.out, "--minShapes=x:1x4 --optShapes=x:8x4 --maxShapes=x:32x4")) << r.out;
  r = kiln_cli("build --onnx=" + path("tiny.onnx") + " --minShapes=x:1x4,y:1x3");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "names 'y', which is not an input")) << r.out;
  // Names may contain ':' (the dims follow the last one): the name is read whole, then refused.
  r = kiln_cli("build --onnx=" + path("tiny.onnx") + " --minShapes=in:0:1x4");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "names 'in:0'")) << r.out;
  // A profile the model cannot take (dim 1 is fixed at 4) is a command-line error too.
  r = kiln_cli("build --onnx=" + path("tiny.onnx") + " --minShapes=x:1x5 --maxShapes=x:8x5");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "fixed at 4")) << r.out;
}

// --shapeSteps (issue 15): the profile's batch takes 2, 4, 6, 8 only; a run at 3 is refused with
// the step and the nearest values; an opt off the steps is a command-line error.
TEST_F(CliTest, ShapeStepsBuildAndRefuseOffStepShapes) {
  write_model(path("stepped.onnx"), 1.0f);
  const std::string engine = path("stepped.kiln");
  auto r = kiln_cli("build --onnx=" + path("stepped.onnx") +
                    " --minShapes=x:2x4 --optShapes=x:4x4 --maxShapes=x:8x4 --shapeSteps=x:2x1 "
                    "--verbose --saveEngine=" +
                    engine);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "steps: batch = 2*batch_step2")) << r.out;
  r = kiln_cli("run --loadEngine=" + engine + " --shapes=x:6x4");
  EXPECT_EQ(r.code, 0) << r.out;
  r = kiln_cli("run --loadEngine=" + engine + " --shapes=x:3x4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "it moves in steps of 2 (the nearest values are 2 and 4)")) << r.out;
  r = kiln_cli("build --onnx=" + path("stepped.onnx") +
               " --minShapes=x:2x4 --optShapes=x:5x4 --maxShapes=x:8x4 --shapeSteps=x:2x1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "opt 5 is not min 2 plus a multiple of the step 2")) << r.out;
  r = kiln_cli("build --onnx=" + path("stepped.onnx") +
               " --minShapes=x:2x4 --maxShapes=x:8x4 --shapeSteps=y:2x1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--shapeSteps names 'y'")) << r.out;
}

// A sequence input: --sequenceLengths lays it out as tensor inputs xs[0], xs[1] whose shapes the
// shape flags give; y concatenates them, and the sequence output ys is ys[0], ys[1].
TEST_F(CliTest, SequenceInputsTakeTheirLengthAndElementShapes) {
  ::onnx::ModelProto m = ::kiln::testing::make_model(18);
  auto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("xs");
  auto* tt =
      in->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type();
  tt->set_elem_type(1);
  tt->mutable_shape()->add_dim()->set_dim_param("n");
  auto* concat = ::kiln::testing::add_node(g, "ConcatFromSequence", {"xs"}, {"y"}, "concat");
  auto* axis = concat->add_attribute();
  axis->set_name("axis");
  axis->set_type(::onnx::AttributeProto::INT);
  axis->set_i(0);
  ::kiln::testing::add_node(g, "Identity", {"xs"}, {"ys"}, "pass");
  ::kiln::testing::add_output(g, "y");
  auto* out = g->add_output();
  out->set_name("ys");
  out->mutable_type()
      ->mutable_sequence_type()
      ->mutable_elem_type()
      ->mutable_tensor_type()
      ->set_elem_type(1);
  {
    std::ofstream f(path("seq.onnx"), std::ios::binary);
    f << m.SerializeAsString();
  }
  auto r = kiln_cli("build --onnx=" + path("seq.onnx"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--sequenceLengths=xs:N")) << r.out;
  r = kiln_cli("build --onnx=" + path("seq.onnx") + " --sequenceLengths=xs:2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "xs[0]: [n]")) << r.out;
  const std::string engine = path("seq.kiln");
  r = kiln_cli(
      "build --onnx=" + path("seq.onnx") +
      " --sequenceLengths=xs:2 --minShapes='xs[0]:1,xs[1]:1' --optShapes='xs[0]:4,xs[1]:2' "
      "--maxShapes='xs[0]:8,xs[1]:8' --saveEngine=" +
      engine);
  ASSERT_EQ(r.code, 0) << r.out;
  r = kiln_cli("run --loadEngine=" + engine + " --shapes='xs[0]:3,xs[1]:5'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "y: shape 8 float32")) << r.out;
  EXPECT_TRUE(contains(r.out, "ys[0]: shape 3 float32")) << r.out;
  EXPECT_TRUE(contains(r.out, "ys[1]: shape 5 float32")) << r.out;
  r = kiln_cli("build --onnx=" + path("seq.onnx") + " --sequenceLengths=xs:2x3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "needs one length")) << r.out;
}

// A detector's tail: NonMaxSuppression over 3 classes (at most 5 boxes each), then the kept boxes
// gathered. The number kept is data-dependent: inspect lists its dim and marks the layer, run
// prints exact shapes, compare matches ONNX Runtime.
TEST_F(CliTest, DataDependentOutputsBuildInspectRunAndCompare) {
  using namespace ::kiln::testing;
  ::onnx::ModelProto m = make_model(17);
  auto* g = m.mutable_graph();
  add_input(g, "boxes", ::onnx::TensorProto::FLOAT, {"1", "n", "4"});
  add_input(g, "scores", ::onnx::TensorProto::FLOAT, {"1", "3", "n"});
  *g->add_initializer() = raw_tensor<int64_t>("max_out", ::onnx::TensorProto::INT64, {1}, {5});
  *g->add_initializer() = raw_tensor<float>("iou", ::onnx::TensorProto::FLOAT, {1}, {0.5f});
  *g->add_initializer() = raw_tensor<int64_t>("two", ::onnx::TensorProto::INT64, {}, {2});
  *g->add_initializer() = raw_tensor<int64_t>("zero", ::onnx::TensorProto::INT64, {1}, {0});
  add_node(g, "NonMaxSuppression", {"boxes", "scores", "max_out", "iou"}, {"sel"}, "nms");
  auto* pick = add_node(g, "Gather", {"sel", "two"}, {"box_idx"}, "pick_box");
  auto* axis = pick->add_attribute();
  axis->set_name("axis"), axis->set_type(::onnx::AttributeProto::INT), axis->set_i(1);
  add_node(g, "Squeeze", {"boxes", "zero"}, {"boxes2d"}, "squeeze");
  add_node(g, "Gather", {"boxes2d", "box_idx"}, {"kept"}, "gather_boxes");
  add_output(g, "sel", ::onnx::TensorProto::INT64);
  add_output(g, "kept");
  {
    std::ofstream f(path("nms_tail.onnx"), std::ios::binary);
    f << m.SerializeAsString();
  }
  const std::string engine = path("nms_tail.kiln");
  auto r = kiln_cli("build --onnx=" + path("nms_tail.onnx") +
                    " --minShapes=boxes:1x1x4,scores:1x3x1 --optShapes=boxes:1x50x4,scores:1x3x50"
                    " --maxShapes=boxes:1x200x4,scores:1x3x200 --saveEngine=" +
                    engine);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "nms_selected in [0, 3*min(5, n)]")) << r.out;
  r = kiln_cli("inspect " + engine);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "kept    float32   [nms_selected, 4]")) << r.out;
  EXPECT_TRUE(contains(r.out, "sizes from data (the run waits for them)")) << r.out;
  r = kiln_cli("run --loadEngine=" + engine + " --shapes=boxes:1x20x4,scores:1x3x20");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "sel: shape ") && contains(r.out, "x3 int64")) << r.out;
  r = kiln_cli("compare --loadEngine=" + engine + " --onnx=" + path("nms_tail.onnx") +
               " --shapes=boxes:1x30x4,scores:1x3x30");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "PASS: 2 of 2 outputs within tolerance")) << r.out;
}

// Shape-value inputs from the command line: an integer input the model gives a fixed shape takes
// values through --minShapes/--optShapes/--maxShapes (trtexec's spelling for shape tensors), and
// --shapes gives them to a run.
TEST_F(CliTest, ShapeValueInputsBuildInspectRunAndCompare) {
  using namespace ::kiln::testing;
  ::onnx::ModelProto m = make_model(17);
  auto* g = m.mutable_graph();
  add_input(g, "x", ::onnx::TensorProto::FLOAT, {"n", "10"});
  add_input(g, "k", ::onnx::TensorProto::INT64, {"1"});
  add_input(g, "shape", ::onnx::TensorProto::INT64, {"2"});
  *g->add_initializer() =
      raw_tensor<float>("row", ::onnx::TensorProto::FLOAT, {1, 4}, {1.f, 2.f, 3.f, 4.f});
  auto* topk = add_node(g, "TopK", {"x", "k"}, {"vals", "idx"}, "topk");
  auto* axis = topk->add_attribute();
  axis->set_name("axis"), axis->set_type(::onnx::AttributeProto::INT), axis->set_i(1);
  add_node(g, "Expand", {"row", "shape"}, {"e"}, "expand");
  add_output(g, "vals");
  add_output(g, "idx", ::onnx::TensorProto::INT64);
  add_output(g, "e");
  {
    std::ofstream f(path("values.onnx"), std::ios::binary);
    f << m.SerializeAsString();
  }
  const std::string engine = path("values.kiln");
  auto r = kiln_cli("build --onnx=" + path("values.onnx") +
                    " --minShapes=x:1x10,k:1,shape:1x4 --optShapes=x:2x10,k:3,shape:2x4"
                    " --maxShapes=x:4x10,k:5,shape:6x4 --saveEngine=" +
                    engine);
  ASSERT_EQ(r.code, 0) << r.out;
  r = kiln_cli("inspect " + engine);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "shape values (host memory): [shape_0, 4]")) << r.out;
  EXPECT_TRUE(contains(r.out, "vals   float32   [n, k_0]")) << r.out;
  EXPECT_TRUE(contains(r.out, "k values min 1 opt 3 max 5")) << r.out;
  r = kiln_cli("run --loadEngine=" + engine + " --shapes=x:3x10,k:4,shape:5x4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "vals: shape 3x4 float32")) << r.out;
  EXPECT_TRUE(contains(r.out, "e: shape 5x4 float32")) << r.out;
  r = kiln_cli("run --loadEngine=" + engine + " --shapes=x:3x10,k:7,shape:5x4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "input 'k' element 0 (k_0) = 7 is outside the range [1, 5]"))
      << r.out;
  r = kiln_cli("compare --loadEngine=" + engine + " --onnx=" + path("values.onnx") +
               " --shapes=x:2x10,k:2,shape:3x4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "PASS: 3 of 3 outputs within tolerance")) << r.out;
  // --loadInputs gives a shape-value input its values too: they are used (issue 41, class 7: they
  // were dropped for the profile's opt values) and refused outside the profile like --shapes'.
  for (auto [name, k] : {std::pair{"k4.pb", int64_t(4)}, std::pair{"k7.pb", int64_t(7)}}) {
    std::ofstream f(path(name), std::ios::binary);
    f << raw_tensor<int64_t>("k", ::onnx::TensorProto::INT64, {1}, {k}).SerializeAsString();
  }
  r = kiln_cli("run --loadEngine=" + engine +
               " --shapes=x:3x10,shape:5x4 --loadInputs=k:" + path("k4.pb"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "vals: shape 3x4 float32")) << r.out;
  r = kiln_cli("run --loadEngine=" + engine +
               " --shapes=x:3x10,shape:5x4 --loadInputs=k:" + path("k7.pb"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "input 'k' element 0 (k_0) = 7 is outside the range [1, 5]"))
      << r.out;
}

TEST_F(CliTest, CudaDeviceIsRefusedClearlyWithoutABackendOrGpu) {
  write_model(path("tiny_cuda.onnx"), 1.0f);
  auto r = kiln_cli("build --onnx=" + path("tiny_cuda.onnx") +
                    " --minShapes=x:1x4 --maxShapes=x:8x4 --device=cuda");
  if (r.code == 0) GTEST_SKIP() << "this build has a CUDA backend and a GPU";
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "CUDA")) << r.out;
}

TEST_F(CliTest, UnsupportedOpsAreListedAllAtOnce) {
  write_model(path("weird.onnx"), 1.0f, {"FooOp", "BarOp", "Relu"});
  auto r = kiln_cli("inspect " + path("weird.onnx"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "2 node(s) use ops kiln does not support")) << r.out;
  EXPECT_TRUE(contains(r.out, "FooOp  node 'weird_0'")) << r.out;
  EXPECT_TRUE(contains(r.out, "BarOp  node 'weird_1'")) << r.out;
  r = kiln_cli("inspect --json " + path("weird.onnx"));
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "\"supported\": false")) << r.out;
  r = kiln_cli("build --onnx=" + path("weird.onnx") + " --minShapes=x:1x4");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "FooOp") && contains(r.out, "BarOp")) << r.out;
}

TEST_F(CliTest, DemoModelEndToEnd) {
  build_demo();
  if (HasFatalFailure() || IsSkipped()) return;
  auto r = kiln_cli("build --onnx=" + demo() + " --saveEngine=" + path("demo16.kiln") +
                    " --minShapes=image:1x3x32x32 --optShapes=image:4x3x32x32 "
                    "--maxShapes=image:16x3x32x32 --fp16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(
      contains(r.out, "0: image min 1x3x32x32 opt 4x3x32x32 max 16x3x32x32   (batch in [1, 16])"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "probs  float32   [batch, 10]")) << r.out;
  EXPECT_TRUE(contains(r.out, "builder flags: tf32 fp16")) << r.out;
  EXPECT_TRUE(
      contains(r.out, "--fp16 recorded in the engine, but the cpu backend computes in fp32"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "profile 0: min ")) << r.out;
  EXPECT_TRUE(contains(r.out, "build time: ")) << r.out;
  EXPECT_FALSE(contains(r.out, "shape log:")) << r.out;
  // --verbose adds the shape log: the symbol's range, each node's shapes, the proof's steps.
  r = kiln_cli("build --onnx=" + demo() +
               " --minShapes=image:1x3x32x32 --optShapes=image:4x3x32x32 "
               "--maxShapes=image:16x3x32x32 --verbose");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* part :
       {"shape log: profile 0: batch in [1, 16]", "shape log: shapes after inference",
        "[batch, 3, 32, 32]", "shape log: profile proof: "}) {
    EXPECT_TRUE(contains(r.out, part)) << part << "\n" << r.out;
  }

  // run: random inputs at a chosen shape, then the test set's input with outputs exported.
  r = kiln_cli("run --loadEngine=" + path("demo.kiln") + " --shapes=image:5x3x32x32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "probs: shape 5x10 float32")) << r.out;
  fs::path set = fs::path(demo()).parent_path() / "test_data_set_1";
  r = kiln_cli("run --loadEngine=" + path("demo.kiln") + " --loadInputs=image:" +
               (set / "input_0.pb").string() + " --exportOutput=" + path("out"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto expected = onnx::parse_tensor_file((set / "output_0.pb").string());
  ASSERT_TRUE(expected.ok());
  std::vector<float> got = npy_floats(fs::path(path("out")) / "probs.npy");
  ASSERT_EQ(int64_t(got.size()), expected->numel());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected->float_at(int64_t(i)),
                1e-4 + 1e-3 * std::fabs(expected->float_at(int64_t(i))));
  }
  r = kiln_cli("run --loadEngine=" + path("demo.kiln") +
               " --shapes=image:2x3x32x32 --exportOutput=" + path("o.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(read_file(path("o.json")),
                       "\"name\": \"probs\", \"dtype\": \"float32\", \"shape\": [2, 10]"));

  // Two profiles (--profile=1 starts the second); run picks the one whose ranges hold the shape.
  r = kiln_cli(
      "build --onnx=" + demo() + " --saveEngine=" + path("demo2.kiln") +
      " --minShapes=image:1x3x32x32 --maxShapes=image:4x3x32x32 --profile=1"
      " --minShapes=image:5x3x32x32 --optShapes=image:8x3x32x32 --maxShapes=image:16x3x32x32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "1: image min 5x3x32x32 opt 8x3x32x32 max 16x3x32x32")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("demo2.kiln") + " --shapes=image:8x3x32x32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "profile 1: its ranges hold the shapes and its opt is nearest)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "probs: shape 8x10 float32")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("demo2.kiln") + " --shapes=image:8x3x32x32 --profile=0");
  EXPECT_EQ(r.code, 2) << r.out;

  // A shape outside the profile: exit 2, naming the input, the dim and the range.
  r = kiln_cli("run --loadEngine=" + path("demo.kiln") + " --shapes=image:17x3x32x32");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "input 'image' dim 0 (batch) = 17 is outside the range [1, 16]"))
      << r.out;
  r = kiln_cli("run --loadEngine=" + path("demo.kiln") + " --shapes=photo:1x3x32x32");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "image: [batch, 3, 32, 32]")) << r.out;

  // bench, with the times exported.
  r = kiln_cli("bench --loadEngine=" + path("demo.kiln") +
               " --iterations=3 --warmUp=0 --exportTimes=" + path("t.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "shapes image:4x3x32x32")) << r.out;  // the opt shape by default
  EXPECT_TRUE(contains(r.out, "timed: 3 runs")) << r.out;
  EXPECT_TRUE(contains(r.out, "latency (ms): min ")) << r.out;
  EXPECT_TRUE(contains(r.out, "p99 ")) << r.out;
  EXPECT_TRUE(contains(read_file(path("t.json")), "\"iterations\": 3"))
      << read_file(path("t.json"));
  r = kiln_cli("bench --onnx=" + demo() + " --shapes=image:2x3x32x32 --iterations=2 --warmUp=0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "samples/s, batch 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "cpu threads: ")) << r.out;
  // --threads=N (ONNX Runtime's intra-op threads) on a CPU engine, in range, printed; run too.
  r = kiln_cli("bench --loadEngine=" + path("demo.kiln") +
               " --iterations=2 --warmUp=0 --threads=3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "cpu threads: 3 (--threads)")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("demo.kiln") + " --threads=1");
  EXPECT_EQ(r.code, 0) << r.out;
  r = kiln_cli("bench --loadEngine=" + path("demo.kiln") + " --threads=257");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--threads=257 is outside [0, 256]")) << r.out;
  r = kiln_cli("bench --loadEngine=" + path("demo.kiln") + " --threads");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--threads needs a value")) << r.out;
  // trtexec's --noDataTransfers: a cpu engine has no transfers to leave out, so it times the same.
  r = kiln_cli("bench --loadEngine=" + path("demo.kiln") +
               " --iterations=2 --warmUp=0 --noDataTransfers --exportTimes=" + path("t2.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "timed: 2 runs")) << r.out;
  EXPECT_TRUE(contains(read_file(path("t2.json")), "\"device_io\": false"))
      << read_file(path("t2.json"));

  // inspect: the engine (header, layers with kernels, memory) and the model.
  r = kiln_cli("inspect " + path("demo.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* part :
       {"header: format version 7", "device cpu", "cpu.FusedConv", "float32", "conv1",
        "activation memory: ", "profile 0: min ", "probs  float32   [batch, 10]",
        "fused layers: 2 (each with the model's nodes it replaced)", "2 nodes: Conv, Relu"}) {
    EXPECT_TRUE(contains(r.out, part)) << part << "\n" << r.out;
  }
  r = kiln_cli("inspect --json " + path("demo.kiln"));
  ASSERT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "\"kind\": \"engine\"") &&
              contains(r.out, "\"kernel\": \"cpu.FusedConv\""))
      << r.out;
  r = kiln_cli("inspect " + demo());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "support: every node uses an op kiln supports")) << r.out;
  EXPECT_TRUE(contains(r.out, "image  float32  [batch, 3, 32, 32]")) << r.out;

  // compare: against ONNX Runtime on random inputs (make_demo_model.py ran, so it is importable).
  r = kiln_cli("compare --onnx=" + demo() + " --loadEngine=" + path("demo.kiln") +
               " --shapes=image:3x3x32x32");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "reference: ONNX Runtime 1.")) << r.out;
  EXPECT_TRUE(contains(r.out, "CPUExecutionProvider, FP32 (the reference computes in FP32)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "3/3 100%")) << r.out;  // top-1 agreement on (batch, classes)
  EXPECT_TRUE(contains(r.out, "PASS: 1 of 1 outputs within tolerance")) << r.out;
  r = kiln_cli("compare --onnx=" + demo() + " --shapes=image:2x3x32x32 --reference=kiln");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "reference: kiln CPU reference kernels (FP32)")) << r.out;
  EXPECT_TRUE(contains(r.out, "strict FP32 (--reference=kiln)")) << r.out;
  EXPECT_FALSE(contains(r.out, "onnxruntime was not available")) << r.out;  // it was not asked
  // Without a usable Python, compare falls back to kiln's own FP32 reference and says why.
  r = kiln_cli("compare --onnx=" + demo() + " --shapes=image:2x3x32x32",
               "KILN_PYTHON=/nonexistent/python3 ");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "reference: kiln CPU reference kernels (FP32)")) << r.out;
  EXPECT_TRUE(contains(r.out, "/nonexistent/python3) was not found")) << r.out;
  EXPECT_TRUE(contains(r.out, "strict FP32; onnxruntime was not available (")) << r.out;
  r = kiln_cli("compare --onnx=" + demo() + " --shapes=image:2x3x32x32 --reference=ort",
               "KILN_PYTHON=/nonexistent/python3 ");
  EXPECT_EQ(r.code, 1) << r.out;
}

// The checksums are public: an engine edited behind recomputed ones (an arena slot of INT64_MAX,
// which overflowed the activation memory sum inspect prints) is refused by the verifier instead.
TEST_F(CliTest, InspectRefusesAHostileEngineWithoutOverflow) {
  build_demo();
  auto plan = plan::load_file(path("demo.kiln"));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->slot_bytes.empty());
  plan->slot_bytes.back() = ir::Dim(INT64_MAX);
  ASSERT_TRUE(plan::save_file(*plan, path("hostile.kiln")).ok());
  auto r = kiln_cli("inspect " + path("hostile.kiln"));
  EXPECT_EQ(r.code, 1) << r.out;  // a reported failure, not a signal (-1)
  EXPECT_TRUE(contains(r.out, "arena slots are non-negative and the arena fits int64")) << r.out;
}

TEST_F(CliTest, CompareFailsWithExitOneOnAMismatch) {
  // The engine of y = x + 1.01 against the model y = x + 1: every element is off by 0.01.
  write_model(path("plus1.onnx"), 1.0f);
  write_model(path("plus101.onnx"), 1.01f);
  auto r =
      kiln_cli("build --onnx=" + path("plus101.onnx") + " --saveEngine=" + path("plus101.kiln") +
               " --minShapes=x:1x4 --maxShapes=x:8x4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = kiln_cli("compare --onnx=" + path("plus1.onnx") + " --loadEngine=" + path("plus101.kiln") +
               " --shapes=x:2x4");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "built from a different model file")) << r.out;
  EXPECT_TRUE(contains(r.out, "FAIL: 0 of 1 outputs within tolerance")) << r.out;
  EXPECT_TRUE(contains(r.out, "1.00e-02")) << r.out;  // max abs, to the printed precision
  // The same mismatch passes with a tolerance that admits it.
  r = kiln_cli("compare --onnx=" + path("plus1.onnx") + " --loadEngine=" + path("plus101.kiln") +
               " --shapes=x:2x4 --atol 0.02");
  EXPECT_EQ(r.code, 0) << r.out;
}

// An engine whose layers compute in float16 because its tensors are float16 (no layer records a
// reduced compute precision: the nodes compute in their own dtypes) gets float16's default
// tolerances, as an FP16 CUDA engine's elementwise and normalization layers do.
TEST_F(CliTest, CompareTolerancesFollowFloat16Activations) {
  write_model(path("plus1_f16.onnx"), 1.0f, {}, /*float16=*/true);
  auto r =
      kiln_cli("compare --onnx=" + path("plus1_f16.onnx") + " --shapes=x:2x4 --reference=kiln");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "defaults for float16 layers")) << r.out;
  write_model(path("plus1_f32.onnx"), 1.0f);
  r = kiln_cli("compare --onnx=" + path("plus1_f32.onnx") + " --shapes=x:2x4 --reference=kiln");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "defaults for float32 layers")) << r.out;
}

// ---- trtexec's flags: accepted, refused with a reason, warned about (tools/kiln/flag_table.cc) --

// docs/trtexec_flags.md is generated from the flag table; it must not drift from it.
TEST_F(CliTest, TrtexecFlagsDocMatchesTheFlagTable) {
  auto r = kiln_cli("help-flags --markdown");
  ASSERT_EQ(r.code, 0) << r.out;  // also fails when the table has overlapping rows
  std::string doc = read_file(fs::path(KILN_SOURCE_DIR) / "docs" / "trtexec_flags.md");
  EXPECT_EQ(doc, r.out) << "docs/trtexec_flags.md is out of date: run scripts/gen_flags_doc.sh "
                           "BUILD_DIR and commit the result";
  EXPECT_NE(doc.find("| flag |"), std::string::npos) << doc;
  for (const char* row : {"| `--memPoolSize=workspace:SIZE` |", "| `--plugins=FILE` |",
                          "| `--timingCacheFile=FILE` |", "| `--best` |"}) {
    EXPECT_TRUE(contains(r.out, row)) << row;
  }
}

TEST_F(CliTest, TrtexecBuildFlagsHaveTheirEffect) {
  write_model(path("tf.onnx"), 0.5f);
  const std::string onnx = " --onnx=" + path("tf.onnx");
  // --shapes on build: min = opt = max, as trtexec builds from it.
  auto r = kiln_cli("build" + onnx + " --shapes=x:2x4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "0: x min 2x4 opt 2x4 max 2x4")) << r.out;
  EXPECT_FALSE(contains(r.out, "warning")) << r.out;
  r = kiln_cli("build" + onnx + " --minShapes=x:1x4 --maxShapes=x:8x4 --shapes=x:2x4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "0: x min 1x4 opt 8x4 max 8x4")) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --shapes has no effect")) << r.out;

  // --best: every precision kiln has (fp16, bf16, tf32), recorded in the engine.
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --best");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "builder flags: tf32 fp16 bf16")) << r.out;
  EXPECT_TRUE(contains(r.out, "--best recorded in the engine")) << r.out;
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --best --noTF32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "builder flags: fp16 bf16\n")) << r.out;

  // --memPoolSize in trtexec's units (MiB by default), --workspace its deprecated alias: parsed,
  // shown in the summary, and said to bound nothing (BuilderConfig has no pool limit).
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --memPoolSize=workspace:1024");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "memory pool: workspace 1.00 GiB (1073741824 bytes, from "
                       "--memPoolSize=workspace:1024), recorded but not enforced"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --memPoolSize: ")) << r.out;
  for (auto [spec, bytes] :
       {std::pair{"workspace:512K", "524288 bytes"}, std::pair{"workspace:0.5", "524288 bytes"},
        std::pair{"workspace:2g", "2147483648 bytes"}, std::pair{"workspace:100B", "100 bytes"}}) {
    r = kiln_cli("build" + onnx + " --shapes=x:2x4 --memPoolSize=" + spec);
    ASSERT_EQ(r.code, 0) << spec << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, bytes)) << spec << "\n" << r.out;
  }
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --workspace=64");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --workspace: deprecated")) << r.out;
  EXPECT_TRUE(contains(r.out, "(67108864 bytes, from --workspace=64)")) << r.out;
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --workspace=64 --memPoolSize=workspace:128");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "give different workspace sizes")) << r.out;
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --memPoolSize=workspace:1024MiB");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "is not a size")) << r.out;
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --memPoolSize=workspace:64,dlaSRAM:1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "the dlaSRAM pool is not supported: kiln has no DLA backend"))
      << r.out;

  // --timingCacheFile: a missing file is created, with no warning (TimingCacheFile* tests below).
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --timingCacheFile=" + path("cache.bin"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "warning")) << r.out;
  EXPECT_TRUE(fs::is_regular_file(path("cache.bin")));
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --explicitBatch");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --explicitBatch: every kiln engine has an explicit batch"))
      << r.out;

  // trtexec's --device=N is a GPU index, not kiln's backend choice.
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --device=0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "is trtexec's GPU index")) << r.out;
}

// x = [[1..4], [5..8]] as a TensorProto file, for exact values in the output.
void write_input_pb(const fs::path& file) {
  ::onnx::TensorProto t;
  t.set_name("x");
  t.set_data_type(1);
  t.add_dims(2);
  t.add_dims(4);
  for (int i = 1; i <= 8; ++i) t.add_float_data(float(i));
  std::ofstream f(file, std::ios::binary);
  f << t.SerializeAsString();
}

TEST_F(CliTest, TrtexecRunAndBenchFlagsHaveTheirEffect) {
  write_model(path("tr.onnx"), 0.5f);
  write_input_pb(path("x.pb"));
  // run --onnx builds then runs (--shapes as min = opt = max), --iterations runs N times, and
  // --dumpOutput prints every value, a row per line.
  auto r = kiln_cli("run --onnx=" + path("tr.onnx") + " --loadInputs=x:" + path("x.pb") +
                    " --shapes=x:2x4 --iterations=3 --dumpOutput --saveEngine=" + path("tr.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[2/4] building the engine for cpu")) << r.out;
  EXPECT_TRUE(contains(r.out, "y: shape 2x4 float32")) << r.out;
  EXPECT_TRUE(contains(r.out, "    [0,:] 1.5 2.5 3.5 4.5\n    [1,:] 5.5 6.5 7.5 8.5\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "time: 3 runs; the first ")) << r.out;
  ASSERT_TRUE(fs::exists(path("tr.kiln")));
  r = kiln_cli("run --loadEngine=" + path("tr.kiln") + " --duration=0.05 --verbose");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[1/2] loading ")) << r.out;
  EXPECT_TRUE(contains(r.out, "[2/2] running")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("tr.kiln"));  // plain: no stage lines, as before
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "[1/")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("tr.kiln") + " --onnx=" + path("tr.onnx"));
  EXPECT_EQ(r.code, 2) << r.out;

  // Two profiles; --useProfile (trtexec's spelling) picks the one to run.
  r = kiln_cli("build --onnx=" + path("tr.onnx") + " --saveEngine=" + path("tr2.kiln") +
               " --minShapes=x:1x4 --maxShapes=x:4x4 --profile=1 --minShapes=x:1x4 "
               "--maxShapes=x:16x4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = kiln_cli("run --loadEngine=" + path("tr2.kiln") + " --shapes=x:2x4 --useProfile=1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "profile 1)")) << r.out;
  r = kiln_cli("bench --loadEngine=" + path("tr2.kiln") +
               " --shapes=x:2x4 --useProfile=1 --iterations=1 --warmUp=0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "profile 1,")) << r.out;

  // bench: --avgRuns prints trtexec's trace averages, --percentile picks the percentiles.
  r = kiln_cli("bench --loadEngine=" + path("tr.kiln") +
               " --iterations=4 --warmUp=0 --avgRuns=2 --percentile=50,95 --exportTimes=" +
               path("tr_times.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "trace averages of 2 runs (ms): ")) << r.out;
  EXPECT_TRUE(contains(r.out, "  p50 ") && contains(r.out, "  p95 ")) << r.out;
  EXPECT_FALSE(contains(r.out, "p90")) << r.out;
  EXPECT_TRUE(contains(read_file(path("tr_times.json")), "\"p95\": "))
      << read_file(path("tr_times.json"));
  // --dumpProfile / --exportProfile: a profiled pass after the timed runs, one row per layer that
  // runs (inspect --json lists the layers; aliases run nothing), trtexec's JSON form.
  auto profiled = kiln_cli("bench --loadEngine=" + path("tr.kiln") +
                           " --iterations=4 --warmUp=0 --dumpProfile " +
                           "--separateProfileRun --exportProfile=" + path("tr_profile.json"));
  ASSERT_EQ(profiled.code, 0) << profiled.out;
  EXPECT_TRUE(contains(profiled.out, "layer profile (4 runs, a sync per run")) << profiled.out;
  EXPECT_TRUE(contains(profiled.out, "Time(ms)") && contains(profiled.out, "Time(%)"))
      << profiled.out;
  auto layers = kiln_cli("inspect --json " + path("tr.kiln"));
  ASSERT_EQ(layers.code, 0) << layers.out;
  const std::string profile = read_file(path("tr_profile.json"));
  EXPECT_TRUE(contains(profile, "[{\"count\": 4}")) << profile;
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  const size_t running = count(layers.out, "\"kernel\": \"cpu.");
  EXPECT_GT(running, 0u) << layers.out;
  EXPECT_EQ(count(profile, "\"averageMs\": "), running) << profile;
  EXPECT_EQ(count(profile, "\"percentage\": "), running) << profile;
  size_t line = r.out.find("trace averages of 2 runs (ms): ");
  ASSERT_NE(line, std::string::npos);
  std::string values = r.out.substr(line, r.out.find('\n', line) - line);
  EXPECT_EQ(std::count(values.begin(), values.end(), ' '), 7) << values;  // 4 runs: 2 averages
  r = kiln_cli("bench --loadEngine=" + path("tr.kiln") + " --iterations=1 --percentile=101");
  EXPECT_EQ(r.code, 2) << r.out;
  r = kiln_cli("bench --onnx=" + path("tr.onnx") +
               " --shapes=x:2x4 --iterations=1 --warmUp=0 "
               "--saveEngine=" +
               path("tr_bench.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(path("tr_bench.kiln")));
}

TEST_F(CliTest, TrtexecFlagsKilnLacksAreRefusedWithAReason) {
  const std::string e = " --loadEngine=" + path("absent.kiln");
  const std::string m = " --onnx=" + path("absent.onnx");
  struct Case {
    std::string args, reason;
  };
  for (const Case& c : std::vector<Case>{
           {"build" + m + " --plugins=libfoo.so", "kiln loads no plugin libraries"},
           {"bench" + e + " --staticPlugins=libfoo.so", "kiln loads no plugin libraries"},
           {"build" + m + " --int8 --minShapesCalib=x:1x4", "no separate calibration profile"},
           {"run" + e + " --useDLACore=0", "kiln has no DLA backend"},
           {"run" + e + " --separateProfileRun", "per-layer profiles come from kiln bench"},
           {"bench" + e + " --streams=2", "one execution context on one stream"},
           {"build" + m + " --threads", "one execution context on one stream"},
           {"bench" + e + " --useSpinWait", "no spin-wait"},
           {"run" + e + " --exportProfile=p.json", "per-layer profiles come from kiln bench"},
           {"build" + m + " --exportLayerInfo=l.json", "kiln inspect --json ENGINE > FILE"},
           {"build" + m + " --fp8", "no FP8 kernels"},
           {"build" + m + " --stronglyTyped", "no strongly typed mode"},
           {"build" + m + " --inputIOFormats=fp16:chw", "no other IO format"},
           {"build" + m + " --loadEngine=m.kiln", "kiln build builds from --onnx"},
           {"bench" + e + " --dumpOutput", "kiln run --dumpOutput"},
           {"run" + e + " --batch=4", "no implicit batch"},
       }) {
    auto r = kiln_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "is not supported: ")) << c.args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, c.reason)) << c.args << "\n" << r.out;
    EXPECT_FALSE(contains(r.out, "unknown flag")) << c.args << "\n" << r.out;
  }
  // A flag of another kiln command says which commands take it.
  auto r = kiln_cli("run" + e + " --exportTimes=t.json");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--exportTimes is a flag of kiln bench, not of kiln run")) << r.out;
}

// --int8 --calib: what is refused before any Python runs. (The calibrated build itself runs
// kiln.quantize: python/tests/test_quantize.py test_kiln_build_int8_calib.)
TEST_F(CliTest, Int8CalibrationFlagsAreCheckedBeforeCalibrating) {
  write_model(path("q.onnx"), 1.0f);
  const std::string onnx = " --onnx=" + path("q.onnx") + " --shapes=x:2x4";
  auto r = kiln_cli("build" + onnx + " --calib=" + path("data.npz"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--calib calibrates an INT8 build: add --int8")) << r.out;
  r = kiln_cli("build" + onnx + " --int8 --calibMethod=minmax");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--calibMethod needs the data to calibrate on")) << r.out;
  // trtexec's habit: --calib=<TensorRT calibration cache>.
  {
    std::ofstream f(path("calib.cache"));
    f << "TRT-8601-EntropyCalibration2\ninput: 3c010a14\n";
  }
  r = kiln_cli("build" + onnx + " --int8 --calib=" + path("calib.cache"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "is a TensorRT calibration cache, which kiln cannot read")) << r.out;
  r = kiln_cli("build" + onnx + " --int8 --calib=" + path("absent.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "no such calibration cache")) << r.out;
  r = kiln_cli("build" + onnx + " --int8 --calibCache=" + path("absent.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "absent.json does not exist, and there is no --calib=")) << r.out;
  EXPECT_FALSE(contains(r.out, "calibrating")) << r.out;
  r = kiln_cli("inspect --calib=" + path("data.npz") + " " + path("q.onnx"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "calibration is a build step")) << r.out;
}

TEST_F(CliTest, TrtexecFlagsWithoutEffectWarnAndDuplicatesAreCaught) {
  write_model(path("tw.onnx"), 1.0f);
  const std::string onnx = " --onnx=" + path("tw.onnx");
  auto r = kiln_cli("build" + onnx + " --shapes=x:2x4 --saveEngine=" + path("tw.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  // Build flags next to --loadEngine change nothing: each one is named in a warning.
  r = kiln_cli("bench --loadEngine=" + path("tw.kiln") +
               " --fp16 --noTF32 --minShapes=x:1x4 --memPoolSize=workspace:64 --iterations=1 "
               "--warmUp=0");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* flag : {"--fp16", "--noTF32", "--minShapes", "--memPoolSize"}) {
    EXPECT_TRUE(
        contains(r.out, std::string("warning: ") + flag + " has no effect with --loadEngine"))
        << flag << "\n"
        << r.out;
  }
  EXPECT_FALSE(contains(r.out, "warning: --memPoolSize: ")) << r.out;  // one warning per flag
  r = kiln_cli("run --loadEngine=" + path("tw.kiln") + " --best --timingCacheFile=c.bin");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --best has no effect with --loadEngine")) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --timingCacheFile has no effect with --loadEngine"))
      << r.out;
  r = kiln_cli("compare" + onnx + " --loadEngine=" + path("tw.kiln") +
               " --shapes=x:2x4 --reference=kiln --bf16");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --bf16 has no effect with --loadEngine")) << r.out;
  r = kiln_cli("bench --loadEngine=" + path("tw.kiln") + " --profile=1 --iterations=1 --warmUp=0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "--useProfile=N picks the profile to run")) << r.out;

  // A single-valued flag twice: different values are a usage error, the same value a warning.
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --saveEngine=" + path("a.kiln") +
               " --saveEngine=" + path("b.kiln"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--saveEngine is given twice, as --saveEngine=")) << r.out;
  EXPECT_FALSE(fs::exists(path("a.kiln")) || fs::exists(path("b.kiln")));
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --saveEngine=" + path("a.kiln") +
               " --saveEngine=" + path("a.kiln"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: --saveEngine is given 2 times with the same value"))
      << r.out;
  r = kiln_cli("bench --loadEngine=" + path("tw.kiln") + " --iterations=2 --iterations=3");
  EXPECT_EQ(r.code, 2) << r.out;
  r = kiln_cli("build" + onnx + " --shapes=x:2x4 --fp16 --fp16=false");
  EXPECT_EQ(r.code, 2) << r.out;
  // Shape flags repeat by design (one set per profile).
  r = kiln_cli("build" + onnx +
               " --minShapes=x:1x4 --maxShapes=x:2x4 --profile=1 "
               "--minShapes=x:3x4 --maxShapes=x:4x4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "warning")) << r.out;
}

// ---- --timingCacheFile and --builderOptimizationLevel ------------------------------------------

// Two builds of the demo with one cache: the second times nothing (hits only) and writes the same
// engine bytes; builds without a cache are byte-identical too (no timestamp or address leaks in).
TEST_F(CliTest, TimingCacheFileMakesRebuildsHitAndByteIdentical) {
  build_demo();
  if (HasFatalFailure() || IsSkipped()) return;
  const std::string build = "build --onnx=" + demo() + " --shapes=image:2x3x32x32 --saveEngine=";
  auto r = kiln_cli(build + path("nc1.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "timing cache: none (no --timingCacheFile)")) << r.out;
  r = kiln_cli(build + path("nc2.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_file(path("nc1.kiln")), read_file(path("nc2.kiln")));

  const std::string cache = path("demo.tc");
  fs::remove(cache);
  r = kiln_cli(build + path("tc1.kiln") + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "timing cache: 0 hits, ")) << r.out;
  EXPECT_FALSE(contains(r.out, " 0 misses")) << r.out;
  EXPECT_TRUE(contains(r.out, "(" + cache + ", ")) << r.out;
  EXPECT_FALSE(contains(r.out, "warning")) << r.out;
  const std::string cache_bytes = read_file(cache);
  auto loaded = TimingCache::load(cache);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const size_t entries = loaded->size();
  ASSERT_GT(entries, 0u);

  r = kiln_cli(build + path("tc2.kiln") + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "timing cache: " + std::to_string(entries) + " hits, 0 misses"))
      << r.out;
  EXPECT_EQ(read_file(path("tc1.kiln")), read_file(path("tc2.kiln")));
  EXPECT_EQ(read_file(path("tc1.kiln")), read_file(path("nc1.kiln")));
  EXPECT_EQ(read_file(cache), cache_bytes);

  // The level is part of each key: level 0 misses everything the level-3 builds recorded.
  r = kiln_cli(build + path("tc0.kiln") + " --timingCacheFile=" + cache +
               " --builderOptimizationLevel=0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "timing cache: 0 hits, ")) << r.out;
  EXPECT_TRUE(contains(r.out, std::to_string(2 * entries) + " entries")) << r.out;
}

// A cache entry changed by hand (through the API, which keeps the checksum right) is the tactic
// the engine records: the build trusts the cache, as TensorRT does. The CPU's kernels ignore the
// tactic, so the engine still runs.
TEST_F(CliTest, TimingCacheFileEditedEntryIsWhatTheEngineRecords) {
  build_demo();
  if (HasFatalFailure() || IsSkipped()) return;
  const std::string build = "build --onnx=" + demo() + " --shapes=image:2x3x32x32 --saveEngine=";
  const std::string cache = path("edit.tc");
  fs::remove(cache);
  auto r = kiln_cli(build + path("edit0.kiln") + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  auto loaded = TimingCache::load(cache);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  int edited = 0;
  for (const auto& [key, tactic] : loaded->entries()) {
    if (contains(key, "op=kiln::FusedConv@")) {
      loaded->insert(key, "edited-tactic");
      ++edited;
    }
  }
  ASSERT_GT(edited, 0) << "the demo has no FusedConv layer";
  ASSERT_TRUE(loaded->save(cache).ok());
  r = kiln_cli("inspect " + path("edit0.kiln"));
  EXPECT_FALSE(contains(r.out, "edited-tactic")) << r.out;

  r = kiln_cli(build + path("edit1.kiln") + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, " 0 misses")) << r.out;
  r = kiln_cli("inspect --json " + path("edit1.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "edited-tactic")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("edit1.kiln") + " --shapes=image:2x3x32x32");
  EXPECT_EQ(r.code, 0) << r.out;
}

// A cache file that cannot be used is a warning naming it and the reason; the build goes on with
// an empty cache (and rewrites a corrupt file; a special file is left as it is).
TEST_F(CliTest, TimingCacheFileUnusableWarnsAndBuilds) {
  write_model(path("tcu.onnx"), 1.0f);
  const std::string build = "build --onnx=" + path("tcu.onnx") + " --shapes=x:2x4";
  const std::string cache = path("tcu.tc");
  fs::remove(cache);
  auto r = kiln_cli(build + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  std::string good = read_file(cache);
  ASSERT_GT(good.size(), 40u);

  std::string bad = good;
  bad[bad.size() / 2] ^= 0x10;
  std::ofstream(cache, std::ios::binary | std::ios::trunc) << bad;
  r = kiln_cli(build + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "warning: timing cache '" + cache +
                                  "': the timing cache is "
                                  "truncated or corrupted"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "timing cache: 0 hits, 1 misses (" + cache +
                                  ", unusable before this build, 1 entries, written)"))
      << r.out;
  EXPECT_EQ(read_file(cache), good);  // rewritten whole

  std::ofstream(cache, std::ios::binary | std::ios::trunc) << good.substr(0, 20);
  r = kiln_cli(build + " --timingCacheFile=" + cache);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "the timing cache is truncated")) << r.out;

  fs::create_directories(path("tcu_dir"));
  r = kiln_cli(build + " --timingCacheFile=" + path("tcu_dir"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "'" + path("tcu_dir") + "' is a directory")) << r.out;
  EXPECT_TRUE(contains(r.out, "not written)")) << r.out;
  EXPECT_TRUE(fs::is_directory(path("tcu_dir")));

  // A FIFO with no writer: refused from its stat, so the build neither blocks nor replaces it.
  fs::remove(path("tcu_fifo"));
  ASSERT_EQ(mkfifo(path("tcu_fifo").c_str(), 0600), 0);
  r = kiln_cli(build + " --timingCacheFile=" + path("tcu_fifo"), "timeout 60 ");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "'" + path("tcu_fifo") + "' is a FIFO")) << r.out;
  EXPECT_TRUE(fs::is_fifo(path("tcu_fifo")));
}

// Every file the CLI writes (issue 41, class 3): a FIFO named as the engine, the exported outputs,
// the exported times or the layer profile is refused from its stat, never opened (an open for
// writing blocks until a reader comes), and left as it is; a symbolic link keeps pointing at the
// file it names, which is replaced.
TEST_F(CliTest, WritersRefuseSpecialFilesAndKeepSymbolicLinks) {
  write_model(path("w.onnx"), 1.0f);
  fs::remove(path("w_fifo"));
  ASSERT_EQ(mkfifo(path("w_fifo").c_str(), 0600), 0);
  auto r =
      kiln_cli("build --onnx=" + path("w.onnx") + " --shapes=x:2x4 --saveEngine=" + path("w_fifo"),
               "timeout 60 ");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the build blocked on the FIFO";
  EXPECT_TRUE(contains(r.out, "engine file '" + path("w_fifo") + "': it exists and is a FIFO"))
      << r.out;
  EXPECT_TRUE(fs::is_fifo(path("w_fifo")));
  r = kiln_cli("build --onnx=" + path("w.onnx") + " --shapes=x:2x4 --saveEngine=" + path("w.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  // --exportOutput writes JSON to a .json path (a folder of .npy files otherwise).
  fs::remove(path("w_fifo.json"));
  ASSERT_EQ(mkfifo(path("w_fifo.json").c_str(), 0600), 0);
  for (const char* flag : {"--exportOutput=", "--exportTimes=", "--exportProfile="}) {
    const bool run = std::string(flag) == "--exportOutput=";
    const std::string target = path(run ? "w_fifo.json" : "w_fifo");
    r = kiln_cli(std::string(run ? "run" : "bench") + " --loadEngine=" + path("w.kiln") +
                     " --shapes=x:2x4 " + flag + target,
                 "timeout 60 ");
    EXPECT_NE(r.code, 0) << flag << r.out;
    EXPECT_NE(r.code, 124) << flag << " blocked on the FIFO";
    EXPECT_TRUE(contains(r.out, "'" + target + "': it exists and is a FIFO")) << flag << r.out;
    EXPECT_TRUE(fs::is_fifo(target));
  }
  fs::create_directories(path("w_dir"));
  r = kiln_cli("build --onnx=" + path("w.onnx") + " --shapes=x:2x4 --saveEngine=" + path("w_dir"));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "it exists and is a directory")) << r.out;
  // Through a symbolic link: the engine it names is replaced, the link stays a link.
  fs::remove(path("w_link.kiln"));
  fs::create_symlink(path("w.kiln"), path("w_link.kiln"));
  r = kiln_cli("build --onnx=" + path("w.onnx") +
               " --shapes=x:3x4 --saveEngine=" + path("w_link.kiln"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_symlink(path("w_link.kiln")));
  r = kiln_cli("run --loadEngine=" + path("w.kiln") + " --shapes=x:3x4");
  EXPECT_EQ(r.code, 0) << r.out;
}

// An input past the machine's memory (issue 41, class 6): refused with the bytes it needs before
// it is allocated, as a usage error; the random input came out empty and a check aborted the
// process, in Release too.
TEST_F(CliTest, AnInputTooLargeToAllocateIsRefusedWithItsSize) {
  write_model(path("big.onnx"), 1.0f);
  for (const char* cmd : {"run", "bench"}) {
    auto r =
        kiln_cli(std::string(cmd) + " --onnx=" + path("big.onnx") + " --shapes=x:1099511627776x4",
                 "timeout 120 ");
    EXPECT_EQ(r.code, 2) << cmd << r.out;
    EXPECT_TRUE(
        contains(r.out, "input 'x' of shape (1099511627776, 4) float32 needs 17592186044416 bytes"))
        << r.out;
    EXPECT_TRUE(contains(r.out, "more than this machine's memory")) << r.out;
    EXPECT_FALSE(contains(r.out, "invariant")) << r.out;
  }
}

TEST_F(CliTest, BuilderOptimizationLevelOutOfRangeIsAUsageError) {
  write_model(path("lvl.onnx"), 1.0f);
  const std::string build = "build --onnx=" + path("lvl.onnx") + " --shapes=x:2x4";
  for (const char* bad : {"9", "-1", "6"}) {
    auto r = kiln_cli(build + " --builderOptimizationLevel=" + bad);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(
        contains(r.out, "--builderOptimizationLevel=" + std::string(bad) + " is outside [0, 5]"))
        << r.out;
  }
  auto r = kiln_cli(build + " --builderOptimizationLevel=three");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "is not an integer")) << r.out;
  for (const char* good : {"0", "5"}) {
    r = kiln_cli(build + " --builderOptimizationLevel=" + good);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_FALSE(contains(r.out, "warning")) << r.out;
  }
}

// The trtexec line of the issue, then a run at batch 4 whose output is exactly 4x1000.
TEST_F(CliTest, SharedVitTrtexecLine) {
  std::string models = models_dir();
  if (models.empty()) GTEST_SKIP() << "../shared/models is absent";
  auto r =
      kiln_cli("build --onnx=" + models + "/vit_tiny/model.onnx --saveEngine=" + path("v.kiln") +
               " --minShapes=x:1x3x224x224 --optShapes=x:8x3x224x224 --maxShapes=x:32x3x224x224");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[batch, 1000]")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("v.kiln") + " --shapes=x:4x3x224x224");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "linear_16: shape 4x1000 float32")) << r.out;
  r = kiln_cli("run --loadEngine=" + path("v.kiln") + " --shapes=x:33x3x224x224");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "input 'x' dim 0 (batch) = 33 is outside the range [1, 32]"))
      << r.out;
  r = kiln_cli("bench --loadEngine=" + path("v.kiln") +
               " --shapes=x:1x3x224x224 --iterations=2 --warmUp=0");
  EXPECT_EQ(r.code, 0) << r.out;
  r = kiln_cli("inspect " + path("v.kiln"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "(batch in [1, 32])")) << r.out;
}

// kiln compare passes in FP32 on all six shared models, with the profiles of model_util.cc and the
// test sets' own inputs.
TEST_F(CliTest, SharedModelsCompareInFp32) {
  std::string models = models_dir();
  if (models.empty()) GTEST_SKIP() << "../shared/models is absent";
  for (const char* model : {"mobilenet_v3_small", "vit_tiny", "vit_tiny_legacy",
                            "unet_pixelshuffle", "testmod_linear", "llama_tiny"}) {
    auto profile = shared_model_profile(model);
    ASSERT_EQ(profile.size(), 1u) << model;
    const auto& p = profile[0];
    auto spec = [&](const Shape& s) {
      std::string out = p.input + ":";
      for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
      return out;
    };
    std::string dir = models + "/" + model;
    auto r = kiln_cli("compare --onnx=" + dir + "/model.onnx --minShapes=" + spec(p.min) +
                      " --optShapes=" + spec(p.opt) + " --maxShapes=" + spec(p.max) +
                      " --loadInputs=" + p.input + ":" + dir + "/test_data_set_0/input_0.pb");
    EXPECT_EQ(r.code, 0) << model << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "PASS: 1 of 1 outputs within tolerance")) << model << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "atol 1.00e-04, rtol 1.00e-03")) << r.out;
  }
}

// Files that are not regular files, empty or cut short, and numeric flags outside their ranges:
// each is refused with its exit code and a phrase naming the problem, in well under the timeout
// (a device read to its end, or a FIFO waited on, would hang or exhaust memory instead).
TEST_F(CliTest, SpecialFilesAndOutOfRangeFlagsAreRefusedPromptly) {
  const fs::path d = *dir_ / "special";
  fs::create_directories(d);
  auto p = [&](const std::string& name) { return (d / name).string(); };
  write_model(d / "tiny.onnx", 1.0f);
  const std::string engine = p("tiny.kiln");
  auto built =
      kiln_cli("build --onnx=" + p("tiny.onnx") + " --shapes=x:2x4 --saveEngine=" + engine);
  ASSERT_EQ(built.code, 0) << built.out;

  // Special files, each under several names so every reader sees each kind. Devices are reached
  // only through links made here, and only read.
  for (const char* name : {"dir.kiln", "dir.onnx", "dir.npy"}) fs::create_directory(d / name);
  for (const char* name : {"fifo.kiln", "fifo.onnx", "fifo.npy"}) {
    ASSERT_EQ(mkfifo((d / name).c_str(), 0600), 0) << name;
  }
  const bool have_zero = fs::exists("/dev/zero"), have_urandom = fs::exists("/dev/urandom");
  for (const char* name : {"zero.kiln", "zero.onnx", "zero.npy", "zero.tc"}) {
    if (have_zero) fs::create_symlink("/dev/zero", d / name);
  }
  for (const char* name : {"urandom.kiln", "urandom.onnx", "urandom.pb"}) {
    if (have_urandom) fs::create_symlink("/dev/urandom", d / name);
  }
  for (const char* name : {"empty.kiln", "empty.onnx", "empty.npy"}) {
    std::ofstream(d / name).close();
  }
  const std::string engine_bytes = read_file(engine), model_bytes = read_file(d / "tiny.onnx");
  std::ofstream(d / "cut.kiln", std::ios::binary)
      << engine_bytes.substr(0, engine_bytes.size() / 2);
  std::ofstream(d / "cut.onnx", std::ios::binary) << model_bytes.substr(0, model_bytes.size() / 2);
  // A valid .npy header for 2x4 float32, with 28 of its 32 data bytes.
  {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }";
    header += std::string(64 - (10 + header.size() + 1) % 64, ' ') + "\n";
    std::ofstream f(d / "cut.npy", std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    f.put(char(header.size() & 0xff)).put(char(header.size() >> 8));
    f << header << std::string(28, '\0');
  }
  // Sparse, so cheap: 1 GiB where input x (at most 2x4) allows about 1 MiB.
  std::ofstream(d / "huge.npy").close();
  fs::resize_file(d / "huge.npy", uint64_t(1) << 30);

  const std::string run = "run --loadEngine=" + engine;
  const std::string bench = "bench --loadEngine=" + engine;
  const std::string build = "build --onnx=" + p("tiny.onnx") + " --shapes=x:2x4";
  struct Case {
    std::string args;
    int code;
    std::string phrase;
    bool needs_zero = false, needs_urandom = false;
  };
  const std::vector<Case> cases = {
      {"run --loadEngine=" + p("dir.kiln"), 1, "is a directory"},
      {"run --loadEngine=" + p("fifo.kiln"), 1, "is a FIFO"},
      {"run --loadEngine=" + p("zero.kiln"), 1, "is a device", true},
      {"bench --loadEngine=" + p("urandom.kiln"), 1, "is a device", false, true},
      {"run --loadEngine=" + p("empty.kiln"), 1, "(it is empty)"},
      {"run --loadEngine=" + p("cut.kiln"), 1, "truncated"},
      {"inspect " + p("zero.kiln"), 1, "is a device", true},
      {"inspect " + p("fifo.kiln"), 1, "is a FIFO"},
      {"build --onnx=" + p("dir.onnx"), 1, "is a directory"},
      {"build --onnx=" + p("fifo.onnx"), 1, "is a FIFO"},
      {"build --onnx=" + p("zero.onnx"), 1, "is a device", true},
      {"build --onnx=" + p("urandom.onnx"), 1, "is a device", false, true},
      {"build --onnx=" + p("empty.onnx"), 1, "is not a valid ONNX ModelProto"},
      {"build --onnx=" + p("cut.onnx"), 1, "is not a valid ONNX ModelProto"},
      {run + " --loadInputs=x:" + p("dir.npy"), 1, "is a directory"},
      {run + " --loadInputs=x:" + p("fifo.npy"), 1, "is a FIFO"},
      {run + " --loadInputs=x:" + p("zero.npy"), 1, "is a device", true},
      {run + " --loadInputs=x:" + p("urandom.pb"), 1, "is a device", false, true},
      {run + " --loadInputs=x:" + p("empty.npy"), 1, "bad magic"},
      {run + " --loadInputs=x:" + p("cut.npy"), 1, "holds 28 data bytes"},
      {run + " --loadInputs=x:" + p("huge.npy"), 1, "has 1073741824 bytes, more than the"},
      // An unusable timing cache warns and the build goes on without it.
      {build + " --timingCacheFile=" + p("zero.tc"), 0, "is a device", true},
      {bench + " --duration=1e308", 2, "--duration=1e308 is outside [0, 86400]"},
      {bench + " --duration=-1", 2, "--duration=-1 is outside [0, 86400]"},
      {bench + " --duration=nan", 2, "--duration=nan is outside"},
      {bench + " --duration=1e400", 2, "--duration=1e400 is outside"},
      {bench + " --warmUp=inf", 2, "--warmUp=inf is outside [0, 86400000]"},
      {bench + " --warmUp=soon", 2, "--warmUp=soon is not a number"},
      {bench + " --iterations=2147483648", 2, "--iterations=2147483648 is outside [1, 2147483647]"},
      {bench + " --iterations=9223372036854775808", 2,
       "--iterations=9223372036854775808 is outside"},
      {bench + " --iterations=-1", 2, "--iterations=-1 is outside"},
      {bench + " --iterations=1e3", 2, "--iterations=1e3 is not an integer"},
      {bench + " --avgRuns=0", 2, "--avgRuns=0 is outside [1, 2147483647]"},
      {bench + " --avgRuns=4294967297", 2, "--avgRuns=4294967297 is outside"},
      {bench + " --useProfile=2147483648", 2, "--useProfile=2147483648 is outside [0, 2147483647]"},
      {run + " --profile=2147483648", 2, "--profile=2147483648 is outside [0, 2147483647]"},
      {run + " --useProfile=9223372036854775808", 2, "--useProfile=9223372036854775808 is outside"},
      {run + " --useProfile=-1", 2, "--useProfile=-1 is outside"},
      {run + " --useProfile=first", 2, "--useProfile=first is not an integer"},
      {run + " --useProfile=1", 2, "profile 1 (--profile/--useProfile) does not exist"},
      {run + " --duration=inf", 2, "--duration=inf is outside [0, 86400]"},
      {run + " --iterations=0", 2, "--iterations=0 is outside [1, 2147483647]"},
      {run + " --seed=-1", 2, "--seed=-1 is outside"},
      {run + " --shapes=x:99999999999x99999999999", 2, "the product of its dims overflows"},
      {run + " --shapes=x:9223372036854775808x4", 2, "is too large"},
      {run + " --shapes=x:-1x4", 2, "dims must be non-negative integers"},
      {"build --onnx=" + p("tiny.onnx") + " --profile=2147483648 --minShapes=x:1x4", 2,
       "--profile=2147483648 is outside [0, 2147483647]"},
      {"build --onnx=" + p("tiny.onnx") + " --profile=-1 --minShapes=x:1x4", 2,
       "--profile=-1 is outside"},
      {build + " --builderOptimizationLevel=2147483648", 2,
       "--builderOptimizationLevel=2147483648 is outside [0, 5]"},
      {"compare --onnx=" + p("tiny.onnx") + " --shapes=x:2x4 --atol=nan", 2,
       "--atol=nan is outside"},
      {"compare --onnx=" + p("tiny.onnx") + " --shapes=x:2x4 --rtol=-1", 2, "--rtol=-1 is outside"},
  };
  int checked = 0;
  for (const Case& c : cases) {
    if ((c.needs_zero && !have_zero) || (c.needs_urandom && !have_urandom)) continue;
    ++checked;
    const auto start = std::chrono::steady_clock::now();
    // KILL after 20 s: a hang fails this case instead of the whole run.
    auto r = kiln_cli(c.args, "timeout -s KILL 20 ");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, c.phrase)) << c.args << "\nexpected: " << c.phrase << "\n" << r.out;
    EXPECT_LT(seconds, 10.0) << c.args;
    EXPECT_FALSE(contains(r.out, "internal error")) << c.args << "\n" << r.out;
  }
  EXPECT_GE(checked, 30);
}

}  // namespace
}  // namespace kiln::testing

// The timing cache: its file (deterministic bytes, and every unusable file refused with a reason
// instead of a crash or a hang) and the builder's use of it (select_kernels takes a cached tactic,
// records new ones, and keys them by everything the choice depends on).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "backends/kernel_registry.h"
#include "builder/build_state.h"
#include "core/hash.h"
#include "kiln.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("kiln_timing_cache_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// The file's last 8 bytes are checksum64 of the rest: an edit that keeps the file well-formed
// must rewrite it, so that the reader's checks past the checksum are reached.
void fix_checksum(std::vector<uint8_t>& b) {
  uint64_t c = checksum64(std::span<const uint8_t>(b).first(b.size() - 8));
  for (int k = 0; k < 8; ++k) b[b.size() - 8 + k] = uint8_t(c >> (8 * k));
}

TimingCache three_entries(bool reversed) {
  std::vector<std::pair<std::string, std::string>> e = {
      {"impl=a\nlevel=3", "t1"}, {"impl=b\nlevel=3", ""}, {"impl=c\nlevel=0", "algo=7"}};
  if (reversed) std::reverse(e.begin(), e.end());
  TimingCache c;
  for (auto& [k, t] : e) c.insert(k, t);
  return c;
}

TEST(TimingCache, LookupCountsHitsAndMissesAndComparesTheWholeKey) {
  TimingCache c = three_entries(false);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.lookup("impl=c\nlevel=0"), std::optional<std::string>("algo=7"));
  EXPECT_EQ(c.lookup("impl=b\nlevel=3"), std::optional<std::string>(""));  // empty is a tactic
  EXPECT_EQ(c.lookup("impl=c\nlevel=1"), std::nullopt);
  EXPECT_EQ(c.hits(), 2);
  EXPECT_EQ(c.misses(), 1);
  c.insert("impl=c\nlevel=0", "algo=2");  // replaces
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.lookup("impl=c\nlevel=0"), std::optional<std::string>("algo=2"));
}

TEST(TimingCache, RoundTripGivesTheSameEntriesAndBytesWhateverTheInsertionOrder) {
  const fs::path dir = temp_dir();
  TimingCache a = three_entries(false), b = three_entries(true);
  EXPECT_EQ(a.serialize(), b.serialize());
  auto back = TimingCache::deserialize(a.serialize());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->entries(), a.entries());
  EXPECT_EQ(back->serialize(), a.serialize());

  const fs::path file = dir / "round.tc";
  ASSERT_TRUE(b.save(file.string()).ok());
  EXPECT_EQ(read_bytes(file), a.serialize());
  auto loaded = TimingCache::load(file.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->entries(), a.entries());
  // No temporary file is left beside it.
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);

  // A missing file is an empty cache, not an error: the build creates it.
  auto missing = TimingCache::load((dir / "absent.tc").string());
  ASSERT_TRUE(missing.ok()) << missing.status().to_string();
  EXPECT_EQ(missing->size(), 0u);
  fs::remove_all(dir);
}

// Each unusable file is an error naming the file and what is wrong with it.
TEST(TimingCache, UnusableFilesAreRefusedWithTheReason) {
  const fs::path dir = temp_dir();
  const std::vector<uint8_t> good = three_entries(false).serialize();
  auto expect_refused = [&](const fs::path& p, const std::string& reason) {
    auto start = std::chrono::steady_clock::now();
    auto c = TimingCache::load(p.string());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << p;
    ASSERT_FALSE(c.ok()) << p;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("'" + p.string() + "'"), std::string::npos)
        << c.status().message();
    EXPECT_NE(c.status().message().find(reason), std::string::npos) << c.status().message();
  };

  std::vector<uint8_t> b(good.begin(), good.begin() + long(good.size()) - 5);
  write_bytes(dir / "truncated.tc", b);
  expect_refused(dir / "truncated.tc", "checksum does not match");
  write_bytes(dir / "header_only.tc", std::vector<uint8_t>(good.begin(), good.begin() + 12));
  expect_refused(dir / "header_only.tc", "truncated");
  b = good;
  b[good.size() / 2] ^= 0x20;
  write_bytes(dir / "flipped.tc", b);
  expect_refused(dir / "flipped.tc", "checksum does not match");
  b = good;
  b[8] = 2;  // the version, with a checksum that matches: refused for the version alone
  fix_checksum(b);
  write_bytes(dir / "v2.tc", b);
  expect_refused(dir / "v2.tc", "format version 2; this kiln reads version 1");
  b = good;
  b[0] = 'X';
  write_bytes(dir / "magic.tc", b);
  expect_refused(dir / "magic.tc", "not a kiln timing cache");
  write_bytes(dir / "empty.tc", {});
  expect_refused(dir / "empty.tc", "not a kiln timing cache");
  // Well-formed and checksummed, but an entry's stored hash is not its key's.
  b = good;
  b[20] ^= 1;  // the first entry's hash starts at byte 20 (magic 8, version 4, count 8)
  fix_checksum(b);
  write_bytes(dir / "hash.tc", b);
  expect_refused(dir / "hash.tc", "has a hash that is not its key's");
  // Bytes after the last entry.
  b = good;
  b.insert(b.end() - 8, {1, 2, 3});
  fix_checksum(b);
  write_bytes(dir / "trailing.tc", b);
  expect_refused(dir / "trailing.tc", "3 bytes follow the last entry");

  // Special files are refused from their stat, never read: a directory, a FIFO with no writer
  // (opening it for reading would block), an endless device.
  fs::create_directory(dir / "a_dir");
  expect_refused(dir / "a_dir", "is a directory");
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  expect_refused(dir / "fifo", "is a FIFO");
  if (fs::exists("/dev/zero")) expect_refused("/dev/zero", "is a device");
  // Over the size cap: refused before anything is read (the file is sparse, so this is cheap).
  {
    std::ofstream(dir / "huge.tc").close();
    fs::resize_file(dir / "huge.tc", TimingCache::kMaxFileBytes + 1);
  }
  expect_refused(dir / "huge.tc", "more than the 67108864 a timing cache file may have");

  // save() leaves a special file as it is rather than renaming a regular file over it.
  Status st = three_entries(false).save((dir / "fifo").string());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a regular file"), std::string::npos) << st.message();
  EXPECT_TRUE(fs::is_fifo(dir / "fifo"));
  fs::remove_all(dir);
}

// x: float32[batch, 4] -> Relu -> Relu -> LeakyRelu(alpha) -> y. The two Relus have one
// signature, so the second is a hit even in the build that fills the cache. Every op's output is
// a network output, so fuse_elementwise leaves three layers (it does not absorb an engine output).
Network relu_network(float alpha) {
  Network net;
  ir::Graph& g = net.graph;
  g.opsets[""] = 18;
  int x = g.add_value("x");
  g.values[x].dtype = DType::kFloat32;
  g.values[x].shape = std::vector<ir::Dim>{ir::Dim::symbol("batch"), ir::Dim(4)};
  int prev = x;
  const char* ops[] = {"Relu", "Relu", "LeakyRelu"};
  std::vector<int> outs;
  for (int i = 0; i < 3; ++i) {
    int out = g.add_value("v" + std::to_string(i));
    outs.push_back(out);
    ir::Node n;
    n.name = "n" + std::to_string(i);
    n.op_type = ops[i];
    n.opset = 18;
    n.inputs = {prev};
    n.outputs = {out};
    if (i == 2) n.attrs.set("alpha", ir::Attribute{.type = ir::AttrType::kFloat, .f = alpha});
    g.nodes.push_back(n);
    prev = out;
  }
  g.inputs = {x};
  g.outputs = outs;
  return net;
}

BuilderConfig config_with(std::shared_ptr<TimingCache> cache, int64_t opt_batch, int level = 3) {
  BuilderConfig config;
  OptimizationProfile p;
  EXPECT_TRUE(p.set_dimensions("x", {1, 4}, {opt_batch, 4}, {8, 4}).ok());
  config.add_profile(p);
  EXPECT_TRUE(config.set_builder_optimization_level(level).ok());
  config.set_timing_cache(std::move(cache));
  return config;
}

TEST(TimingCacheBuild, SecondBuildHitsEveryLayerAndIsByteIdentical) {
  auto cache = std::make_shared<TimingCache>();
  auto first = Builder().build(relu_network(0.1f), config_with(cache, 2));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(cache->misses(), 2);  // Relu, LeakyRelu
  EXPECT_EQ(cache->hits(), 1);    // the second Relu
  EXPECT_EQ(cache->size(), 2u);

  // Through the file, as kiln build --timingCacheFile does.
  auto reloaded = TimingCache::deserialize(cache->serialize());
  ASSERT_TRUE(reloaded.ok());
  auto again = std::make_shared<TimingCache>(std::move(reloaded).value());
  auto second = Builder().build(relu_network(0.1f), config_with(again, 2));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(again->hits(), 3);
  EXPECT_EQ(again->misses(), 0);
  EXPECT_EQ(second->serialize(), first->serialize());
  EXPECT_EQ(again->serialize(), cache->serialize());  // nothing new was recorded

  // And without a cache the engine is the same: the cache changes how the tactic is found, not it.
  auto plain = Builder().build(relu_network(0.1f), config_with(nullptr, 2));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->serialize(), first->serialize());
}

// What the choice depends on is in the key: another attribute value, opt or min shape or
// optimization level misses; the max shape (not part of the key) does not.
TEST(TimingCacheBuild, KeyChangesWithAttributesOptShapesAndLevel) {
  auto cache = std::make_shared<TimingCache>();
  ASSERT_TRUE(Builder().build(relu_network(0.1f), config_with(cache, 2)).ok());
  ASSERT_EQ(cache->misses(), 2);
  ASSERT_TRUE(Builder().build(relu_network(0.3f), config_with(cache, 2)).ok());
  EXPECT_EQ(cache->misses(), 3) << "another alpha is another LeakyRelu signature";
  ASSERT_TRUE(Builder().build(relu_network(0.1f), config_with(cache, 4)).ok());
  EXPECT_EQ(cache->misses(), 5) << "another opt batch is another signature for both ops";
  ASSERT_TRUE(Builder().build(relu_network(0.1f), config_with(cache, 2, 0)).ok());
  EXPECT_EQ(cache->misses(), 7) << "the optimization level is part of the key";
  const int64_t misses = cache->misses();
  BuilderConfig other_max;
  OptimizationProfile p;
  ASSERT_TRUE(p.set_dimensions("x", {1, 4}, {2, 4}, {16, 4}).ok());
  other_max.add_profile(p);
  other_max.set_timing_cache(cache);
  ASSERT_TRUE(Builder().build(relu_network(0.1f), other_max).ok());
  EXPECT_EQ(cache->misses(), misses);
  BuilderConfig other_min;
  OptimizationProfile pm;
  ASSERT_TRUE(pm.set_dimensions("x", {2, 4}, {2, 4}, {8, 4}).ok());
  other_min.add_profile(pm);
  other_min.set_timing_cache(cache);
  ASSERT_TRUE(Builder().build(relu_network(0.1f), other_min).ok());
  EXPECT_EQ(cache->misses(), misses + 2) << "a min shape equal to opt is another signature";
}

// The key select_kernels computes, rebuilt here from its parts for the first Relu: an entry
// changed under it is the tactic the engine records, without the implementation being asked.
TEST(TimingCacheBuild, CachedTacticIsWhatThePlanRecords) {
  ir::Node relu;
  relu.op_type = "Relu";
  relu.opset = 18;
  ir::Value in, out;
  in.dtype = out.dtype = DType::kFloat32;
  in.shape = out.shape = std::vector<ir::Dim>{ir::Dim::symbol("batch"), ir::Dim(4)};
  ir::SymbolValues opt = {{"batch", 2}}, min = {{"batch", 1}};
  backends::KernelQuery q{relu, {&in}, {&out}, BuilderConfig().precision()};
  q.opt_symbols = &opt;
  q.min_symbols = &min;
  const backends::KernelImpl* impl = nullptr;
  for (const auto* c :
       backends::kernel_registry().candidates(ops::find_op("", "Relu"), Device::kCPU)) {
    if (c->supports(q).ok()) {
      impl = c;
      break;
    }
  }
  ASSERT_NE(impl, nullptr);
  q.precision = impl->precision(q);
  const std::string key = builder::timing_cache_key(impl->id(), q, "cpu");
  for (const char* part : {"impl=cpu.", "op=ai.onnx::Relu@18\n", "in0=float32(2, 4) min(1, 4)\n",
                           "out0=float32(2, 4) min(1, 4)\n", "level=3\n", "device=cpu"}) {
    EXPECT_NE(key.find(part), std::string::npos) << part << " not in\n" << key;
  }

  auto cache = std::make_shared<TimingCache>();
  cache->insert(key, "edited-tactic");
  auto engine = Builder().build(relu_network(0.1f), config_with(cache, 2));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(cache->hits(), 2);  // both Relus
  auto layers = engine->layers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].tactic, "edited-tactic");
  EXPECT_EQ(layers[1].tactic, "edited-tactic");
  EXPECT_EQ(layers[2].tactic, "");  // LeakyRelu: a miss, the implementation's default
  EXPECT_EQ(cache->lookup(key), std::optional<std::string>("edited-tactic"));  // not overwritten
}

TEST(TimingCacheBuild, OptimizationLevelOutsideZeroToFiveIsRefused) {
  BuilderConfig c;
  EXPECT_EQ(c.builder_optimization_level(), 3);
  for (int bad : {-1, 6, 9}) {
    Status st = c.set_builder_optimization_level(bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("outside 0..5"), std::string::npos) << st.message();
  }
  EXPECT_EQ(c.builder_optimization_level(), 3);
  EXPECT_TRUE(c.set_builder_optimization_level(0).ok());
  EXPECT_EQ(c.builder_optimization_level(), 0);
}

}  // namespace
}  // namespace kiln::testing

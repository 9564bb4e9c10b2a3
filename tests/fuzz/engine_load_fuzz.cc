// libFuzzer target: bytes as an engine file, loaded as `kiln run` loads one; an engine that loads
// is inspected and run once at its first profile's min shapes. The custom mutator edits one
// section's payload (or a header field) and lays the file out again with every checksum
// recomputed: the checksums are no defence against an attacker, so the loader's verifier is what
// this target tests, and byte flips alone would only ever reach the checksum comparison.
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kiln.h"
#include "plan/byte_io.h"
#include "plan/engine_file.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using kiln::plan::EngineHeader;
using kiln::plan::SectionEntry;

// Inputs of more elements are not run: a legitimately large engine only costs the fuzzer time.
constexpr int64_t kMaxInputElements = int64_t(1) << 18;

// Lays out an engine file as engine_file.cc's writer does: the header with fresh offsets, sizes,
// checksums and file size, then each payload at the next 64-byte boundary.
std::vector<uint8_t> lay_out(const EngineHeader& h,
                             const std::vector<std::vector<uint8_t>>& payloads) {
  kiln::plan::ByteWriter w;
  w.bytes({reinterpret_cast<const uint8_t*>(kiln::plan::kEngineMagic), 8});
  w.u32(h.format_version);
  w.str(h.kiln_version);
  w.u32(uint32_t(h.device));
  w.u32(h.builder_flags);
  w.u64(h.model_hash);
  const size_t file_size_at = w.size();
  w.u64(0);
  w.u32(uint32_t(payloads.size()));
  const uint64_t header_size = w.size() + payloads.size() * 32 + 8;
  uint64_t end = header_size;
  std::vector<uint64_t> offsets;
  for (const auto& p : payloads) {
    offsets.push_back((end + 63) / 64 * 64);
    end = offsets.back() + p.size();
  }
  w.patch_u64(file_size_at, end);
  for (size_t i = 0; i < payloads.size(); ++i) {
    w.u32(h.sections[i].tag);
    w.u32(h.sections[i].flags);
    w.u64(offsets[i]);
    w.u64(payloads[i].size());
    w.u64(kiln::checksum64(payloads[i]));
  }
  w.u64(kiln::checksum64(w.data()));
  for (size_t i = 0; i < payloads.size(); ++i) {
    w.align(64);
    w.bytes(payloads[i]);
  }
  return w.take();
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned seed) {
  std::minstd_rand rng(seed);
  auto parsed = kiln::plan::read_header({data, size});
  // A file that is no engine, and now and then one that is, gets byte-level mutation, so the
  // header and table checks are fuzzed too.
  if (!parsed.ok() || parsed->sections.empty() || rng() % 16 == 0) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  EngineHeader h = std::move(parsed).value();
  std::vector<std::vector<uint8_t>> payloads;
  for (const SectionEntry& e : h.sections) {
    payloads.emplace_back(data + e.offset, data + e.offset + e.size);
  }
  switch (rng() % 8) {
    case 0:  // a header field
      h.builder_flags ^= 1u << (rng() % 32);
      break;
    case 1:  // a section's flags, or the table's order
      if (rng() % 2) {
        h.sections[rng() % h.sections.size()].flags ^= 1u << (rng() % 2);
      } else {
        size_t a = rng() % h.sections.size(), b = rng() % h.sections.size();
        std::swap(h.sections[a], h.sections[b]);
        std::swap(payloads[a], payloads[b]);
      }
      break;
    default: {  // a payload: the graph, the value and node tables mostly, the weights rarely
      size_t i = rng() % payloads.size();
      if (h.sections[i].tag == kiln::plan::kSectionWeights && rng() % 4 != 0) {
        i = (i + 1) % payloads.size();
      }
      std::vector<uint8_t>& p = payloads[i];
      const size_t old = p.size();
      p.resize(old + 64);
      p.resize(LLVMFuzzerMutate(p.data(), old, p.size()));
      break;
    }
  }
  const std::vector<uint8_t> out = lay_out(h, payloads);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  auto engine = Engine::deserialize(std::span<const uint8_t>(data, size));
  if (!engine.ok()) return 0;
  (void)engine->layers();
  (void)engine->activation_bytes_formula().to_string();
  std::map<std::string, Tensor> inputs;
  for (int i = 0; i < engine->num_io_tensors(); ++i) {
    const std::string name = engine->io_tensor_name(i);
    (void)engine->tensor_symbolic_shape(name);
    if (engine->tensor_mode(name) != TensorIOMode::kINPUT) continue;
    for (int p = 0; p < engine->num_profiles(); ++p) {
      for (auto which :
           {OptProfileSelector::kMIN, OptProfileSelector::kOPT, OptProfileSelector::kMAX}) {
        (void)engine->profile_shape(name, p, which);
        (void)engine->activation_bytes(p, which);
      }
    }
    auto shape = engine->profile_shape(name, 0, OptProfileSelector::kMIN);
    auto dtype = engine->tensor_dtype(name);
    if (!shape.ok() || !dtype.ok()) return 0;
    int64_t elements = 1;
    for (int64_t d : *shape) {
      if (d < 0 || d > kMaxInputElements) return 0;
      elements *= d;
      if (elements > kMaxInputElements) return 0;
    }
    auto t = Tensor::zeros(*dtype, *shape);
    if (!t.ok()) return 0;
    inputs.emplace(name, std::move(t).value());
  }
  auto context = engine->create_execution_context();
  if (!context.ok()) return 0;
  (*context)->set_max_loop_iterations(
      1000);  // a run-time loop whose condition never turns false ends soon
  (void)(*context)->run(inputs);
  return 0;
}

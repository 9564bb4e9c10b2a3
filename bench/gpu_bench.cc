// gpu_bench: kiln latency per shared model on the GPU, inputs and outputs resident on the device
// (what an application binding device buffers sees), with and without CUDA graphs.
// Usage: gpu_bench MODELS_DIR [iterations]. Prints one line per model, batch and mode.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln.h"

using namespace kiln;

namespace {

struct Case {
  const char* model;
  const char* input;
  Shape (*shape)(int64_t batch);
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpu_bench MODELS_DIR [iterations]\n");
    return 2;
  }
  std::string dir = argv[1];
  int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  const Case cases[] = {
      {"mobilenet_v3_small", "x", [](int64_t b) { return Shape{b, 3, 224, 224}; }},
      {"vit_tiny", "x", [](int64_t b) { return Shape{b, 3, 224, 224}; }},
      {"unet_pixelshuffle", "x", [](int64_t b) { return Shape{b, 3, 200, 200}; }},
      {"llama_tiny", "ids", [](int64_t b) { return Shape{b, 64}; }},
  };
  for (const Case& c : cases) {
    auto net = onnx::parse_file(dir + "/" + c.model + "/model.onnx");
    if (!net.ok()) {
      std::printf("%s: %s\n", c.model, net.status().to_string().c_str());
      continue;
    }
    for (const char* prec : {"fp32", "tf32", "fp16"}) {
      BuilderConfig config;
      if (std::string(prec) == "fp32") config.clear_flag(BuilderFlag::kTF32);
      if (std::string(prec) == "fp16") config.set_flag(BuilderFlag::kFP16);
      OptimizationProfile p;
      Shape mn = c.shape(1), mx = c.shape(8);
      (void)p.set_dimensions(c.input, mn, c.shape(8), mx);
      config.add_profile(p);
      auto engine = Builder(Device::kCUDA).build(*net, config);
      if (!engine.ok()) {
        std::printf("%s %s: %s\n", c.model, prec, engine.status().to_string().c_str());
        continue;
      }
      for (int64_t batch : {1, 8}) {
        for (bool graph : {false, true}) {
          auto ctx = engine->create_execution_context();
          if (!ctx.ok()) return 1;
          (*ctx)->set_use_cuda_graph(graph);
          Shape s = c.shape(batch);
          (void)(*ctx)->set_input_shape(c.input, s);
          std::vector<void*> buffers;
          bool ok = true;
          for (int i = 0; i < engine->num_io_tensors(); ++i) {
            std::string name = engine->io_tensor_name(i);
            Shape ts = *(*ctx)->tensor_shape(name);
            size_t bytes = 8;
            for (int64_t d : ts) bytes *= size_t(d);
            void* p = nullptr;
            cudaMalloc(&p, bytes);
            cudaMemset(p, 0, bytes);  // token ids 0, zero images: timing only
            buffers.push_back(p);
            ok = ok && (*ctx)->set_tensor_address(name, p).ok();
          }
          for (int w = 0; w < 10 && ok; ++w) ok = (*ctx)->execute().ok();
          if (!ok) {
            std::printf("%s %s batch %lld: run failed: %s\n", c.model, prec, (long long)batch,
                        (*ctx)->execute().to_string().c_str());
            continue;
          }
          std::vector<double> ms;
          for (int it = 0; it < iters; ++it) {
            auto t0 = std::chrono::steady_clock::now();
            (void)(*ctx)->execute();
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          }
          std::printf("kiln  %-19s %-5s batch %2lld %-8s median %8.3f ms  min %8.3f ms\n", c.model, prec,
                      (long long)batch, graph ? "graph" : "stream", median(ms), *std::min_element(ms.begin(), ms.end()));
          for (void* p : buffers) cudaFree(p);
        }
      }
    }
  }
  return 0;
}

// kiln inspect: describes an ONNX model (IO with symbolic shapes, ops, and every op kiln does not
// support, all at once) or an engine (header, IO, profiles, output formulas, layers, memory).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "commands.h"
#include "core/file.h"
#include "describe.h"
#include "engine_source.h"
#include "json.h"
#include "plan/engine_file.h"

namespace kiln::cli {
namespace {

CommandSpec inspect_spec() {
  return command_spec(
      kCmdInspect, "inspect", "(MODEL.onnx | MODEL_DIR | ENGINE.kiln) [--json]",
      "Describes a model or an engine (told apart by the engine file's magic bytes).\n"
      "A model: IO tensors with symbolic shapes, opsets, ops used, every op kiln does not support\n"
      "(all at once), and a build command to start from. An engine: the header (versions, device,\n"
      "build config, model hash, sections), IO, profiles, output shape formulas, each layer with\n"
      "its kernel and precision, activation memory per profile (formula and min/opt/max values).",
      "PATH");
}

// JSON numbers lose precision past 2^53, so 64-bit hashes are written as hex strings.
std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string value_line(const ir::Value& v) {
  return std::string(dtype_name(v.dtype)) + "  " +
         (v.shape ? ir::dims_to_string(*v.shape) : "(unknown shape)");
}

int inspect_model(const std::string& path, bool json) {
  auto network = load_network(path);
  if (!network.ok()) return report("inspect", network.error());
  const ir::Graph& g = network->graph;
  std::map<std::string, int> ops;
  for (const auto& n : g.nodes) ops[(n.domain.empty() ? "" : n.domain + ".") + n.op_type]++;
  int64_t weight_bytes = 0, weight_count = 0;
  for (const auto& v : g.values) {
    if (v.constant && v.producer < 0) weight_bytes += int64_t(v.constant->nbytes()), ++weight_count;
  }
  Status supported = Builder().check_supported(*network);
  std::string build_hint = "kiln build --onnx=" + path + " --saveEngine=model.kiln";
  for (int v : g.inputs) {
    const auto& val = g.values[v];
    bool dyn = false;
    if (val.shape) {
      for (const auto& d : *val.shape) dyn |= !d.is_const();
    }
    if (dyn) build_hint += " " + example_shape_flags(val);
  }

  if (json) {
    JsonWriter j;
    j.begin_object().key("kind").value("onnx").key("path").value(path);
    j.key("ir_version").value(network->ir_version).key("producer").value(network->producer);
    j.key("model_hash").value(hex64(network->model_hash)).key("graph").value(g.name);
    j.key("opsets").begin_object();
    for (const auto& [d, v] : g.opsets) j.key(d.empty() ? "ai.onnx" : d).value(int64_t(v));
    j.end_object();
    for (const char* which : {"inputs", "outputs"}) {
      j.key(which).begin_array();
      for (int v : std::strcmp(which, "inputs") == 0 ? g.inputs : g.outputs) {
        const auto& val = g.values[v];
        j.begin_object().key("name").value(val.name).key("dtype").value(
            std::string(dtype_name(val.dtype)));
        j.key("shape").begin_array();
        if (val.shape) {
          for (const auto& d : *val.shape) {
            if (d.is_const())
              j.value(d.value());
            else
              j.value(d.to_string());
          }
        }
        j.end_array().end_object();
      }
      j.end_array();
    }
    j.key("nodes").value(int64_t(g.nodes.size())).key("ops").begin_object();
    for (const auto& [op, n] : ops) j.key(op).value(n);
    j.end_object();
    j.key("weights")
        .begin_object()
        .key("tensors")
        .value(weight_count)
        .key("bytes")
        .value(weight_bytes)
        .end_object();
    j.key("supported").value(supported.ok());
    j.key("unsupported_report");
    if (supported.ok())
      j.null();
    else
      j.value(supported.message());
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return kExitOk;
  }

  std::printf("model: %s\n", path.c_str());
  std::printf("  graph '%s', ONNX ir_version %lld, producer '%s', model hash %016llx\n",
              g.name.c_str(), static_cast<long long>(network->ir_version),
              network->producer.c_str(), static_cast<unsigned long long>(network->model_hash));
  std::string opsets;
  for (const auto& [d, v] : g.opsets)
    opsets += (opsets.empty() ? "" : ", ") + (d.empty() ? "ai.onnx" : d) + " " + std::to_string(v);
  std::printf("  opsets: %s\n", opsets.c_str());
  std::printf("inputs:\n");
  for (int v : g.inputs)
    std::printf("  %s  %s\n", g.values[v].name.c_str(), value_line(g.values[v]).c_str());
  std::printf("outputs (as the model declares them; kiln derives exact formulas at build time):\n");
  for (int v : g.outputs)
    std::printf("  %s  %s\n", g.values[v].name.c_str(), value_line(g.values[v]).c_str());
  std::printf("nodes: %zu\n  ops:", g.nodes.size());
  for (const auto& [op, n] : ops) std::printf(" %s %d", op.c_str(), n);
  std::printf("\nweights: %lld tensors, %s\n", static_cast<long long>(weight_count),
              format_bytes(weight_bytes).c_str());
  if (supported.ok()) {
    std::printf("support: every node uses an op kiln supports\n");
  } else {
    std::printf("support: %s\n", supported.message().c_str());
  }
  std::printf("to build (example ranges; pick real ones): %s\n", build_hint.c_str());
  return kExitOk;
}

int inspect_engine(const std::string& path, const std::vector<uint8_t>& bytes, bool json) {
  auto header = plan::read_header(bytes);
  if (!header.ok())
    return report("inspect",
                  failure(header.status(), "reading the engine header of '" + path + "'"));
  auto engine = Engine::deserialize(bytes);
  if (!engine.ok())
    return report("inspect", failure(engine.status(), "loading the engine '" + path + "'"));
  const auto& h = *header;
  if (json) {
    JsonWriter j;
    j.begin_object().key("kind").value("engine").key("path").value(path);
    j.key("header").begin_object();
    j.key("format_version")
        .value(int64_t(h.format_version))
        .key("kiln_version")
        .value(h.kiln_version);
    j.key("device")
        .value(std::string(device_name(h.device)))
        .key("builder_flags")
        .value(flags_to_string(h.builder_flags));
    j.key("model_hash").value(hex64(h.model_hash)).key("file_size").value(h.file_size);
    j.key("sections").begin_array();
    for (const auto& s : h.sections) {
      j.begin_object()
          .key("tag")
          .value(plan::section_tag_name(s.tag))
          .key("offset")
          .value(s.offset);
      j.key("size").value(s.size).key("required").value(s.required()).end_object();
    }
    j.end_array().end_object();
    engine_json(j, *engine);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return kExitOk;
  }
  std::printf("engine: %s (%s)\n", path.c_str(), format_bytes(int64_t(h.file_size)).c_str());
  std::printf(
      "header: format version %u, kiln %s, device %s, builder flags: %s, model hash %016llx\n",
      h.format_version, h.kiln_version.c_str(), std::string(device_name(h.device)).c_str(),
      flags_to_string(h.builder_flags).c_str(), static_cast<unsigned long long>(h.model_hash));
  std::printf("sections:");
  for (const auto& s : h.sections) {
    std::printf(" %s%s %s at %llu", plan::section_tag_name(s.tag).c_str(),
                s.required() ? "" : " (optional)", format_bytes(int64_t(s.size)).c_str(),
                static_cast<unsigned long long>(s.offset));
  }
  std::printf("\n%s%s", describe_profiles(*engine).c_str(), describe_io(*engine).c_str());
  std::printf("%s", describe_layers(*engine, /*each=*/true).c_str());
  std::printf("precision: %s\n", precision_summary(*engine, {}).c_str());
  std::printf("%s", describe_memory(*engine).c_str());
  return kExitOk;
}

}  // namespace

int inspect_command(const Argv& argv) {
  const CommandSpec spec = inspect_spec();
  auto args = Args::parse(spec, argv);
  if (!args.ok()) return report("inspect", args.error());
  if (args->help()) {
    std::fputs(help_text(spec).c_str(), stdout);
    return kExitOk;
  }
  auto json = args->get_bool("json");
  if (!json.ok()) return report("inspect", json.error());
  if (args->positional().empty()) {
    return report("inspect",
                  usage_error("give a model or an engine: kiln inspect model.onnx | model.kiln"));
  }
  std::string path = args->positional()[0];
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    path = (std::filesystem::path(path) / "model.onnx").string();
  // Engine files are the larger of the two kinds; a model is read again by the parser, which
  // refuses one over protobuf's 2 GiB.
  auto file = RegularFile::open(path, plan::kMaxEngineFileBytes, "model or engine");
  if (!file.ok()) return report("inspect", failure(file.status().message()));
  uint8_t magic[8] = {};
  if (file->size() >= 8 && file->read_at(0, magic).ok() &&
      std::memcmp(magic, plan::kEngineMagic, 8) == 0) {
    auto bytes = file->read_all();
    if (!bytes.ok()) return report("inspect", failure(bytes.status().message()));
    return inspect_engine(path, *bytes, *json);
  }
  return inspect_model(path, *json);
}

}  // namespace kiln::cli

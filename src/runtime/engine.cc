// Engine: checking and preparing a plan, loading and saving it, and answering questions about IO.
#include "runtime/engine.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "core/checked.h"
#include "plan/engine_file.h"
#include "runtime/engine_data.h"

namespace kiln {
namespace {

StatusOr<std::shared_ptr<const EngineData>> make_engine_data(plan::Plan plan) {
  auto data = std::make_shared<EngineData>();
  KILN_ASSIGN_OR_RETURN(data->backend, backends::get_backend(plan.device));
  data->plan = std::move(plan);
  KILN_RETURN_IF_ERROR(verify_plan(*data));
  const ir::Graph& g = data->plan.graph;
  for (int v : g.inputs) data->io_values.push_back(v);
  for (int v : g.outputs) data->io_values.push_back(v);
  data->num_inputs = int(g.inputs.size());
  data->io_of_value.assign(g.values.size(), -1);
  for (size_t i = 0; i < data->io_values.size(); ++i) {
    if (data->io_of_value[data->io_values[i]] < 0) data->io_of_value[data->io_values[i]] = int(i);
  }
  for (size_t i = 0; i < data->io_values.size(); ++i) {
    data->io_by_name.emplace(g.values[data->io_values[i]].name, int(i));
  }
  for (int v : g.inputs) {
    std::vector<EngineData::DimBinding> dims;
    for (const auto& d : *g.values[v].shape) {
      EngineData::DimBinding b;
      if (d.is_const()) {
        b.value = d.value();
      } else {
        b.fixed = false;
        if (!d.as_linear(&b.symbol, &b.coeff, &b.offset) || b.coeff <= 0) {
          return invalid_argument("engine input '" + g.values[v].name + "' has dim " +
                                  d.to_string() + ", which is not of the form c*symbol + k");
        }
      }
      dims.push_back(std::move(b));
    }
    data->input_bindings.push_back(std::move(dims));
  }
  data->shape_value_of_input.assign(g.inputs.size(), -1);
  for (size_t k = 0; k < data->plan.shape_values.size(); ++k) {
    auto io = data->find_io(data->plan.shape_values[k].name);
    if (!io.ok() || *io >= data->num_inputs || data->shape_value_of_input[size_t(*io)] >= 0) {
      return invalid_argument("the plan lists shape-value input '" +
                              data->plan.shape_values[k].name +
                              "', which is not an engine input or is listed twice");
    }
    data->shape_value_of_input[size_t(*io)] = int(k);
  }
  // Which values wait for data-dependent dims, and which nodes make them.
  const auto& dd_dims = data->plan.data_dependent;
  std::set<std::string> dd;
  for (const auto& d : dd_dims) dd.insert(d.symbol);
  data->value_data_dependent.assign(g.values.size(), 0);
  data->shape_data_dependent.assign(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size() && !dd.empty(); ++v) {
    const ir::Value& val = g.values[v];
    data->shape_data_dependent[v] = val.shape && ir::names_data_dependent(*val.shape, dd_dims);
    data->value_data_dependent[v] =
        data->shape_data_dependent[v] ||
        (val.sym_value && ir::names_data_dependent(*val.sym_value, dd_dims));
  }
  data->node_makes_data_dependent.assign(g.nodes.size(), 0);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    data->node_makes_data_dependent[n] = ir::makes_data_dependent(g, g.nodes[n], dd_dims);
  }
  KILN_ASSIGN_OR_RETURN(data->loops, plan::find_loops(g));  // verify_plan has checked them
  data->loop_at_node.assign(g.nodes.size(), -1);
  data->loop_growth.resize(data->loops.size());
  data->loop_values.resize(data->loops.size());
  for (size_t r = 0; r < data->loops.size(); ++r) {
    data->loop_at_node[size_t(data->loops[r].begin)] =
        data->loop_at_node[size_t(data->loops[r].end)] = int(r);
    const ir::Node& begin = g.nodes[size_t(data->loops[r].begin)];
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> grow,
                          begin.attrs.get_ints("grow", std::vector<int64_t>{}));
    std::set<std::string> symbols;
    for (size_t t = 0; t + 2 < grow.size();
         t += 3) {  // verify_plan ran its inference: the triples are valid
      const size_t j = size_t(grow[t]), d = size_t(grow[t + 1]);
      const ir::Dim& dim = (*g.values[size_t(begin.outputs[2 + j])].shape)[d];
      data->loop_growth[r].push_back({j, d, dim.to_string()});
      symbols.insert(dim.to_string());
    }
    for (size_t v = 0; v < g.values.size() && !symbols.empty(); ++v) {
      std::set<std::string> named;
      const ir::Value& val = g.values[v];
      if (val.shape)
        for (const ir::Dim& d : *val.shape) d.collect_symbols(&named);
      if (val.sym_value)
        for (const ir::Dim& d : *val.sym_value) d.collect_symbols(&named);
      for (const std::string& sym : symbols) {
        if (named.count(sym)) {
          data->loop_values[r].push_back(int(v));
          break;
        }
      }
    }
  }
  for (const ir::Node& node : g.nodes) {
    data->has_guards = data->has_guards || !node.guards.empty();
    data->node_selects_branch.push_back(ops::find_op(node.domain, node.op_type) ==
                                        ops::OpKind::kSelectBranch);
  }
  KILN_RETURN_IF_ERROR(upload_constants(*data));
  KILN_RETURN_IF_ERROR(prepare_implementations(*data));
  return std::shared_ptr<const EngineData>(std::move(data));
}

}  // namespace

StatusOr<Engine> Engine::from_plan(plan::Plan plan) {
  KILN_ASSIGN_OR_RETURN(auto data, make_engine_data(std::move(plan)));
  return Engine(std::move(data));
}

StatusOr<Engine> Engine::load(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(plan::Plan plan, plan::load_file(path, backends::backend_section_tags()));
  KILN_ASSIGN_OR_RETURN(auto data, make_engine_data(std::move(plan)));
  return Engine(std::move(data));
}

StatusOr<Engine> Engine::deserialize(std::span<const uint8_t> bytes) {
  KILN_ASSIGN_OR_RETURN(plan::Plan plan,
                        plan::deserialize(bytes, backends::backend_section_tags()));
  KILN_ASSIGN_OR_RETURN(auto data, make_engine_data(std::move(plan)));
  return Engine(std::move(data));
}

Status Engine::save(const std::string& path) const { return plan::save_file(data_->plan, path); }

std::vector<uint8_t> Engine::serialize() const { return plan::serialize(data_->plan); }

int Engine::num_io_tensors() const { return int(data_->io_values.size()); }

std::string Engine::io_tensor_name(int index) const {
  if (index < 0 || index >= num_io_tensors()) return "";
  return data_->plan.graph.values[data_->io_values[index]].name;
}

StatusOr<std::vector<ir::Dim>> Engine::tensor_symbolic_shape(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(int io, data_->find_io(name));
  return *data_->plan.graph.values[data_->io_values[io]].shape;
}

StatusOr<Shape> Engine::tensor_shape(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(auto dims, tensor_symbolic_shape(name));
  Shape s;
  for (const auto& d : dims) s.push_back(d.is_const() ? d.value() : -1);
  return s;
}

StatusOr<DType> Engine::tensor_dtype(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(int io, data_->find_io(name));
  return data_->plan.graph.values[data_->io_values[io]].dtype;
}

TensorIOMode Engine::tensor_mode(const std::string& name) const {
  auto it = data_->io_by_name.find(name);
  if (it == data_->io_by_name.end()) return TensorIOMode::kNONE;
  return it->second < data_->num_inputs ? TensorIOMode::kINPUT : TensorIOMode::kOUTPUT;
}

int Engine::num_profiles() const { return int(data_->plan.profiles.size()); }

StatusOr<Shape> Engine::profile_shape(const std::string& input, int profile,
                                      OptProfileSelector which) const {
  if (tensor_mode(input) != TensorIOMode::kINPUT) {
    return not_found("'" + input + "' is not an input of this engine");
  }
  if (profile < 0 || profile >= num_profiles()) {
    return invalid_argument("profile " + std::to_string(profile) +
                            " does not exist; the engine has " + std::to_string(num_profiles()));
  }
  for (const auto& r : data_->plan.profiles[profile].inputs) {
    if (r.name == input) {
      return which == OptProfileSelector::kMIN   ? r.min
             : which == OptProfileSelector::kOPT ? r.opt
                                                 : r.max;
    }
  }
  return tensor_shape(input);  // a static input: its shape is its only shape
}

bool Engine::is_shape_inference_io(const std::string& name) const {
  auto io = data_->find_io(name);
  return io.ok() && *io < data_->num_inputs && data_->shape_value_of_input[size_t(*io)] >= 0;
}

StatusOr<std::vector<int64_t>> Engine::profile_tensor_values(const std::string& input, int profile,
                                                             OptProfileSelector which) const {
  if (!is_shape_inference_io(input)) {
    return not_found("'" + input +
                     "' is not a shape-value input of this engine (see is_shape_inference_io)");
  }
  if (profile < 0 || profile >= num_profiles()) {
    return invalid_argument("profile " + std::to_string(profile) +
                            " does not exist; the engine has " + std::to_string(num_profiles()));
  }
  for (const auto& r : data_->plan.profiles[size_t(profile)].values) {
    if (r.name == input) {
      return which == OptProfileSelector::kMIN   ? r.min
             : which == OptProfileSelector::kOPT ? r.opt
                                                 : r.max;
    }
  }
  return not_found("input '" + input + "' has one fixed value of a non-integer dtype, not a range");
}

ir::Dim Engine::activation_bytes_formula() const {
  ir::Dim total(0);
  for (const auto& b : data_->plan.slot_bytes) total = total + b;
  return total;
}

Device Engine::device() const { return data_->plan.device; }

int Engine::num_layers() const { return int(data_->plan.graph.nodes.size()); }

std::vector<LayerInfo> Engine::layers() const {
  const plan::Plan& p = data_->plan;
  std::vector<LayerInfo> out;
  const std::vector<int> loop_of = plan::loop_of_nodes(p.graph, data_->loops);
  for (size_t n = 0; n < p.graph.nodes.size(); ++n) {
    const ir::Node& node = p.graph.nodes[n];
    const plan::NodePlan& choice = p.nodes[n];
    LayerInfo info{node.name, node.op_type, choice.impl,   choice.tactic,
                   "",        "",           choice.layout, node.replaced};
    DType out_dtype = node.outputs.empty() || node.outputs[0] < 0
                          ? DType::kUndefined
                          : p.graph.values[node.outputs[0]].dtype;
    info.precision = choice.precision.to_string(dtype_name(out_dtype));
    info.data_dependent = data_->node_makes_data_dependent[n] != 0;
    for (const ir::Guard& gd : node.guards)
      info.runs_when.push_back({p.graph.values[size_t(gd.cond)].name, gd.when});
    int loop = loop_of[n];
    if (loop >= 0 && data_->loops[size_t(loop)].begin == int(n))
      loop = data_->loops[size_t(loop)].parent;
    if (loop >= 0) info.repeats_in = p.graph.nodes[size_t(data_->loops[size_t(loop)].begin)].name;
    if (choice.impl == plan::kControlImpl) info.precision = "-";  // the run's own copies
    if (choice.impl == plan::kAliasImpl) {
      info.precision = "-";
      int v = node.outputs[0];
      if (v >= 0 && p.values[v].alias_of >= 0)
        info.alias_of = p.graph.values[p.values[v].alias_of].name;
    }
    out.push_back(std::move(info));
  }
  return out;
}

StatusOr<int64_t> Engine::activation_bytes(int profile, OptProfileSelector which) const {
  if (profile < 0 || profile >= std::max(num_profiles(), 1)) {
    return invalid_argument("profile " + std::to_string(profile) +
                            " does not exist; the engine has " + std::to_string(num_profiles()));
  }
  ir::SymbolValues symbols;
  for (int i = 0; i < data_->num_inputs; ++i) {
    std::string name = io_tensor_name(i);
    KILN_ASSIGN_OR_RETURN(Shape shape, profile_shape(name, profile, which));
    const auto& bindings = data_->input_bindings[i];
    for (size_t d = 0; d < bindings.size() && d < shape.size(); ++d) {
      const auto& b = bindings[d];
      if (!b.fixed) symbols[b.symbol] = (shape[d] - b.offset) / b.coeff;
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::SymbolRanges ranges, size_ranges(data_->plan, symbols));
  int64_t total = 0;
  for (const auto& slot : data_->plan.slot_bytes) {
    auto bytes = value_or_upper(slot, symbols, ranges);
    if (!bytes || *bytes < 0) {
      return internal_error("cannot evaluate activation slot size " + slot.to_string());
    }
    auto padded = checked_add(*bytes, 63);  // the runtime arena's alignment
    auto sum = padded ? checked_add(total, *padded / 64 * 64) : std::nullopt;
    if (!sum)
      return invalid_argument("activation memory overflows int64 at slot " + slot.to_string());
    total = *sum;
  }
  return total;
}

const plan::Plan& Engine::plan() const { return data_->plan; }

StatusOr<std::unique_ptr<ExecutionContext>> Engine::create_execution_context() const {
  std::unique_ptr<ExecutionContext> ctx(new ExecutionContext(data_));
  KILN_RETURN_IF_ERROR(ctx->prepare_kernels());
  return ctx;
}

}  // namespace kiln

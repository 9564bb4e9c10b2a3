// ModelProtos built in C++ for frontend tests: a model with one opset, graph inputs with dims in
// a string form, nodes, raw-data initializers, and the parse of the serialized bytes.
#pragma once

#include <string>
#include <vector>

#include "frontend/onnx/parse.h"
#include "onnx/onnx.pb.h"

namespace kiln::testing {

inline ::onnx::ModelProto make_model(int64_t opset = 18) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("kiln_test");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  m.mutable_graph()->set_name("main");
  return m;
}

// dims: digits -> dim_value, "" -> neither value nor param, anything else -> dim_param.
inline void add_input(::onnx::GraphProto* g, const std::string& name, int elem_type,
                      const std::vector<std::string>& dims) {
  auto* vi = g->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (d.empty()) continue;
    if (d.find_first_not_of("0123456789") == std::string::npos) {
      dim->set_dim_value(std::stoll(d));
    } else {
      dim->set_dim_param(d);
    }
  }
}

inline void add_output(::onnx::GraphProto* g, const std::string& name, int elem_type = 1) {
  auto* vi = g->add_output();
  vi->set_name(name);
  vi->mutable_type()->mutable_tensor_type()->set_elem_type(elem_type);
}

inline ::onnx::NodeProto* add_node(::onnx::GraphProto* g, const std::string& op,
                                   const std::vector<std::string>& inputs,
                                   const std::vector<std::string>& outputs,
                                   const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

template <typename T>
::onnx::TensorProto raw_tensor(const std::string& name, int dtype, std::vector<int64_t> dims,
                               const std::vector<T>& values) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(dtype);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)));
  return t;
}

inline std::vector<uint8_t> serialize(const ::onnx::ModelProto& m) {
  std::string s = m.SerializeAsString();
  return std::vector<uint8_t>(s.begin(), s.end());
}

inline StatusOr<Network> parse(const ::onnx::ModelProto& m, const std::string& dir = "") {
  return onnx::parse_bytes(serialize(m), dir);
}

}  // namespace kiln::testing

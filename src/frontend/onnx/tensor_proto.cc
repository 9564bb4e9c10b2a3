// TensorProto decoding: raw_data (little-endian) or the typed repeated fields, with every size
// validated before anything is allocated or copied, since model files are untrusted input.
#include "frontend/onnx/tensor_proto.h"

#include <bit>
#include <cstring>
#include <string>

#include "core/checked.h"

namespace kiln::onnx {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw_data is little-endian; a big-endian host needs byte swapping here");

}  // namespace

std::string onnx_type_name(int32_t code) {
  DType known = dtype_from_onnx(code);
  if (known != DType::kUndefined) return std::string(dtype_name(known));
  switch (code) {
    case 8:
      return "string";
    case 14:
      return "complex64";
    case 15:
      return "complex128";
    case 17:
      return "float8e4m3fn";
    case 18:
      return "float8e4m3fnuz";
    case 19:
      return "float8e5m2";
    case 20:
      return "float8e5m2fnuz";
    case 21:
      return "uint4";
    case 22:
      return "int4";
    case 23:
      return "float4e2m1";
    case 24:
      return "float8e8m0";
    case 25:
      return "uint2";
    case 26:
      return "int2";
    default:
      return "data type code " + std::to_string(code);
  }
}

namespace {

enum class Field { kRaw, kFloat, kInt32, kInt64, kDouble, kUInt64, kString };

const char* field_name(Field f) {
  switch (f) {
    case Field::kRaw:
      return "raw_data";
    case Field::kFloat:
      return "float_data";
    case Field::kInt32:
      return "int32_data";
    case Field::kInt64:
      return "int64_data";
    case Field::kDouble:
      return "double_data";
    case Field::kUInt64:
      return "uint64_data";
    case Field::kString:
      return "string_data";
  }
  return "?";
}

// The typed field ONNX stores each element type in (onnx.proto's comments on TensorProto).
Field typed_field(DType d) {
  switch (d) {
    case DType::kFloat32:
      return Field::kFloat;
    case DType::kInt64:
      return Field::kInt64;
    case DType::kFloat64:
      return Field::kDouble;
    case DType::kUInt32:
    case DType::kUInt64:
      return Field::kUInt64;
    default:
      return Field::kInt32;  // int32, int16, int8, uint16, uint8, bool, float16, bfloat16
  }
}

template <typename Dst, typename Src>
void narrow_copy(const Src& src, void* dst) {
  Dst* out = static_cast<Dst*>(dst);
  for (int i = 0; i < src.size(); ++i) out[i] = static_cast<Dst>(src.Get(i));
}

// Copies `src` (numel elements, already checked) into t, narrowing to the element width.
void copy_typed(const ::onnx::TensorProto& tp, Field field, Tensor* t) {
  void* dst = t->data();
  switch (field) {
    case Field::kFloat:
      narrow_copy<float>(tp.float_data(), dst);
      break;
    case Field::kInt64:
      narrow_copy<int64_t>(tp.int64_data(), dst);
      break;
    case Field::kDouble:
      narrow_copy<double>(tp.double_data(), dst);
      break;
    case Field::kUInt64:
      if (t->dtype() == DType::kUInt32) {
        narrow_copy<uint32_t>(tp.uint64_data(), dst);
      } else {
        narrow_copy<uint64_t>(tp.uint64_data(), dst);
      }
      break;
    case Field::kInt32:
      switch (t->dtype()) {
        case DType::kInt32:
          narrow_copy<int32_t>(tp.int32_data(), dst);
          break;
        case DType::kInt16:
          narrow_copy<int16_t>(tp.int32_data(), dst);
          break;
        case DType::kInt8:
          narrow_copy<int8_t>(tp.int32_data(), dst);
          break;
        case DType::kBool: {
          uint8_t* out = static_cast<uint8_t*>(dst);
          for (int i = 0; i < tp.int32_data_size(); ++i) out[i] = tp.int32_data(i) != 0;
          break;
        }
        case DType::kUInt8:
          narrow_copy<uint8_t>(tp.int32_data(), dst);
          break;
        // float16/bfloat16 keep their bit pattern in the low 16 bits.
        default:
          narrow_copy<uint16_t>(tp.int32_data(), dst);
          break;
      }
      break;
    case Field::kRaw:
    case Field::kString:
      break;
  }
}

int field_count(const ::onnx::TensorProto& tp, Field f) {
  switch (f) {
    case Field::kRaw:
      return tp.has_raw_data() ? 1 : 0;
    case Field::kFloat:
      return tp.float_data_size();
    case Field::kInt32:
      return tp.int32_data_size();
    case Field::kInt64:
      return tp.int64_data_size();
    case Field::kDouble:
      return tp.double_data_size();
    case Field::kUInt64:
      return tp.uint64_data_size();
    case Field::kString:
      return tp.string_data_size();
  }
  return 0;
}

}  // namespace

std::string tensor_label(const ::onnx::TensorProto& tp) {
  return tp.name().empty() ? std::string("tensor (unnamed)") : "tensor '" + tp.name() + "'";
}

StatusOr<Tensor> decode_tensor(const ::onnx::TensorProto& tp, const std::string& model_dir) {
  const std::string label = tensor_label(tp);
  const int32_t code = tp.data_type();
  if (code <= 0) return invalid_model(label + " has no data type");
  const DType dtype = dtype_from_onnx(code);
  if (dtype == DType::kUndefined) {
    return unsupported(label + " has element type " + onnx_type_name(code) +
                       ", which kiln does not support");
  }
  if (tp.has_segment()) return unsupported(label + " is a segment of a larger tensor");

  Shape shape(tp.dims().begin(), tp.dims().end());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return invalid_model(label + " has negative dim " + std::to_string(shape[i]) + " at axis " +
                           std::to_string(i));
    }
  }
  auto numel = checked_numel(shape);
  std::optional<int64_t> nbytes;
  if (numel) nbytes = checked_mul(*numel, int64_t(dtype_size(dtype)));
  if (!nbytes) return invalid_model(label + " shape " + shape_to_string(shape) + " overflows");
  const std::string needs = std::string(dtype_name(dtype)) + shape_to_string(shape) + " needs ";

  static constexpr Field kFields[] = {Field::kRaw,    Field::kFloat,  Field::kInt32, Field::kInt64,
                                      Field::kDouble, Field::kUInt64, Field::kString};
  int sources = 0;
  Field source = Field::kRaw;
  for (Field f : kFields) {
    if (field_count(tp, f) > 0) {
      ++sources;
      source = f;
    }
  }

  if (tp.data_location() == ::onnx::TensorProto::EXTERNAL) {
    if (sources > 0) {
      return invalid_model(label + " is stored externally but also holds " + field_name(source));
    }
    return read_external_data(tp, model_dir, dtype, shape, *nbytes);
  }
  if (sources > 1) return invalid_model(label + " holds data in more than one field");

  if (sources == 0 || source == Field::kRaw) {
    const int64_t have = sources == 0 ? 0 : int64_t(tp.raw_data().size());
    if (have != *nbytes) {
      return invalid_model(label + " has " + std::to_string(have) + " bytes of data, but " + needs +
                           std::to_string(*nbytes) + " bytes");
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, shape));
    if (have > 0) std::memcpy(t.data(), tp.raw_data().data(), size_t(have));
    return t;
  }

  const Field want = typed_field(dtype);
  if (source != want) {
    return invalid_model(label + " (" + std::string(dtype_name(dtype)) + ") holds its data in " +
                         field_name(source) + "; expected raw_data or " + field_name(want));
  }
  const int64_t have = field_count(tp, source);
  if (have != *numel) {
    return invalid_model(label + " has " + std::to_string(have) + " elements in " +
                         field_name(source) + ", but " + needs + std::to_string(*numel));
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(dtype, shape));
  copy_typed(tp, source, &t);
  return t;
}

}  // namespace kiln::onnx

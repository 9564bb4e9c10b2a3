// The nanobind module kiln._kiln: kiln's public C++ API under the same names, with numpy/DLPack
// tensors in and out, Status codes raised as typed exceptions, and the GIL released while kiln
// works.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "kiln.h"
#include "plan/plan.h"

namespace nb = nanobind;

namespace kiln::python {
namespace {

// ---- Status -> typed Python exceptions --------------------------------------------------------

// Thrown only inside this module, translated to the exception class of its code at the boundary.
struct StatusError {
  Status status;
};

// Python classes for each StatusCode, defined in kiln/_errors.py (so editors see them as plain
// classes) and looked up on the first error, when the kiln package has finished importing.
PyObject* error_class(StatusCode code) {
  static const char* const kNames[] = {
      "Error",         "InvalidArgumentError", "InvalidModelError", "UnsupportedError",
      "NotFoundError", "OutOfMemoryError",     "DeviceError",       "InternalError",
      "CancelledError"};
  constexpr int kNumCodes = int(sizeof(kNames) / sizeof(kNames[0]));
  static PyObject* classes[kNumCodes] = {};
  int index = int(code);
  if (index <= 0 || index >= kNumCodes) index = 0;  // kOk never raises; unknown codes map to Error
  if (!classes[index]) {
    PyObject* module = PyImport_ImportModule("kiln._errors");
    if (!module) {
      PyErr_Clear();
      return PyExc_RuntimeError;  // the extension imported on its own, as by stubgen
    }
    classes[index] = PyObject_GetAttrString(module, kNames[index]);  // kept for the process's life
    Py_DECREF(module);
    if (!classes[index]) {
      PyErr_Clear();
      return PyExc_RuntimeError;
    }
  }
  return classes[index];
}

[[noreturn]] void raise(Status status) { throw StatusError{std::move(status)}; }

void check(const Status& status) {
  if (!status.ok()) raise(status);
}

template <typename T>
T value_or_raise(StatusOr<T>&& result) {
  if (!result.ok()) raise(result.status());
  return std::move(result).value();
}

[[noreturn]] void raise_invalid(std::string message) {
  raise(invalid_argument(std::move(message)));
}

void register_error_translator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(error_class(e.status.code()), e.status.message().c_str());
    }
  });
}

// ---- dtypes ----------------------------------------------------------------------------------

std::string shape_str(const Shape& s) { return shape_to_string(s); }

DType dtype_from_dlpack(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  if (t.lanes != 1) return DType::kUndefined;
  switch (C(t.code)) {
    case C::Float:
      return t.bits == 32   ? DType::kFloat32
             : t.bits == 16 ? DType::kFloat16
             : t.bits == 64 ? DType::kFloat64
                            : DType::kUndefined;
    case C::Bfloat:
      return t.bits == 16 ? DType::kBFloat16 : DType::kUndefined;
    case C::Int:
      return t.bits == 8    ? DType::kInt8
             : t.bits == 16 ? DType::kInt16
             : t.bits == 32 ? DType::kInt32
             : t.bits == 64 ? DType::kInt64
                            : DType::kUndefined;
    case C::UInt:
      return t.bits == 8    ? DType::kUInt8
             : t.bits == 16 ? DType::kUInt16
             : t.bits == 32 ? DType::kUInt32
             : t.bits == 64 ? DType::kUInt64
                            : DType::kUndefined;
    case C::Bool:
      return t.bits == 8 ? DType::kBool : DType::kUndefined;
    default:
      return DType::kUndefined;
  }
}

nb::dlpack::dtype dlpack_from_dtype(DType d) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C code, int bits) { return nb::dlpack::dtype{uint8_t(code), uint8_t(bits), 1}; };
  switch (d) {
    case DType::kFloat32:
      return make(C::Float, 32);
    case DType::kFloat16:
      return make(C::Float, 16);
    case DType::kFloat64:
      return make(C::Float, 64);
    case DType::kBFloat16:
      return make(C::Bfloat, 16);
    case DType::kInt8:
      return make(C::Int, 8);
    case DType::kInt16:
      return make(C::Int, 16);
    case DType::kInt32:
      return make(C::Int, 32);
    case DType::kInt64:
      return make(C::Int, 64);
    case DType::kUInt8:
      return make(C::UInt, 8);
    case DType::kUInt16:
      return make(C::UInt, 16);
    case DType::kUInt32:
      return make(C::UInt, 32);
    case DType::kUInt64:
      return make(C::UInt, 64);
    case DType::kBool:
      return make(C::Bool, 8);
    case DType::kUndefined:
      break;
  }
  return make(C::Float, 0);
}

// numpy has no bfloat16; ml_dtypes (which JAX and onnx use) provides one when it is installed.
nb::object numpy_dtype(DType d) {
  if (d == DType::kBFloat16) {
    try {
      return nb::module_::import_("ml_dtypes").attr("bfloat16");
    } catch (nb::python_error&) {
      raise(unsupported("bfloat16 has no numpy dtype: install ml_dtypes to use bfloat16 tensors"));
    }
  }
  return nb::module_::import_("numpy").attr("dtype")(std::string(dtype_name(d)));
}

// ---- tensors in ------------------------------------------------------------------------------

// DLPack device types: kDLCPU and kDLCUDAHost (pinned host memory) are host memory kiln's CPU
// kernels can read; kDLCUDA and kDLCUDAManaged are memory CUDA kernels read in place.
bool is_host_device(int device_type) { return device_type == 1 || device_type == 3; }
bool is_cuda_device(int device_type) { return device_type == 2 || device_type == 13; }

// A device array reached host-only code: a CPU engine, or a build without the CUDA backend.
[[noreturn]] void raise_device(const std::string& name, int device_type) {
  std::string where = "device type " + std::to_string(device_type) + " (DLPack)";
  if (is_cuda_device(device_type)) where = "a CUDA device";
  auto cuda = backends::get_backend(Device::kCUDA);
  if (!cuda.ok()) {
    raise(unsupported("tensor '" + name + "' lives on " + where +
                      ", but kiln cannot run CUDA here (" + cuda.status().message() +
                      "): pass host memory (e.g. tensor.cpu().numpy())"));
  }
  raise_invalid(
      "tensor '" + name + "' lives on " + where +
      ", but this engine runs on the CPU: pass host memory, or build the engine with Device.CUDA");
}

// The DLPack device type `obj` reports through __dlpack_device__, or -1 when it reports none.
int dlpack_device_type(nb::handle obj) {
  if (!nb::hasattr(obj, "__dlpack_device__")) return -1;
  try {
    nb::object dev = obj.attr("__dlpack_device__")();
    return nb::cast<int>(dev[0]);
  } catch (nb::python_error&) {
    return -1;  // numpy raises for dtypes DLPack lacks (bfloat16); the host paths decide
  } catch (nb::cast_error&) {
    return -1;
  }
}

// numpy arrays of ml_dtypes.bfloat16 export neither DLPack nor a buffer format nanobind reads, so
// they are viewed as uint16 and tagged bfloat16 again. None for any other object.
std::optional<nb::ndarray<nb::ro>> bfloat16_numpy_view(const std::string& name, nb::handle obj,
                                                       bool writable) {
  if (!nb::hasattr(obj, "dtype") || !nb::hasattr(obj, "view") || !nb::hasattr(obj, "flags"))
    return std::nullopt;
  nb::object dtype = obj.attr("dtype");
  if (!nb::hasattr(dtype, "name") ||
      nb::cast<std::string>(nb::str(dtype.attr("name"))) != "bfloat16") {
    return std::nullopt;
  }
  if (writable && !nb::cast<bool>(obj.attr("flags").attr("writeable"))) {
    raise_invalid("output '" + name + "' is bound to a read-only array; kiln must write into it");
  }
  nb::object as_u16 = obj.attr("view")(nb::module_::import_("numpy").attr("uint16"));
  nb::ndarray<nb::ro> bits;
  if (!nb::try_cast(as_u16, bits, /*convert=*/false)) return std::nullopt;
  std::vector<size_t> shape(bits.ndim());
  std::vector<int64_t> strides(bits.ndim());
  for (size_t i = 0; i < bits.ndim(); ++i) {
    shape[i] = bits.shape(i);
    strides[i] = bits.stride(i);
  }
  // The uint16 view owns a reference to the caller's array, so the memory outlives this ndarray.
  return nb::ndarray<nb::ro>(bits.data(), shape.size(), shape.data(), as_u16, strides.data(),
                             nb::dlpack::dtype{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1},
                             bits.device_type(), bits.device_id());
}

void check_dtype_known(const std::string& name, const nb::ndarray<nb::ro>& arr) {
  if (dtype_from_dlpack(arr.dtype()) != DType::kUndefined) return;
  static const char* const kCodes[] = {"int",    "uint",    "float", "opaque",
                                       "bfloat", "complex", "bool"};
  int code = arr.dtype().code;
  std::string kind = code < 7 ? kCodes[code] : "DLPack code " + std::to_string(code);
  raise_invalid("tensor '" + name + "' has dtype " + kind + std::to_string(int(arr.dtype().bits)) +
                ", which kiln does not support");
}

// A host view of any object with the buffer protocol or __dlpack__, checked for device and dtype.
// `writable` refuses read-only arrays (output buffers); inputs accept them.
nb::ndarray<nb::ro> as_host_array(const std::string& name, nb::handle obj, bool writable) {
  // Ask the device before importing: a framework may refuse to export device memory to the CPU.
  int device_type = dlpack_device_type(obj);
  if (device_type >= 0 && !is_host_device(device_type)) raise_device(name, device_type);
  if (auto bf16 = bfloat16_numpy_view(name, obj, writable)) return *bf16;
  nb::ndarray<nb::ro> arr;
  if (!nb::try_cast(obj, arr, /*convert=*/false)) {
    std::string type = nb::type_name(obj.type()).c_str();
    raise_invalid("tensor '" + name +
                  "': expected a numpy array or an object with __dlpack__, got " + type);
  }
  if (!is_host_device(arr.device_type())) raise_device(name, arr.device_type());
  if (writable) {
    nb::ndarray<> rw;
    if (!nb::try_cast(obj, rw, /*convert=*/false)) {
      raise_invalid("output '" + name + "' is bound to a read-only array; kiln must write into it");
    }
  }
  check_dtype_known(name, arr);
  return arr;
}

// The handle of a CUDA stream given as an int (a cudaStream_t), a torch.cuda.Stream (its
// cuda_stream) or a CuPy stream (its ptr). None is 0, CUDA's legacy default stream.
uintptr_t stream_handle(nb::handle stream) {
  if (stream.is_none()) return 0;
  nb::handle h = stream;
  nb::object attr;
  if (!nb::isinstance<nb::int_>(h)) {
    if (nb::hasattr(h, "cuda_stream")) {
      attr = h.attr("cuda_stream");
    } else if (nb::hasattr(h, "ptr")) {
      attr = h.attr("ptr");
    } else {
      raise_invalid(
          "expected a CUDA stream: an int (cudaStream_t), a torch.cuda.Stream or a CuPy stream; "
          "got " +
          std::string(nb::type_name(h.type()).c_str()));
    }
    h = attr;
  }
  try {
    return nb::cast<uintptr_t>(h);
  } catch (nb::cast_error&) {
    raise_invalid("a CUDA stream handle must be a non-negative int (a cudaStream_t)");
  }
}

// A view of a CUDA array (torch, CuPy, anything with __dlpack__) for a CUDA engine: on the device
// kiln runs on, of a dtype kiln has (callers check its layout). With `stream` (the stream kiln will
// run on), the array is exported through __dlpack__(stream=...), so the producer orders its pending
// work before that stream's (DLPack's stream handshake; 1 stands for CUDA's legacy default stream).
nb::ndarray<nb::ro> as_device_array(const std::string& name, nb::handle obj,
                                    std::optional<uintptr_t> stream) {
  nb::ndarray<nb::ro> arr;
  bool ok = false;
  if (stream && nb::hasattr(obj, "__dlpack__")) {
    nb::object capsule =
        obj.attr("__dlpack__")(nb::arg("stream") = *stream == 0 ? uintptr_t(1) : *stream);
    ok = nb::try_cast(capsule, arr, /*convert=*/false);
  } else {
    ok = nb::try_cast(obj, arr, /*convert=*/false);
  }
  if (!ok) {
    raise_invalid("tensor '" + name +
                  "': expected a CUDA array with __dlpack__ (torch, CuPy), got " +
                  std::string(nb::type_name(obj.type()).c_str()));
  }
  if (!is_cuda_device(arr.device_type()))
    raise_invalid("tensor '" + name + "' is not CUDA device memory");
  const int here = value_or_raise(backends::get_backend(Device::kCUDA))->device_ordinal();
  if (arr.device_id() != here) {
    raise_invalid("tensor '" + name + "' lives on cuda:" + std::to_string(arr.device_id()) +
                  ", but kiln runs on cuda:" + std::to_string(here) +
                  " (CUDA's current device): move the tensor or select that device first");
  }
  check_dtype_known(name, arr);
  return arr;
}

Shape array_shape(const nb::ndarray<nb::ro>& a) {
  Shape s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = int64_t(a.shape(i));
  return s;
}

// C order, ignoring the strides of extent-1 dims (numpy and torch disagree about those).
bool is_c_contiguous(const nb::ndarray<nb::ro>& a) {
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) == 1) continue;
    if (a.stride(i) != expected) return false;
    expected *= int64_t(a.shape(i));
  }
  return true;
}

// Gathers a strided array into C order; strides are in elements and may be negative.
void copy_strided(const nb::ndarray<nb::ro>& a, char* dst) {
  const size_t item = a.itemsize(), ndim = a.ndim();
  const char* base = static_cast<const char*>(a.data());
  if (a.size() == 0) return;
  std::vector<size_t> index(ndim, 0);
  for (size_t n = 0, total = a.size(); n < total; ++n) {
    int64_t offset = 0;
    for (size_t d = 0; d < ndim; ++d) offset += int64_t(index[d]) * a.stride(d);
    std::memcpy(dst + n * item, base + offset * int64_t(item), item);
    for (size_t d = ndim; d-- > 0;) {
      if (++index[d] < a.shape(d)) break;
      index[d] = 0;
    }
  }
}

// A kiln Tensor over the array's memory when it is C-contiguous, else over a C-ordered copy.
// The caller keeps `arr` alive for as long as the Tensor is used.
Tensor tensor_from_array(const nb::ndarray<nb::ro>& arr) {
  DType dtype = dtype_from_dlpack(arr.dtype());
  Shape shape = array_shape(arr);
  if (is_c_contiguous(arr))
    return Tensor::wrap(dtype, shape, const_cast<void*>(arr.data()), nullptr);
  Tensor copy = value_or_raise(Tensor::zeros(dtype, shape));
  copy_strided(arr, static_cast<char*>(copy.data()));
  return copy;
}

// ---- tensors out -----------------------------------------------------------------------------

// A numpy array that owns kiln's Tensor (its memory is not copied) and has exactly its shape.
// bfloat16 travels as uint16 (numpy cannot import it) and is viewed as ml_dtypes.bfloat16.
nb::object to_numpy(Tensor t) {
  const bool bf16 = t.dtype() == DType::kBFloat16;
  nb::object bf16_dtype =
      bf16 ? numpy_dtype(DType::kBFloat16) : nb::none();  // raises without ml_dtypes
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  auto* owned = new Tensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::numpy> arr(owned->data(), shape.size(), shape.data(), owner, nullptr,
                             dlpack_from_dtype(bf16 ? DType::kUInt16 : owned->dtype()),
                             nb::device::cpu::value);
  nb::object out = arr.cast();
  return bf16 ? out.attr("view")(bf16_dtype) : out;
}

// Device outputs come back in the inputs' framework (torch, CuPy), else as nanobind's own array,
// whose __dlpack__ lets any framework take it without a copy.
enum class Framework { kOther, kTorch, kCuPy };

Framework framework_of(nb::handle obj) {
  std::string module = nb::cast<std::string>(nb::str(obj.type().attr("__module__")));
  auto under = [&](const std::string& top) {
    return module == top || module.rfind(top + ".", 0) == 0;
  };
  return under("torch") ? Framework::kTorch : under("cupy") ? Framework::kCuPy : Framework::kOther;
}

// Device memory from kiln's CUDA backend, freed by it when the last array over it goes.
struct DeviceBuffer {
  const backends::Backend* backend;
  void* data;
};

// A device array of exactly `shape` over `buffer`'s memory, which it owns (no copy).
nb::object device_array(DeviceBuffer* buffer, const Shape& shape, DType dtype, int device_id,
                        Framework framework) {
  nb::capsule owner(buffer, [](void* p) noexcept {
    auto* b = static_cast<DeviceBuffer*>(p);
    b->backend->deallocate(b->data);
    delete b;
  });
  std::vector<size_t> dims(shape.begin(), shape.end());
  auto make = [&]<typename F>(F) {
    return nb::ndarray<F>(buffer->data, dims.size(), dims.data(), owner, nullptr,
                          dlpack_from_dtype(dtype), nb::device::cuda::value, device_id)
        .cast();
  };
  switch (framework) {
    case Framework::kTorch:
      return make(nb::pytorch{});
    case Framework::kCuPy:
      return make(nb::cupy{});
    case Framework::kOther:
      break;
  }
  return make(nb::device::cuda{});  // no framework: nanobind's own array
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t d : s) l.append(d);
  return nb::tuple(l);
}

Shape shape_from(nb::handle seq) {
  Shape s;
  for (nb::handle d : seq) s.push_back(nb::cast<int64_t>(d));
  return s;
}

// ---- ExecutionContext with bound arrays -------------------------------------------------------

// An array bound with set_tensor_address(name, array): kept alive and checked against the shapes
// each execute() needs, so a buffer sized for another batch (seed 000) is an error, not garbage.
struct Binding {
  nb::object owner;
  Shape shape;
  DType dtype;
};

class BoundContext {
 public:
  BoundContext(Engine engine, std::unique_ptr<ExecutionContext> ctx)
      : engine_(std::move(engine)), ctx_(std::move(ctx)) {}

  void set_input_shape(const std::string& name, nb::handle shape) {
    Exclusive guard(this);
    check(ctx_->set_input_shape(name, shape_from(shape)));
  }
  nb::tuple tensor_shape(const std::string& name) {
    Exclusive guard(this);
    return shape_tuple(value_or_raise(ctx_->tensor_shape(name)));
  }
  void infer_shapes() {
    Exclusive guard(this);
    check(ctx_->infer_shapes());
  }

  void set_tensor_address(const std::string& name, nb::handle target) {
    Exclusive guard(this);
    TensorIOMode mode = engine_.tensor_mode(name);
    if (mode == TensorIOMode::kNONE)
      raise(not_found("the engine has no tensor named '" + name + "'"));
    if (nb::isinstance<nb::int_>(target) || target.is_none()) {
      void* ptr = target.is_none() ? nullptr : reinterpret_cast<void*>(nb::cast<uintptr_t>(target));
      check(ctx_->set_tensor_address(name, ptr));
      bound_.erase(name);
      return;
    }
    nb::ndarray<nb::ro> arr;
    if (engine_.device() == Device::kCUDA) {
      int device_type = dlpack_device_type(target);
      if (!is_cuda_device(device_type)) {
        raise_invalid("tensor '" + name +
                      "': this engine runs on CUDA, so set_tensor_address takes device memory "
                      "(a CUDA array with __dlpack__, such as a torch or CuPy tensor, or a device "
                      "pointer as an "
                      "int); run() takes host arrays and copies them");
      }
      arr = as_device_array(name, target, std::nullopt);
    } else {
      arr = as_host_array(name, target, /*writable=*/mode == TensorIOMode::kOUTPUT);
    }
    DType want = value_or_raise(engine_.tensor_dtype(name));
    DType got = dtype_from_dlpack(arr.dtype());
    if (got != want) {
      raise_invalid("tensor '" + name + "' is bound to a " + std::string(dtype_name(got)) +
                    " array, but the engine expects " + std::string(dtype_name(want)));
    }
    if (!is_c_contiguous(arr)) {
      raise_invalid(
          "tensor '" + name +
          "' is bound to an array that is not C-contiguous; kiln reads and "
          "writes bound memory in place: pass numpy.ascontiguousarray(a) (torch: t.contiguous())");
    }
    Shape shape = array_shape(arr);
    if (mode == TensorIOMode::kINPUT) check(ctx_->set_input_shape(name, shape));
    check(ctx_->set_tensor_address(name, const_cast<void*>(arr.data())));
    bound_[name] = Binding{nb::borrow(target), shape, got};
  }

  uintptr_t tensor_address(const std::string& name) const {
    return reinterpret_cast<uintptr_t>(ctx_->tensor_address(name));
  }

  // Synchronous: ordered after the work queued on stream 0 (where torch's default stream puts the
  // inputs' producers), then waited for. The context's own stream does not wait for stream 0 by
  // itself (it is non-blocking), so without the fence a tensor torch had just queued was read
  // early.
  void execute() { execute_on(nullptr, /*synchronize=*/true); }

  // TensorRT's execute_async_v3: enqueues on `stream` (a cudaStream_t as an int). A CPU engine runs
  // synchronously and takes stream 0 only: a real stream there means device pointers the CPU cannot
  // read. Errors raise (TensorRT returns False and logs); success returns True, as TensorRT does.
  bool execute_async_v3(nb::handle stream_obj) {
    const uintptr_t stream = stream_handle(stream_obj);
    if (engine_.device() == Device::kCPU && stream != 0) {
      raise_invalid(
          "execute_async_v3: this engine runs on the CPU, which has no streams: pass stream_handle "
          "0 "
          "(the run is synchronous)");
    }
    // Stream 0 is CUDA's legacy default stream (torch's default current stream), not the context's
    // own (enqueue(nullptr)): the run is ordered after the work queued there and before the work
    // queued there later, and not waited for, as TensorRT's enqueueV3(0) is.
    execute_on(reinterpret_cast<void*>(stream), /*synchronize=*/false);
    return true;
  }

  void execute_on(void* stream, bool synchronize) {
    Exclusive guard(this);
    for (int i = 0; i < engine_.num_io_tensors(); ++i) {  // inputs first: they decide the rest
      const std::string name = engine_.io_tensor_name(i);
      auto it = bound_.find(name);
      if (it == bound_.end()) continue;
      const Binding& b = it->second;
      Shape need = value_or_raise(ctx_->tensor_shape(name));
      if (need != b.shape) {
        raise_invalid("tensor '" + name + "' is bound to an array of shape " + shape_str(b.shape) +
                      ", but this run's shape is " + shape_str(need) +
                      ": allocate it from context.tensor_shape('" + name +
                      "') after set_input_shape");
      }
    }
    nb::gil_scoped_release release;
    if (synchronize) {
      check(ctx_->enqueue_on_default_stream());
      // Stream 0 is ordered after the run, whether it ran there (a replayed graph) or was fenced.
      check(value_or_raise(backends::get_backend(engine_.device()))->synchronize(nullptr));
      return;
    }
    check(enqueue_on(reinterpret_cast<uintptr_t>(stream)));
  }

  // Enqueues on a caller's stream handle: 0 is CUDA's legacy default stream (torch's default
  // stream), fenced by enqueue_on_default_stream; any other handle is used as it is.
  Status enqueue_on(uintptr_t stream) {
    return stream ? ctx_->enqueue(reinterpret_cast<void*>(stream))
                  : ctx_->enqueue_on_default_stream();
  }

  // run(inputs): a dict of outputs. Inputs are a dict of name -> array, a list or tuple of arrays
  // in engine input order, or one array for a one-input engine. Device arrays (every input on the
  // CUDA device, for a CUDA engine) run without copies and return device outputs, on `stream` when
  // given (enqueued, not waited for) and otherwise on the context's stream, waited for.
  nb::dict run(nb::handle inputs_obj, nb::handle stream) {
    nb::dict inputs = named_inputs(inputs_obj);
    bool device = false;
    for (auto [key, value] : inputs) device = device || is_cuda_device(dlpack_device_type(value));
    if (device && engine_.device() == Device::kCUDA) return run_device(inputs, stream);
    if (!stream.is_none()) {
      raise_invalid(
          "run(stream=...) runs device arrays: these inputs are host memory, which run() copies "
          "and "
          "waits for (pass stream=None)");
    }
    return run_named(inputs);
  }

  // ONNX Runtime's run(output_names, input_feed): a list of arrays in the order asked for (all
  // outputs in engine order when output_names is None).
  nb::list run_ort(nb::handle output_names, nb::handle inputs_obj) {
    std::vector<std::string> names;
    if (output_names.is_none()) {
      for (int i = 0; i < engine_.num_io_tensors(); ++i) {
        std::string n = engine_.io_tensor_name(i);
        if (engine_.tensor_mode(n) == TensorIOMode::kOUTPUT) names.push_back(n);
      }
    } else {
      if (nb::isinstance<nb::str>(output_names))
        raise_invalid("run(): output_names must be a list of names or None");
      for (nb::handle n : output_names) {
        std::string name = nb::cast<std::string>(n);
        if (engine_.tensor_mode(name) != TensorIOMode::kOUTPUT) {
          raise(not_found("run(): the engine has no output named '" + name + "'"));
        }
        names.push_back(std::move(name));
      }
    }
    nb::dict outputs = run(inputs_obj, nb::none());
    nb::list result;
    for (const std::string& n : names) result.append(outputs[nb::str(n.c_str())]);
    return result;
  }

 private:
  nb::dict named_inputs(nb::handle inputs_obj) {
    if (nb::isinstance<nb::dict>(inputs_obj)) return nb::borrow<nb::dict>(inputs_obj);
    std::vector<std::string> names;
    for (int i = 0; i < engine_.num_io_tensors(); ++i) {
      std::string n = engine_.io_tensor_name(i);
      if (engine_.tensor_mode(n) == TensorIOMode::kINPUT) names.push_back(n);
    }
    nb::list items;
    if (nb::isinstance<nb::list>(inputs_obj) || nb::isinstance<nb::tuple>(inputs_obj)) {
      for (nb::handle item : inputs_obj) items.append(item);
    } else if (nb::hasattr(inputs_obj, "__dlpack__") ||
               nb::hasattr(inputs_obj, "__array_interface__")) {
      items.append(inputs_obj);
    } else {
      raise_invalid(
          "run() takes a dict of input name -> array, a list of arrays in input order, or one "
          "array; got " +
          std::string(nb::type_name(inputs_obj.type()).c_str()));
    }
    if (items.size() != names.size()) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      raise_invalid("run(): the engine has " + std::to_string(names.size()) + " input(s) (" + list +
                    "), got " + std::to_string(items.size()) + " array(s)");
    }
    nb::dict named;
    for (size_t i = 0; i < names.size(); ++i) named[nb::str(names[i].c_str())] = items[i];
    return named;
  }

  nb::dict run_device(nb::dict inputs_dict, nb::handle stream_obj) {
    Exclusive guard(this);
    const backends::Backend* backend = value_or_raise(backends::get_backend(Device::kCUDA));
    const bool given = !stream_obj.is_none();
    const uintptr_t stream =
        given ? stream_handle(stream_obj) : reinterpret_cast<uintptr_t>(ctx_->stream());
    std::vector<nb::ndarray<nb::ro>>
        keep;  // hold the inputs' DLPack exports until the run is enqueued
    Framework framework = Framework::kOther;
    int device_id = backend->device_ordinal();
    // Any failure below leaves no address of this call's memory bound.
    struct Unbind {
      const Engine& engine;
      ExecutionContext* ctx;
      ~Unbind() {
        for (int i = 0; i < engine.num_io_tensors(); ++i)
          (void)ctx->set_tensor_address(engine.io_tensor_name(i), nullptr);
      }
    } unbind{engine_, ctx_.get()};
    bound_.clear();
    for (auto [key, value] : inputs_dict) {
      if (!nb::isinstance<nb::str>(key)) raise_invalid("run(): input names must be str");
      std::string name = nb::cast<std::string>(key);
      if (engine_.tensor_mode(name) != TensorIOMode::kINPUT)
        raise(not_found("run(): the engine has no input named '" + name + "'"));
      if (!is_cuda_device(dlpack_device_type(value))) {
        raise_invalid(
            "run(): input '" + name +
            "' is host memory while other inputs are on the CUDA device: "
            "pass every input on the device (outputs come back there) or every input on the host");
      }
      if (keep.empty()) framework = framework_of(value);
      keep.push_back(as_device_array(name, value, stream));
      const nb::ndarray<nb::ro>& arr = keep.back();
      DType want = value_or_raise(engine_.tensor_dtype(name)), got = dtype_from_dlpack(arr.dtype());
      if (got != want) {
        raise_invalid("run(): input '" + name + "' is " + std::string(dtype_name(got)) +
                      ", but the engine expects " + std::string(dtype_name(want)) +
                      " (device inputs are not converted: cast it first)");
      }
      if (!is_c_contiguous(arr)) {
        raise_invalid("run(): input '" + name +
                      "' is not C-contiguous; device inputs are read in place: "
                      "pass t.contiguous()");
      }
      check(ctx_->set_input_shape(name, array_shape(arr)));
      check(ctx_->set_tensor_address(name, const_cast<void*>(arr.data())));
    }
    struct Free {
      void operator()(DeviceBuffer* b) const {
        b->backend->deallocate(b->data);
        delete b;
      }
    };
    std::vector<std::string> outputs;
    std::vector<std::unique_ptr<DeviceBuffer, Free>> owned;  // freed here if the run fails
    std::vector<Shape> shapes;
    // An output of data-dependent size (-1 dims until the run): a device buffer of the exact size,
    // allocated during the run by this allocator.
    struct Sized final : OutputAllocator {
      const backends::Backend* backend;
      DeviceBuffer* buffer = nullptr;
      Shape shape;
      explicit Sized(const backends::Backend* b) : backend(b) {}
      ~Sized() override {
        if (buffer) Free()(buffer);
      }
      void* reallocate_output(const std::string&, void*, size_t bytes, size_t) override {
        auto p = backend->allocate(std::max<size_t>(bytes, 1));
        if (!p.ok()) return nullptr;
        if (buffer) Free()(buffer);
        buffer = new DeviceBuffer{backend, *p};
        return *p;
      }
      void notify_shape(const std::string&, const Shape& s) override { shape = s; }
    };
    std::vector<std::unique_ptr<Sized>> sized;  // per output: set for a data-dependent one
    struct Unset {
      const Engine& engine;
      ExecutionContext* ctx;
      ~Unset() {
        for (int i = 0; i < engine.num_io_tensors(); ++i) {
          if (engine.tensor_mode(engine.io_tensor_name(i)) == TensorIOMode::kOUTPUT) {
            (void)ctx->set_output_allocator(engine.io_tensor_name(i), nullptr);
          }
        }
      }
    } unset{engine_, ctx_.get()};
    for (int i = 0; i < engine_.num_io_tensors(); ++i) {
      std::string name = engine_.io_tensor_name(i);
      if (engine_.tensor_mode(name) != TensorIOMode::kOUTPUT) continue;
      Shape shape = value_or_raise(ctx_->tensor_shape(name));
      outputs.push_back(name);
      if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
        sized.push_back(std::make_unique<Sized>(backend));
        check(ctx_->set_output_allocator(name, sized.back().get()));
        owned.emplace_back(nullptr);
        shapes.emplace_back();
        continue;
      }
      sized.emplace_back(nullptr);
      check(ctx_->set_output_allocator(name, nullptr));
      size_t bytes =
          size_t(shape_numel(shape)) * dtype_size(value_or_raise(engine_.tensor_dtype(name)));
      void* data = value_or_raise(backend->allocate(std::max<size_t>(bytes, 1)));
      owned.emplace_back(new DeviceBuffer{backend, data});
      check(ctx_->set_tensor_address(name, data));
      shapes.push_back(std::move(shape));
    }
    Status status;
    {
      nb::gil_scoped_release release;
      status = enqueue_on(stream);  // without a given stream, `stream` is the context's own
      if (status.ok() && !given) status = backend->synchronize(reinterpret_cast<void*>(stream));
    }
    check(status);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!sized[i]) continue;
      if (!sized[i]->buffer) sized[i]->reallocate_output(outputs[i], nullptr, 1, 64);
      owned[i].reset(std::exchange(sized[i]->buffer, nullptr));
      shapes[i] = sized[i]->shape;
    }
    nb::dict out;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string& name = outputs[i];
      out[nb::str(name.c_str())] =
          device_array(owned[i].release(), shapes[i], value_or_raise(engine_.tensor_dtype(name)),
                       device_id, framework);
    }
    return out;
  }

  nb::dict run_named(nb::dict inputs_dict) {
    Exclusive guard(this);
    std::vector<nb::ndarray<nb::ro>> keep;  // the arrays whose memory the Tensors wrap
    std::map<std::string, Tensor> inputs;
    for (auto [key, value] : inputs_dict) {
      if (!nb::isinstance<nb::str>(key)) raise_invalid("run(): input names must be str");
      std::string name = nb::cast<std::string>(key);
      keep.push_back(as_host_array(name, value, /*writable=*/false));
      inputs[name] = tensor_from_array(keep.back());
    }
    std::map<std::string, Tensor> outputs;
    Status status;
    {
      nb::gil_scoped_release release;
      auto result = ctx_->run(inputs);
      if (result.ok()) {
        outputs = std::move(result).value();
      } else {
        status = result.status();
      }
      // run() leaves the IO addresses pointing at memory this call owns; forget them, so that a
      // later execute() without set_tensor_address fails cleanly instead of reading freed memory.
      for (int i = 0; i < engine_.num_io_tensors(); ++i) {
        (void)ctx_->set_tensor_address(engine_.io_tensor_name(i), nullptr);
      }
    }
    bound_.clear();
    check(status);
    nb::dict out;
    for (auto& [name, t] : outputs) out[nb::str(name.c_str())] = to_numpy(std::move(t));
    return out;
  }

 public:
  void set_optimization_profile(int profile) {
    Exclusive guard(this);
    check(ctx_->set_optimization_profile(profile));
  }
  int optimization_profile() const { return ctx_->optimization_profile(); }
  bool profile_pinned() const { return ctx_->profile_pinned(); }
  size_t arena_bytes() const { return ctx_->arena_bytes(); }
  void set_use_cuda_graph(bool on) {
    Exclusive guard(this);
    ctx_->set_use_cuda_graph(on);
  }
  bool use_cuda_graph() const { return ctx_->use_cuda_graph(); }
  void set_graph_capacity(size_t n) {
    Exclusive guard(this);
    ctx_->set_cuda_graph_cache_capacity(n);
  }
  size_t graph_capacity() const { return ctx_->cuda_graph_cache_capacity(); }
  void set_max_loop_iterations(int64_t n) {
    Exclusive guard(this);
    ctx_->set_max_loop_iterations(n);
  }
  void set_cpu_threads(int n) {
    Exclusive guard(this);
    check(ctx_->set_cpu_threads(n));
  }
  int cpu_threads() const { return ctx_->cpu_threads(); }
  // From any thread, while another runs: no Exclusive guard (the run holds it).
  void cancel() { ctx_->cancel(); }
  int64_t max_loop_iterations() const { return ctx_->max_loop_iterations(); }
  void set_batch_buckets(std::vector<int64_t> buckets) {
    Exclusive guard(this);
    check(ctx_->set_batch_buckets(std::move(buckets)));
  }
  std::vector<int64_t> batch_buckets() const { return ctx_->batch_buckets(); }
  nb::dict graph_stats() const {
    const auto s = ctx_->cuda_graph_stats();
    nb::dict d;
    d["captures"] = s.captures;
    d["replays"] = s.replays;
    d["evictions"] = s.evictions;
    d["cached"] = s.cached;
    return d;
  }
  const Engine& engine() const { return engine_; }

 private:
  // A C++ ExecutionContext serves one caller at a time. Python threads sharing one context would
  // race inside it once the GIL is released, so a second caller gets an error instead.
  class Exclusive {
   public:
    explicit Exclusive(BoundContext* c) : c_(c) {
      if (c_->busy_.exchange(true)) {
        raise_invalid(
            "this ExecutionContext is in use by another thread: create one context per thread "
            "with engine.create_execution_context()");
      }
    }
    ~Exclusive() { c_->busy_.store(false); }

   private:
    BoundContext* c_;
  };

  std::atomic<bool> busy_{false};
  Engine engine_;  // shares the immutable engine data with every other context
  std::unique_ptr<ExecutionContext> ctx_;
  std::map<std::string, Binding> bound_;
};

// ---- Engine helpers --------------------------------------------------------------------------

nb::tuple engine_tensor_shape(const Engine& e, const std::string& name) {
  return shape_tuple(value_or_raise(e.tensor_shape(name)));
}
nb::object engine_tensor_dtype(const Engine& e, const std::string& name) {
  return numpy_dtype(value_or_raise(e.tensor_dtype(name)));
}
std::string engine_io_tensor_name(const Engine& e, int index) {
  if (index < 0 || index >= e.num_io_tensors()) {
    throw nb::index_error(("io tensor index " + std::to_string(index) + " is outside [0, " +
                           std::to_string(e.num_io_tensors()) + ")")
                              .c_str());
  }
  return e.io_tensor_name(index);
}

std::vector<uint8_t> bytes_of(nb::handle obj) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    raise_invalid("expected bytes (or another buffer), got " +
                  std::string(nb::type_name(obj.type()).c_str()));
  }
  std::vector<uint8_t> out(static_cast<uint8_t*>(view.buf),
                           static_cast<uint8_t*>(view.buf) + view.len);
  PyBuffer_Release(&view);
  return out;
}

// ---- TensorRT-style building ------------------------------------------------------------------

// TensorRT's memory pools. kiln's builder has no workspace bound yet (it sizes activation memory
// exactly, per run): set_memory_pool_limit records the value and get_memory_pool_limit reports it,
// but it bounds nothing.
enum class MemoryPoolType { kWORKSPACE = 0, kTACTIC_SHARED_MEMORY = 5 };

// BuilderConfig plus the memory pool limits recorded for TensorRT-style code, and the timing cache
// file the builds read and write (the path stands for TensorRT's create/set_timing_cache pair).
struct PyBuilderConfig : BuilderConfig {
  std::map<MemoryPoolType, uint64_t> pool_limits;
  std::string timing_cache_file;
};

// One graph input or output of a Network, as TensorRT's ITensor shows it: shape with -1 for each
// dynamic dim, and kiln's symbolic view beside it. Output shapes are inferred by the builder, so a
// parsed network knows only their dtype (shape None).
struct NetworkTensor {
  std::string name;
  DType dtype = DType::kUndefined;
  std::optional<std::vector<std::string>> symbolic_shape;
  std::optional<std::vector<int64_t>> shape;
  bool is_input = false;
};

NetworkTensor network_tensor(const Network& n, int index, bool input) {
  const std::vector<int>& ids = input ? n.graph.inputs : n.graph.outputs;
  if (index < 0 || index >= int(ids.size())) {
    throw nb::index_error(((input ? "input index " : "output index ") + std::to_string(index) +
                           " is outside [0, " + std::to_string(ids.size()) + ")")
                              .c_str());
  }
  const ir::Value& v = n.graph.values[ids[index]];
  NetworkTensor t;
  t.name = v.name;
  t.dtype = v.dtype;
  t.is_input = input;
  if (input && v.shape) {
    std::vector<std::string> sym;
    std::vector<int64_t> dims;
    for (const ir::Dim& d : *v.shape) {
      sym.push_back(d.to_string());
      dims.push_back(d.is_const() ? d.value() : -1);
    }
    t.symbolic_shape = std::move(sym);
    t.shape = std::move(dims);
  }
  return t;
}

Network& check_network_parsed(Network& n) {
  if (n.graph.nodes.empty() && n.graph.outputs.empty()) {
    raise_invalid(
        "the network is empty: parse a model into it first, e.g. kiln.OnnxParser(network, "
        "logger).parse(data)");
  }
  return n;
}

void warn_runtime(const std::string& message) {
  if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) throw nb::python_error();
}

// With a timing cache file: loaded first (one that cannot be used is a RuntimeWarning and an empty
// cache, as kiln build does) and written after a successful build.
Engine build_engine(const Builder& b, const Network& network, const PyBuilderConfig& py_config) {
  BuilderConfig config = py_config;
  const std::string& cache_file = py_config.timing_cache_file;
  if (!cache_file.empty()) {
    auto loaded = TimingCache::load(cache_file);
    if (!loaded.ok())
      warn_runtime(loaded.status().message() + "; building with an empty timing cache");
    config.set_timing_cache(
        std::make_shared<TimingCache>(loaded.ok() ? std::move(loaded).value() : TimingCache()));
  }
  StatusOr<Engine> e = [&] {
    nb::gil_scoped_release release;
    return b.build(network, config);
  }();
  if (e.ok() && config.timing_cache()) {
    Status saved = config.timing_cache()->save(cache_file);
    if (!saved.ok())
      warn_runtime(saved.message() + "; the engine is built, but the cache was not updated");
  }
  return value_or_raise(std::move(e));
}

std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>> profile_dimensions(
    const OptimizationProfile& p, const std::string& input) {
  auto it = p.inputs().find(input);
  if (it == p.inputs().end())
    raise(not_found("the profile has no dimensions for input '" + input + "'"));
  return std::make_tuple(it->second.min, it->second.opt, it->second.max);
}

nb::tuple profile_triple(const Engine& e, const std::string& input, int profile) {
  nb::list shapes;
  for (OptProfileSelector which :
       {OptProfileSelector::kMIN, OptProfileSelector::kOPT, OptProfileSelector::kMAX}) {
    shapes.append(shape_tuple(value_or_raise(e.profile_shape(input, profile, which))));
  }
  return nb::tuple(shapes);
}

nb::bytes engine_bytes(const Engine& e) {
  std::vector<uint8_t> b;
  {
    nb::gil_scoped_release release;
    b = e.serialize();
  }
  return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace
}  // namespace kiln::python

NB_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "kiln: ONNX inference optimizer and runtime (C++ API, same names).";
  register_error_translator();

  nb::enum_<Device>(m, "Device", "Where an engine runs.")
      .value("CPU", Device::kCPU)
      .value("CUDA", Device::kCUDA);
  nb::enum_<BuilderFlag>(m, "BuilderFlag", "Precision flags of a BuilderConfig (TensorRT's names).")
      .value("TF32", BuilderFlag::kTF32)
      .value("FP16", BuilderFlag::kFP16)
      .value("BF16", BuilderFlag::kBF16)
      .value("INT8", BuilderFlag::kINT8);
  nb::enum_<TensorIOMode>(m, "TensorIOMode", "Whether a named tensor is an engine input or output.")
      .value("NONE", TensorIOMode::kNONE)
      .value("INPUT", TensorIOMode::kINPUT)
      .value("OUTPUT", TensorIOMode::kOUTPUT);
  nb::enum_<OptProfileSelector>(m, "OptProfileSelector",
                                "Which shape of a profile: MIN, OPT or MAX.")
      .value("MIN", OptProfileSelector::kMIN)
      .value("OPT", OptProfileSelector::kOPT)
      .value("MAX", OptProfileSelector::kMAX);

  nb::enum_<MemoryPoolType>(
      m, "MemoryPoolType",
      "TensorRT's memory pools, for BuilderConfig.set_memory_pool_limit. kiln records the "
      "limits but bounds nothing with them yet: activation memory is sized exactly per run.")
      .value("WORKSPACE", MemoryPoolType::kWORKSPACE)
      .value("TACTIC_SHARED_MEMORY", MemoryPoolType::kTACTIC_SHARED_MEMORY);

  m.attr("kiln_version") = plan::kKilnVersion;  // written into every engine file
  m.attr("engine_format_version") =
      plan::kFormatVersion;  // the engine file format this build reads and writes
#ifdef KILN_PYTHON_WITH_CUDA
  m.attr("built_with_cuda") =
      true;  // the CUDA backend is compiled in (device_available says if it runs here)
#else
  m.attr("built_with_cuda") = false;
#endif

  m.def(
      "device_available", [](Device d) { return backends::get_backend(d).ok(); }, nb::arg("device"),
      "Whether this build of kiln has a backend for `device` (CUDA needs a CUDA build).");

  // kiln.empty_pinned's memory: `nbytes` of page-locked host memory from the CUDA backend as a
  // uint8 array that frees it when the last view of it goes.
  m.def(
      "_pinned_bytes",
      [](size_t nbytes) {
        struct Pinned {
          const backends::Backend* backend;
          void* data;
        };
        const backends::Backend* b = value_or_raise(backends::get_backend(Device::kCUDA));
        auto* owned = new Pinned{b, value_or_raise(b->allocate_host(nbytes))};
        nb::capsule owner(owned, [](void* p) noexcept {
          auto* h = static_cast<Pinned*>(p);
          h->backend->deallocate_host(h->data);
          delete h;
        });
        const size_t n = nbytes;
        return nb::ndarray<nb::numpy, uint8_t>(owned->data, 1, &n, owner).cast();
      },
      nb::arg("nbytes"));

  nb::class_<NetworkTensor>(m, "NetworkTensor",
                            "A graph input or output of a Network (TensorRT's ITensor).")
      .def_ro("name", &NetworkTensor::name)
      .def_prop_ro(
          "dtype",
          [](const NetworkTensor& t) {
            return t.dtype == DType::kUndefined ? nb::object(nb::none()) : numpy_dtype(t.dtype);
          },
          nb::sig("def dtype(self) -> numpy.dtype | None"),
          "The numpy dtype; None where the model declares none.")
      .def_prop_ro(
          "dtype_name", [](const NetworkTensor& t) { return std::string(dtype_name(t.dtype)); },
          "kiln's dtype name ('float32', 'bfloat16', ...; 'undefined' where the model declares "
          "none).")
      .def_ro("shape", &NetworkTensor::shape,
              "Inputs: the shape with -1 for each dynamic dim. Outputs: None (the builder infers "
              "them).")
      .def_ro("symbolic_shape", &NetworkTensor::symbolic_shape,
              "Inputs: each dim as text ('batch', '3'); outputs: None.")
      .def_ro("is_network_input", &NetworkTensor::is_input)
      .def("__repr__", [](const NetworkTensor& t) {
        std::string dims = "?";
        if (t.symbolic_shape) {
          dims.clear();
          for (const std::string& d : *t.symbolic_shape) dims += (dims.empty() ? "" : ", ") + d;
        }
        return "<kiln.NetworkTensor " + t.name + " " + std::string(dtype_name(t.dtype)) + " [" +
               dims + "]>";
      });

  nb::class_<Network>(m, "Network", "A parsed ONNX model (kiln.onnx.parse_file).")
      .def(nb::init<>(),
           "An empty network, for kiln.OnnxParser to fill (TensorRT's builder.create_network()).")
      .def_prop_ro("num_inputs", [](const Network& n) { return int(n.graph.inputs.size()); })
      .def_prop_ro("num_outputs", [](const Network& n) { return int(n.graph.outputs.size()); })
      .def_prop_ro(
          "num_layers", [](const Network& n) { return int(n.graph.nodes.size()); },
          "Nodes in the model.")
      .def(
          "get_input", [](const Network& n, int i) { return network_tensor(n, i, true); },
          nb::arg("index"), "Graph input `index` (initializers excluded), in model order.")
      .def(
          "get_output", [](const Network& n, int i) { return network_tensor(n, i, false); },
          nb::arg("index"), "Graph output `index`, in model order.")
      .def(
          "_take", [](Network& n, Network& other) { n = std::move(other); }, nb::arg("other"),
          "Moves a parsed network into this one, leaving `other` empty (kiln.OnnxParser uses it).")
      .def_prop_ro(
          "path", [](const Network& n) { return n.path; },
          "The model file; empty when parsed from bytes.")
      .def_prop_ro(
          "model_hash", [](const Network& n) { return n.model_hash; },
          "FNV-1a 64 of the model bytes.")
      .def_prop_ro("ir_version", [](const Network& n) { return n.ir_version; })
      .def_prop_ro("producer", [](const Network& n) { return n.producer; })
      .def_prop_ro("num_nodes", [](const Network& n) { return n.graph.nodes.size(); });

  // kiln.onnx (python/kiln/onnx.py) wraps these two with typed signatures.
  m.def(
      "_onnx_parse_file",
      [](const std::filesystem::path& path) {
        StatusOr<Network> net = [&] {
          nb::gil_scoped_release release;
          return onnx::parse_file(path.string());
        }();
        return value_or_raise(std::move(net));
      },
      nb::arg("path"));
  m.def(
      "_onnx_parse_bytes",
      [](nb::handle data, const std::string& model_dir) {
        std::vector<uint8_t> bytes = bytes_of(data);
        StatusOr<Network> net = [&] {
          nb::gil_scoped_release release;
          return onnx::parse_bytes(bytes, model_dir);
        }();
        return value_or_raise(std::move(net));
      },
      nb::arg("data"), nb::arg("model_dir") = "");

  nb::class_<OptimizationProfile>(m, "OptimizationProfile",
                                  "Min/opt/max shapes of each dynamic input.")
      .def(nb::init<>())
      .def(
          "set_dimensions",
          [](OptimizationProfile& p, const std::string& input, std::vector<int64_t> min,
             std::vector<int64_t> opt, std::vector<int64_t> max,
             std::optional<std::vector<int64_t>> steps) {
            check(steps ? p.set_dimensions(input, std::move(min), std::move(opt), std::move(max),
                                           std::move(*steps))
                        : p.set_dimensions(input, std::move(min), std::move(opt), std::move(max)));
          },
          nb::arg("input"), nb::arg("min"), nb::arg("opt"), nb::arg("max"),
          nb::arg("steps") = nb::none(),
          "Sets the shapes of one input; min <= opt <= max elementwise, checked when the engine is "
          "built. "
          "steps (one per dim, 1 for every value): a dim of step k takes min, min + k, ..., max "
          "only; the "
          "build proves the model for those values and set_input_shape refuses the others.")
      .def(
          "set_shape",
          [](OptimizationProfile& p, const std::string& input, std::vector<int64_t> min,
             std::vector<int64_t> opt, std::vector<int64_t> max) {
            check(p.set_dimensions(input, std::move(min), std::move(opt), std::move(max)));
          },
          nb::arg("input"), nb::arg("min"), nb::arg("opt"), nb::arg("max"),
          "Alias of set_dimensions (TensorRT's name).")
      .def(
          "set_shape_values",
          [](OptimizationProfile& p, const std::string& input, std::vector<int64_t> min,
             std::vector<int64_t> opt, std::vector<int64_t> max) {
            check(p.set_shape_values(input, std::move(min), std::move(opt), std::move(max)));
          },
          nb::arg("input"), nb::arg("min"), nb::arg("opt"), nb::arg("max"),
          "A shape-value input (TensorRT's shape tensors): an integer input whose values decide "
          "shapes takes, per "
          "element, values in [min, max] at run time; the build proves the model over them.")
      .def(
          "set_shape_values",
          [](OptimizationProfile& p, const std::string& input, const nb::ndarray<nb::ro>& value) {
            Tensor t = tensor_from_array(value);
            auto copy = Tensor::zeros(t.dtype(), t.shape());
            check(copy.status());
            if (t.nbytes()) std::memcpy(copy->data(), t.data(), t.nbytes());
            check(p.set_shape_values(input, std::move(copy).value()));
          },
          nb::arg("input"), nb::arg("value"),
          "The one value an input of any dtype takes (Resize's float scales): the engine is built "
          "for it and a run "
          "given another is refused.")
      .def("get_dimensions", &profile_dimensions, nb::arg("input"),
           "The (min, opt, max) shapes set for `input`.")
      .def("get_shape", &profile_dimensions, nb::arg("input"),
           "Alias of get_dimensions (TensorRT's name); NotFoundError for an input the profile does "
           "not set.")
      .def_prop_ro(
          "inputs",
          [](const OptimizationProfile& p) {
            std::vector<std::string> names;
            for (const auto& [name, dims] : p.inputs()) names.push_back(name);
            return names;
          },
          "Names of the inputs this profile sets.");

  nb::class_<PyBuilderConfig>(
      m, "BuilderConfig", "Profiles and precision policy; TF32 is on by default, as in TensorRT.")
      .def(nb::init<>())
      .def(
          "set_flag", [](PyBuilderConfig& c, BuilderFlag f) { c.set_flag(f); }, nb::arg("flag"))
      .def(
          "clear_flag", [](PyBuilderConfig& c, BuilderFlag f) { c.clear_flag(f); }, nb::arg("flag"))
      .def(
          "get_flag", [](const PyBuilderConfig& c, BuilderFlag f) { return c.get_flag(f); },
          nb::arg("flag"))
      .def_prop_ro(
          "flags", [](const PyBuilderConfig& c) { return c.flags(); },
          "The flags as a bit mask (1 << BuilderFlag).")
      .def(
          "add_profile", [](PyBuilderConfig& c, const OptimizationProfile& p) { c.add_profile(p); },
          nb::arg("profile"), "Adds a profile (copied).")
      .def(
          "add_optimization_profile",
          [](PyBuilderConfig& c, const OptimizationProfile& p) {
            c.add_profile(p);
            return int(c.profiles().size()) - 1;
          },
          nb::arg("profile"), "Adds a profile (copied) and returns its index (TensorRT's name).")
      .def_prop_ro("num_profiles",
                   [](const PyBuilderConfig& c) { return int(c.profiles().size()); })
      .def_prop_ro(
          "num_optimization_profiles",
          [](const PyBuilderConfig& c) { return int(c.profiles().size()); },
          "Alias of num_profiles (TensorRT's name).")
      .def(
          "set_memory_pool_limit",
          [](PyBuilderConfig& c, MemoryPoolType pool, uint64_t bytes) {
            c.pool_limits[pool] = bytes;
          },
          nb::arg("pool"), nb::arg("pool_size"),
          "Records a TensorRT memory pool limit. It bounds nothing yet: kiln's builder has no "
          "workspace pool, "
          "and activation memory is sized exactly for each run's shapes.")
      .def(
          "get_memory_pool_limit",
          [](const PyBuilderConfig& c, MemoryPoolType pool) {
            auto it = c.pool_limits.find(pool);
            return it == c.pool_limits.end() ? std::numeric_limits<uint64_t>::max() : it->second;
          },
          nb::arg("pool"), "The limit recorded for `pool`; 2**64 - 1 (no limit) when none was set.")
      .def_prop_rw(
          "builder_optimization_level",
          [](const PyBuilderConfig& c) { return c.builder_optimization_level(); },
          [](PyBuilderConfig& c, int level) { check(c.set_builder_optimization_level(level)); },
          "How hard kernels search for tactics, 0..5 (default 3): 0 takes each implementation's "
          "heuristic first "
          "choice without timing; from 1 on implementations may time their candidates on the "
          "device.")
      .def(
          "set_timing_cache_file",
          [](PyBuilderConfig& c, const std::filesystem::path& path) {
            c.timing_cache_file = path.string();
          },
          nb::arg("path"),
          "Builds read tactics from this timing cache file and write their choices back, so a "
          "rebuild times "
          "nothing and gives a byte-identical engine. A missing file is created; one that cannot "
          "be used is a "
          "RuntimeWarning and the build starts from an empty cache. An empty path turns the cache "
          "off.")
      .def_prop_ro(
          "timing_cache_file", [](const PyBuilderConfig& c) { return c.timing_cache_file; },
          "The timing cache file set_timing_cache_file gave; empty when none.")
      .def(
          "set_sequence_length",
          [](PyBuilderConfig& c, const std::string& input, int64_t length) {
            check(c.set_sequence_length(input, length));
          },
          nb::arg("input"), nb::arg("length"),
          "The length of sequence input `input` (an ONNX sequence(tensor) or optional(sequence)): "
          "the engine takes "
          "its elements as the tensor inputs 'input[0]' .. 'input[length-1]', each with shapes of "
          "its own (profiles "
          "name them so). A sequence output 'y' is likewise the outputs 'y[0]', ... A model with a "
          "sequence input "
          "builds only with its length set.")
      .def_prop_ro(
          "sequence_lengths", [](const PyBuilderConfig& c) { return c.sequence_lengths(); },
          "The sequence lengths set, by input name.")
      .def(
          "set_optional_present",
          [](PyBuilderConfig& c, const std::string& input, bool present) {
            c.set_optional_present(input, present);
          },
          nb::arg("input"), nb::arg("present"),
          "Whether optional input `input` holds a value in the engine built (default True): "
          "present, it is a tensor "
          "input of its name (or a sequence, as set_sequence_length says); absent, the engine has "
          "no input for it. "
          "An empty optional output likewise has no output tensor.")
      .def_prop_ro(
          "optional_present", [](const PyBuilderConfig& c) { return c.optional_present(); },
          "Whether each optional input named so far is present, by input name.");

  nb::class_<Engine>(
      m, "Engine",
      "A built engine: immutable, shareable by threads; each thread runs its own ExecutionContext.")
      .def_static(
          "load",
          [](const std::filesystem::path& path) {
            StatusOr<Engine> e = [&] {
              nb::gil_scoped_release release;
              return Engine::load(path.string());
            }();
            return value_or_raise(std::move(e));
          },
          nb::arg("path"),
          "Loads an engine file; a truncated, corrupted or mismatched file raises "
          "InvalidModelError.")
      .def_static(
          "deserialize",
          [](nb::handle data) {
            std::vector<uint8_t> bytes = bytes_of(data);
            StatusOr<Engine> e = [&] {
              nb::gil_scoped_release release;
              return Engine::deserialize(bytes);
            }();
            return value_or_raise(std::move(e));
          },
          nb::arg("data"), nb::sig("def deserialize(data: bytes) -> Engine"),
          "Loads an engine from bytes.")
      .def(
          "save",
          [](const Engine& e, const std::filesystem::path& path) {
            nb::gil_scoped_release release;
            check(e.save(path.string()));
          },
          nb::arg("path"), "Writes the engine file.")
      .def("serialize", &engine_bytes,
           "The engine file's bytes (what save() writes; Engine.deserialize reads them).")
      .def_prop_ro("num_io_tensors", &Engine::num_io_tensors, "Number of inputs plus outputs.")
      .def("io_tensor_name", &engine_io_tensor_name, nb::arg("index"),
           "Inputs first, then outputs, each in model order; IndexError outside [0, "
           "num_io_tensors).")
      .def("tensor_shape", &engine_tensor_shape, nb::arg("name"),
           "The shape with -1 for each dynamic dim (TensorRT's convention); see "
           "tensor_symbolic_shape.")
      .def(
          "tensor_symbolic_shape",
          [](const Engine& e, const std::string& name) {
            std::vector<std::string> dims;
            for (const ir::Dim& d : value_or_raise(e.tensor_symbolic_shape(name)))
              dims.push_back(d.to_string());
            return dims;
          },
          nb::arg("name"), "Each dim as text: ['batch_size', 'seq_len + 1', '8'].")
      .def("tensor_dtype", &engine_tensor_dtype, nb::arg("name"),
           nb::sig("def tensor_dtype(self, name: str) -> numpy.dtype"), "The tensor's numpy dtype.")
      .def("tensor_mode", &Engine::tensor_mode, nb::arg("name"),
           "INPUT, OUTPUT, or NONE for an unknown name.")
      .def_prop_ro("num_profiles", &Engine::num_profiles, "Number of optimization profiles.")
      .def_prop_ro("num_optimization_profiles", &Engine::num_profiles,
                   "Alias of num_profiles (TensorRT's name).")
      .def(
          "profile_shape",
          [](const Engine& e, const std::string& input, int profile,
             std::optional<OptProfileSelector> which) -> nb::object {
            if (!which) return profile_triple(e, input, profile);
            return shape_tuple(value_or_raise(e.profile_shape(input, profile, *which)));
          },
          nb::arg("input"), nb::arg("profile"), nb::arg("which").none() = nb::none(),
          nb::sig("def profile_shape(self, input: str, profile: int, which: OptProfileSelector | "
                  "None = None) -> "
                  "tuple[int, ...] | tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]"),
          "The MIN, OPT or MAX shape of `input` in `profile`; without `which`, the (min, opt, max) "
          "triple.")
      .def("is_shape_inference_io", &Engine::is_shape_inference_io, nb::arg("name"),
           "Whether `name` is a shape-value input: the run reads its values in host memory "
           "(TensorRT's name).")
      .def(
          "get_tensor_profile_values",
          [](const Engine& e, const std::string& name, int profile) {
            nb::list out;
            for (OptProfileSelector w :
                 {OptProfileSelector::kMIN, OptProfileSelector::kOPT, OptProfileSelector::kMAX}) {
              out.append(shape_tuple(value_or_raise(e.profile_tensor_values(name, profile, w))));
            }
            return nb::tuple(out);
          },
          nb::arg("name"), nb::arg("profile_index"),
          nb::sig("def get_tensor_profile_values(self, name: str, profile_index: int) -> "
                  "tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]"),
          "(min, opt, max) values of shape-value input `name` in profile `profile_index` "
          "(TensorRT's name).")
      .def("get_tensor_profile_shape", &profile_triple, nb::arg("name"), nb::arg("profile_index"),
           nb::sig("def get_tensor_profile_shape(self, name: str, profile_index: int) -> "
                   "tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]"),
           "(min, opt, max) shapes of input `name` in profile `profile_index` (TensorRT's name).")
      .def(
          "activation_bytes_formula",
          [](const Engine& e) { return e.activation_bytes_formula().to_string(); },
          "Activation memory in bytes as a formula over the input symbols.")
      .def_prop_ro("device", &Engine::device)
      .def_prop_ro("num_layers", &Engine::num_layers, "Nodes that run.")
      .def(
          "create_execution_context",
          [](const Engine& e) {
            return new BoundContext(e, value_or_raise(e.create_execution_context()));
          },
          nb::rv_policy::take_ownership,
          "A new context: per-thread shapes, addresses and activation memory.")
      // TensorRT 10 spellings, so code written against TensorRT reads the same.
      .def("get_tensor_name", &engine_io_tensor_name, nb::arg("index"),
           "Alias of io_tensor_name (TensorRT's name).")
      .def("get_tensor_shape", &engine_tensor_shape, nb::arg("name"),
           "Alias of tensor_shape (TensorRT's name).")
      .def("get_tensor_dtype", &engine_tensor_dtype, nb::arg("name"),
           nb::sig("def get_tensor_dtype(self, name: str) -> numpy.dtype"),
           "Alias of tensor_dtype (TensorRT's name).")
      .def("get_tensor_mode", &Engine::tensor_mode, nb::arg("name"),
           "Alias of tensor_mode (TensorRT's name).")
      .def("__repr__", [](const Engine& e) {
        std::string s = "<kiln.Engine " + std::string(device_name(e.device())) + ", " +
                        std::to_string(e.num_io_tensors()) + " io tensors:";
        for (int i = 0; i < e.num_io_tensors(); ++i) {
          std::string n = e.io_tensor_name(i);
          s += " " + n + (e.tensor_mode(n) == TensorIOMode::kINPUT ? "(in)" : "(out)");
        }
        return s + ">";
      });

  nb::class_<Builder>(
      m, "Builder",
      "Builds engines for a device. kiln.Builder(kiln.Device.CPU) is kiln's spelling; "
      "kiln.Builder(logger) is TensorRT's (it builds for the CPU unless device= says otherwise).")
      .def(nb::init<Device>(), nb::arg("device") = Device::kCPU)
      .def(
          "__init__",
          [](Builder* self, nb::handle logger, Device device) {
            if (!logger.is_none() && !nb::hasattr(logger, "log")) {
              throw nb::type_error(
                  "Builder(logger): expected a kiln.Logger (an object with log(severity, msg)) "
                  "or a kiln.Device");
            }
            new (self) Builder(device);
          },
          nb::arg("logger").none(), nb::arg("device") = Device::kCPU,
          nb::sig("def __init__(self, logger: object, device: Device = Device.CPU) -> None"))
      .def(
          "build",
          [](const Builder& b, const Network& network, const PyBuilderConfig& config) {
            return build_engine(b, network, config);
          },
          nb::arg("network"), nb::arg("config"),
          "Builds an engine; a profile that breaks a node raises with the node, dims and "
          "sub-range.")
      // TensorRT 10's building spellings. Where TensorRT returns None and logs, kiln raises the
      // typed error.
      .def(
          "create_network", [](const Builder&, uint32_t /*flags*/) { return Network(); },
          nb::arg("flags") = 0,
          "An empty Network for kiln.OnnxParser to fill. Flags are accepted and ignored: kiln "
          "networks always "
          "have explicit batch dims, and precision follows the BuilderConfig flags.")
      .def(
          "create_builder_config", [](const Builder&) { return PyBuilderConfig(); },
          "A new BuilderConfig.")
      .def(
          "create_optimization_profile", [](const Builder&) { return OptimizationProfile(); },
          "A new OptimizationProfile.")
      .def(
          "build_serialized_network",
          [](const Builder& b, Network& network, const PyBuilderConfig& config) {
            return engine_bytes(build_engine(b, check_network_parsed(network), config));
          },
          nb::arg("network"), nb::arg("config"), "Builds and returns the engine file's bytes.")
      .def(
          "build_engine_with_config",
          [](const Builder& b, Network& network, const PyBuilderConfig& config) {
            return build_engine(b, check_network_parsed(network), config);
          },
          nb::arg("network"), nb::arg("config"),
          "Builds an Engine (alias of build for a parsed network).");

  nb::class_<BoundContext>(m, "ExecutionContext",
                           "Runs an engine for one caller; create one per thread with "
                           "Engine.create_execution_context().")
      .def(
          "set_input_shape",
          [](BoundContext& c, const std::string& name, nb::handle shape) {
            c.set_input_shape(name, shape);
            return true;
          },
          nb::arg("name"), nb::arg("shape"),
          nb::sig(
              "def set_input_shape(self, name: str, shape: collections.abc.Sequence[int]) -> bool"),
          "Validated against the active profile: rank, each dim's range, shared symbols. Returns "
          "True "
          "(TensorRT's habit); errors raise.")
      .def("tensor_shape", &BoundContext::tensor_shape, nb::arg("name"),
           nb::sig("def tensor_shape(self, name: str) -> tuple[int, ...]"),
           "Inputs: the shape set; outputs: the exact shape the current input shapes imply.")
      .def("get_tensor_shape", &BoundContext::tensor_shape, nb::arg("name"),
           nb::sig("def get_tensor_shape(self, name: str) -> tuple[int, ...]"),
           "Alias of tensor_shape.")
      .def("infer_shapes", &BoundContext::infer_shapes,
           "Resolves every shape; raises naming the inputs still unset.")
      .def(
          "set_tensor_address",
          [](BoundContext& c, const std::string& name, nb::handle target) {
            c.set_tensor_address(name, target);
            return true;
          },
          nb::arg("name"), nb::arg("address").none(),
          nb::sig("def set_tensor_address(self, name: str, address: int | object | None) -> bool"),
          "Binds a tensor's memory. An int is a raw host pointer (you keep the memory alive and "
          "sized). "
          "An array (numpy or __dlpack__, C-contiguous, the engine's dtype) is kept alive by the "
          "context; "
          "an input array also sets the input shape, and execute() checks each array's shape "
          "against "
          "the run's exact shape. Returns True (TensorRT's habit); errors raise.")
      .def("tensor_address", &BoundContext::tensor_address, nb::arg("name"),
           "The bound address (0 when unset).")
      .def("get_tensor_address", &BoundContext::tensor_address, nb::arg("name"),
           "Alias of tensor_address.")
      .def("execute", &BoundContext::execute,
           "Runs with the bound addresses, without the GIL, and waits for the run. On the GPU the "
           "run is "
           "ordered after the work queued on stream 0 (torch's default stream), as "
           "execute_async_v3(0) is.")
      .def("execute_async_v3", &BoundContext::execute_async_v3, nb::arg("stream_handle").none(),
           nb::sig("def execute_async_v3(self, stream_handle: int | object) -> bool"),
           "TensorRT's enqueue: runs with the bound addresses on `stream_handle` (a cudaStream_t "
           "as an int, a "
           "torch.cuda.Stream or a CuPy stream) and returns True without waiting for the run. A "
           "CPU engine "
           "takes stream 0 only and runs synchronously. On the GPU stream 0 is CUDA's legacy "
           "default stream (torch's "
           "default stream): the run is ordered after the work queued there and before later work "
           "there, "
           "without waiting. Errors raise.")
      .def("execute_async", &BoundContext::execute_async_v3, nb::arg("stream").none(),
           nb::sig("def execute_async(self, stream: int | object) -> bool"),
           "Alias of execute_async_v3.")
      .def("run", &BoundContext::run, nb::arg("inputs"), nb::kw_only(),
           nb::arg("stream").none() = nb::none(),
           nb::sig("def run(self, inputs: collections.abc.Mapping[str, object] | "
                   "collections.abc.Sequence[object] | "
                   "object, *, stream: int | object | None = None) -> dict[str, typing.Any]"),
           "Runs on a dict of input arrays (or a list in engine input order, or one array) and "
           "returns a dict "
           "of output arrays of exactly their shapes. Host arrays: C-contiguous ones of the "
           "engine's dtype are "
           "read in place, other layouts copied, a different dtype raises InvalidArgumentError; "
           "outputs are numpy "
           "arrays owning kiln's memory (no copy); a CUDA engine copies them to and from the "
           "device. CUDA arrays "
           "(torch, CuPy, any __dlpack__; every input on the device, C-contiguous, the engine's "
           "dtype) are read in "
           "place and the outputs are new device arrays, torch or CuPy tensors when the inputs "
           "are. With "
           "`stream` (an int handle, a torch.cuda.Stream or a CuPy stream) the run is enqueued on "
           "it after the "
           "inputs' producers (DLPack's stream handshake) and not waited for; without it the run "
           "waits.")
      .def(
          "run",
          [](BoundContext& c, nb::handle output_names, nb::handle inputs, nb::handle) {
            return c.run_ort(output_names, inputs);
          },
          nb::arg("output_names").none(), nb::arg("input_feed"),
          nb::arg("run_options").none() = nb::none(),
          nb::sig("def run(self, output_names: collections.abc.Sequence[str] | None, input_feed: "
                  "collections.abc.Mapping[str, object] | collections.abc.Sequence[object], "
                  "run_options: object = None) "
                  "-> list[numpy.ndarray]"),
          "ONNX Runtime's spelling: returns a list of output arrays in the order of `output_names` "
          "(every output, in engine order, for None). run_options is accepted and ignored.")
      .def("set_optimization_profile", &BoundContext::set_optimization_profile, nb::arg("profile"))
      .def(
          "set_optimization_profile_async",
          [](BoundContext& c, int profile, uintptr_t) {
            c.set_optimization_profile(profile);
            return true;
          },
          nb::arg("profile_index"), nb::arg("stream_handle"),
          "TensorRT's name for set_optimization_profile; the switch is immediate, so the stream is "
          "not used.")
      .def_prop_ro("optimization_profile", &BoundContext::optimization_profile)
      .def_prop_ro("active_optimization_profile", &BoundContext::optimization_profile,
                   "Alias of optimization_profile (TensorRT's name).")
      .def_prop_ro(
          "profile_pinned", &BoundContext::profile_pinned,
          "Whether set_optimization_profile pinned the context. Unpinned, an engine with several "
          "profiles takes the one whose ranges hold every input's shape and whose opt shapes are "
          "nearest, chosen once every input shape is set (optimization_profile then says which).")
      .def_prop_ro("arena_bytes", &BoundContext::arena_bytes,
                   "Bytes of activation memory held now.")
      .def_prop_rw(
          "use_cuda_graph", &BoundContext::use_cuda_graph, &BoundContext::set_use_cuda_graph,
          "CUDA engines: capture each run once per set of input shapes (and IO addresses, stream) "
          "and replay it; ignored on the CPU and by engines with data-dependent sizes.")
      .def_prop_rw("cuda_graph_cache_capacity", &BoundContext::graph_capacity,
                   &BoundContext::set_graph_capacity,
                   "Captured graphs kept, the least recently used dropped first (default 4).")
      .def("cancel", &BoundContext::cancel,
           "Stops the run in progress on this context from another thread: it raises "
           "kiln.CancelledError. "
           "Checked between layers and loop iterations; a run that starts later is not affected.")
      .def_prop_rw("cpu_threads", &BoundContext::cpu_threads, &BoundContext::set_cpu_threads,
                   "CPU engines: the threads each run splits its kernels over, the calling thread "
                   "included (ONNX Runtime's intra_op_num_threads). Reads the count in use; set "
                   "1..256, or 0 for the default (KILN_CPU_THREADS, else the CPUs this process may "
                   "use). Contexts share one pool of workers.")
      .def_prop_rw(
          "max_loop_iterations", &BoundContext::max_loop_iterations,
          &BoundContext::set_max_loop_iterations,
          "A loop that runs at run time (an ONNX Loop whose trip count or condition is data) stops "
          "the "
          "run with an error naming it at this many iterations with its condition still true "
          "(default 1,000,000).")
      .def_prop_rw(
          "batch_buckets", &BoundContext::batch_buckets, &BoundContext::set_batch_buckets,
          "CUDA graphs: a batch runs at its bucket (the next one up), inputs padded with zero "
          "rows, "
          "outputs sliced back to their exact shapes. Raises where padding could change real rows "
          "(an output not starting with the batch, a reduction across it) and on the CPU.")
      .def_prop_ro(
          "cuda_graph_stats", &BoundContext::graph_stats,
          "{'captures', 'replays', 'evictions', 'cached'}: what the graph cache did so far.")
      .def_prop_ro("engine", &BoundContext::engine, nb::rv_policy::copy,
                   "The engine this context runs.");
}

// kiln build --int8 --calib: the model calibrated on kiln's CPU engine and written with INT8 Q/DQ
// nodes by the Python package's kiln.quantize (the Python that installed kiln, KILN_PYTHON, else
// python3 from PATH), into a temporary folder the returned object removes.
#pragma once

#include <memory>
#include <string>

#include "flags.h"

namespace kiln::cli {

// What --calib, --calibMethod and --calibCache asked for.
struct CalibrationRequest {
  std::string data;    // --calib: a folder of .npz feeds, one .npz stacking samples, or a cache
  std::string method;  // --calibMethod (kiln.quantize's default when empty)
  std::string cache;   // --calibCache: read when it exists, else written
};

// A Q/DQ model made for one build; the folder holding it goes with the last copy.
class CalibratedModel {
 public:
  const std::string& path() const { return path_; }
  static Result<std::shared_ptr<CalibratedModel>> make(const std::string& onnx,
                                                       const CalibrationRequest& request);
  ~CalibratedModel();
  CalibratedModel(const CalibratedModel&) = delete;
  CalibratedModel& operator=(const CalibratedModel&) = delete;

 private:
  CalibratedModel() = default;
  std::string dir_, path_;
};

// The interpreter kiln's Python commands run on: KILN_PYTHON when set, else python3.
std::string kiln_python();

}  // namespace kiln::cli

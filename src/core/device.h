// Devices an engine can target.
#pragma once

#include <string_view>

namespace kiln {

enum class Device { kCPU = 0, kCUDA = 1 };

inline std::string_view device_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

}  // namespace kiln

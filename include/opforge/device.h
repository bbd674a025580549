// Where a tensor's memory lives. The enum leaves room for more device kinds (the `forge`
// PrivateUse1 device registers as its own kind later).
#pragma once

#include <cstdint>
#include <string>

namespace opforge {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int32_t index = 0;

  bool operator==(const Device&) const = default;
};

// "cpu", "cuda:1".
std::string device_name(Device device);
std::string device_type_name(DeviceType type);

}  // namespace opforge

#include "phalanx/core/device.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  for (DeviceType type : {DeviceType::CUDA, DeviceType::Sim}) {
    const std::string name = type == DeviceType::CUDA ? "cuda" : "sim";
    if (text == name) return {type, 0};
    if (text.rfind(name + ":", 0) == 0) {
      const std::string idx = text.substr(name.size() + 1);
      if (!idx.empty() && idx.size() <= 4 && idx.find_first_not_of("0123456789") == std::string::npos)
        return {type, std::stoi(idx)};
    }
  }
  throw ValueError("unknown device '" + text + "': expected cpu, cuda, cuda:N, sim or sim:N");
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda:" + std::to_string(index);
    case DeviceType::Sim: return "sim:" + std::to_string(index);
  }
  return "device?" + std::to_string(static_cast<int>(type));
}

}  // namespace phalanx

#include "phalanx/core/tensor_map.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx {

void TensorMap::set(const std::string& name, const Tensor& t) {
  for (auto& item : items_)
    if (item.first == name) {
      item.second = t;
      return;
    }
  items_.emplace_back(name, t);
}

const Tensor* TensorMap::find(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return &item.second;
  return nullptr;
}

const Tensor& TensorMap::at(const std::string& name) const {
  if (const Tensor* t = find(name)) return *t;
  std::string have;
  for (const auto& item : items_) have += (have.empty() ? "" : ", ") + item.first;
  throw ValueError("no tensor named '" + name + "' (have: " + (have.empty() ? "none" : have) + ")");
}

std::vector<std::string> TensorMap::names() const {
  std::vector<std::string> out;
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

}  // namespace phalanx

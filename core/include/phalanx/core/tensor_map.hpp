#pragma once
// An insertion-ordered name -> tensor map: state dicts, .npz archives.
#include <string>
#include <utility>
#include <vector>

#include "phalanx/core/tensor.hpp"

namespace phalanx {

class TensorMap {
 public:
  using Item = std::pair<std::string, Tensor>;
  /// Inserts or replaces.
  void set(const std::string& name, const Tensor& t);
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  /// Throws ValueError listing the available names when `name` is missing.
  const Tensor& at(const std::string& name) const;
  const Tensor* find(const std::string& name) const;
  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  std::vector<std::string> names() const;

 private:
  std::vector<Item> items_;
};

}  // namespace phalanx

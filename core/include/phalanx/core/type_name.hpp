#pragma once
// Readable C++ type names for messages and printing.
#include <string>
#include <typeinfo>

namespace phalanx {

/// The demangled name of `type` without its namespaces, as PyTorch prints a class name:
/// phalanx::nn::Linear -> "Linear", my::TwoTower -> "TwoTower", a::B<c::D> -> "B<D>".
/// Falls back to the mangled name where the ABI cannot demangle it.
std::string short_type_name(const std::type_info& type);

template <typename T>
std::string short_type_name() {
  return short_type_name(typeid(T));
}

}  // namespace phalanx

#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace phalanx {

using Shape = std::vector<std::int64_t>;

std::int64_t numel_of(const Shape& s);
/// "[2, 3]", used in every shape error message.
std::string shape_str(const Shape& s);
/// Normalises a possibly negative dimension index; throws ValueError naming `op` if out of range.
int normalize_dim(std::int64_t dim, std::size_t ndim, const char* op);

}  // namespace phalanx

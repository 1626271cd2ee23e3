#include "phalanx/core/error.hpp"

#include "phalanx/core/dtype.hpp"

namespace phalanx {

namespace detail {
void throw_internal(const char* file, int line, const std::string& what) {
  throw InternalError(concat(file, ":", line, ": ", what,
                             " (an internal error in Phalanx: please report it)"));
}
}  // namespace detail

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
  }
  return "?";
}

}  // namespace phalanx

#include "phalanx/core/error.hpp"

#include <cstdio>

#include "phalanx/core/dtype.hpp"

namespace phalanx {

namespace detail {
void throw_internal(const char* file, int line, const std::string& what) {
  throw InternalError(concat(file, ":", line, ": ", what,
                             " (an internal error in Phalanx: please report it)"));
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out += static_cast<char>(ch);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", ch);
      out += b;
    }
  }
  return out;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}
}  // namespace detail

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Bool: return "bool";
  }
  return "?";
}

}  // namespace phalanx

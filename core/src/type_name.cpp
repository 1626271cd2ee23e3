#include "phalanx/core/type_name.hpp"

#include <cstdlib>
#include <memory>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

namespace phalanx {

namespace {
std::string demangle(const char* mangled) {
#if defined(__GNUG__)
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  if (status == 0 && out) return out.get();
#endif
  return mangled;
}
}  // namespace

std::string short_type_name(const std::type_info& type) {
  std::string full = demangle(type.name());
  // Classes in an unnamed namespace (test and example code) demangle with this prefix.
  const std::string anon = "(anonymous namespace)::";
  for (std::size_t at; (at = full.find(anon)) != std::string::npos;) full.erase(at, anon.size());
  // Drop every namespace (or enclosing class) qualifier, at any template depth: a qualifier
  // is the identifier run just before "::".
  std::string out;
  out.reserve(full.size());
  std::size_t word = 0;  // where the current identifier starts in `out`
  for (std::size_t i = 0; i < full.size(); ++i) {
    const char c = full[i];
    if (c == ':' && i + 1 < full.size() && full[i + 1] == ':') {
      out.resize(word);  // the qualifier and its "::" go
      ++i;
      continue;
    }
    const bool ident = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out += c;
    if (!ident) word = out.size();
  }
  return out;
}

}  // namespace phalanx

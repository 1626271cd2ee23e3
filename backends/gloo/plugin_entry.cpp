// The plugin's one C entry point.
#include <cstdio>

#include "gloo_backend.hpp"
#include "phalanx/backends/plugin_abi.h"

namespace {
void* create(const void* config, char* error, size_t error_len) {
  // Phalanx errors (TimeoutError for a rank that never joins, ...) propagate as C++
  // exceptions: plugins are C++ built against this Phalanx, see plugin_abi.h.
  return static_cast<phalanx::Backend*>(
      new phalanx::gloo_backend::GlooBackend(*static_cast<const phalanx::BackendConfig*>(config)));
}
void destroy(void* backend) { delete static_cast<phalanx::Backend*>(backend); }

const phalanx_plugin_descriptor kDescriptor = {
    PHALANX_PLUGIN_ABI_VERSION, "gloo", "comm", "Gloo 0.5 over TCP (CPU tensors)", nullptr, &create, &destroy,
};
}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}

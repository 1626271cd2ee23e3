// A plugin built for another ABI version (the registry must refuse it).
#include "phalanx/core/plugin_abi.h"

namespace {
void* create(const void*, char*, size_t) { return nullptr; }
const phalanx_plugin_descriptor kDescriptor = {999u, "badabi", "comm", "wrong ABI", nullptr, &create, nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}

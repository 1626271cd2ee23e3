// A plugin whose probe says it cannot run here (like NCCL without a GPU).
#include <cstdio>

#include "phalanx/core/plugin_abi.h"

namespace {
int probe(char* reason, size_t len) {
  std::snprintf(reason, len, "no frobnicator on this machine");
  return 0;
}
void* create(const void*, char*, size_t) { return nullptr; }
const phalanx_plugin_descriptor kDescriptor = {PHALANX_PLUGIN_ABI_VERSION, "unavailable", "comm", "never available",
                                               &probe, &create, nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}

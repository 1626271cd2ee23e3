/* The plugin ABI moved to core (device and communication plugins share it); this path
 * keeps working for plugins that include it. */
#include "phalanx/core/plugin_abi.h"

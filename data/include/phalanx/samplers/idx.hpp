#pragma once
// Moved to phalanx/data/idx.hpp (datasets and the DataLoader are the data component, data/);
// this path keeps working.
#include "phalanx/data/idx.hpp"

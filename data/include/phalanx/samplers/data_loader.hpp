#pragma once
// Moved to phalanx/data/data_loader.hpp (datasets and the DataLoader are the data component, data/);
// this path keeps working.
#include "phalanx/data/data_loader.hpp"

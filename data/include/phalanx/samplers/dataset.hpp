#pragma once
// Moved to phalanx/data/dataset.hpp (datasets and the DataLoader are the data component, data/);
// this path keeps working.
#include "phalanx/data/dataset.hpp"

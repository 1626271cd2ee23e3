#pragma once
// Umbrella for data/: datasets (tensor, .npy, IDX/MNIST, byte-level text), the read cache, the DataLoader.
#include "phalanx/data/data_cache.hpp"
#include "phalanx/data/data_loader.hpp"
#include "phalanx/data/dataset.hpp"
#include "phalanx/data/idx.hpp"
#include "phalanx/data/text_dataset.hpp"

#pragma once
// Umbrella for samplers/: samplers, datasets, the DataLoader.
#include "phalanx/samplers/data_loader.hpp"
#include "phalanx/samplers/dataset.hpp"
#include "phalanx/samplers/distributed_sampler.hpp"
#include "phalanx/samplers/idx.hpp"
#include "phalanx/samplers/micro_batch_sampler.hpp"
#include "phalanx/samplers/sampler.hpp"
#include "phalanx/samplers/shuffle.hpp"

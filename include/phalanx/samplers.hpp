#pragma once
// Umbrella for samplers/ (Sampler, DistributedSampler, MicroBatchSampler); it also brings in
// data/ (datasets, the DataLoader), which lived here before the two were split.
#include "phalanx/data.hpp"
#include "phalanx/samplers/distributed_sampler.hpp"
#include "phalanx/samplers/micro_batch_sampler.hpp"
#include "phalanx/samplers/sampler.hpp"
#include "phalanx/samplers/shuffle.hpp"

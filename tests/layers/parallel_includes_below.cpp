// Must compile: parallel may use every layer below it.
#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/tensor.hpp"
#include "phalanx/data/data_loader.hpp"
#include "phalanx/optim/sgd.hpp"
#include "phalanx/parallel/ddp.hpp"
#include "phalanx/samplers/distributed_sampler.hpp"

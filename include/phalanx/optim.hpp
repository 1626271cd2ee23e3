#pragma once
// Umbrella for optim/.
#include "phalanx/optim/adam.hpp"
#include "phalanx/optim/grad_scaler.hpp"
#include "phalanx/optim/lr_scheduler.hpp"
#include "phalanx/optim/optimizer.hpp"
#include "phalanx/optim/scaling.hpp"
#include "phalanx/optim/sgd.hpp"

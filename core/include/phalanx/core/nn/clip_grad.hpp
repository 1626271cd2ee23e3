#pragma once
// torch.nn.utils.clip_grad_norm_ / clip_grad_value_ (PyTorch 1.13).
#include <vector>

#include "phalanx/core/tensor.hpp"

namespace phalanx::nn {

/// Scales the gradients of `params` (those without one are skipped) in place so that their
/// total norm (the norm_type-norm of the per-tensor norms; infinity: the largest |g|) is at most
/// max_norm: each is multiplied by max_norm / (total + 1e-6) when that is below 1. Returns the
/// total norm before clipping. error_if_nonfinite: a NaN/inf total throws instead.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
/// Clamps every gradient of `params` into [-clip_value, clip_value] in place.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace phalanx::nn

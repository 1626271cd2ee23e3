#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/generator.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

Tensor dropout(const Tensor& x_in, float p, bool training, Generator* gen) {
  const Tensor x = ops_detail::contiguous_input(x_in);
  if (!ops_detail::is_reduced(x)) ops_detail::check_float(x, "dropout");
  if (!(p >= 0.f && p <= 1.f))
    throw ValueError(detail::concat("dropout: probability must be in [0, 1], got ", p));
  // The identity (eval, or p = 0: nanoGPT's default) returns x in any dtype, as PyTorch: a bf16
  // x under autocast is not widened and rounded back for nothing (two casts a pass each way).
  if (!training || p == 0.f) return x;
  if (ops_detail::is_reduced(x))
    return ops_detail::in_float32(x.dtype(), [=](const Tensor& t) { return dropout(t, p, training, gen); }, x);
  GeneratorGuard guard(gen);
  Generator& g = guard.get();
  // The mask is drawn on the host so it is the same for every device.
  Tensor mask = Tensor::empty(x.shape());
  float* m = mask.data<float>();
  const float keep_scale = p < 1.f ? 1.f / (1.f - p) : 0.f;
  for (std::int64_t i = 0; i < mask.numel(); ++i) m[i] = g.uniform() >= p ? keep_scale : 0.f;
  return mul(x, mask.to(x.device()));
}

}  // namespace phalanx

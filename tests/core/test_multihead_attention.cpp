// nn::MultiheadAttention against PyTorch 1.13's nn.MultiheadAttention (batch_first; self- and
// cross-attention, Bool and Float attn_mask, per-head masks, key_padding_mask; the fused and
// the explicit path; sequence first): outputs, weights and every gradient within 1e-5
// (tests/fixtures/gpt_parity.npz, scripts/fixtures/gpt.py); PyTorch's init; the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "phalanx/core/memory_stats.hpp"
#include "support/gpt_fixture.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

/// An int64 0/1 array as a Bool tensor.
Tensor to_bool(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::Bool);
  auto* p = static_cast<unsigned char*>(out.raw_data());
  const std::int64_t* s = t.data<std::int64_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = s[i] != 0;
  return out;
}

void close(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-5) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  CHECK(max_rel_err(got, want) <= tol);
}

}  // namespace

TEST_CASE("MultiheadAttention equals PyTorch 1.13: outputs, weights and every gradient within 1e-5") {
  for (const std::string c : {"self", "cross", "mask3d", "plain"}) {
    CAPTURE(c);
    const std::string p = "mha_" + c + ".";
    nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(16, 4).batch_first(true));
    CHECK(mha.state_dict().names() ==
          std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
    mha.load_state_dict(under(p + "init."));
    Tensor q = fx(p + "query").clone().requires_grad_(true);
    Tensor k = fixture().contains(p + "key") ? fx(p + "key").clone().requires_grad_(true) : q;
    Tensor v = fixture().contains(p + "value") ? fx(p + "value").clone().requires_grad_(true) : q;
    Tensor am, kpm;
    if (const Tensor* m = fixture().find(p + "attn_mask")) am = m->dtype() == DType::Int64 ? to_bool(*m) : *m;
    if (const Tensor* m = fixture().find(p + "key_padding_mask")) kpm = to_bool(*m);
    const bool need_weights = fixture().contains(p + "weights");
    const bool average = c != "mask3d";
    auto [out, weights] = mha.forward(q, k, v, kpm, am, need_weights, average);
    close(out, fx(p + "out"), "out");
    if (need_weights) close(weights, fx(p + "weights"), "weights");
    else CHECK_FALSE(weights.defined());
    out.backward(fx(p + "gy"));
    close(q.grad(), fx(p + "grad.query"), "grad.query");
    if (!k.is_same(q)) {
      close(k.grad(), fx(p + "grad.key"), "grad.key");
      close(v.grad(), fx(p + "grad.value"), "grad.value");
    }
    for (const auto& [name, t] : mha.named_parameters()) close(t.grad(), fx(p + "grad." + name), "grad." + name);

    // The same through the other paths: without weights (the fused kernel) and sequence first.
    if (need_weights) {
      auto [fused, none] = mha.forward(q, k, v, kpm, am, false);
      close(fused, fx(p + "out"), "fused out");
    }
    nn::MultiheadAttention seq_first(nn::MultiheadAttentionOptions(16, 4));
    seq_first.load_state_dict(mha.state_dict());
    const Tensor qs = permute(q, {1, 0, 2});
    const Tensor ks = k.is_same(q) ? qs : permute(k, {1, 0, 2}), vs = v.is_same(q) ? qs : permute(v, {1, 0, 2});
    close(permute(std::get<0>(seq_first.forward(qs, ks, vs, kpm, am)), {1, 0, 2}), fx(p + "out"), "sequence first");
  }
}

TEST_CASE("MultiheadAttention: PyTorch's init, unbatched input, and one-line errors") {
  Generator g(1);
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(32, 4).batch_first(true), &g);
  const float bound = std::sqrt(6.f / (32 + 96));
  const auto w = mha.in_proj_weight.to_vector<float>();
  float lo = 1, hi = -1;
  for (float x : w) lo = std::min(lo, x), hi = std::max(hi, x);
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(hi > 0.9f * bound);  // xavier's bound, not a Linear's 1/sqrt(32)
  for (float x : mha.in_proj_bias.to_vector<float>()) CHECK(x == 0.f);
  for (float x : mha.out_proj->bias.to_vector<float>()) CHECK(x == 0.f);
  for (float x : mha.out_proj->weight.to_vector<float>()) CHECK(std::abs(x) <= 1.f / std::sqrt(32.f));
  CHECK(mha.describe() == "MultiheadAttention(embed_dim=32, num_heads=4, dropout=0, bias=True, batch_first=True)");

  // Unbatched [L, E] equals a batch of one.
  const Tensor x = randn({5, 32}, &g);
  NoGradGuard ng;
  const Tensor one = std::get<0>(mha.forward(x, x, x));
  const Tensor xb = reshape(x, {1, 5, 32});
  close(reshape(std::get<0>(mha.forward(xb, xb, xb)), {5, 32}), one, "unbatched");

  CHECK_THROWS_WITH_AS(nn::MultiheadAttention(30, 4),
                       "MultiheadAttention: num_heads 4 does not divide embed_dim 30: choose a head count that divides it",
                       ValueError);
  const Tensor q = randn({2, 5, 32}, &g), kv = randn({2, 6, 32}, &g);
  CHECK_THROWS_WITH_AS(mha.forward(q, kv, kv, to_bool(zeros({2, 5}, DType::Int64))),
                       "MultiheadAttention: key_padding_mask must be [N, S] = [2, 6], got [2, 5]", ShapeError);
  CHECK_THROWS_WITH_AS(mha.forward(q, kv, kv, zeros({2, 6})),
                       "MultiheadAttention: key_padding_mask must be Bool (true = padding, ignored), got float32",
                       TypeError);
  CHECK_THROWS_WITH_AS(mha.forward(q, kv, kv, Tensor(), zeros({6, 5})),
                       "MultiheadAttention: attn_mask must be [L, S] = [5, 6] or [N * num_heads, L, S] = [8, 5, 6], "
                       "got [6, 5]",
                       ShapeError);
  CHECK_THROWS_AS(mha.forward(q, randn({2, 6, 16}, &g), kv), ShapeError);
}

TEST_CASE("MultiheadAttention need_weights with a padding mask builds no [N, H, L, S] float mask") {
  Generator g(4);
  const std::int64_t N = 2, H = 4, L = 64, E = 32;
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(E, H).batch_first(true), &g);
  mha.eval();
  const Tensor x = randn({N, L, E}, &g);
  Tensor pad = zeros({N, L}, DType::Bool);
  for (std::int64_t s = L - 5; s < L; ++s) pad.data<bool>()[s] = true;  // row 0: last 5 keys padding
  NoGradGuard ng;
  const auto peak_of = [&](const Tensor& kpm) {
    Tensor out, w;
    reset_cpu_peak_memory();
    const std::size_t before = cpu_memory_stats().allocated_bytes;
    std::tie(out, w) = mha.forward(x, x, x, kpm, Tensor(), true, false);
    return cpu_memory_stats().peak_allocated_bytes - before;
  };
  const std::size_t plain = peak_of(Tensor()), padded = peak_of(pad);
  const std::size_t scores_bytes = static_cast<std::size_t>(N * H * L * L) * sizeof(float);
  INFO("peak without mask ", plain, " B, with the padding mask ", padded, " B; one [N, H, L, S] float: ",
       scores_bytes, " B");
  CHECK(padded < plain + scores_bytes / 2);  // the Bool mask broadcast (1 B an element) at most
  // The same weights as the fused path's output: padding keys get weight 0.
  Tensor out, w;
  std::tie(out, w) = mha.forward(x, x, x, pad, Tensor(), true, false);
  const auto wv = w.to_vector<float>();
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t s = L - 5; s < L; ++s) CHECK(wv[static_cast<std::size_t>((h * L + 3) * L + s)] == 0.f);
  const auto [fused, none] = mha.forward(x, x, x, pad, Tensor(), false);
  CHECK(max_rel_err(out, fused) < 1e-5);
}

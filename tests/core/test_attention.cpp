// scaled_dot_product_attention (docs/attention.md): the fused kernel against a reference
// composed of existing 2-D ops, head by head; finite-difference gradients; the dropout
// stream; float and Bool masks and their broadcasting; fully masked rows; the three SIMD
// levels; the sim device; bad input; PyTorch 1.13 parity; and peak memory growing linearly
// with the sequence length.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "phalanx/core/kernels.hpp"
#include "phalanx/core/memory_stats.hpp"
#include "phalanx/core/npy.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using phalanx::test::gradcheck;
using phalanx::test::max_rel_err;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

Tensor randn_t(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, &g);
}

/// Sets an environment variable for a scope.
struct EnvGuard {
  std::string name;
  EnvGuard(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~EnvGuard() { ::unsetenv(name.c_str()); }
};

/// The vector levels PHALANX_ATTENTION_SIMD caps the kernel to. A level this CPU lacks falls
/// back to a lower one silently, so the tests say when they could not run it.
const char* const kLevels[3] = {"scalar", "avx2", "avx512"};
bool level_available(int level) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (level == 2) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  if (level == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return true;
#else
  return level == 0;
#endif
}

/// [B, rows, cols] slice h as a [rows, cols] tensor (differentiable).
Tensor head_of(const Tensor& t, std::int64_t h) {
  const std::int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  const Tensor flat = reshape(t, {t.numel() / (rows * cols), rows, cols});
  return reshape(narrow(flat, 0, h, 1), {rows, cols});
}

/// The [L, S] additive mask of head h: the float mask broadcast (right-aligned) from its
/// shape to lead + [L, S], plus -inf above the diagonal when causal.
Tensor head_mask(const Tensor& mask, const Shape& lead, std::int64_t l, std::int64_t s, std::int64_t h,
                 bool causal) {
  std::vector<float> out(static_cast<std::size_t>(l * s), 0.f);
  Shape full = lead;
  full.push_back(l);
  full.push_back(s);
  std::vector<std::int64_t> idx(full.size());
  std::int64_t rem = h;
  for (int d = static_cast<int>(lead.size()) - 1; d >= 0; --d) {
    idx[d] = rem % lead[d];
    rem /= lead[d];
  }
  std::vector<float> m;
  if (mask.defined()) m = mask.to_vector<float>();
  for (std::int64_t i = 0; i < l; ++i)
    for (std::int64_t j = 0; j < s; ++j) {
      float v = 0.f;
      if (mask.defined()) {
        idx[full.size() - 2] = i;
        idx[full.size() - 1] = j;
        const Shape& ms = mask.shape();
        std::int64_t off = 0;
        for (std::size_t k = 0; k < ms.size(); ++k) {
          const std::size_t fd = full.size() - ms.size() + k;
          off = off * ms[k] + (ms[k] == 1 ? 0 : idx[fd]);
        }
        v = m[static_cast<std::size_t>(off)];
      }
      if (causal && j > i) v = -kInf;
      out[static_cast<std::size_t>(i * s + j)] = v;
    }
  return tensor(out, {l, s});
}

/// The documented dropout stream: weight (head, i, j) is kept when the top 24 bits of
/// output (head * L + i) * S + j of SplitMix64 seeded with the call's seed are >= p * 2^24.
std::uint64_t split_mix_output(std::uint64_t seed, std::uint64_t n) {
  std::uint64_t x = seed + (n + 1) * 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
Tensor head_dropout(std::uint64_t seed, float p, std::int64_t h, std::int64_t l, std::int64_t s) {
  std::vector<float> z(static_cast<std::size_t>(l * s));
  for (std::int64_t i = 0; i < l; ++i)
    for (std::int64_t j = 0; j < s; ++j) {
      const auto n = static_cast<std::uint64_t>((h * l + i) * s + j);
      const float u = static_cast<float>(split_mix_output(seed, n) >> 40) * 0x1p-24f;
      z[static_cast<std::size_t>(i * s + j)] = u >= p ? 1.f / (1.f - p) : 0.f;
    }
  return tensor(z, {l, s});
}

struct Case {
  Shape lead;
  std::int64_t l, s, e, ev;
  bool causal = false;
  std::optional<double> scale;
  Shape mask_shape;  // empty: no mask
  float dropout_p = 0.f;
  std::optional<float> masked_row;  // every mask entry of query row 0 set to this (a masked row)
};

std::string describe(const Case& c) {
  return "lead " + shape_str(c.lead) + " L " + std::to_string(c.l) + " S " + std::to_string(c.s) + " E " +
         std::to_string(c.e) + " Ev " + std::to_string(c.ev) + (c.causal ? " causal" : "") +
         (c.scale ? " scale " + std::to_string(*c.scale) : "") +
         (c.mask_shape.empty() ? "" : " mask " + shape_str(c.mask_shape)) +
         (c.dropout_p > 0 ? " dropout " + std::to_string(c.dropout_p) : "") +
         (c.masked_row ? " row 0 masked with " + std::to_string(*c.masked_row) : "");
}

Shape with(Shape lead, std::int64_t a, std::int64_t b) {
  lead.push_back(a);
  lead.push_back(b);
  return lead;
}

/// A float mask: mostly 0 with some -inf (never a whole row) and some finite biases.
Tensor make_mask(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  const std::int64_t cols = s.back();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float u = g.uniform();
    p[i] = (i % cols != 0 && u < 0.2f) ? -kInf : u < 0.5f ? 0.f : g.normal();
  }
  return t;
}

struct Inputs {
  Tensor q, k, v, mask;
};
Inputs make_inputs(const Case& c, std::uint64_t seed) {
  Inputs in{randn_t(with(c.lead, c.l, c.e), seed), randn_t(with(c.lead, c.s, c.e), seed + 1),
            randn_t(with(c.lead, c.s, c.ev), seed + 2), Tensor()};
  if (!c.mask_shape.empty()) in.mask = make_mask(c.mask_shape, seed + 3);
  if (c.masked_row) {
    const std::int64_t rows = c.mask_shape.at(c.mask_shape.size() - 2), cols = c.mask_shape.back();
    float* p = in.mask.data<float>();
    for (std::int64_t i = 0; i < in.mask.numel(); ++i)
      if (i / cols % rows == 0) p[i] = *c.masked_row;
  }
  return in;
}

std::int64_t heads(const Case& c) {
  std::int64_t b = 1;
  for (auto d : c.lead) b *= d;
  return b;
}

/// Each row's maximum (0 for a row of -inf), repeated along the row, as a constant: the
/// reference subtracts it before log_softmax, whose x - (max + log sum) loses log sum when
/// every score is about -1e9.
Tensor row_max(const Tensor& scores) {
  const std::int64_t rows = scores.shape()[0], cols = scores.shape()[1];
  std::vector<float> s = scores.detach().to_vector<float>();
  for (std::int64_t i = 0; i < rows; ++i) {
    float* r = s.data() + i * cols;
    float m = *std::max_element(r, r + cols);
    if (m == -kInf) m = 0.f;
    std::fill(r, r + cols, m);
  }
  return tensor(s, {rows, cols});
}

/// Compares the fused op's output and q/k/v gradients with the reference built head by
/// head from matmul, log_softmax and exp.
void check_against_reference(const Case& c, double tol = 2e-5) {
  CAPTURE(describe(c));
  Inputs in = make_inputs(c, 11);
  const std::uint64_t gen_seed = 99;
  // Fused.
  Tensor q = in.q.detach().requires_grad_(true), k = in.k.detach().requires_grad_(true),
         v = in.v.detach().requires_grad_(true);
  Generator gen(gen_seed);
  Tensor out = scaled_dot_product_attention(q, k, v, in.mask, c.dropout_p, c.causal, c.scale, &gen);
  REQUIRE(out.shape() == with(c.lead, c.l, c.ev));
  Tensor r = randn_t(out.shape(), 5);
  out.backward(r);
  // Reference.
  Tensor rq = in.q.detach().requires_grad_(true), rk = in.k.detach().requires_grad_(true),
         rv = in.v.detach().requires_grad_(true);
  const float scale = static_cast<float>(c.scale ? *c.scale : 1.0 / std::sqrt(double(c.e)));
  const std::uint64_t drop_seed = Generator(gen_seed).next_u64();
  Tensor loss;
  for (std::int64_t h = 0; h < heads(c); ++h) {
    Tensor scores = add(mul(matmul(head_of(rq, h), transpose(head_of(rk, h), 0, 1)), scale),
                        head_mask(in.mask, c.lead, c.l, c.s, h, c.causal));
    Tensor w = exp(log_softmax(sub(scores, row_max(scores)), -1));
    if (c.dropout_p > 0) w = mul(w, head_dropout(drop_seed, c.dropout_p, h, c.l, c.s));
    Tensor oh = matmul(w, head_of(rv, h));
    CHECK(max_rel_err(head_of(out, h).detach(), oh.detach()) < tol);
    Tensor part = sum(mul(oh, head_of(r, h)));
    loss = loss.defined() ? add(loss, part) : part;
  }
  loss.backward();
  CHECK(max_rel_err(q.grad(), rq.grad()) < tol);
  CHECK(max_rel_err(k.grad(), rk.grad()) < tol);
  CHECK(max_rel_err(v.grad(), rv.grad()) < tol);
}

}  // namespace

TEST_CASE("attention: the fused kernel equals softmax(q k^T * scale + mask) v, outputs and gradients") {
  std::vector<Case> cases = {
      {{2, 3}, 5, 5, 4, 4},
      {{2}, 7, 7, 8, 8, true},
      {{3}, 9, 6, 5, 3},                   // L != S, Ev != E, widths below one vector
      {{2}, 6, 11, 4, 6, true},            // causal with L < S (top-left aligned)
      {{2}, 11, 6, 4, 6, true},            // causal with L > S
      {{1, 2}, 70, 130, 20, 36},           // several tiles, partial last tiles
      {{2}, 150, 150, 32, 32, true},       // causal across tiles
      {{2}, 130, 70, 17, 33, true, 0.3},  // causal, scale, odd widths
      {{2, 2}, 8, 9, 4, 4, false, std::nullopt, {8, 9}},            // [L, S] mask
      {{2, 3}, 8, 9, 4, 4, false, std::nullopt, {2, 1, 1, 9}},      // padding mask [B, 1, 1, S]
      {{2, 3}, 8, 9, 4, 4, true, 0.7, {3, 8, 1}},                   // per-head, per-row bias, causal
      {{2}, 100, 90, 16, 16, false, std::nullopt, {2, 100, 90}},    // mask across tiles
      {{2}, 40, 40, 8, 8, true, std::nullopt, {}, 0.3f},            // dropout
      {{1, 2}, 70, 80, 16, 20, false, std::nullopt, {80}, 0.5f},    // dropout, mask, tiles
      {{1}, 1, 1, 1, 1},
      {{}, 6, 5, 3, 2},                                             // no leading dims
      // A row masked with a large finite value (every score rounds to it): its weights are
      // 1/S, not exp(s - lse) = 1 (lse rounds to the scores too).
      {{2}, 4, 8, 4, 4, false, std::nullopt, {4, 8}, 0.f, -1e9f},
      {{2}, 4, 8, 4, 4, false, std::nullopt, {4, 8}, 0.f, std::numeric_limits<float>::lowest()},
      {{2}, 70, 130, 8, 8, false, std::nullopt, {70, 130}, 0.f, -1e9f},  // across tiles
  };
  for (int level = 0; level < 3; ++level) {
    if (!level_available(level)) {
      MESSAGE("this CPU has no ", kLevels[level], " level: its reference cases ran at a lower level");
      continue;
    }
    EnvGuard env("PHALANX_ATTENTION_SIMD", kLevels[level]);
    CAPTURE(kLevels[level]);
    for (const Case& c : cases) check_against_reference(c);
  }
}

TEST_CASE("attention: a float attn_mask that requires grad is refused under grad mode, accepted without") {
  Tensor q = randn_t({2, 4, 3}, 1), k = randn_t({2, 5, 3}, 2), v = randn_t({2, 5, 3}, 3);
  Tensor bias = randn_t({4, 5}, 4).requires_grad_(true);
  try {
    scaled_dot_product_attention(q, k, v, bias);
    FAIL("no error for a mask that requires grad");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()) ==
          "scaled_dot_product_attention: attn_mask requires grad, but its gradient is not computed: detach() it, "
          "or add the bias to the scores with matmul/softmax");
  }
  CHECK_NOTHROW(scaled_dot_product_attention(q, k, v, bias.detach()));
  NoGradGuard no_grad;
  CHECK_NOTHROW(scaled_dot_product_attention(q, k, v, bias));
}

TEST_CASE("attention: a row masked with -1e9 or lowest() gets weights 1/S in the backward too") {
  for (const float m : {-1e9f, std::numeric_limits<float>::lowest()}) {
    CAPTURE(m);
    std::vector<float> mv(4 * 8, 0.f);
    for (int j = 0; j < 8; ++j) mv[static_cast<std::size_t>(j)] = m;
    Tensor q = randn_t({4, 2}, 1), k = randn_t({8, 2}, 2), v = randn_t({8, 1}, 3).requires_grad_(true);
    Tensor out = scaled_dot_product_attention(q, k, v, tensor(mv, {4, 8}));
    std::vector<float> g(4, 0.f);
    g[0] = 1.f;  // d out[0] / d v[j] = weight (0, j) = 1/8
    out.backward(tensor(g, {4, 1}));
    const std::vector<float> dv = v.grad().to_vector<float>();
    for (int j = 0; j < 8; ++j) CHECK(dv[static_cast<std::size_t>(j)] == doctest::Approx(0.125).epsilon(1e-6));
  }
}

TEST_CASE("attention: the AVX-512, AVX2 and scalar paths agree") {
  const Case c{{2, 2}, 90, 100, 24, 40, true, std::nullopt, {2, 1, 90, 100}, 0.2f};
  Tensor outs[3], gq[3], gk[3], gv[3];
  for (int i = 0; i < 3; ++i) {
    if (!level_available(i)) MESSAGE("this CPU has no ", kLevels[i], " level: compared a lower level in its place");
    EnvGuard env("PHALANX_ATTENTION_SIMD", kLevels[i]);
    Inputs in = make_inputs(c, 3);
    Tensor q = in.q.requires_grad_(true), k = in.k.requires_grad_(true), v = in.v.requires_grad_(true);
    Generator gen(4);
    outs[i] = scaled_dot_product_attention(q, k, v, in.mask, c.dropout_p, c.causal, c.scale, &gen);
    outs[i].backward(randn_t(outs[i].shape(), 8));
    gq[i] = q.grad();
    gk[i] = k.grad();
    gv[i] = v.grad();
  }
  for (int i = 0; i < 2; ++i) {
    CAPTURE(kLevels[i]);
    CHECK(max_rel_err(outs[i], outs[2]) < 1e-5);
    CHECK(max_rel_err(gq[i], gq[2]) < 1e-5);
    CHECK(max_rel_err(gk[i], gk[2]) < 1e-5);
    CHECK(max_rel_err(gv[i], gv[2]) < 1e-5);
  }
  EnvGuard bad("PHALANX_ATTENTION_SIMD", "sse9");
  Inputs in = make_inputs(c, 3);
  CHECK_THROWS_AS(scaled_dot_product_attention(in.q, in.k, in.v), ConfigError);
}

TEST_CASE("attention: finite-difference gradients of q, k and v") {
  const std::vector<Case> cases = {
      {{2}, 3, 3, 2, 2},
      {{1, 2}, 4, 4, 3, 3, true},
      {{2}, 3, 5, 2, 3, false, 0.4},                               // L != S, Ev != E, scale
      {{2}, 4, 3, 3, 2, true, std::nullopt, {4, 3}},               // causal with a float mask
      {{2, 1}, 3, 4, 2, 2, false, std::nullopt, {2, 1, 1, 4}},     // padding mask
      {{2}, 4, 4, 3, 2, true, std::nullopt, {}, 0.3f},             // dropout (fixed seed)
  };
  for (const Case& c : cases) {
    CAPTURE(describe(c));
    Inputs in = make_inputs(c, 21);
    const Tensor mask = in.mask;
    gradcheck(
        [&](auto& x) {
          Generator gen(5);  // the same seed each call: the same dropped weights
          return scaled_dot_product_attention(x[0], x[1], x[2], mask, c.dropout_p, c.causal, c.scale, &gen);
        },
        {in.q, in.k, in.v});
  }
}

TEST_CASE("attention: the dropout stream drops about p of the weights, p = 1 drops all, p = 0 none") {
  const Case c{{4}, 64, 64, 8, 8};
  Inputs in = make_inputs(c, 2);
  // v = identity columns: out[i, j] is the (scaled, kept) weight (i, j) itself.
  Tensor v = Tensor::empty({4, 64, 64});
  float* pv = v.data<float>();
  for (std::int64_t i = 0; i < v.numel(); ++i) pv[i] = (i / 64) % 64 == i % 64 ? 1.f : 0.f;
  Generator g(3);
  const auto w = scaled_dot_product_attention(in.q, in.k, v, Tensor(), 0.25f, false, std::nullopt, &g)
                     .to_vector<float>();
  std::int64_t zeros_seen = 0;
  for (float x : w) zeros_seen += x == 0.f;
  const double frac = double(zeros_seen) / double(w.size());
  CHECK(frac > 0.23);
  CHECK(frac < 0.27);
  Generator g1(3);
  for (float x : scaled_dot_product_attention(in.q, in.k, in.v, Tensor(), 1.f, false, std::nullopt, &g1)
                     .to_vector<float>())
    CHECK(x == 0.f);
  // p = 0 draws nothing from the generator and equals the call without dropout.
  Generator g2(3);
  Tensor a = scaled_dot_product_attention(in.q, in.k, in.v, Tensor(), 0.f, false, std::nullopt, &g2);
  CHECK(g2.next_u64() == Generator(3).next_u64());
  CHECK(max_rel_err(a, scaled_dot_product_attention(in.q, in.k, in.v)) == 0.0);
  // Each call draws one seed: two calls drop differently, the same seed drops the same.
  Generator g3(3);
  Tensor b1 = scaled_dot_product_attention(in.q, in.k, in.v, Tensor(), 0.5f, false, std::nullopt, &g3);
  Tensor b2 = scaled_dot_product_attention(in.q, in.k, in.v, Tensor(), 0.5f, false, std::nullopt, &g3);
  Generator g4(3);
  Tensor b3 = scaled_dot_product_attention(in.q, in.k, in.v, Tensor(), 0.5f, false, std::nullopt, &g4);
  CHECK(max_rel_err(b1, b2) > 1e-3);
  CHECK(max_rel_err(b1, b3) == 0.0);
}

TEST_CASE("attention: a row whose every score is masked gives zeros and no gradient (PyTorch 2.5+)") {
  // Row 2 fully masked (float -inf, or Bool false), row 0 partly; tiles of 64 cross row 70.
  for (const bool as_bool : {false, true}) {
    CAPTURE(as_bool);
    const std::int64_t l = 72, s = 70;
    std::vector<float> m(static_cast<std::size_t>(l * s), 0.f);
    for (std::int64_t j = 0; j < s; ++j) m[static_cast<std::size_t>(2 * s + j)] = -kInf;
    for (std::int64_t j = 0; j < s; ++j) m[static_cast<std::size_t>(70 * s + j)] = -kInf;
    m[1] = -kInf;
    Tensor fmask = tensor(m, {l, s});
    Tensor mask = fmask;
    if (as_bool) {
      mask = Tensor::empty({l, s}, DType::Bool);
      auto* p = static_cast<unsigned char*>(mask.raw_data());
      for (std::size_t i = 0; i < m.size(); ++i) p[i] = m[i] == 0.f;
    }
    Tensor q = randn_t({2, l, 8}, 1).requires_grad_(true), k = randn_t({2, s, 8}, 2).requires_grad_(true),
           v = randn_t({2, s, 4}, 3).requires_grad_(true);
    Tensor out = scaled_dot_product_attention(q, k, v, mask);
    Tensor r = randn_t(out.shape(), 4);
    out.backward(r);
    const auto o = out.to_vector<float>(), gq = q.grad().to_vector<float>();
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < l; ++i) {
        const bool masked = i == 2 || i == 70;
        for (std::int64_t c = 0; c < 4; ++c) CHECK((o[static_cast<std::size_t>((h * l + i) * 4 + c)] == 0.f) == masked);
        for (std::int64_t c = 0; c < 8; ++c) {
          const float g = gq[static_cast<std::size_t>((h * l + i) * 8 + c)];
          CHECK(std::isfinite(g));
          if (masked) CHECK(g == 0.f);
        }
      }
    // k and v get what the other rows give them: the masked rows' weights are zero.
    Tensor q2 = q.detach().requires_grad_(true), k2 = k.detach().requires_grad_(true),
           v2 = v.detach().requires_grad_(true);
    std::vector<float> rz = r.to_vector<float>();
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t c = 0; c < 4; ++c) {
        rz[static_cast<std::size_t>((h * l + 2) * 4 + c)] = 0.f;
        rz[static_cast<std::size_t>((h * l + 70) * 4 + c)] = 0.f;
      }
    // The same op with rows 2 and 70 unmasked and their upstream gradient zeroed.
    std::vector<float> mr = m;
    for (std::int64_t j = 0; j < s; ++j) {
      mr[static_cast<std::size_t>(2 * s + j)] = 0.f;
      mr[static_cast<std::size_t>(70 * s + j)] = 0.f;
    }
    Tensor out2 = scaled_dot_product_attention(q2, k2, v2, tensor(mr, {l, s}));
    out2.backward(tensor(rz, out2.shape()));
    CHECK(max_rel_err(k.grad(), k2.grad()) < 1e-6);
    CHECK(max_rel_err(v.grad(), v2.grad()) < 1e-6);
  }
}

TEST_CASE("attention: the sim device gives the CPU's bits, outputs and gradients") {
  const Device sim = Device::sim(0);
  const Case c{{2, 2}, 70, 66, 8, 12, true, std::nullopt, {2, 1, 1, 66}, 0.1f};
  Inputs in = make_inputs(c, 9);
  Tensor outs[2], gq[2], gk[2], gv[2];
  for (int d = 0; d < 2; ++d) {
    const Device dev = d == 0 ? Device::cpu() : sim;
    Tensor q = in.q.to(dev).requires_grad_(true), k = in.k.to(dev).requires_grad_(true),
           v = in.v.to(dev).requires_grad_(true);
    Generator gen(6);
    outs[d] = scaled_dot_product_attention(q, k, v, in.mask.to(dev), c.dropout_p, c.causal, c.scale, &gen);
    CHECK(outs[d].device() == dev);
    outs[d].backward(randn_t(outs[d].shape(), 2).to(dev));
    gq[d] = q.grad().to(Device::cpu());
    gk[d] = k.grad().to(Device::cpu());
    gv[d] = v.grad().to(Device::cpu());
  }
  auto same = [](const Tensor& a, const Tensor& b) {
    const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
    return x.shape() == y.shape() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
  };
  CHECK(same(outs[0], outs[1]));
  CHECK(same(gq[0], gq[1]));
  CHECK(same(gk[0], gk[1]));
  CHECK(same(gv[0], gv[1]));
}

namespace {
template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}
void one_line_naming(const std::string& msg, std::initializer_list<const char*> parts) {
  CAPTURE(msg);
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find("scaled_dot_product_attention") != std::string::npos);
  for (const char* p : parts) CHECK(msg.find(p) != std::string::npos);
}
}  // namespace

TEST_CASE("attention: bad input is one line naming the shapes") {
  Tensor q = randn_t({2, 4, 3}, 1), k = randn_t({2, 5, 3}, 2), v = randn_t({2, 5, 6}, 3);
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(q, k, v, zeros({4, 4})); }),
                  {"attn_mask [4, 4]", "[2, 4, 5]"});
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(q, k, v, zeros({3, 4, 5})); }),
                  {"attn_mask [3, 4, 5]", "[2, 4, 5]"});
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(q, randn_t({2, 5, 4}, 4), v); }),
                  {"last dim E", "q [2, 4, 3]", "k [2, 5, 4]"});
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(q, k, randn_t({2, 6, 6}, 4)); }),
                  {"k [2, 5, 3]", "v [2, 6, 6]"});
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(q, randn_t({3, 5, 3}, 4), v); }),
                  {"leading dims", "k [3, 5, 3]"});
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(randn_t({4}, 1), k, v); }), {"q [4]"});
  one_line_naming(error_of<TypeError>([&] { scaled_dot_product_attention(q, k, v, zeros({4, 5}, DType::Int64)); }),
                  {"attn_mask must be bool", "int64 [4, 5]"});
  one_line_naming(error_of<ShapeError>([&] { scaled_dot_product_attention(q, k, v, ones({2, 5, 5}, DType::Bool)); }),
                  {"attn_mask [2, 5, 5]", "[2, 4, 5]"});
  one_line_naming(error_of<ValueError>([&] { scaled_dot_product_attention(q, k, v, Tensor(), 1.5f); }),
                  {"dropout_p", "1.5"});
  one_line_naming(error_of<ShapeError>([&] {
                    scaled_dot_product_attention(zeros({2, 4, 0}), zeros({2, 5, 0}), v);
                  }),
                  {"last dim E of at least 1", "q [2, 4, 0]"});
}

TEST_CASE("attention: Ev = 0 gives an empty output without running the kernels") {
  Tensor q = randn_t({2, 4, 3}, 1), k = randn_t({2, 5, 3}, 2);
  Tensor out = scaled_dot_product_attention(q, k, zeros({2, 5, 0}), ones({4, 5}, DType::Bool));
  CHECK(out.shape() == Shape{2, 4, 0});
}

TEST_CASE("attention: peak memory grows linearly with the sequence length (no T x T matrix)") {
  // One head group, causal, forward and backward; the peak counts every CPU tensor and the
  // kernels' scratch. A T x T score matrix of one head alone would be 4 T^2 bytes.
  std::size_t extra[3];
  const std::int64_t ts[3] = {256, 1024, 4096};
  for (int i = 0; i < 3; ++i) {
    const std::int64_t t = ts[i];
    Tensor q = randn_t({1, 2, t, 32}, 1).requires_grad_(true), k = randn_t({1, 2, t, 32}, 2).requires_grad_(true),
           v = randn_t({1, 2, t, 32}, 3).requires_grad_(true);
    Tensor r = randn_t({1, 2, t, 32}, 4);
    const std::size_t before = cpu_memory_stats().allocated_bytes;
    reset_cpu_peak_memory();
    scaled_dot_product_attention(q, k, v, Tensor(), 0.f, true).backward(r);
    extra[i] = cpu_memory_stats().peak_allocated_bytes - before;
    CAPTURE(t);
    CAPTURE(extra[i]);
    if (t >= 1024) CHECK(extra[i] < static_cast<std::size_t>(4 * t * t));  // less than one head's score matrix
  }
  MESSAGE("peak bytes beyond the inputs, T = 256, 1024, 4096: " << extra[0] << ", " << extra[1] << ", "
                                                                 << extra[2]);
  // 4x the length: about 4x the memory (quadratic would be 16x).
  CHECK(double(extra[1]) / double(extra[0]) < 4.5);
  CHECK(double(extra[2]) / double(extra[1]) < 4.5);
}

TEST_CASE("attention: PyTorch 1.13 parity (softmax(q k^T * scale + mask) v), outputs and gradients within 1e-5") {
  // tests/fixtures/attention_parity.npz, made by scripts/fixtures/attention.py.
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/attention_parity.npz");
  for (const char* name : {"causal", "causal_tiles", "padding", "scale", "bias_scale_tiles"}) {
    CAPTURE(name);
    const std::string n = name;
    auto at = [&](const char* key) { return f.at(n + "." + key); };
    const float sc = at("scale").to_vector<float>()[0];
    const bool causal = at("causal").to_vector<std::int64_t>()[0] != 0;
    const Tensor mask = f.contains(n + ".mask") ? at("mask") : Tensor();
    Tensor q = at("q").detach().requires_grad_(true), k = at("k").detach().requires_grad_(true),
           v = at("v").detach().requires_grad_(true);
    Tensor out = scaled_dot_product_attention(q, k, v, mask, 0.f, causal,
                                              std::isnan(sc) ? std::nullopt : std::optional<double>(sc));
    out.backward(at("gout"));
    CHECK(max_rel_err(out, at("out")) < 1e-5);
    CHECK(max_rel_err(q.grad(), at("gq")) < 1e-5);
    CHECK(max_rel_err(k.grad(), at("gk")) < 1e-5);
    CHECK(max_rel_err(v.grad(), at("gv")) < 1e-5);
  }
}

namespace {
/// The Bool mask that keeps what `mask` (float, 0 or -inf) keeps: true where it is finite.
Tensor to_bool_mask(const Tensor& mask) {
  Tensor b = Tensor::empty(mask.shape(), DType::Bool);
  const auto m = mask.to_vector<float>();
  auto* p = static_cast<unsigned char*>(b.raw_data());
  for (std::size_t i = 0; i < m.size(); ++i) p[i] = m[i] != -kInf;
  return b;
}
/// A float mask of 0 and -inf (never a whole row at -inf).
Tensor keep_or_drop_mask(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = (i % s.back() != 0 && g.uniform() < 0.3f) ? -kInf : 0.f;
  return t;
}
}  // namespace

TEST_CASE("attention: a Bool mask (true: takes part) equals the float mask of 0 and -inf, on CPU and sim") {
  const Device sim = Device::sim(0);
  struct BoolCase {
    Shape lead;
    std::int64_t l, s, e, ev;
    bool causal;
    Shape mask;
    float dropout_p;
  };
  const BoolCase cases[] = {
      {{2, 3}, 9, 11, 8, 8, false, {2, 1, 1, 11}, 0.f},  // padding
      {{2}, 70, 90, 16, 12, true, {70, 90}, 0.f},        // [L, S] across tiles, with causal
      {{1, 2}, 65, 65, 8, 8, false, {2, 1, 65}, 0.2f},   // per head, broadcast over rows, dropout
  };
  for (const BoolCase& c : cases) {
    CAPTURE(shape_str(c.mask));
    const Tensor fmask = keep_or_drop_mask(c.mask, 3), bmask = to_bool_mask(fmask);
    Tensor results[3][4];  // float on CPU, bool on CPU, bool on sim: out, gq, gk, gv
    for (int variant = 0; variant < 3; ++variant) {
      const Device dev = variant == 2 ? sim : Device::cpu();
      Tensor q = randn_t(with(c.lead, c.l, c.e), 1).to(dev).requires_grad_(true),
             k = randn_t(with(c.lead, c.s, c.e), 2).to(dev).requires_grad_(true),
             v = randn_t(with(c.lead, c.s, c.ev), 3).to(dev).requires_grad_(true);
      Generator gen(8);
      Tensor out = scaled_dot_product_attention(q, k, v, (variant == 0 ? fmask : bmask).to(dev), c.dropout_p,
                                                c.causal, std::nullopt, &gen);
      out.backward(randn_t(out.shape(), 4).to(dev));
      results[variant][0] = out.to(Device::cpu());
      results[variant][1] = q.grad().to(Device::cpu());
      results[variant][2] = k.grad().to(Device::cpu());
      results[variant][3] = v.grad().to(Device::cpu());
    }
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(max_rel_err(results[1][i], results[0][i]) == 0.0);
      CHECK(max_rel_err(results[2][i], results[1][i]) == 0.0);
    }
  }
}

TEST_CASE("attention: PyTorch parity with the padding mask given as Bool") {
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/attention_parity.npz");
  Tensor q = f.at("padding.q").detach().requires_grad_(true), k = f.at("padding.k").detach().requires_grad_(true),
         v = f.at("padding.v").detach().requires_grad_(true);
  Tensor out = scaled_dot_product_attention(q, k, v, to_bool_mask(f.at("padding.mask")));
  out.backward(f.at("padding.gout"));
  CHECK(max_rel_err(out, f.at("padding.out")) < 1e-5);
  CHECK(max_rel_err(q.grad(), f.at("padding.gq")) < 1e-5);
  CHECK(max_rel_err(k.grad(), f.at("padding.gk")) < 1e-5);
  CHECK(max_rel_err(v.grad(), f.at("padding.gv")) < 1e-5);
}

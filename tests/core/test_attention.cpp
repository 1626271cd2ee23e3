// scaled_dot_product_attention (docs/attention.md): the fused kernel against a reference
// composed of existing 2-D ops, head by head; finite-difference gradients; the dropout
// stream; masks and their broadcasting; fully masked rows; the three SIMD levels; the sim
// device; bad input; and peak memory growing linearly with the sequence length.
#include <doctest/doctest.h>

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
};

std::string describe(const Case& c) {
  return "lead " + shape_str(c.lead) + " L " + std::to_string(c.l) + " S " + std::to_string(c.s) + " E " +
         std::to_string(c.e) + " Ev " + std::to_string(c.ev) + (c.causal ? " causal" : "") +
         (c.scale ? " scale " + std::to_string(*c.scale) : "") +
         (c.mask_shape.empty() ? "" : " mask " + shape_str(c.mask_shape)) +
         (c.dropout_p > 0 ? " dropout " + std::to_string(c.dropout_p) : "");
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
  return in;
}

std::int64_t heads(const Case& c) {
  std::int64_t b = 1;
  for (auto d : c.lead) b *= d;
  return b;
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
    Tensor w = exp(log_softmax(scores, -1));
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
  };
  for (const Case& c : cases) check_against_reference(c);
}

TEST_CASE("attention: the AVX-512, AVX2 and scalar paths agree") {
  const Case c{{2, 2}, 90, 100, 24, 40, true, std::nullopt, {2, 1, 90, 100}, 0.2f};
  Tensor outs[3], grads[3];
  const char* levels[3] = {"scalar", "avx2", "avx512"};
  for (int i = 0; i < 3; ++i) {
    EnvGuard env("PHALANX_ATTENTION_SIMD", levels[i]);
    Inputs in = make_inputs(c, 3);
    Tensor q = in.q.requires_grad_(true);
    Generator gen(4);
    outs[i] = scaled_dot_product_attention(q, in.k, in.v, in.mask, c.dropout_p, c.causal, c.scale, &gen);
    outs[i].backward(randn_t(outs[i].shape(), 8));
    grads[i] = q.grad();
  }
  for (int i = 0; i < 2; ++i) {
    CAPTURE(levels[i]);
    CHECK(max_rel_err(outs[i], outs[2]) < 1e-5);
    CHECK(max_rel_err(grads[i], grads[2]) < 1e-5);
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

TEST_CASE("attention: a row whose every score is masked is NaN (PyTorch's softmax of -inf), others unaffected") {
  Tensor q = randn_t({1, 4, 3}, 1), k = randn_t({1, 5, 3}, 2), v = randn_t({1, 5, 2}, 3);
  std::vector<float> m(20, 0.f);
  for (int j = 0; j < 5; ++j) m[2 * 5 + j] = -kInf;  // row 2 fully masked
  m[0 * 5 + 1] = -kInf;
  Tensor mask = tensor(m, {4, 5});
  Tensor out = scaled_dot_product_attention(q, k, v, mask);
  const auto o = out.to_vector<float>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 2; ++c) {
      CAPTURE(r);
      CHECK(std::isnan(o[r * 2 + c]) == (r == 2));
    }
  // The other rows equal the attention of those rows alone.
  Tensor rows = scaled_dot_product_attention(reshape(narrow(q, 1, 0, 2), {1, 2, 3}), k, v, narrow(mask, 0, 0, 2));
  const auto ro = rows.to_vector<float>();
  for (int i = 0; i < 4; ++i) CHECK(o[i] == doctest::Approx(ro[i]).epsilon(1e-6));
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
                  {"attn_mask", "int64"});
  one_line_naming(error_of<ValueError>([&] { scaled_dot_product_attention(q, k, v, Tensor(), 1.5f); }),
                  {"dropout_p", "1.5"});
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

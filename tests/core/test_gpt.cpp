// nn::GPT against nanoGPT's model.py on PyTorch 1.13 (tests/fixtures/gpt_parity.npz,
// scripts/fixtures/gpt.py): logits, loss and every gradient within 1e-5; 20 AdamW steps with
// nanoGPT's decay groups within 1e-5; initialisation, decay groups, generate, dropout streams
// and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "support/gpt_fixture.hpp"
#include "support/gradcheck.hpp"

using namespace phalanx;
using namespace phalanx::test;

namespace {

void close(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-5) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  CHECK(max_rel_err(got, want) <= tol);
}

/// A trained parameter against PyTorch's, within 1e-5 of the tensor's largest value. One
/// exception: the key part of each c_attn.bias. It adds q.b_k to every score of a query row,
/// which softmax ignores, so its gradient is zero but for rounding (PyTorch's: ~1e-11) and
/// AdamW turns that noise into steps of ~lr * noise / eps in either framework, unrelated to
/// each other. It changes no output; both stay tiny (checked: below 1e-4), and the query and
/// value parts are held to 1e-5 like everything else.
void close_trained(const std::string& name, const Tensor& got, const Tensor& want) {
  const std::string kb = "attn.c_attn.bias";
  if (name.size() < kb.size() || name.compare(name.size() - kb.size(), kb.size(), kb) != 0)
    return close(got, want, "final." + name);
  INFO("final." << name);
  const auto a = got.to_vector<float>(), b = want.to_vector<float>();
  const std::size_t E = a.size() / 3;
  double scale = 1e-30, worst = 0, key_max = 0;
  for (float v : b) scale = std::max(scale, std::abs(static_cast<double>(v)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (i >= E && i < 2 * E) {
      key_max = std::max({key_max, std::abs(static_cast<double>(a[i])), std::abs(static_cast<double>(b[i]))});
    } else {
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    }
  }
  CHECK(worst / scale <= 1e-5);
  CHECK(key_max <= 1e-4);
}

nn::GPTConfig fixture_config() {
  return nn::GPTConfig()
      .block_size(fx("gpt.config.block_size").item_int())
      .vocab_size(fx("gpt.config.vocab_size").item_int())
      .n_layer(fx("gpt.config.n_layer").item_int())
      .n_head(fx("gpt.config.n_head").item_int())
      .n_embd(fx("gpt.config.n_embd").item_int());
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("GPT equals nanoGPT on PyTorch 1.13: logits, loss and every gradient within 1e-5") {
  nn::GPT model(fixture_config());
  const TensorMap init = under("gpt.init.");
  // nanoGPT's state_dict names in nanoGPT's order, lm_head.weight included.
  CHECK(model.state_dict().names() == init.names());
  model.load_state_dict(init);
  CHECK(model.named_parameters().size() + 1 == init.size());  // the tied weight once
  const Tensor idx = fx("gpt.idx"), targets = fx("gpt.targets");
  close(model.forward(idx), fx("gpt.logits"), "logits");
  Tensor loss = model.forward(idx, targets);
  CHECK(std::abs(loss.item() - fx("gpt.loss").item()) <= 1e-5 * std::abs(fx("gpt.loss").item()));
  loss.backward();
  for (const auto& [name, t] : model.named_parameters()) close(t.grad(), fx("gpt.grad." + name), "grad." + name);
}

TEST_CASE("GPT: 20 AdamW steps with nanoGPT's decay groups equal PyTorch within 1e-5") {
  set_num_threads(1);
  nn::GPT model(fixture_config());
  model.load_state_dict(under("gpt.init."));
  const nn::DecayGroups groups = nn::decay_groups(model);
  optim::AdamW opt(groups.decay, optim::AdamWOptions(3e-3).beta1(0.9).beta2(0.95).weight_decay(0.1));
  opt.add_param_group(groups.no_decay, {{"weight_decay", 0.0}});
  for (int s = 0; s < 20; ++s) {
    CAPTURE(s);
    Tensor loss = model.forward(fx("train.x" + std::to_string(s)), fx("train.y" + std::to_string(s)));
    const float want = fx("train.loss" + std::to_string(s)).item();
    CHECK(std::abs(loss.item() - want) <= 1e-5 * std::abs(want));
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
  }
  for (const auto& [name, t] : model.named_parameters()) close_trained(name, t, fx("train.final." + name));
}

TEST_CASE("decay_groups: Linear weights decay; biases, LayerNorm weights and embeddings (the tied one once) do not") {
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(2).n_head(2).n_embd(8));
  const nn::DecayGroups g = nn::decay_groups(model);
  std::set<const TensorImpl*> decay, no_decay;
  for (const auto& t : g.decay) decay.insert(t.impl());
  for (const auto& t : g.no_decay) no_decay.insert(t.impl());
  CHECK(decay.size() == g.decay.size());
  CHECK(no_decay.size() == g.no_decay.size());
  CHECK(g.decay.size() + g.no_decay.size() == model.parameters().size());
  for (const auto& [name, t] : model.named_parameters()) {
    CAPTURE(name);
    const bool linear_weight = name.find("c_attn.weight") != std::string::npos ||
                               name.find("c_proj.weight") != std::string::npos ||
                               name.find("c_fc.weight") != std::string::npos;
    CHECK(decay.count(t.impl()) == (linear_weight ? 1u : 0u));
    CHECK(no_decay.count(t.impl()) == (linear_weight ? 0u : 1u));
  }
  CHECK(g.decay.size() == 8);  // 4 Linear weights a block; lm_head.weight is wte's, which does not decay
  // Usable as AdamW's two groups (each tensor once: the optimizer refuses duplicates).
  optim::AdamW opt(g.decay, optim::AdamWOptions(1e-3).weight_decay(0.1));
  opt.add_param_group(g.no_decay, {{"weight_decay", 0.0}});
}

TEST_CASE("GPT: nanoGPT's names, tie, initialisation and num_params") {
  Generator g(5);
  const nn::GPTConfig c = nn::GPTConfig().block_size(32).vocab_size(256).n_layer(3).n_head(4).n_embd(64);
  nn::GPT model(c, &g);
  const auto names = names_of(model.named_parameters());
  CHECK(names.front() == "transformer.wte.weight");
  CHECK(names[1] == "transformer.wpe.weight");
  CHECK(names.back() == "transformer.ln_f.bias");
  CHECK(model.state_dict().names().back() == "lm_head.weight");
  const TensorMap s = model.state_dict();
  CHECK(s.at("lm_head.weight").data<float>() == s.at("transformer.wte.weight").data<float>());
  auto stdev = [](const Tensor& t) {
    double sum = 0, sq = 0;
    for (float v : t.to_vector<float>()) sum += v, sq += static_cast<double>(v) * v;
    const double n = static_cast<double>(t.numel());
    return std::sqrt(sq / n - (sum / n) * (sum / n));
  };
  CHECK(stdev(s.at("transformer.wte.weight")) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stdev(s.at("transformer.h.0.attn.c_attn.weight")) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stdev(s.at("transformer.h.1.mlp.c_proj.weight")) == doctest::Approx(0.02 / std::sqrt(6.0)).epsilon(0.05));
  CHECK(stdev(s.at("transformer.h.2.attn.c_proj.weight")) == doctest::Approx(0.02 / std::sqrt(6.0)).epsilon(0.05));
  for (float v : s.at("transformer.h.0.attn.c_attn.bias").to_vector<float>()) CHECK(v == 0.f);
  for (float v : s.at("transformer.h.0.ln_1.weight").to_vector<float>()) CHECK(v == 1.f);
  // nanoGPT's get_num_params: every parameter once, less the position embedding.
  const std::int64_t E = 64, per_block = 2 * 2 * E + (3 * E * E + 3 * E) + (E * E + E) + (4 * E * E + 4 * E) + (4 * E * E + E);
  CHECK(model.num_params(false) == 256 * E + 32 * E + 3 * per_block + 2 * E);
  CHECK(model.num_params() == model.num_params(false) - 32 * E);
  // The same generator seed, the same model.
  Generator g2(5);
  nn::GPT again(c, &g2);
  CHECK(max_rel_err(again.parameters()[5], model.parameters()[5]) == 0);
  // bias=false: no biases anywhere, nanoGPT's LayerNorm without one.
  nn::GPT nobias(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(1).n_head(2).n_embd(8).bias(false));
  for (const auto& n : names_of(nobias.named_parameters())) CHECK(n.find("bias") == std::string::npos);
}

TEST_CASE("GPT config and input errors are one line naming the value and the limit") {
  CHECK_THROWS_WITH_AS(nn::GPT(nn::GPTConfig().n_head(5).n_embd(128)),
                       "GPTConfig: n_head 5 does not divide n_embd 128: use a head count that divides the width (or a "
                       "width that is a multiple of 5)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(nn::GPTConfig().n_layer(0).validate(), "GPTConfig: n_layer must be at least 1, got 0", ConfigError);
  CHECK_THROWS_WITH_AS(nn::GPTConfig().dropout(1.f).validate(), "GPTConfig: dropout must be in [0, 1), got 1", ConfigError);
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(1).n_head(2).n_embd(8));
  CHECK_THROWS_WITH_AS(model.forward(zeros({2, 9}, DType::Int64)),
                       "GPT: sequence length 9 exceeds block_size 8: feed at most the last 8 tokens", ValueError);
  Tensor ids = zeros({2, 4}, DType::Int64);
  ids.data<std::int64_t>()[6] = 11;
  CHECK_THROWS_WITH_AS(model.forward(ids), "GPT: token id 11 at [1, 2] is outside the vocabulary [0, 11)", ValueError);
  ids.data<std::int64_t>()[6] = -1;
  CHECK_THROWS_WITH_AS(model.forward(ids), "GPT: token id -1 at [1, 2] is outside the vocabulary [0, 11)", ValueError);
  CHECK_THROWS_AS(model.forward(zeros({2, 4})), TypeError);
  CHECK_THROWS_AS(model.forward(zeros({8}, DType::Int64)), ShapeError);
  CHECK_THROWS_AS(model.forward(zeros({2, 4}, DType::Int64), zeros({2, 3}, DType::Int64)), ShapeError);
}

TEST_CASE("GPT::generate: the same seed gives the same tokens; top_k 1 is greedy; long prompts are cropped") {
  Generator init(3);
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(2).n_head(2).n_embd(16).dropout(0.2f), &init);
  const Tensor prompt = tensor(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  Generator a(42), b(42), c(43);
  const Tensor x = model.generate(prompt, 12, 0.8f, 5, &a);
  CHECK(x.shape() == Shape{2, 15});
  CHECK(x.to_vector<std::int64_t>() == model.generate(prompt, 12, 0.8f, 5, &b).to_vector<std::int64_t>());
  CHECK(x.to_vector<std::int64_t>() != model.generate(prompt, 12, 0.8f, 5, &c).to_vector<std::int64_t>());
  CHECK(model.is_training());  // the caller's mode comes back
  // The prompt is kept; 15 > block_size 8: each step saw the last 8 tokens only.
  const auto v = x.to_vector<std::int64_t>();
  CHECK(std::vector<std::int64_t>(v.begin(), v.begin() + 3) == std::vector<std::int64_t>{1, 2, 3});
  // top_k = 1 takes the argmax of the last position's logits.
  Generator d(1);
  const Tensor greedy = model.generate(prompt, 1, 1.f, 1, &d);
  model.eval();
  NoGradGuard ng;
  const Tensor logits = model.forward(prompt);
  const Tensor last = argmax(reshape(narrow(logits, 1, 2, 1), {2, 11}), 1);
  CHECK(greedy.to_vector<std::int64_t>()[3] == last.to_vector<std::int64_t>()[0]);
  CHECK(greedy.to_vector<std::int64_t>()[7] == last.to_vector<std::int64_t>()[1]);
  // A 12-token prompt with block_size 8: the greedy token is the argmax of forward(the last 8
  // tokens) at position 7, and here differs from the argmax of a wrong window (the first 8),
  // so a crop at the wrong end fails.
  model.train();
  const Tensor long_prompt =
      tensor(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 10, 9},
             {2, 12});
  Generator e(1);
  const Tensor cropped = model.generate(long_prompt, 1, 1.f, 1, &e);
  REQUIRE(cropped.shape() == Shape{2, 13});
  model.eval();
  const auto window_argmax = [&](std::int64_t start) {
    const Tensor l = model.forward(narrow(long_prompt, 1, start, 8));
    return argmax(reshape(narrow(l, 1, 7, 1), {2, 11}), 1).to_vector<std::int64_t>();
  };
  const auto want = window_argmax(4), wrong = window_argmax(0);
  CHECK(want != wrong);
  CHECK(cropped.to_vector<std::int64_t>()[12] == want[0]);
  CHECK(cropped.to_vector<std::int64_t>()[25] == want[1]);
  CHECK(model.generate(zeros({0, 3}, DType::Int64), 4).shape() == Shape{0, 3});  // nothing to extend
  CHECK_THROWS_AS(model.generate(prompt, 1, 0.f), ValueError);
  CHECK_THROWS_AS(model.generate(prompt, 1, 1.f, -1), ValueError);
}

TEST_CASE("GPT::generate: NaN or inf logits are a one-line ValueError, not token 0") {
  Generator init(3);
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(1).n_head(2).n_embd(16), &init);
  const Tensor prompt = tensor(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto named = model.named_parameters();
  Tensor ln_f;
  for (auto& [n, t] : named)
    if (n == "transformer.ln_f.weight") ln_f = t;
  REQUIRE(ln_f.defined());
  {
    NoGradGuard ng;
    ln_f.data<float>()[0] = std::nanf("");
  }
  Generator g(1);
  for (std::int64_t top_k : {0, 3})
    CHECK_THROWS_WITH_AS(model.generate(prompt, 4, 1.f, top_k, &g),
                         "GPT::generate: the logits of row 0 at step 0 are not finite (NaN/inf): the model has "
                         "diverged",
                         ValueError);
  CHECK(model.is_training());
  {
    NoGradGuard ng;
    ln_f.data<float>()[0] = std::numeric_limits<float>::infinity();
  }
  CHECK_THROWS_AS(model.generate(prompt, 4, 1.f, 0, &g), ValueError);
}

TEST_CASE("GPT dropout draws from its generator: the same seed, the same loss; eval mode is dropout-free") {
  const nn::GPTConfig c = nn::GPTConfig().block_size(8).vocab_size(11).n_layer(2).n_head(2).n_embd(16).dropout(0.3f);
  const Tensor idx = tensor(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  auto loss_with = [&](std::uint64_t stream, bool training) {
    Generator init(9), drop;
    drop.seed_pcg(1234, stream);  // docs/gpt.md: a per-rank stream from the seed and the rank
    nn::GPT m(c, &init, &drop);
    m.train(training);
    NoGradGuard ng;
    return m.forward(idx, idx).item();
  };
  CHECK(loss_with(0, true) == loss_with(0, true));
  CHECK(loss_with(0, true) != loss_with(1, true));
  CHECK(loss_with(0, false) == loss_with(1, false));
  Generator init(9);
  nn::GPT no_dropout(nn::GPTConfig(c).dropout(0.f), &init);
  NoGradGuard ng;
  CHECK(no_dropout.forward(idx, idx).item() == loss_with(0, false));
}

TEST_CASE("GPT on the sim test accelerator: the CPU's logits, loss, gradients and samples") {
  const nn::GPTConfig c = nn::GPTConfig().block_size(8).vocab_size(11).n_layer(2).n_head(2).n_embd(16);
  Generator g1(4), g2(4);
  nn::GPT cpu(c, &g1), sim(c, &g2);
  sim.to(Device::sim());
  const Tensor idx = tensor(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  Tensor a = cpu.forward(idx, idx), b = sim.forward(idx.to(Device::sim()), idx.to(Device::sim()));
  CHECK(b.device() == Device::sim());
  CHECK(std::abs(a.item() - b.item()) <= 1e-6f * std::abs(a.item()));
  a.backward();
  b.backward();
  const auto pc = cpu.named_parameters(), ps = sim.named_parameters();
  for (std::size_t i = 0; i < pc.size(); ++i) close(ps[i].second.grad().to(Device::cpu()), pc[i].second.grad(), pc[i].first);
  Generator s1(8), s2(8);
  CHECK(cpu.generate(idx, 4, 1.f, 3, &s1).to_vector<std::int64_t>() ==
        sim.generate(idx.to(Device::sim()), 4, 1.f, 3, &s2).to(Device::cpu()).to_vector<std::int64_t>());
}

TEST_CASE("GPT on a device: the ids are not copied to the host to be checked; the embedding refuses them") {
  Generator init(3);
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(1).n_head(2).n_embd(16), &init);
  model.to(Device::sim());
  Tensor ids = zeros({2, 4}, DType::Int64);
  ids.data<std::int64_t>()[6] = 11;
  // On the CPU GPT's own message; elsewhere the embedding op's check (a CUDA stream is not
  // synced by every forward to scan the ids).
  CHECK_THROWS_WITH_AS(model.forward(ids.to(Device::sim())),
                       "embedding: index 11 at position 6 is out of range [0, 11) for weight [11, 16]", ValueError);
  CHECK_THROWS_AS(model.forward(zeros({2, 4}, DType::Float32, Device::sim())), TypeError);
  CHECK_THROWS_AS(model.forward(zeros({2, 9}, DType::Int64, Device::sim())), ValueError);
}

TEST_CASE("GPT::generate gives each module its own train/eval mode back") {
  Generator init(3);
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(2).n_head(2).n_embd(16).dropout(0.1f), &init);
  std::shared_ptr<nn::Module> transformer, h0;
  for (auto& [n, c] : model.named_children())
    if (n == "transformer") transformer = c;
  REQUIRE(transformer);
  for (auto& [n, c] : transformer->named_children())
    if (n == "h") h0 = c->named_children().front().second;
  REQUIRE(h0);
  h0->eval();  // e.g. a frozen block
  Generator g(1);
  model.generate(tensor(std::vector<std::int64_t>{1, 2, 3}, {1, 3}), 2, 1.f, 0, &g);
  CHECK(model.is_training());
  CHECK(transformer->is_training());
  CHECK(!h0->is_training());
  for (auto& [n, c] : h0->named_children()) CHECK(!c->is_training());
  model.eval();
  model.generate(tensor(std::vector<std::int64_t>{1, 2, 3}, {1, 3}), 2, 1.f, 0, &g);
  CHECK(!model.is_training());
}

TEST_CASE("GPT targets: float ones are a TypeError; -1 (nanoGPT's ignore_index) says it is not supported") {
  Generator init(3);
  nn::GPT model(nn::GPTConfig().block_size(8).vocab_size(11).n_layer(1).n_head(2).n_embd(16), &init);
  const Tensor ids = zeros({2, 4}, DType::Int64);
  CHECK_THROWS_WITH_AS(model.forward(ids, zeros({2, 4})), "GPT: targets must be int64 token ids, got float32",
                       TypeError);
  CHECK_THROWS_WITH_AS(model.forward(ids, zeros({2, 3}, DType::Int64)),
                       "GPT: targets must be of the ids' shape [2, 4], got [2, 3]", ShapeError);
  Tensor targets = zeros({2, 4}, DType::Int64);
  targets.data<std::int64_t>()[5] = -1;
  CHECK_THROWS_WITH_AS(model.forward(ids, targets),
                       "GPT: targets hold -1 at [1, 1]; nanoGPT's ignore_index=-1 is not supported: give every "
                       "position a token id in [0, 11), or crop the sequences",
                       ValueError);
}

// nanoGPT's GPT (karpathy/nanoGPT model.py), module for module, with its state_dict names.
#include "phalanx/core/nn/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/nn/activation.hpp"
#include "phalanx/core/nn/batchnorm.hpp"
#include "phalanx/core/nn/conv.hpp"
#include "phalanx/core/nn/embedding.hpp"
#include "phalanx/core/nn/layernorm.hpp"
#include "phalanx/core/nn/linear.hpp"
#include "phalanx/core/nn/multihead_attention.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

void GPTConfig::validate() const {
  auto positive = [](const char* name, std::int64_t v) {
    if (v < 1) throw ConfigError(detail::concat("GPTConfig: ", name, " must be at least 1, got ", v));
  };
  positive("block_size", block_size_);
  positive("vocab_size", vocab_size_);
  positive("n_layer", n_layer_);
  positive("n_head", n_head_);
  positive("n_embd", n_embd_);
  if (n_embd_ % n_head_ != 0)
    throw ConfigError(detail::concat("GPTConfig: n_head ", n_head_, " does not divide n_embd ", n_embd_,
                                     ": use a head count that divides the width (or a width that is a multiple of ",
                                     n_head_, ")"));
  if (!(dropout_ >= 0.f && dropout_ < 1.f))
    throw ConfigError(detail::concat("GPTConfig: dropout must be in [0, 1), got ", dropout_));
}

namespace gpt_internal {

/// nanoGPT's ModuleDict / ModuleList: a named container (forward is the owner's business).
class Container : public Module {
 public:
  explicit Container(std::string kind) : kind_(std::move(kind)) {}
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
  std::string describe() const override { return kind_; }

 private:
  std::string kind_;
};

/// nanoGPT's LayerNorm: torch's, with the bias optional (GPTConfig::bias), eps 1e-5.
class LayerNorm : public Module {
 public:
  LayerNorm(std::int64_t n, bool with_bias) : n_(n) {
    weight = register_parameter("weight", ones({n}));
    if (with_bias) bias = register_parameter("bias", zeros({n}));
  }
  Tensor forward(const Tensor& x) override { return layer_norm(x, {n_}, weight, bias, 1e-5); }
  std::string describe() const override { return "LayerNorm()"; }
  Tensor weight, bias;

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override {
    if (name == "weight") weight = t;
    if (name == "bias") bias = t;
  }

 private:
  std::int64_t n_;
};

/// Causal self-attention: c_attn (q, k, v in one GEMM), heads through the fused attention
/// with is_causal (nanoGPT's flash path; its non-flash path is the same function), c_proj.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& c, Generator* init, Generator* dropout_gen)
      : n_head_(c.n_head()), p_(c.dropout()), gen_(dropout_gen) {
    c_attn = register_module("c_attn", std::make_shared<Linear>(c.n_embd(), 3 * c.n_embd(), c.bias(), init));
    c_proj = register_module("c_proj", std::make_shared<Linear>(c.n_embd(), c.n_embd(), c.bias(), init));
    register_module("attn_dropout", std::make_shared<Dropout>(c.dropout(), dropout_gen));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout(), dropout_gen));
  }
  Tensor forward(const Tensor& x) override {
    const std::int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = n_head_;
    // nanoGPT's split(n_embd, dim=2) + view + transpose(1, 2) of q, k and v, as views:
    // [B, T, 3, H, D] -> [3, B, H, T, D] and its pieces along dim 0, which the CPU attention
    // reads in place (no copy). In the backward, split assembles the gradient in the layout of
    // c_attn's output and permute's backward is then a view: one copy, not two.
    const Tensor qkv = permute(reshape(c_attn->forward(x), {B, T, 3, H, C / H}), {2, 0, 3, 1, 4});
    const auto parts = split(qkv, 1, 0);
    auto head = [&](int i) { return reshape(parts[i], {B, H, T, C / H}); };
    const Tensor y = scaled_dot_product_attention(head(0), head(1), head(2), Tensor(), is_training() ? p_ : 0.f,
                                                  true, std::nullopt, gen_);
    return resid_dropout->forward(c_proj->forward(reshape(permute(y, {0, 2, 1, 3}), {B, T, C})));
  }
  std::string describe() const override { return "CausalSelfAttention"; }
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;

 private:
  std::int64_t n_head_;
  float p_;
  Generator* gen_;
};

class MLP : public Module {
 public:
  MLP(const GPTConfig& c, Generator* init, Generator* dropout_gen) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(c.n_embd(), 4 * c.n_embd(), c.bias(), init));
    gelu = register_module("gelu", std::make_shared<GELU>());
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd(), c.n_embd(), c.bias(), init));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout(), dropout_gen));
  }
  Tensor forward(const Tensor& x) override {
    return dropout->forward(c_proj->forward(gelu->forward(c_fc->forward(x))));
  }
  std::string describe() const override { return "MLP"; }
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Dropout> dropout;
};

/// Pre-LayerNorm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class Block : public Module {
 public:
  Block(const GPTConfig& c, Generator* init, Generator* dropout_gen) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd(), c.bias()));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c, init, dropout_gen));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd(), c.bias()));
    mlp = register_module("mlp", std::make_shared<MLP>(c, init, dropout_gen));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = add(x, attn->forward(ln_1->forward(x)));
    return add(h, mlp->forward(ln_2->forward(h)));
  }
  std::string describe() const override { return "Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

}  // namespace gpt_internal

namespace {

void post_order(Module& m, const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : m.named_children()) post_order(*child, fn);
  fn(m);
}

void normal_(Tensor& t, float std, Generator& g) { t.copy_(mul(randn(t.shape(), &g), std)); }

}  // namespace

GPT::GPT(const GPTConfig& config, Generator* init, Generator* dropout_gen) : config_(config) {
  config_.validate();
  const GPTConfig& c = config_;
  auto transformer = register_module("transformer", std::make_shared<gpt_internal::Container>("ModuleDict"));
  wte_ = transformer->add("wte", std::make_shared<Embedding>(c.vocab_size(), c.n_embd(), std::nullopt, init));
  wpe_ = transformer->add("wpe", std::make_shared<Embedding>(c.block_size(), c.n_embd(), std::nullopt, init));
  drop_ = transformer->add("drop", std::make_shared<Dropout>(c.dropout(), dropout_gen));
  auto h = transformer->add("h", std::make_shared<gpt_internal::Container>("ModuleList"));
  for (std::int64_t i = 0; i < c.n_layer(); ++i)
    blocks_.push_back(h->add(std::to_string(i), std::make_shared<gpt_internal::Block>(c, init, dropout_gen)));
  ln_f_ = transformer->add("ln_f", std::make_shared<gpt_internal::LayerNorm>(c.n_embd(), c.bias()));
  lm_head_ = register_module("lm_head", std::make_shared<Linear>(c.n_embd(), c.vocab_size(), false, init));
  // nanoGPT's `self.transformer.wte.weight = self.lm_head.weight`: one tensor, two names.
  lm_head_->replace_parameter("weight", wte_->weight);

  // _init_weights through nn.Module.apply (children before their parent, in registration
  // order; the tied tensor is drawn as wte, then again as lm_head), then every c_proj.weight
  // with the residual scaling.
  GeneratorGuard guard(init);
  Generator& g = guard.get();
  NoGradGuard ng;
  post_order(*this, [&](Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) {
      normal_(lin->weight, 0.02f, g);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = dynamic_cast<Embedding*>(&m)) {
      normal_(emb->weight, 0.02f, g);
    }
  });
  const float proj_std = 0.02f / std::sqrt(2.f * static_cast<float>(c.n_layer()));
  for (auto& [name, p] : named_parameters()) {
    const std::string suffix = "c_proj.weight";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      normal_(p, proj_std, g);
  }
}

void GPT::check_ids(const Tensor& idx) const {
  if (!idx.defined()) throw ValueError("GPT: the token ids are undefined");
  if (idx.dtype() != DType::Int64)
    throw TypeError(std::string("GPT: token ids must be int64 [B, T], got ") + dtype_name(idx.dtype()));
  if (idx.dim() != 2) throw ShapeError("GPT: token ids must be [B, T], got " + shape_str(idx.shape()));
  const std::int64_t T = idx.size(1);
  if (T > config_.block_size())
    throw ValueError(detail::concat("GPT: sequence length ", T, " exceeds block_size ", config_.block_size(),
                                    ": feed at most the last ", config_.block_size(), " tokens"));
  if (T == 0) throw ValueError("GPT: the sequences are empty (T = 0): give at least one token");
  // Values are scanned on the host only when they are there: copying them back would sync a
  // CUDA stream on every step. Elsewhere the embedding's own check (asynchronous on CUDA)
  // refuses an id outside the vocabulary.
  if (!idx.device().is_cpu()) return;
  const Tensor ids = idx.is_contiguous() ? idx : idx.clone();
  const std::int64_t* p = ids.data<std::int64_t>();
  const std::int64_t V = config_.vocab_size();
  for (std::int64_t i = 0; i < idx.numel(); ++i)
    if (p[i] < 0 || p[i] >= V)
      throw ValueError(detail::concat("GPT: token id ", p[i], " at [", i / T, ", ", i % T,
                                      "] is outside the vocabulary [0, ", V, ")"));
}

Tensor GPT::hidden(const Tensor& idx) {
  const std::int64_t T = idx.size(1);
  const Tensor pos = arange(T, DType::Int64, idx.device());
  Tensor x = drop_->forward(add(wte_->forward(idx), wpe_->forward(pos)));
  for (auto& block : blocks_) x = block->forward(x);
  return ln_f_->forward(x);
}

Tensor GPT::forward(const Tensor& idx) {
  check_ids(idx);
  return lm_head_->forward(hidden(idx));
}

Tensor GPT::forward(const Tensor& idx, const Tensor& targets) {
  check_ids(idx);
  if (!targets.defined()) throw ValueError("GPT: the targets are undefined: pass int64 [B, T] next-token ids");
  if (targets.shape() != idx.shape())
    throw ShapeError("GPT: targets must be of the ids' shape " + shape_str(idx.shape()) + ", got " +
                     shape_str(targets.shape()));
  if (targets.dtype() != DType::Int64)
    throw TypeError(std::string("GPT: targets must be int64 token ids, got ") + dtype_name(targets.dtype()));
  if (targets.device().is_cpu()) {
    // nanoGPT passes ignore_index=-1 to cross_entropy; this loss has no ignore_index, and the
    // generic message for -1 would not say why. Scanned on the CPU only (no per-step sync).
    const Tensor tc = targets.is_contiguous() ? targets : targets.clone();
    const std::int64_t* t = tc.data<std::int64_t>();
    const std::int64_t T = targets.size(1);
    for (std::int64_t i = 0; i < targets.numel(); ++i)
      if (t[i] == -1)
        throw ValueError(detail::concat("GPT: targets hold -1 at [", i / T, ", ", i % T,
                                        "]; nanoGPT's ignore_index=-1 is not supported: give every position a "
                                        "token id in [0, ", config_.vocab_size(), "), or crop the sequences"));
  }
  const Tensor logits = lm_head_->forward(hidden(idx));
  const std::int64_t n = idx.numel();
  return cross_entropy(reshape(logits, {n, config_.vocab_size()}), reshape(targets, {n}));
}

Tensor GPT::generate(const Tensor& idx, std::int64_t max_new_tokens, float temperature, std::int64_t top_k,
                     Generator* gen) {
  if (max_new_tokens < 0) throw ValueError(detail::concat("GPT::generate: max_new_tokens must be >= 0, got ", max_new_tokens));
  if (!(temperature > 0.f) || !std::isfinite(temperature))
    throw ValueError(detail::concat("GPT::generate: temperature must be > 0, got ", temperature));
  if (top_k < 0) throw ValueError(detail::concat("GPT::generate: top_k must be >= 0 (0: all ids), got ", top_k));
  if (idx.defined() && idx.dim() == 2 && idx.size(1) > config_.block_size()) {
    // generate crops long prompts itself; only the ids are checked here.
    check_ids(narrow(idx, 1, idx.size(1) - config_.block_size(), config_.block_size()));
  } else {
    check_ids(idx);
  }
  const Device dev = idx.device();
  const std::int64_t B = idx.size(0), V = config_.vocab_size(), block = config_.block_size();
  if (B == 0 || max_new_tokens == 0) return idx.clone();
  std::vector<std::vector<std::int64_t>> seq(B);
  {
    const Tensor host = dev.is_cpu() ? idx.clone() : idx.to(Device::cpu());
    const std::int64_t* p = host.data<std::int64_t>();
    for (std::int64_t b = 0; b < B; ++b) seq[b].assign(p + b * idx.size(1), p + (b + 1) * idx.size(1));
  }
  // eval for sampling, then each module's own mode back (also on a throw): train(was) on the
  // root would also switch on a submodule the caller had put in eval().
  struct Mode {
    std::vector<std::pair<Module*, bool>> was;  // post-order: children before their parent
    ~Mode() {
      // Parents first: a parent's train() sets its whole subtree, its descendants then fix theirs.
      for (auto it = was.rbegin(); it != was.rend(); ++it) it->first->train(it->second);
    }
  } mode;
  post_order(*this, [&](Module& m) { mode.was.emplace_back(&m, m.is_training()); });
  eval();
  NoGradGuard ng;
  std::vector<std::int64_t> window;
  // Per-row scratch, allocated once for the whole call.
  std::vector<double> weight(static_cast<std::size_t>(V));
  std::vector<float> scaled(static_cast<std::size_t>(V)), sorted;
  if (top_k > 0 && top_k < V) sorted.resize(static_cast<std::size_t>(V));
  for (std::int64_t step = 0; step < max_new_tokens; ++step) {
    const std::int64_t T = std::min<std::int64_t>(static_cast<std::int64_t>(seq[0].size()), block);
    window.clear();
    for (const auto& s : seq) window.insert(window.end(), s.end() - T, s.end());
    const Tensor x = hidden(from_buffer(window.data(), {B, T}, dev));
    // Only the last position's logits are needed (nanoGPT's inference path).
    const Tensor logits = lm_head_->forward(narrow(x, 1, T - 1, 1)).to(Device::cpu());
    const float* l = logits.data<float>();
    GeneratorGuard guard(gen);
    Generator& g = guard.get();
    for (std::int64_t b = 0; b < B; ++b) {
      const float* row = l + b * V;
      // logits / temperature; below the top_k-th largest -> -inf (ties with it stay, as
      // nanoGPT's `logits < v[:, [-1]]`); softmax; one multinomial draw.
      for (std::int64_t i = 0; i < V; ++i) {
        scaled[i] = row[i] / temperature;
        // NaN would make nth_element's order undefined and every weight 0 (PyTorch's
        // multinomial refuses such probabilities too): a diverged model, said so.
        if (!std::isfinite(scaled[i]))
          throw ValueError(detail::concat("GPT::generate: the logits of row ", b, " at step ", step,
                                          " are not finite (NaN/inf): the model has diverged"));
      }
      float threshold = -std::numeric_limits<float>::infinity();
      if (!sorted.empty()) {
        std::copy(scaled.begin(), scaled.end(), sorted.begin());
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
        threshold = sorted[static_cast<std::size_t>(top_k - 1)];
      }
      const float top = *std::max_element(scaled.begin(), scaled.end());
      double total = 0;
      for (std::int64_t i = 0; i < V; ++i) {
        weight[i] = scaled[i] >= threshold ? std::exp(static_cast<double>(scaled[i]) - top) : 0.0;
        total += weight[i];
      }
      // Finite logits: the largest has weight 1, so total >= 1 and some id is picked.
      const double u = static_cast<double>(g.next_u64() >> 11) * 0x1.0p-53 * total;
      std::int64_t pick = -1;
      double cum = 0;
      for (std::int64_t i = 0; i < V; ++i) {
        if (weight[i] == 0) continue;
        pick = i;
        cum += weight[i];
        if (cum > u) break;
      }
      seq[b].push_back(pick);
    }
  }
  std::vector<std::int64_t> flat;
  for (const auto& s : seq) flat.insert(flat.end(), s.begin(), s.end());
  return from_buffer(flat.data(), {B, static_cast<std::int64_t>(seq[0].size())}, dev);
}

std::int64_t GPT::num_params(bool non_embedding) const {
  std::int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();  // the tied weight once
  return non_embedding ? n - wpe_->weight.numel() : n;
}

std::string GPT::describe() const {
  return detail::concat("GPT(n_layer=", config_.n_layer(), ", n_head=", config_.n_head(), ", n_embd=", config_.n_embd(),
                        ", block_size=", config_.block_size(), ", vocab_size=", config_.vocab_size(),
                        ", dropout=", config_.dropout(), ", bias=", config_.bias() ? "True" : "False", ")");
}

DecayGroups decay_groups(const Module& model) {
  // nanoGPT's rule: weights of Linear layers (and convolutions, the in_proj_weight of
  // MultiheadAttention) decay; biases, norms' weights and embeddings do not. A tensor in
  // both (the tied wte / lm_head weight) does not decay, as nanoGPT removes lm_head.weight
  // from its decay set. Anything else decays if it is a matrix or more (nanoGPT's later rule).
  std::set<const TensorImpl*> decay, no_decay;
  std::function<void(const Module&)> visit = [&](const Module& m) {
    const bool whitelisted = dynamic_cast<const Linear*>(&m) || dynamic_cast<const Conv2d*>(&m) ||
                             dynamic_cast<const MultiheadAttention*>(&m);
    const bool blacklisted = dynamic_cast<const Embedding*>(&m) || dynamic_cast<const nn::LayerNorm*>(&m) ||
                             dynamic_cast<const gpt_internal::LayerNorm*>(&m) || dynamic_cast<const BatchNorm*>(&m);
    for (const auto& [name, t] : m.named_parameters(false)) {
      if (name.find('.') != std::string::npos) continue;  // a child's: visited with the child
      const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
      if (is_bias || blacklisted)
        no_decay.insert(t.impl());
      else if (whitelisted)
        decay.insert(t.impl());
    }
    for (const auto& [name, child] : m.named_children()) visit(*child);
  };
  visit(model);
  DecayGroups out;
  for (const auto& [name, t] : model.named_parameters()) {
    const bool nd = no_decay.count(t.impl()) > 0, d = decay.count(t.impl()) > 0;
    if (nd || (!d && t.dim() < 2))
      out.no_decay.push_back(t);
    else
      out.decay.push_back(t);
  }
  return out;
}

}  // namespace phalanx::nn

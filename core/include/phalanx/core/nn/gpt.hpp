#pragma once
// GPT: nanoGPT's model (karpathy/nanoGPT model.py) with its state_dict names, so weights
// move between nanoGPT and Phalanx as .npz with the same keys:
//   transformer.wte.weight [V, E], transformer.wpe.weight [block_size, E],
//   transformer.h.<i>.ln_1.{weight,bias}, .attn.c_attn.{weight,bias} [3E, E], [3E],
//   .attn.c_proj.{weight,bias}, .ln_2.{weight,bias}, .mlp.c_fc.{weight,bias} [4E, E],
//   .mlp.c_proj.{weight,bias}, transformer.ln_f.{weight,bias}, lm_head.weight (no bias).
// lm_head.weight is transformer.wte.weight (one tensor): named_parameters() lists it once,
// under transformer.wte.weight, and state_dict() under both names, as PyTorch does.
#include <cstdint>
#include <memory>
#include <vector>

#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

class Embedding;
class Linear;
class Dropout;
namespace gpt_internal {
class Block;
class LayerNorm;
}  // namespace gpt_internal

/// nanoGPT's GPTConfig, chainable in libtorch's options style:
///   GPTConfig().n_layer(4).n_head(4).n_embd(128).block_size(128)
struct GPTConfig {
#define PHALANX_GPT_OPTION(type, name, init)                   \
  GPTConfig& name(type v) { name##_ = v; return *this; }      \
  type name() const { return name##_; }                        \
  type name##_ = init;
  PHALANX_GPT_OPTION(std::int64_t, block_size, 1024)
  PHALANX_GPT_OPTION(std::int64_t, vocab_size, 50304)
  PHALANX_GPT_OPTION(std::int64_t, n_layer, 12)
  PHALANX_GPT_OPTION(std::int64_t, n_head, 12)
  PHALANX_GPT_OPTION(std::int64_t, n_embd, 768)
  PHALANX_GPT_OPTION(float, dropout, 0.f)
  PHALANX_GPT_OPTION(bool, bias, true)
#undef PHALANX_GPT_OPTION
  /// Throws ConfigError naming the value and the limit (heads that do not divide the width, ...).
  void validate() const;
};

class GPT : public Module {
 public:
  /// Initialised as nanoGPT's _init_weights: Linear and Embedding weights normal(0, 0.02),
  /// biases zero, every c_proj.weight normal(0, 0.02 / sqrt(2 n_layer)), drawn from `init`
  /// (the default generator when null). Dropout draws from `dropout_gen` (see nn::Dropout).
  explicit GPT(const GPTConfig& config, Generator* init = nullptr, Generator* dropout_gen = nullptr);

  /// idx: int64 [B, T] token ids, T <= block_size, ids < vocab_size -> logits [B, T, V].
  Tensor forward(const Tensor& idx) override;
  /// nanoGPT's forward(idx, targets): the mean cross-entropy of the logits against
  /// targets int64 [B, T] (ignore_index -1 not supported).
  Tensor forward(const Tensor& idx, const Tensor& targets);

  /// nanoGPT's generate: appends max_new_tokens tokens to idx [B, T] (cropped to the last
  /// block_size tokens each step), sampling from softmax(logits / temperature) restricted to
  /// the top_k most likely ids (top_k 0: all), with `gen`. Runs without autograd, in eval mode
  /// (each module's own train/eval flag comes back); NaN/inf logits are a ValueError.
  Tensor generate(const Tensor& idx, std::int64_t max_new_tokens, float temperature = 1.f,
                  std::int64_t top_k = 0, Generator* gen = nullptr);

  const GPTConfig& config() const { return config_; }
  /// Parameters excluding the position embedding when non_embedding (nanoGPT's get_num_params).
  std::int64_t num_params(bool non_embedding = true) const;
  std::string describe() const override;

 private:
  /// ln_f's output [B, T, E] for checked ids.
  Tensor hidden(const Tensor& idx);
  /// Throws the one-line errors for ids that forward cannot take.
  void check_ids(const Tensor& idx) const;
  GPTConfig config_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Dropout> drop_;
  std::vector<std::shared_ptr<gpt_internal::Block>> blocks_;
  std::shared_ptr<gpt_internal::LayerNorm> ln_f_;
  std::shared_ptr<Linear> lm_head_;
};

/// The two AdamW groups nanoGPT configures: weights of Linear layers decay; biases,
/// LayerNorm weights and embeddings (the tied wte/lm_head included) do not. Each tensor once.
struct DecayGroups {
  std::vector<Tensor> decay, no_decay;
};
DecayGroups decay_groups(const Module& model);

}  // namespace phalanx::nn

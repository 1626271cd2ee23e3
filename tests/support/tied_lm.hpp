#pragma once
// A small language model with a tied embedding / output weight, buildable from 2-D ops: token
// ids [N] -> emb [N, D] -> tanh(hidden) -> logits = linear(h, emb.weight) [N, V]. The output
// layer `head` is an nn::Linear whose weight is the embedding's (as nanoGPT's lm_head), so
// the one tensor is registered as emb.weight and head.weight. Shared by tests/core/
// test_tied_weights.cpp and tests/parallel/test_tied_ddp.cpp.
#include <memory>

#include <phalanx/phalanx.hpp>

namespace phalanx::test {

inline constexpr std::int64_t kTiedVocab = 13, kTiedWidth = 8;

class TiedLM : public nn::Module {
 public:
  explicit TiedLM(std::uint64_t seed = 21) {
    Generator g(seed);
    emb = register_module("emb", std::make_shared<nn::Embedding>(kTiedVocab, kTiedWidth, std::nullopt, &g));
    hidden = register_module("hidden", std::make_shared<nn::Linear>(kTiedWidth, kTiedWidth, true, &g));
    head = register_module("head", std::make_shared<nn::Linear>(kTiedWidth, kTiedVocab, false, &g));
    head->weight = head->replace_parameter("weight", emb->weight);
    NoGradGuard ng;
    emb->weight.mul_(0.3f);  // N(0, 0.3): logits of a moderate size
  }
  Tensor forward(const Tensor& ids) override { return head->forward(tanh(hidden->forward(emb->forward(ids)))); }
  std::string describe() const override { return "TiedLM"; }
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::Linear> hidden, head;
};

/// n token ids and next-token targets in [0, kTiedVocab); the same for every call.
struct TokenData {
  Tensor x, y;
};
inline TokenData make_tokens(std::int64_t n) {
  Generator g(77);
  return {randint(kTiedVocab, {n}, &g), randint(kTiedVocab, {n}, &g)};
}

}  // namespace phalanx::test

#pragma once
#include <optional>

#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// torch.nn.Embedding: weight [num_embeddings, embedding_dim] drawn from N(0, 1) (from `gen`,
/// the default generator when null); the padding_idx row (negative counts from the end) is
/// zero and gets no gradient. forward takes int64 indices of any shape.
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim,
            std::optional<std::int64_t> padding_idx = std::nullopt, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices) override;
  std::string describe() const override;
  void reset_parameters(Generator* gen = nullptr);

  Tensor weight;
  std::int64_t num_embeddings, embedding_dim;
  std::optional<std::int64_t> padding_idx;  ///< normalised to [0, num_embeddings)

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace phalanx::nn

#include "phalanx/core/nn/embedding.hpp"

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

Embedding::Embedding(std::int64_t num, std::int64_t dim, std::optional<std::int64_t> pad, Generator* gen)
    : num_embeddings(num), embedding_dim(dim) {
  if (num <= 0 || dim <= 0)
    throw ValueError(detail::concat("Embedding: num_embeddings and embedding_dim must be positive, got ", num, " and ",
                                    dim));
  if (pad) {
    if (*pad >= num || *pad < -num)
      throw ValueError(detail::concat("Embedding: padding_idx ", *pad, " must be within num_embeddings (", num, ")"));
    padding_idx = *pad < 0 ? *pad + num : *pad;
  }
  weight = register_parameter("weight", Tensor::empty({num, dim}));
  reset_parameters(gen);
}

void Embedding::reset_parameters(Generator* gen) {
  GeneratorGuard guard(gen);
  NoGradGuard ng;
  weight.copy_(randn(weight.shape(), &guard.get()));
  if (padding_idx) weight.narrow_rows(*padding_idx, *padding_idx + 1).zero_();
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(indices, weight, padding_idx ? *padding_idx : -1); }

std::string Embedding::describe() const {
  return padding_idx ? detail::concat("Embedding(", num_embeddings, ", ", embedding_dim, ", padding_idx=", *padding_idx, ")")
                     : detail::concat("Embedding(", num_embeddings, ", ", embedding_dim, ")");
}

void Embedding::on_parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight")
    weight = t;
}

}  // namespace phalanx::nn

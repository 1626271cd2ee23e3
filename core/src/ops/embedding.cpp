// Embedding lookup: a row gather forward, a scatter-add into a dense gradient backward.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {
class EmbeddingBackward final : public Node {
 public:
  EmbeddingBackward(Tensor indices, Shape weight_shape, std::int64_t padding_idx)
      : indices_(std::move(indices)), weight_shape_(std::move(weight_shape)), padding_idx_(padding_idx) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gw = zeros(weight_shape_, DType::Float32, g.device());
    kernels_for(g.device()).embedding_backward(g, indices_, padding_idx_, gw);
    return {gw};
  }
  const char* name() const override { return "EmbeddingBackward"; }
  void release_saved() override { indices_ = Tensor(); }

 private:
  Tensor indices_;
  Shape weight_shape_;
  std::int64_t padding_idx_;
};
}  // namespace

Tensor embedding(const Tensor& indices_in, const Tensor& weight_in, std::int64_t padding_idx) {
  const Tensor indices = contiguous_input(indices_in), weight = contiguous_input(weight_in);
  if (is_reduced(weight))
    return in_float32(weight.dtype(), [=](const Tensor& i, const Tensor& w) { return embedding(i, w, padding_idx); },
                      indices, weight);
  const char* op = "embedding";
  check_float(weight, op, "weight");
  check_defined(indices, op, "indices");
  if (indices.dtype() != DType::Int64)
    throw TypeError(detail::concat("embedding: indices must be int64, got ", dtype_name(indices.dtype())));
  check_same_device(indices, weight, op);
  if (weight.dim() != 2)
    throw ShapeError(detail::concat("embedding: weight must be [num_embeddings, embedding_dim], got ",
                                    shape_str(weight.shape())));
  const std::int64_t num = weight.shape()[0], dim = weight.shape()[1];
  DeviceKernels& k = kernels_for(weight.device());
  const std::int64_t bad = indices.numel() ? k.find_label_out_of_range(indices, num) : -1;
  if (bad >= 0) {
    // Only reached on devices that check synchronously (CPU, sim): the host can read the value.
    const std::int64_t v = indices.to(Device::cpu()).data<std::int64_t>()[bad];
    throw ValueError(detail::concat("embedding: index ", v, " at position ", bad, " is out of range [0, ", num,
                                    ") for weight ", shape_str(weight.shape())));
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = Tensor::empty(out_shape, DType::Float32, weight.device());
  k.embedding(weight, indices, out);
  if (grad_mode_enabled() && weight.requires_grad())
    autograd::record(std::make_shared<EmbeddingBackward>(indices, weight.shape(), padding_idx), {&weight}, out);
  return out;
}

}  // namespace phalanx

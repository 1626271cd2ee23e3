// phalanx-sample: text from a GPT trained by phalanx-train (or nanoGPT's weights as .npz),
// as nanoGPT's sample.py: the prompt's bytes are the first tokens, then --tokens more are
// drawn from softmax(logits / T) over the --top-k most likely bytes. The same seed gives the
// same text. See docs/text_training.md.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>

#include <phalanx/core/nn/gpt.hpp>
#include <phalanx/phalanx.hpp>

#include "trainer/model_spec.hpp"

namespace {

using namespace phalanx;

struct SampleOptions {
  std::string model, weights, prompt = "\n";
  std::int64_t tokens = 200, top_k = 0;
  double temperature = 1.0;
  std::uint64_t seed = 0;
};

[[noreturn]] void usage_error(const std::string& msg) { throw ValueError(msg); }

// The GPT of --model with --weights loaded; one-line errors for weights that do not fit.
std::shared_ptr<nn::GPT> load_model(const SampleOptions& o) {
  const trainer::GptSpec spec = trainer::parse_gpt_spec(o.model);
  TensorMap w;
  try {
    w = load_npz(o.weights);
  } catch (const std::exception& e) {
    usage_error(std::string("--weights ") + e.what());
  }
  if (const Tensor* wpe = w.find("transformer.wpe.weight"); wpe && wpe->dim() == 2 && wpe->shape()[0] != spec.context)
    usage_error(detail::concat("--weights ", o.weights, ": transformer.wpe.weight has ", wpe->shape()[0],
                               " positions but --model ", o.model, " has the context ", spec.context,
                               wpe->shape()[0] < spec.context
                                   ? detail::concat("; the context can be at most ", wpe->shape()[0])
                                   : std::string("; give the context the weights were trained with"),
                               ", e.g. --model ",
                               trainer::gpt_spec_str({spec.layers, spec.heads, spec.width, wpe->shape()[0]})));
  Generator init(0);
  auto gpt = std::make_shared<nn::GPT>(nn::GPTConfig()
                                           .n_layer(spec.layers)
                                           .n_head(spec.heads)
                                           .n_embd(spec.width)
                                           .block_size(spec.context)
                                           .vocab_size(256)
                                           .bias(true),
                                       &init);
  try {
    gpt->load_state_dict(trainer::nanogpt_weights(w, gpt->state_dict()));
  } catch (const std::exception& e) {
    usage_error("--weights " + o.weights + " do not fit --model " + o.model + ": " + e.what());
  }
  gpt->eval();
  return gpt;
}

}  // namespace

int main(int argc, char** argv) {
  SampleOptions o;
  CLI::App app{"phalanx-sample: text from a byte-level GPT (phalanx-train --model gpt:... --save F.npz, or nanoGPT's "
               "weights as .npz with its names).\nPrints the prompt and its continuation; the same --seed gives the "
               "same text.",
               "phalanx-sample"};
  app.add_option("--model", o.model, "the GPT: gpt:LAYERS-HEADS-WIDTH:CONTEXT, as trained")->required();
  app.add_option("--weights", o.weights, "its weights, .npz with nanoGPT's names")->required();
  app.add_option("--prompt", o.prompt, "the text to continue (its bytes are the first tokens)")
      ->default_str("a newline");
  app.add_option("--tokens", o.tokens, "bytes to generate, >= 1")->default_val(200);
  app.add_option("--temperature", o.temperature, "logits / T before the softmax, > 0 (lower: more likely bytes)")
      ->default_val(1.0);
  app.add_option("--top-k", o.top_k, "draw from the K most likely bytes only, in [0, 256] (0: all)")->default_val(0);
  app.add_option("--seed", o.seed, "seed of the draws")->default_val(0);
  for (auto* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the later wins
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "phalanx-sample: %s\n", e.what());
    return 2;
  }
  try {
    if (o.tokens < 1) usage_error(detail::concat("--tokens ", o.tokens, ": expected an integer >= 1"));
    if (!(std::isfinite(o.temperature) && o.temperature > 0))
      usage_error(detail::concat("--temperature ", o.temperature, ": expected a finite number > 0"));
    if (o.top_k < 0 || o.top_k > 256)
      usage_error(detail::concat("--top-k ", o.top_k, ": expected an integer in [0, 256] (the vocabulary is 256 bytes)"));
    if (o.prompt.empty()) usage_error("--prompt is empty: give at least one byte (the default is a newline)");
    auto gpt = load_model(o);
    const auto n = static_cast<std::int64_t>(o.prompt.size());
    Tensor idx = Tensor::empty({1, n}, DType::Int64);
    for (std::int64_t i = 0; i < n; ++i) idx.data<std::int64_t>()[i] = static_cast<unsigned char>(o.prompt[i]);
    Generator gen(o.seed);
    const Tensor out = gpt->generate(idx, o.tokens, static_cast<float>(o.temperature), o.top_k, &gen);
    std::string text;
    text.reserve(static_cast<std::size_t>(out.numel()));
    for (std::int64_t i = 0; i < out.numel(); ++i) text.push_back(static_cast<char>(out.data<std::int64_t>()[i]));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  } catch (const ValueError& e) {
    std::fprintf(stderr, "phalanx-sample: %s\n", e.what());
    return 2;
  } catch (const IoError& e) {
    std::fprintf(stderr, "phalanx-sample: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phalanx-sample: %s\n", e.what());
    return 1;
  }
}

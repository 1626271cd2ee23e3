#pragma once
// PHALANX_ARG(T, name): a chainable option, exactly as libtorch's TORCH_ARG, so options read
// as in a libtorch program:
//   optim::SGD opt(model->parameters(), optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
//   double lr = opts.lr();   // getter
//   opts.lr(0.05);           // setter, returns the options for chaining
// The field itself is `name_` (public, as libtorch's).
#include <utility>

#define PHALANX_ARG(T, name)                                  \
 public:                                                      \
  inline auto name(const T& new_##name)->decltype(*this)& {  \
    this->name##_ = new_##name;                               \
    return *this;                                             \
  }                                                           \
  inline auto name(T&& new_##name)->decltype(*this)& {       \
    this->name##_ = std::move(new_##name);                    \
    return *this;                                             \
  }                                                           \
  inline const T& name() const noexcept { return this->name##_; } \
  inline T& name() noexcept { return this->name##_; }         \
                                                              \
 public:                                                      \
  T name##_ /* NOLINT */

#pragma once
// phalanx-train's options, each declared once in train_options.cpp's table: its flag, its
// config-file key (the flag without the dashes), the kind of value it takes, its help line,
// the default --help shows, and how its value is range-checked and stored in a TrainConfig.
// The command line, the config-file reader and --help are all made from that table.
#include <functional>
#include <string>
#include <vector>

#include "train_config.hpp"

namespace phalanx::trainer {

/// The rate when neither --lr nor --base-lr is given.
constexpr double kDefaultLr = 0.1;

/// What an option takes. A config file's value must be its JSON form: Flag true/false,
/// Integer and Real a number (or its text), List an array of integers (or "A,B,C"), Text a
/// string.
enum class OptionKind { Flag, Integer, Real, List, Text };

struct OptionSpec {
  std::string name;  ///< "--lr"; the config key is the name without the dashes
  OptionKind kind = OptionKind::Text;
  std::string help;
  std::string shown_default;         ///< after '=' in --help; empty: none shown
  std::vector<std::string> choices;  ///< a Text option's accepted values (empty: any)
  /// Checks `text` (the value as given; a flag's is unused) against the option's range and
  /// stores it in the config; throws ValueError "--lr nan: expected a finite number > 0".
  std::function<void(const std::string& name, const std::string& text, TrainConfig& c)> apply;

  std::string key() const { return name.substr(2); }
};

/// Every option but --config and --help, in --help's order; values given are applied in
/// this order too (--classes after --model).
const std::vector<OptionSpec>& train_options();

/// The option of config key `key` ("lr"); nullptr when there is none.
const OptionSpec* find_option_by_key(const std::string& key);

}  // namespace phalanx::trainer

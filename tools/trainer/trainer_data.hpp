#pragma once
// phalanx-train's data: the training (and optional test) set named by the options,
// checked against the model before any training starts.
#include <memory>
#include <string>
#include <vector>

#include <phalanx/samplers.hpp>

#include "train_config.hpp"

namespace phalanx::trainer {

/// A data file that does not fit the options (--model's widths, --classes): a usage error,
/// like a bad option (phalanx-train exits 2 with its one line).
class DataUsageError : public ValueError {
 public:
  using ValueError::ValueError;
};

struct Datasets {
  std::shared_ptr<samplers::TensorDataset> train, test;  ///< an MLP's or a CNN's
  /// A GPT's: the windows of the text's first 90 % and of its last 10 % (the validation set).
  std::shared_ptr<samplers::TextDataset> text_train, text_val;
  Shape input;                ///< one sample's features: [D] (an MLP), [C, H, W] (a CNN) or [T] (a GPT)
  std::int64_t classes = 0;   ///< the model's outputs (a GPT: 256, its vocabulary)
  /// The training set the loader batches.
  samplers::DatasetPtr training() const {
    return text_train ? samplers::DatasetPtr(text_train) : samplers::DatasetPtr(train);
  }
  /// A set evaluated at each epoch's end: the test set, or the text's validation part.
  bool has_test() const { return test != nullptr || text_val != nullptr; }
};

/// The files of --dataset text:F1,F2 or fortunes (Debian's package); empty for other datasets.
std::vector<std::string> text_files(const TrainConfig& config);

/// A GPT's text (--dataset text:... or fortunes): the windows of its context over the first
/// 90 % (stride --stride) and the last 10 % (stride the context: every byte predicted once);
/// a file that is not text, or text too short for one window, is a DataUsageError naming
/// the file and the limit.
/// Loads --dataset or --train-x/--train-y (and --test-x/--test-y), each F.npy or F.npz:KEY;
/// throws a one-line error when the data does not fit the model (features, label dtype,
/// label range) or, unless --no-data-check, holds a NaN/inf (naming the file and row).
/// For a CNN the input shape comes from the data: fashion-mnist is [1, 28, 28]; .npy
/// features [N, C, H, W] give [C, H, W] and [N, H, W] give [1, H, W]; the classes come
/// from --model cnn:...:K (or --classes), else from the dataset (fashion-mnist: 10). An
/// MLP's classes are --classes, else the largest label + 1 (train and test sets); its last
/// width must be that number, its first the data's features (else DataUsageError).
Datasets load_data(const TrainConfig& config);

/// Each data file named by --train-x/--train-y/--test-x/--test-y exists and is a regular
/// file (a FIFO would block, /dev/zero be read without end, a directory fail mid-read):
/// else an IoError naming the option, the file and what it is. Cheap: the files are opened
/// and closed, not read.
void check_data_files(const TrainConfig& config);

}  // namespace phalanx::trainer

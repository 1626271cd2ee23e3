#include "phalanx/data/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "phalanx/core/error.hpp"
#include "phalanx/core/finite.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/npy.hpp"

namespace phalanx::samplers {

TensorDataset::TensorDataset(Tensor features, Tensor labels, std::int64_t num_classes)
    : features_(std::move(features)), labels_(std::move(labels)) {
  if (!features_.defined() || !labels_.defined()) throw ValueError("TensorDataset: undefined tensor");
  features_ = features_.contiguous();  // a view (a column of a table) is read by its values
  labels_ = labels_.contiguous();
  if (features_.dim() < 1 || labels_.dim() < 1)
    throw ShapeError("TensorDataset: features and labels need a leading sample dimension, got " +
                     shape_str(features_.shape()) + " and " + shape_str(labels_.shape()));
  n_ = features_.shape()[0];
  if (labels_.shape()[0] != n_)
    throw ShapeError(detail::concat("TensorDataset: ", n_, " feature rows but ",
                                    labels_.shape()[0], " labels"));
  if (n_ == 0) throw ValueError("TensorDataset: the dataset is empty");
  if (!features_.device().is_cpu() || !labels_.device().is_cpu())
    throw TypeError("TensorDataset: data must be on the CPU (batches are moved by the trainer)");
  if (num_classes > 0) {
    if (labels_.dtype() != DType::Int64)
      throw TypeError(detail::concat("TensorDataset: class labels must be integers, got ", dtype_name(labels_.dtype())));
    const std::int64_t bad = kernels_for(Device::cpu()).find_label_out_of_range(labels_, num_classes);
    if (bad >= 0)
      throw ValueError(detail::concat("TensorDataset: label[", bad, "] = ",
                                      labels_.data<std::int64_t>()[bad],
                                      " is outside [0, ", num_classes, ")"));
  }
}

Shape TensorDataset::feature_shape() const { return Shape(features_.shape().begin() + 1, features_.shape().end()); }
Shape TensorDataset::label_shape() const { return Shape(labels_.shape().begin() + 1, labels_.shape().end()); }

void TensorDataset::gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const {
  const std::size_t xrow = features_.nbytes() / n_, yrow = labels_.nbytes() / n_;
  const auto* xs = static_cast<const char*>(features_.raw_data());
  const auto* ys = static_cast<const char*>(labels_.raw_data());
  auto* xd = static_cast<char*>(x.raw_data());
  auto* yd = static_cast<char*>(y.raw_data());
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t k = idx[i];
    if (k < 0 || k >= n_)
      throw ValueError(detail::concat("dataset index ", k, " is outside [0, ", n_, ")"));
    std::memcpy(xd + i * xrow, xs + k * xrow, xrow);
    std::memcpy(yd + i * yrow, ys + k * yrow, yrow);
  }
}

const MapDataset::Layout& MapDataset::layout() const {
  std::call_once(layout_once_, [this] {
    if (size() < 1) throw ValueError("MapDataset: the dataset is empty (size() is 0); it needs at least one example");
    const Example e = get(0);
    if (!e.x.defined() || !e.y.defined())
      throw ValueError("MapDataset: example 0 has an undefined features or label tensor; get(i) must return both");
    layout_ = Layout{e.x.shape(), e.y.shape(), e.x.dtype(), e.y.dtype()};
  });
  return layout_;
}

Shape MapDataset::feature_shape() const { return layout().x_shape; }
Shape MapDataset::label_shape() const { return layout().y_shape; }
DType MapDataset::feature_dtype() const { return layout().x_dtype; }
DType MapDataset::label_dtype() const { return layout().y_dtype; }

namespace {
// Copies one example's tensor into row `row` of `batch`, after checking it against example 0.
void put_row(const Tensor& t, const char* what, std::int64_t index, const Shape& shape0, DType dtype0,
             Tensor& batch, std::int64_t row) {
  if (!t.defined())
    throw ValueError(detail::concat("MapDataset: example ", index, " has an undefined ", what,
                                    " tensor; get(i) must return both features and label"));
  if (t.shape() != shape0)
    throw ValueError(detail::concat("MapDataset: example ", index, " has ", what, " of shape ", shape_str(t.shape()),
                                    ", example 0 ", shape_str(shape0), "; every example must have example 0's shapes"));
  if (t.dtype() != dtype0)
    throw ValueError(detail::concat("MapDataset: example ", index, " has ", what, " of dtype ", dtype_name(t.dtype()),
                                    ", example 0 ", dtype_name(dtype0), "; every example must have example 0's dtypes"));
  if (batch.dtype() != dtype0 || batch.nbytes() < static_cast<std::size_t>(row + 1) * t.nbytes())
    throw InternalError(detail::concat("MapDataset: the batch's ", what, " (", dtype_name(batch.dtype()), " ",
                                       shape_str(batch.shape()), ") does not fit example ", index,
                                       "; allocate it from feature_shape()/feature_dtype()"));
  if (!(t.device() == Device::cpu()))
    throw ValueError(detail::concat("MapDataset: example ", index, " has ", what, " on ", t.device().str(),
                                    "; get(i) must return CPU tensors (the DataLoader batches on the CPU)"));
  const Tensor src = t.contiguous();  // an example may be a view of a larger tensor
  const std::size_t bytes = src.nbytes();
  std::memcpy(static_cast<char*>(batch.raw_data()) + static_cast<std::size_t>(row) * bytes, src.raw_data(), bytes);
}
}  // namespace

void MapDataset::gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const {
  const Layout& l = layout();
  const std::int64_t n = size();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t k = idx[i];
    if (k < 0 || k >= n) throw ValueError(detail::concat("dataset index ", k, " is outside [0, ", n, ")"));
    const Example e = get(k);
    put_row(e.x, "features", k, l.x_shape, l.x_dtype, x, i);
    put_row(e.y, "label", k, l.y_shape, l.y_dtype, y, i);
  }
}

namespace {

// The dtype an .npy file stores, as NumPy names it, read from its header (only on the error
// path: the loaded tensor has already been converted).
std::string stored_npy_dtype(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string head(4096, '\0');
  f.read(&head[0], static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(f.gcount()));
  const auto key = head.find("'descr'");
  const auto open = key == std::string::npos ? key : head.find('\'', key + 7);
  const auto close = open == std::string::npos ? open : head.find('\'', open + 1);
  if (close == std::string::npos) return "floating point";
  const std::string descr = head.substr(open + 1, close - open - 1);
  if (descr == "<f8") return "float64";
  if (descr == "<f4") return "float32";
  if (descr == "<f2") return "float16";
  return "floating point (" + descr + ")";
}

std::string member_list(const TensorMap& m) {
  std::string s;
  for (const auto& name : m.names()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// First non-finite element (or -1) and how many there are, in one pass that tests 4096
// values at a time with integer operations and looks closer only at a chunk that has one.
std::int64_t find_nonfinite(const float* p, std::int64_t n, std::int64_t& count) {
  constexpr std::int64_t kChunk = 4096;
  std::int64_t first = -1;
  count = 0;
  for (std::int64_t s = 0; s < n; s += kChunk) {
    const std::int64_t e = std::min(n, s + kChunk);
    if (all_finite(p + s, e - s)) continue;
    for (std::int64_t i = s; i < e; ++i)
      if (!std::isfinite(p[i])) {
        if (first < 0) first = i;
        ++count;
      }
  }
  return first;
}

void check_finite(const Tensor& x, const std::string& what) {
  std::int64_t count = 0;
  const std::int64_t bad = find_nonfinite(x.data<float>(), x.numel(), count);
  if (bad < 0) return;
  const std::int64_t row_len = x.numel() / x.shape()[0];
  const float v = x.data<float>()[bad];
  throw ValueError(detail::concat(what, ": row ", bad / row_len, x.dim() == 2 ? ", column " : ", element ",
                                  bad % row_len, " is ", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", " (", count,
                                  count == 1 ? " non-finite value" : " non-finite values",
                                  " in all); the features must be finite numbers"));
}

}  // namespace

Tensor load_array(const std::string& spec) {
  const auto colon = spec.rfind(".npz:");
  const bool npz_path = spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".npz") == 0;
  if (colon == std::string::npos && !npz_path) return load_npy(spec);
  const std::string path = colon == std::string::npos ? spec : spec.substr(0, colon + 4);
  const std::string key = colon == std::string::npos ? "" : spec.substr(colon + 5);
  const TensorMap m = load_npz(path);
  if (key.empty())
    throw ValueError(path + " is an .npz archive: name the array as " + path + ":KEY (members: " + member_list(m) + ")");
  const Tensor* t = m.find(key);
  if (!t) throw ValueError(path + " has no member '" + key + "' (members: " + member_list(m) + ")");
  return *t;
}

std::shared_ptr<TensorDataset> load_npy_dataset(const std::string& fpath, const std::string& lpath,
                                                const NpyDatasetOptions& o) {
  Tensor x = load_array(fpath);
  Tensor y = load_array(lpath);
  if (x.dtype() != DType::Float32)
    throw TypeError(fpath + ": features must be float32 or float64, got " + dtype_name(x.dtype()));
  if (x.dim() < 1 || y.dim() < 1 || x.shape()[0] != y.shape()[0])
    throw ShapeError(fpath + " and " + lpath + ": " + shape_str(x.shape()) + " features but " +
                     shape_str(y.shape()) + " labels; the first dimensions must agree");
  if (o.num_classes > 0 && y.dtype() != DType::Int64) {
    const bool npz = lpath.find(".npz:") != std::string::npos;
    const std::string stored = npz ? "floating point (float32 or float64)" : stored_npy_dtype(lpath);
    throw TypeError(lpath + ": labels are " + stored + ", but class labels must be integers; convert them with " +
                    "y.astype(np.int64) before saving");
  }
  if (o.check_finite && x.numel() > 0) check_finite(x, fpath);
  try {
    return std::make_shared<TensorDataset>(x, y, o.num_classes);
  } catch (const ValueError& e) {  // an out-of-range label: name the file it came from
    std::string why = e.what();
    if (why.rfind("TensorDataset: ", 0) == 0) why = why.substr(15);
    throw ValueError(lpath + ": " + why);
  }
}

std::shared_ptr<TensorDataset> load_npy_dataset(const std::string& fpath, const std::string& lpath,
                                                std::int64_t num_classes) {
  NpyDatasetOptions o;
  o.num_classes = num_classes;
  return load_npy_dataset(fpath, lpath, o);
}

}  // namespace phalanx::samplers

#include "model_sync.hpp"

#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"

namespace phalanx::parallel {

namespace {
std::string describe(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::string s;
  for (const auto& [name, t] : named) s += name + "\t" + shape_str(t.shape()) + "\n";
  return s;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0, nl;
  while ((nl = s.find('\n', start)) != std::string::npos) {
    out.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

std::string pretty(const std::string& line) {
  const auto tab = line.find('\t');
  return "'" + line.substr(0, tab) + "' " + line.substr(tab + 1);
}
}  // namespace

void verify_same_model(ProcessGroup& pg, const std::vector<std::pair<std::string, Tensor>>& named) {
  const int W = pg.size();
  const std::string mine = describe(named);
  // Exchange lengths, then the descriptions packed 8 bytes per int64.
  Tensor len = tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(mine.size())}, {1});
  std::vector<Tensor> lens;
  for (int r = 0; r < W; ++r) lens.push_back(zeros({1}, DType::Int64));
  pg.allgather(lens, len)->wait();
  std::int64_t max_len = 0;
  for (auto& l : lens) max_len = std::max(max_len, l.item_int());
  const std::int64_t words = (max_len + 7) / 8;
  Tensor packed = zeros({std::max<std::int64_t>(words, 1)}, DType::Int64);
  std::memcpy(packed.raw_data(), mine.data(), mine.size());
  std::vector<Tensor> all;
  for (int r = 0; r < W; ++r) all.push_back(zeros({std::max<std::int64_t>(words, 1)}, DType::Int64));
  pg.allgather(all, packed)->wait();
  std::vector<std::vector<std::string>> desc;
  for (int r = 0; r < W; ++r)
    desc.push_back(lines(std::string(static_cast<const char*>(all[r].raw_data()), lens[r].item_int())));
  // Every rank runs the same comparison on the same data: the same message everywhere.
  for (int r = 1; r < W; ++r) {
    const auto& a = desc[0];
    const auto& b = desc[r];
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i])
        throw ConfigError(detail::concat("DDP: the model differs across ranks: parameter ", i, " is ", pretty(a[i]),
                                         " on rank 0 but ", pretty(b[i]), " on rank ", r,
                                         "; every rank must construct the same model"));
    if (a.size() != b.size())
      throw ConfigError(detail::concat("DDP: the model differs across ranks: rank 0 has ", a.size(),
                                       " parameters, rank ", r, " has ", b.size(),
                                       "; every rank must construct the same model"));
  }
}

void broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root) {
  NoGradGuard no_grad;
  for (DType dt : {DType::Float32, DType::Int64}) {
    std::int64_t total = 0;
    for (const auto& t : tensors)
      if (t.dtype() == dt) total += t.numel();
    if (total == 0) continue;
    Tensor flat = Tensor::empty({total}, dt);
    const std::size_t esz = element_size(dt);
    std::int64_t off = 0;
    for (const auto& t : tensors)
      if (t.dtype() == dt) {
        std::memcpy(static_cast<char*>(flat.raw_data()) + off * esz, t.to(Device::cpu()).raw_data(), t.nbytes());
        off += t.numel();
      }
    pg.broadcast(flat, root)->wait();
    off = 0;
    for (const auto& t : tensors)
      if (t.dtype() == dt) {
        Tensor slice(std::make_shared<TensorImpl>(flat.impl()->storage(), static_cast<std::size_t>(off) * esz,
                                                  t.shape(), dt));
        Tensor(t).copy_(slice);
        off += t.numel();
      }
  }
}

}  // namespace phalanx::parallel

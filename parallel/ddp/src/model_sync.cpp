#include "phalanx/parallel/internal/model_sync.hpp"

#include <algorithm>
#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx::parallel {

namespace {
std::string describe(const NamedTensors& named) {
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

Device model_device(const NamedTensors& params, const NamedTensors& buffers) {
  const std::pair<std::string, Tensor>* first = nullptr;
  const char* first_kind = "parameter";
  for (const NamedTensors* list : {&params, &buffers}) {
    const char* kind = list == &params ? "parameter" : "buffer";
    for (const auto& nt : *list) {
      if (!first) {
        first = &nt;
        first_kind = kind;
      } else if (nt.second.device() != first->second.device()) {
        throw ConfigError(detail::concat("DDP: the model spans devices: ", first_kind, " '", first->first, "' is on ",
                                         first->second.device().str(), " but ", kind, " '", nt.first, "' is on ",
                                         nt.second.device().str(),
                                         "; move the whole model to one device before wrapping it "
                                         "(model->to(parallel::local_device()))"));
      }
    }
  }
  return first ? first->second.device() : Device::cpu();
}

std::vector<std::string> allgather_bytes(ProcessGroup& pg, const std::string& mine, Device device) {
  const int W = pg.size();
  const std::int64_t my_len = static_cast<std::int64_t>(mine.size());
  Tensor len = from_buffer(&my_len, {1}, device);
  std::vector<Tensor> lens;
  for (int r = 0; r < W; ++r) lens.push_back(Tensor::empty({1}, DType::Int64, device));
  pg.allgather(lens, len)->synchronize();  // read on the host: its failure too
  std::vector<std::int64_t> sizes;
  for (const auto& l : lens) sizes.push_back(l.item_int());
  // Checked before any use: a bad length (memory a collective read too early) must not size
  // or overrun a buffer; every rank got the same lengths, so every rank throws alike.
  for (int r = 0; r < W; ++r)
    if (sizes[r] < 0 || (r == pg.rank() && sizes[r] != my_len))
      throw InternalError(detail::concat("allgather_bytes: rank ", r, " sent a length of ", sizes[r]));
  const std::int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  const std::int64_t words = std::max<std::int64_t>(1, (longest + 7) / 8);
  std::vector<std::int64_t> packed(static_cast<std::size_t>(words), 0);  // host memory
  std::memcpy(packed.data(), mine.data(), mine.size());
  Tensor buf = from_buffer(packed.data(), {words}, device);
  std::vector<Tensor> bufs;
  for (int r = 0; r < W; ++r) bufs.push_back(Tensor::empty({words}, DType::Int64, device));
  pg.allgather(bufs, buf)->synchronize();
  std::vector<std::string> out;
  for (int r = 0; r < W; ++r) {
    const std::vector<std::int64_t> theirs = bufs[r].to_vector<std::int64_t>();  // copied back on purpose
    if (sizes[r] < 0 || sizes[r] > words * 8)
      throw InternalError(detail::concat("allgather_bytes: rank ", r, " sent a length of ", sizes[r]));
    out.emplace_back(reinterpret_cast<const char*>(theirs.data()), static_cast<std::size_t>(sizes[r]));
  }
  return out;
}

void verify_same_model(ProcessGroup& pg, const NamedTensors& named, Device device) {
  const int W = pg.size();
  std::vector<std::vector<std::string>> desc;
  for (const std::string& d : allgather_bytes(pg, describe(named), device)) desc.push_back(lines(d));
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
  if (tensors.empty()) return;
  NoGradGuard no_grad;
  const Device device = tensors.front().device();
  DeviceKernels& k = kernels_for(device);
  for (DType dt : {DType::Float32, DType::Int64, DType::Float16, DType::BFloat16, DType::Bool}) {  // every dtype: none skipped
    std::int64_t total = 0;
    for (const auto& t : tensors)
      if (t.dtype() == dt) {
        if (t.device() != device)
          throw ConfigError("DDP: the tensors to broadcast span devices (" + device.str() + " and " +
                            t.device().str() + "); keep the whole model on one device");
        total += t.numel();
      }
    if (total == 0) continue;
    // One flat buffer on the tensors' device, filled and emptied by device copies.
    Tensor flat = Tensor::empty({total}, dt, device);
    char* base = static_cast<char*>(flat.raw_data());
    const std::size_t esz = element_size(dt);
    std::size_t off = 0;
    for (const auto& t : tensors)
      if (t.dtype() == dt) {
        k.copy(base + off, t.raw_data(), t.nbytes());
        off += static_cast<std::size_t>(t.numel()) * esz;
      }
    pg.broadcast(flat, root)->wait();
    off = 0;
    for (const auto& t : tensors)
      if (t.dtype() == dt) {
        k.copy(t.raw_data(), base + off, t.nbytes());
        off += static_cast<std::size_t>(t.numel()) * esz;
      }
  }
}

}  // namespace phalanx::parallel

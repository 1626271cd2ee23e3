// "storecomm": a communication backend that moves every tensor through the rendezvous
// store. Slow (each byte goes through one TCP server) but tiny and portable: it shows what
// a backend implements. Every rank publishes its contribution under "<op seq>/<rank>",
// reads the others', and computes the result locally; the last reader deletes the keys.
#include <algorithm>
#include <map>
#include <cstring>

#include <phalanx/backends/backend.hpp>
#include <phalanx/backends/plugin_abi.h>
#include <phalanx/backends/process_group.hpp>
#include <phalanx/backends/store.hpp>
#include <phalanx/core/kernels.hpp>

namespace {

using phalanx::Bytes;
using phalanx::DType;
using phalanx::ReduceOp;
using phalanx::Tensor;

// A backend implements the synchronous run_* hooks; the ProcessGroup that owns it runs them
// on its worker thread and destroys the backend only after that thread stopped.
class StoreBackend final : public phalanx::Backend {
 public:
  explicit StoreBackend(const phalanx::BackendConfig& c) : Backend(c.rank, c.size, c.timeout), store_(c.store) {}
  std::string name() const override { return "storecomm"; }

 protected:
  // Publishes `mine`, returns every rank's bytes (index = rank).
  std::vector<Bytes> exchange(std::uint64_t seq, const Bytes& mine) {
    const std::string base = "sc/" + std::to_string(seq) + "/";
    store_->set(base + std::to_string(rank()), mine);
    std::vector<Bytes> all(size());
    for (int r = 0; r < size(); ++r) all[r] = store_->get(base + std::to_string(r));
    if (store_->add(base + "read", 1) == size()) {  // the last reader cleans up
      for (int r = 0; r < size(); ++r) store_->delete_key(base + std::to_string(r));
      store_->delete_key(base + "read");
    }
    return all;
  }
  static Bytes bytes_of(const Tensor& t) {
    const auto* p = static_cast<const std::uint8_t*>(t.raw_data());
    return Bytes(p, p + t.nbytes());
  }
  static void fill(Tensor& t, const Bytes& b) { std::memcpy(t.raw_data(), b.data(), t.nbytes()); }

  template <typename T>
  static void reduce_into(T* out, const std::vector<Bytes>& all, ReduceOp op, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      T acc;
      std::memcpy(&acc, all[0].data() + i * sizeof(T), sizeof(T));
      for (std::size_t r = 1; r < all.size(); ++r) {
        T v;
        std::memcpy(&v, all[r].data() + i * sizeof(T), sizeof(T));
        switch (op) {
          case ReduceOp::Sum: case ReduceOp::Avg: acc += v; break;
          case ReduceOp::Product: acc *= v; break;
          case ReduceOp::Min: acc = std::min(acc, v); break;
          case ReduceOp::Max: acc = std::max(acc, v); break;
        }
      }
      out[i] = acc;
    }
  }
  void reduce_all(Tensor& t, const std::vector<Bytes>& all, ReduceOp op) {
    if (t.dtype() == DType::Float32) {
      reduce_into(t.data<float>(), all, op, t.numel());
      if (op == ReduceOp::Avg) phalanx::kernels_for(t.device()).divide(t, static_cast<float>(size()));
    } else if (t.dtype() == DType::Int64) {
      reduce_into(t.data<std::int64_t>(), all, op, t.numel());
    } else {
      throw phalanx::TypeError("storecomm: only float32 and int64 tensors");
    }
  }

  void run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) override { reduce_all(t, exchange(seq, bytes_of(t)), op); }
  void run_broadcast(Tensor& t, int root, std::uint64_t seq) override {
    fill(t, exchange(seq, rank() == root ? bytes_of(t) : Bytes{})[root]);
  }
  void run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) override {
    auto all = exchange(seq, bytes_of(in));
    for (int r = 0; r < size(); ++r) fill(out[r], all[r]);
  }
  void run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) override {
    Bytes mine;
    for (auto& t : in) { auto b = bytes_of(t); mine.insert(mine.end(), b.begin(), b.end()); }
    auto all = exchange(seq, mine);
    for (auto& b : all) b = Bytes(b.begin() + rank() * out.nbytes(), b.begin() + (rank() + 1) * out.nbytes());
    reduce_all(out, all, op);
  }
  void run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) override {
    auto all = exchange(seq, bytes_of(t));
    if (rank() == root) reduce_all(t, all, op);
  }
  void run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) override {
    auto all = exchange(seq, bytes_of(in));
    if (rank() == root) for (int r = 0; r < size(); ++r) fill(out[r], all[r]);
  }
  void run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) override {
    Bytes mine;
    if (rank() == root) for (auto& t : in) { auto b = bytes_of(t); mine.insert(mine.end(), b.begin(), b.end()); }
    const Bytes all = exchange(seq, mine)[root];  // a copy: the vector is a temporary
    std::memcpy(out.raw_data(), all.data() + rank() * out.nbytes(), out.nbytes());
  }
  void run_barrier(std::uint64_t seq) override { exchange(seq, {}); }
  void run_send(const Tensor& t, int dst, int tag, std::uint64_t) override {
    store_->set(p2p_key(rank(), dst, tag), bytes_of(t));
  }
  void run_recv(Tensor& t, int src, int tag, std::uint64_t) override {
    const std::string key = p2p_key(src, rank(), tag);
    fill(t, store_->get(key));
    store_->delete_key(key);
  }

 private:
  std::string p2p_key(int src, int dst, int tag) {
    return "sc/p2p/" + std::to_string(src) + ">" + std::to_string(dst) + "/" + std::to_string(tag) + "/" +
           std::to_string(p2p_count_[src * 1000003 + dst * 1009 + tag]++);
  }
  std::map<long long, std::uint64_t> p2p_count_;
  phalanx::StorePtr store_;
};

void* create(const void* config, char*, size_t) {
  // The loader takes a phalanx::Backend* (plugin_abi.h): convert before the void*.
  return static_cast<phalanx::Backend*>(new StoreBackend(*static_cast<const phalanx::BackendConfig*>(config)));
}
void destroy(void* backend) { delete static_cast<phalanx::Backend*>(backend); }

const phalanx_plugin_descriptor kDescriptor = {
    PHALANX_PLUGIN_ABI_VERSION, "storecomm", "comm", "collectives through the rendezvous store (example)",
    nullptr, &create, &destroy};

}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}

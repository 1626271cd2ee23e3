// Writes tests/fuzz/corpus/checkpoint/ (the seeds of fuzz_checkpoint.cpp): real checkpoints
// of a tiny MLP, as files (mode byte 0) and as member lists (mode bytes 1 and 3).
//   g++ -std=c++17 tests/fuzz/make_checkpoint_seeds.cpp -Iinclude -I{core,optim,samplers,backends,data}/include \
//       -Iparallel/{rendezvous,ddp,training}/include \
//       -Ibuild/include -Lbuild -lphalanx -Wl,-rpath,$PWD/build -o /tmp/mk && /tmp/mk tests/fuzz/corpus/checkpoint
#include <cstdio>
#include <fstream>
#include <iterator>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

namespace {
std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void put(const std::string& path, char mode, const std::string& body) {
  std::ofstream(path, std::ios::binary) << mode << body;
}
std::string as_members(const TensorMap& m) {
  std::string out;
  for (const auto& [k, v] : m) {
    const std::string npy = serialize_npy(v);
    out += static_cast<char>(k.size());
    out += k;
    const auto n = static_cast<std::uint32_t>(npy.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += npy;
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  Generator g(1);
  auto net = nn::mlp({2, 3, 2}, "relu", &g);
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::StepLR sched(opt, 2);
  cross_entropy(net->forward(randn({2, 2}, &g)), tensor(std::vector<std::int64_t>{0, 1}, {2})).backward();
  opt.step();
  sched.step();
  parallel::CheckpointState s;
  s.model = net->state_dict();
  s.optimizer = opt.state_dict();
  s.step = 3;
  s.epoch = 1;
  s.step_in_epoch = 1;
  s.world_size = 2;
  s.global_batch = 64;
  s.micro_batch = 32;
  const std::string plain = dir + "/.tmp_plain.npz", full = dir + "/.tmp_full.npz";
  parallel::save_checkpoint(plain, s);
  s.scheduler = sched.state_dict();
  s.generators["default"] = g.get_state();
  s.user.set("epoch_stats", tensor(std::vector<float>{1.5f, 2.f}, {1, 2}));
  s.scalars["loss"] = 0.25;
  parallel::save_checkpoint(full, s);
  put(dir + "/file_plain", 0, bytes_of(plain));
  put(dir + "/file_full", 0, bytes_of(full));
  put(dir + "/members_full_checksummed", 3, as_members(load_npz(full)));
  put(dir + "/members_full_expect", 15, as_members(load_npz(full)));
  put(dir + "/members_plain", 1, as_members(load_npz(plain)));
  std::remove(plain.c_str());
  std::remove(full.c_str());
  return 0;
}

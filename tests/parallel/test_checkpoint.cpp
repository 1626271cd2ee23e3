// Checkpoints that can't lie: round trip, CRC-32 and checksum, manifest checks, the folder.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include <phalanx/phalanx.hpp>

using namespace phalanx;
using parallel::CheckpointDir;
using parallel::CheckpointExpect;
using parallel::CheckpointState;

namespace {

std::string tmp_dir() {
  static const std::string d = [] {
    const std::string p = "/tmp/phalanx_ckpt_test_" + std::to_string(::getpid());
    std::system(("rm -rf " + p + " && mkdir -p " + p).c_str());
    return p;
  }();
  return d;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Fixture {
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::SGD> opt;
  CheckpointState state;
  Fixture(std::vector<std::int64_t> widths = {6, 5, 3}) {
    Generator g(7);
    net = nn::mlp(widths, "relu", &g);
    opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{0.1, 0.9});
    Tensor loss = cross_entropy(net->forward(randn({4, widths.front()}, &g)), tensor(std::vector<std::int64_t>{0, 1, 2, 0}, {4}));
    loss.backward();
    opt->step();  // momentum buffers exist
    state.model = net->state_dict();
    state.optimizer = opt->state_dict();
    state.step = 17;
    state.epoch = 2;
    state.step_in_epoch = 5;
    state.world_size = 2;
    state.global_batch = 64;
    state.micro_batch = 32;
    Generator r(3);
    r.normal();  // a cached spare
    state.generators["data"] = r.get_state();
    state.user.set("curve", tensor(std::vector<float>{1.5f, 1.25f}, {2}));
    state.scalars["loss_sum"] = 0.1 + 0.2;  // not representable in float32
  }
};

}  // namespace

TEST_CASE("a checkpoint round-trips every part exactly, with its manifest") {
  Fixture f;
  const std::string p = tmp_dir() + "/rt.npz";
  const auto written = parallel::save_checkpoint(p, f.state);
  const auto loaded = parallel::load_checkpoint(p);
  const CheckpointState& s = loaded.state;
  CHECK(s.step == 17);
  CHECK(s.epoch == 2);
  CHECK(s.step_in_epoch == 5);
  CHECK(s.world_size == 2);
  CHECK(s.global_batch == 64);
  CHECK(s.micro_batch == 32);
  CHECK(s.scalars.at("loss_sum") == 0.1 + 0.2);
  CHECK(s.user.at("curve").to_vector<float>() == std::vector<float>{1.5f, 1.25f});
  const auto g = s.generators.at("data"), want = f.state.generators.at("data");
  CHECK(g.state == want.state);
  CHECK(g.inc == want.inc);
  CHECK(g.has_spare == want.has_spare);
  CHECK(g.spare == want.spare);
  for (const auto& [k, v] : f.state.model) CHECK(s.model.at(k).to_vector<float>() == v.to_vector<float>());
  CHECK(s.optimizer.names() == f.state.optimizer.names());
  CHECK(loaded.manifest.checksum == written.checksum);
  CHECK(loaded.manifest.written_unix == written.written_unix);
  CHECK(loaded.manifest.written_at().find(" UTC") != std::string::npos);
  // A plain .npz reader sees ordinary members (as numpy does).
  const TensorMap raw = load_npz(p);
  CHECK(raw.contains("model.0.weight"));
  CHECK(raw.at("manifest.step").item_int() == 17);
  // The restored state drives the live objects.
  Fixture other({6, 5, 3});
  other.net->load_state_dict(s.model);
  other.opt->load_state_dict(s.optimizer);
}

TEST_CASE("every flipped byte of the content is refused, naming the file, and the file is left unchanged") {
  Fixture f;
  const std::string p = tmp_dir() + "/flip.npz";
  parallel::save_checkpoint(p, f.state);
  const std::string good = read_bytes(p);
  int refused = 0, tried = 0;
  // Every 7th byte over the whole file: headers, names, data, directory.
  for (std::size_t at = 0; at < good.size(); at += 7) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    write_bytes(p, bad);
    ++tried;
    try {
      parallel::load_checkpoint(p);
    } catch (const Error& e) {
      ++refused;
      CHECK(std::string(e.what()).find(p) != std::string::npos);
    }
    CHECK(read_bytes(p) == bad);  // the loader never writes
  }
  // Every byte counts: the members by their CRC-32 and the content checksum, the zip headers
  // and directory by the whole-file CRC-32 at the end.
  CHECK(refused == tried);
  // A byte inside a weight: the CRC-32 names the member.
  std::string bad = good;
  const auto at = good.find("model.0.weight.npy");
  REQUIRE(at != std::string::npos);
  bad[at + 18 + 30 + 128 + 5] ^= 1;  // past the local header and the .npy header, into the data
  write_bytes(p, bad);
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p), doctest::Contains("member 'model.0.weight.npy' fails its CRC-32 checksum (stored "), IoError);
}

TEST_CASE("a member changed with a valid CRC is caught by the content checksum") {
  Fixture f;
  const std::string p = tmp_dir() + "/sum.npz";
  parallel::save_checkpoint(p, f.state);
  TensorMap m = load_npz(p);
  TensorMap changed;
  for (const auto& [k, v] : m) {
    if (k == "model.0.bias") {
      auto vals = v.to_vector<float>();
      vals[0] += 1e-3f;
      changed.set(k, tensor(vals, v.shape()));
    } else {
      changed.set(k, v);
    }
  }
  save_npz(p, changed);
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p), doctest::Contains("checksum mismatch (stored 0x"), IoError);
  // And a plain .npz is no checkpoint.
  save_npz(p, f.state.model);
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p), doctest::Contains("not a Phalanx checkpoint"), IoError);
}

TEST_CASE("the manifest is checked against the current run, showing both values") {
  Fixture f;
  const std::string p = tmp_dir() + "/man.npz";
  parallel::save_checkpoint(p, f.state);
  CheckpointExpect e;
  e.world_size = 4;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("written with world size 2, this run has 4"),
                       ConfigError);
  e = {};
  e.global_batch = 128;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("global batch 64, this run has 128"), ConfigError);
  e = {};
  Fixture wide({6, 7, 3});
  const TensorMap other_model = wide.net->state_dict();
  e.model = &other_model;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("stored 0.weight [5, 6] float32, current 0.weight [7, 6] float32"),
                       ConfigError);
  e = {};
  optim::Adam adam(f.net->parameters(), optim::AdamOptions{});
  const TensorMap adam_state = adam.state_dict();
  e.optimizer = &adam_state;
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("another optimizer's state"), ConfigError);
  // The matching expectation loads.
  e = {};
  e.world_size = 2;
  e.global_batch = 64;
  e.micro_batch = 32;
  const TensorMap model = f.net->state_dict(), opt = f.opt->state_dict();
  e.model = &model;
  e.optimizer = &opt;
  CHECK(parallel::load_checkpoint(p, e).state.step == 17);
  // A newer format is refused by name.
  TensorMap m = load_npz(p);
  m.set("manifest.format_version", tensor(std::vector<std::int64_t>{parallel::kCheckpointFormat + 1}, {}));
  m.set("manifest.checksum", tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(parallel::content_checksum(m))}, {}));
  save_npz(p, m);
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p), doctest::Contains("format version 2, this Phalanx reads up to 1"), IoError);
}

TEST_CASE("a checkpoint folder keeps the newest N and never overwrites a file it did not write") {
  const std::string d = tmp_dir() + "/dir/a";  // parents are created
  Fixture f;
  CheckpointDir dir(d, 2);
  CHECK_FALSE(dir.latest().has_value());
  for (std::int64_t step : {3, 6, 9, 12}) {
    f.state.step = step;
    dir.save(f.state);
  }
  auto all = dir.list();
  REQUIRE(all.size() == 2);
  CHECK(all[0] == d + "/checkpoint-0000000009.npz");
  CHECK(*dir.latest() == d + "/checkpoint-0000000012.npz");
  CHECK(parallel::load_checkpoint(*dir.latest()).state.step == 12);
  // The same object may replace its own file of the same step (e.g. the final checkpoint).
  f.state.epoch = 3;
  CHECK(dir.save(f.state) == d + "/checkpoint-0000000012.npz");
  // A new object (a restarted run) keeps a damaged file of the same step for inspection.
  std::string bytes = read_bytes(*dir.latest());
  bytes[bytes.size() / 2] ^= 4;
  write_bytes(d + "/checkpoint-0000000012.npz", bytes);
  CheckpointDir again(d, 2);
  CHECK(again.save(f.state) == d + "/checkpoint-0000000012.1.npz");
  CHECK(read_bytes(d + "/checkpoint-0000000012.npz") == bytes);
  CHECK(*again.latest() == d + "/checkpoint-0000000012.1.npz");
  // No temporary file is left behind.
  for (const auto& p : again.list()) CHECK(p.find(".tmp") == std::string::npos);
  CHECK(::access((d + "/checkpoint-0000000012.1.npz.tmp").c_str(), F_OK) != 0);
  CHECK_THROWS_WITH_AS(CheckpointDir(d, 0), doctest::Contains("keep_last must be >= 1"), ValueError);
}

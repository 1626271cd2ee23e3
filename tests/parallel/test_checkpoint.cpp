// Checkpoints that can't lie: round trip, CRC-32 and checksum, manifest checks, the folder.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
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
    opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
    Tensor loss = cross_entropy(net->forward(randn({4, widths.front()}, &g)), tensor(std::vector<std::int64_t>{0, 1, 2, 0}, {4}));
    loss.backward();
    opt->step();  // momentum buffers exist
    state.model = net->state_dict();
    state.optimizer = opt->state_dict();
    state.step = 17;
    state.epoch = 2;
    state.step_in_epoch = 5;
    state.world_size = 1;  // this test process's default world
    state.global_batch = 64;
    state.micro_batch = 32;
    Generator r(3);
    r.normal();  // a cached spare
    state.generators["data"] = r.get_state();
    state.user.set("curve", tensor(std::vector<float>{1.5f, 1.25f}, {2}));
    state.scalars["loss_sum"] = 0.1 + 0.2;  // not representable in float32
  }
};

// A deep copy of a state dict with its first float value changed (state dicts share the parameters).
TensorMap nudged(const TensorMap& m, float by = 1.f) {
  TensorMap out;
  bool done = false;
  for (const auto& [k, v] : m) {
    Tensor c = v.clone();
    if (!done && c.dtype() == DType::Float32 && c.numel() > 0) c.data<float>()[0] += by, done = true;
    out.set(k, c);
  }
  REQUIRE(done);
  return out;
}

}  // namespace

TEST_CASE("a checkpoint round-trips every part exactly, with its manifest") {
  Fixture f;
  f.state.world_size = 2;
  const std::string p = tmp_dir() + "/rt.npz";
  const auto written = parallel::save_checkpoint(p, f.state);
  CheckpointExpect any;
  any.world_size = parallel::kAnyWorld;
  const auto loaded = parallel::load_checkpoint(p, any);
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
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("written with world size 1, this run has 4"),
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
  e.world_size = 1;
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

TEST_CASE("the settings a resume must keep are stored and compared, naming the setting and both values") {
  const std::string p = tmp_dir() + "/config.npz";
  Fixture f;
  f.state.config = {{"lr", "0.1"}, {"seed", "5"}, {"activation", "relu"}};
  parallel::save_checkpoint(p, f.state);
  CHECK(parallel::load_checkpoint(p).state.config == f.state.config);
  std::map<std::string, std::string> now = f.state.config;
  CheckpointExpect e;
  e.config = &now;
  CHECK_NOTHROW(parallel::load_checkpoint(p, e));
  now["lr"] = "0.2";
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e),
                       doctest::Contains("was written with lr 0.1, this run has 0.2: resume with the same lr"), ConfigError);
  now = f.state.config;
  now["shuffle"] = "off";  // a setting the file does not record
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p, e), doctest::Contains("does not record the setting 'shuffle'"),
                       ConfigError);
  // A file recording no settings (written before they were stored) is not checked.
  f.state.config.clear();
  parallel::save_checkpoint(p, f.state);
  CHECK_NOTHROW(parallel::load_checkpoint(p, e));
}

TEST_CASE("one run per folder: a second lock is refused naming the holder's pid; a killed writer's temp files go") {
  const std::string d = tmp_dir() + "/locked";
  CheckpointDir a(d, 2);
  { std::ofstream(d + "/checkpoint-0000000004.npz.tmp.Ab12Cd") << "torn"; }
  a.lock();
  CHECK(::access((d + "/checkpoint-0000000004.npz.tmp.Ab12Cd").c_str(), F_OK) != 0);
  // flock locks belong to the open file: another open (another run) is refused, even here.
  CheckpointDir b(d, 2);
  const std::string holder = "is in use by another run (pid " + std::to_string(::getpid()) + ")";
  CHECK_THROWS_WITH_AS(b.lock(), doctest::Contains(holder.c_str()), ConfigError);
  // Two writers never share a temporary name: a leftover of the fixed old name is untouched.
  { std::ofstream(d + "/checkpoint-0000000008.npz.tmp") << "other writer"; }
  Fixture f;
  f.state.step = 8;
  a.save(f.state);
  CHECK(read_bytes(d + "/checkpoint-0000000008.npz.tmp") == "other writer");
  std::remove((d + "/checkpoint-0000000008.npz.tmp").c_str());
}

TEST_CASE("walking back past damaged files; superseded files are no checkpoints; pruning spares both") {
  const std::string d = tmp_dir() + "/walk";
  Fixture f;
  {
    CheckpointDir dir(d, 2);
    for (std::int64_t step : {10, 20, 30}) {
      f.state.step = step;
      dir.save(f.state);
    }
  }
  std::string bytes = read_bytes(d + "/checkpoint-0000000030.npz");
  bytes[bytes.size() / 3] ^= 1;
  write_bytes(d + "/checkpoint-0000000030.npz", bytes);
  CheckpointDir dir(d, 2);
  std::vector<parallel::SkippedCheckpoint> skipped;
  auto got = dir.load_newest({}, &skipped);
  REQUIRE(got.has_value());
  CHECK(got->first == d + "/checkpoint-0000000020.npz");
  CHECK(got->second.state.step == 20);
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].path == d + "/checkpoint-0000000030.npz");
  CHECK(skipped[0].reason.find("damaged") != std::string::npos);
  dir.protect(got->first);
  // keep_last 2 counts neither the damaged file nor removes it, nor the file resumed from.
  for (std::int64_t step : {21, 22, 23}) {
    f.state.step = step;
    dir.save(f.state);
  }
  CHECK(read_bytes(d + "/checkpoint-0000000030.npz") == bytes);
  CHECK(::access((d + "/checkpoint-0000000020.npz").c_str(), F_OK) == 0);
  CHECK(::access((d + "/checkpoint-0000000021.npz").c_str(), F_OK) != 0);
  CHECK(::access((d + "/checkpoint-0000000022.npz").c_str(), F_OK) == 0);
  // Resuming from step 21's older sibling abandons the newer ones: renamed, kept, invisible.
  const auto renamed = dir.supersede_after(22);
  REQUIRE(renamed.size() == 2);
  CHECK(renamed[0] == d + "/checkpoint-0000000023.npz.superseded");
  CHECK(renamed[1] == d + "/checkpoint-0000000030.npz.superseded");
  CHECK(*dir.latest() == d + "/checkpoint-0000000022.npz");
  // Superseding again never replaces an earlier superseded file of the same name.
  f.state.step = 23;
  dir.save(f.state);
  const auto again = dir.supersede_after(22);
  REQUIRE(again.size() == 1);
  CHECK(again[0] == d + "/checkpoint-0000000023.npz.superseded.1");
  CHECK(::access((d + "/checkpoint-0000000023.npz.superseded").c_str(), F_OK) == 0);
  // Nothing that verifies: nullopt, every file reported.
  const std::string e = tmp_dir() + "/allbad";
  {
    CheckpointDir one(e, 2);
    f.state.step = 1;
    write_bytes(one.save(f.state), "not a zip");
  }
  CheckpointDir bad(e, 2);
  skipped.clear();
  CHECK_FALSE(bad.load_newest({}, &skipped).has_value());
  CHECK(skipped.size() == 1);
}

TEST_CASE("a member name with control bytes is escaped in the message; a non-regular file is refused") {
  const std::string p = tmp_dir() + "/names.npz";
  Fixture f;
  parallel::save_checkpoint(p, f.state);
  TensorMap m = load_npz(p);  // a consistent writer's file with one member more
  m.set("bad\x1b[31mname\xff", zeros({1}));
  save_npz(p, m);
  m = load_npz(p);  // the name as the zip reader gives it back (libzip maps CP437 to UTF-8)
  m.set("manifest.checksum", tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(parallel::content_checksum(m))}, {}));
  save_npz(p, m);
  std::string msg;
  try {
    parallel::load_checkpoint(p);
  } catch (const IoError& e) {
    msg = e.what();
  }
  CHECK(msg.find("unexpected member 'bad\\x") != std::string::npos);
  for (unsigned char ch : msg) CHECK((ch >= 0x20 && ch < 0x7f));
  CHECK_THROWS_WITH_AS(load_npz("/dev/zero"), doctest::Contains("/dev/zero: is a character device, not a regular file"),
                       IoError);
  const std::string fifo = tmp_dir() + "/fifo.npz";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // no writer: opening must not wait for one
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(fifo), doctest::Contains("fifo.npz: is a FIFO, not a regular file"),
                       IoError);
}

namespace {
// A victim file outside the folder, and a symbolic link to it planted at `link`.
std::string plant(const std::string& link) {
  const std::string victim = tmp_dir() + "/victim_" + std::to_string(std::hash<std::string>()(link));
  write_bytes(victim, "precious");
  std::remove(link.c_str());
  REQUIRE(::symlink(victim.c_str(), link.c_str()) == 0);
  return victim;
}
unsigned mode_of(const std::string& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}
}  // namespace

TEST_CASE("a .lock planted as a symbolic link is refused and its target is left unchanged") {
  // mkdir ck; ln -s /path/victim ck/.lock: the trainer once truncated the victim and wrote its pid there.
  const std::string d = tmp_dir() + "/planted_lock";
  REQUIRE(::mkdir(d.c_str(), 0700) == 0);
  const std::string victim = plant(d + "/.lock");
  CheckpointDir dir(d, 2);
  CHECK_THROWS_WITH_AS(dir.lock(), doctest::Contains((d + "/.lock: is a symbolic link").c_str()), IoError);
  CHECK(read_bytes(victim) == "precious");
  // A dangling one does not create its target either.
  std::remove((d + "/.lock").c_str());
  const std::string target = tmp_dir() + "/created_through_lock";
  REQUIRE(::symlink(target.c_str(), (d + "/.lock").c_str()) == 0);
  CHECK_THROWS_AS(dir.lock(), IoError);
  CHECK(::access(target.c_str(), F_OK) != 0);
  // A hard link to another file (its only other name) likewise.
  std::remove((d + "/.lock").c_str());
  REQUIRE(::link(victim.c_str(), (d + "/.lock").c_str()) == 0);
  CHECK_THROWS_WITH_AS(dir.lock(), doctest::Contains("hard links"), IoError);
  CHECK(read_bytes(victim) == "precious");
}

TEST_CASE("planted checkpoint and temporary names do not change their targets") {
  const std::string d = tmp_dir() + "/planted_names";
  CheckpointDir dir(d, 5);
  dir.lock();
  Fixture f;
  f.state.step = 8;
  // The name the save would take: a link there is another's, never replaced or written through.
  const std::string victim = plant(d + "/checkpoint-0000000008.npz");
  // Links at temporary names a writer might try (the names are random, so at least these).
  const std::string tmp_victim = plant(d + "/checkpoint-0000000008.1.npz.tmp");
  const std::string pid_victim = plant(d + "/checkpoint-0000000008.1.npz.tmp." + std::to_string(::getpid()));
  const std::string written = dir.save(f.state);
  CHECK(written == d + "/checkpoint-0000000008.1.npz");
  CHECK(read_bytes(victim) == "precious");
  CHECK(read_bytes(tmp_victim) == "precious");
  CHECK(read_bytes(pid_victim) == "precious");
  struct stat st {};
  REQUIRE(::lstat(written.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK_NOTHROW(parallel::load_checkpoint(written));
  // A dangling link at a step's name is taken too (not replaced): its target is never created.
  const std::string target = tmp_dir() + "/created_through_checkpoint";
  REQUIRE(::symlink(target.c_str(), (d + "/checkpoint-0000000009.npz").c_str()) == 0);
  f.state.step = 9;
  CHECK(dir.save(f.state) == d + "/checkpoint-0000000009.1.npz");
  CHECK(::access(target.c_str(), F_OK) != 0);
}

TEST_CASE("a checkpoint folder another user owns or may write is refused; new files are 0600 in 0700 folders") {
  const mode_t old_mask = ::umask(022);
  const std::string open_dir = tmp_dir() + "/world_writable";
  REQUIRE(::mkdir(open_dir.c_str(), 0700) == 0);
  REQUIRE(::chmod(open_dir.c_str(), 0777) == 0);
  CHECK_THROWS_WITH_AS(CheckpointDir(open_dir, 2),
                       doctest::Contains(("checkpoint folder " + open_dir + " is writable by its group and others").c_str()), IoError);
  // Sticky, as /tmp: others cannot swap this user's files, but they can add a newer
  // "checkpoint" of theirs to be resumed from: refused too.
  REQUIRE(::chmod(open_dir.c_str(), 01777) == 0);
  CHECK_THROWS_WITH_AS(CheckpointDir(open_dir, 2),
                       doctest::Contains(("checkpoint folder " + open_dir + " is writable by its group and others").c_str()), IoError);
  // A link another user planted, naming a folder of this user's: refused (root's links are trusted).
  if (::geteuid() == 0) {
    const std::string mine = tmp_dir() + "/mine_for_link", link = tmp_dir() + "/planted_link";
    REQUIRE(::mkdir(mine.c_str(), 0700) == 0);
    REQUIRE(::symlink(mine.c_str(), link.c_str()) == 0);
    REQUIRE(::lchown(link.c_str(), 12345, 12345) == 0);
    CHECK_THROWS_WITH_AS(CheckpointDir(link, 2), doctest::Contains("is a symbolic link of uid 12345"), IoError);
  }
  if (::geteuid() == 0) {  // giving a folder away needs root
    const std::string theirs = tmp_dir() + "/theirs";
    REQUIRE(::mkdir(theirs.c_str(), 0700) == 0);
    REQUIRE(::chown(theirs.c_str(), 12345, 12345) == 0);
    CHECK_THROWS_WITH_AS(CheckpointDir(theirs, 2), doctest::Contains(("checkpoint folder " + theirs + " belongs to uid 12345").c_str()),
                         IoError);
  }
  ::unsetenv("PHALANX_FILE_MODE");
  const std::string d = tmp_dir() + "/private/run";
  CheckpointDir dir(d, 2);
  CHECK(mode_of(tmp_dir() + "/private") == 0700);
  CHECK(mode_of(d) == 0700);
  dir.lock();
  CHECK(mode_of(d + "/.lock") == 0600);
  Fixture f;
  CHECK(mode_of(dir.save(f.state)) == 0600);
  const std::string single = tmp_dir() + "/single.npz";
  parallel::save_checkpoint(single, f.state);
  CHECK(mode_of(single) == 0600);
  // The explicit option: readable by every user (a shared result), folders 0755.
  ::setenv("PHALANX_FILE_MODE", "0644", 1);
  CheckpointDir shared(tmp_dir() + "/shared_run", 2);
  CHECK(mode_of(tmp_dir() + "/shared_run") == 0755);
  f.state.step = 99;
  CHECK(mode_of(shared.save(f.state)) == 0644);
  ::unsetenv("PHALANX_FILE_MODE");
  ::umask(old_mask);
}

TEST_CASE("a save needs a step: an unset step is refused by save_checkpoint and CheckpointDir::save") {
  Fixture f;
  f.state.step = CheckpointState{}.step;  // the default: unset
  const std::string d = tmp_dir() + "/unset_step";
  CheckpointDir dir(d, 2);
  const char* msg = "CheckpointState.step is not set: set it to the optimizer steps taken so far, so each save gets its own file";
  CHECK_THROWS_WITH_AS(dir.save(f.state), doctest::Contains(msg), ConfigError);
  CHECK_THROWS_WITH_AS(parallel::save_checkpoint(d + "/x.npz", f.state), doctest::Contains(msg), ConfigError);
  CHECK(dir.list().empty());
}

TEST_CASE("one step, one trained state: other weights at a saved step are refused, the same state is saved again") {
  const std::string d = tmp_dir() + "/one_step";
  Fixture f;
  f.state.step = 0;
  CheckpointDir dir(d, 3);
  const std::string first = dir.save(f.state);
  CHECK(first == d + "/checkpoint-0000000000.npz");
  const std::string before = read_bytes(first);
  // The same trained state again (another position, RNG state, scalars, user tensors): this
  // object's own file is replaced by the newer record.
  f.state.epoch = 3;
  f.state.step_in_epoch = 0;
  f.state.scalars["loss_sum"] = 9;
  f.state.user.set("curve", tensor(std::vector<float>{1.5f, 1.25f, 1.f}, {3}));
  CHECK(dir.save(f.state) == first);
  CHECK(parallel::load_checkpoint(first).state.epoch == 3);
  CHECK(dir.list().size() == 1);
  // Other weights at step 0: the step is not advancing. The file stays as it was.
  const std::string kept = read_bytes(first);
  CheckpointState other = f.state;
  other.model = nudged(f.state.model);
  const std::string refused = first + " already holds step 0 with a different model or optimizer state: two saves at one step "
                                      "with different weights mean the step is not advancing; set CheckpointState.step";
  CHECK_THROWS_WITH_AS(dir.save(other), doctest::Contains(refused.c_str()), ConfigError);
  CHECK(read_bytes(first) == kept);
  CHECK(dir.list().size() == 1);
  // So does another optimizer state (the same weights).
  CheckpointState opt_only = f.state;
  opt_only.optimizer = nudged(f.state.optimizer);
  CHECK_THROWS_AS(dir.save(opt_only), ConfigError);
  // A scheduler a little further on (a loop that steps it per epoch, saving the epoch's
  // state at the step of its last periodic save): the same trained state, saved.
  CheckpointState later = f.state;
  later.scheduler.set("last_epoch", tensor(std::vector<std::int64_t>{5}, {1}));
  CHECK(dir.save(later) == first);
  CHECK(parallel::load_checkpoint(first).state.scheduler.contains("last_epoch"));
  CHECK(dir.save(f.state) == first);  // and back, for the checks below
  // Another object (a restarted run) saving the same state: the file stands, the save takes
  // the next suffix; other weights are refused, naming the way out for another run's file.
  CheckpointDir again(d, 3);
  CHECK(again.save(f.state) == d + "/checkpoint-0000000000.1.npz");
  CHECK(read_bytes(first) == kept);
  CHECK_THROWS_WITH_AS(again.save(other), doctest::Contains("give this run an empty folder"), ConfigError);
  // An advancing step takes the other weights.
  other.step = 1;
  CHECK(again.save(other) == d + "/checkpoint-0000000001.npz");
  CHECK(read_bytes(d + "/checkpoint-0000000000.npz") == kept);
  CHECK(before != kept);  // the first save was replaced by the same state's newer record
}

TEST_CASE("a damaged file at the step neither blocks the save nor is touched; superseded files do not block") {
  const std::string d = tmp_dir() + "/damaged_step";
  Fixture f;
  f.state.step = 4;
  CheckpointDir dir(d, 3);
  const std::string p = dir.save(f.state);
  std::string bytes = read_bytes(p);
  bytes[bytes.size() / 2] ^= 8;
  write_bytes(p, bytes);
  // Other weights at the step: the damaged file holds no valid checkpoint of it.
  f.state.model = nudged(f.state.model);
  CHECK(dir.save(f.state) == d + "/checkpoint-0000000004.1.npz");  // even by the object that wrote it
  CHECK(read_bytes(p) == bytes);
  CHECK_NOTHROW(parallel::load_checkpoint(d + "/checkpoint-0000000004.1.npz"));
  // A superseded file of step 5 is no checkpoint: other weights at step 5 are saved.
  f.state.step = 5;
  dir.save(f.state);
  REQUIRE(dir.supersede_after(4).size() == 1);
  f.state.model = nudged(f.state.model);
  CHECK(dir.save(f.state) == d + "/checkpoint-0000000005.npz");
}

TEST_CASE("the world size: recorded from the default world when unset, checked against it on load") {
  const std::string p = tmp_dir() + "/world.npz";
  Fixture f;
  f.state.world_size = 0;  // the default: the default world's size
  set_default_world({0, 2});
  CHECK(parallel::save_checkpoint(p, f.state).world_size == 2);
  CheckpointExpect any;
  any.world_size = parallel::kAnyWorld;
  CHECK(parallel::load_checkpoint(p, any).state.world_size == 2);
  CHECK(parallel::load_checkpoint(p).state.world_size == 2);  // the default expectation: the default world, 2
  set_default_world({0, 1});
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p),
                       doctest::Contains("was written with world size 2, this run has 1: resume with the same number of "
                                         "workers"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parallel::load_checkpoint(p), doctest::Contains("kAnyWorld"), ConfigError);
  CHECK_NOTHROW(parallel::load_checkpoint(p, any));
  CHECK(CheckpointExpect{}.world_size == 0);
  CHECK(CheckpointState{}.world_size == 0);
  // The folder's walk applies the same default.
  const std::string d = tmp_dir() + "/world_dir";
  {
    CheckpointDir dir(d, 2);
    set_default_world({0, 2});
    dir.save(f.state);
    set_default_world({0, 1});
  }
  CheckpointDir dir(d, 2);
  CHECK_THROWS_AS(dir.load_newest({}, nullptr), ConfigError);
  CHECK(dir.load_newest(any, nullptr).has_value());
}

TEST_CASE("world_size 0 after destroy_process_group, in a job of several workers: refused, not recorded as 1") {
  const std::string d = tmp_dir();
  Fixture f;
  f.state.world_size = 0;
  ::setenv("WORLD_SIZE", "2", 1);  // a launched worker whose group is already gone
  CHECK_THROWS_WITH_AS(parallel::save_checkpoint(d + "/x.npz", f.state),
                       doctest::Contains("CheckpointState.world_size is not set and no process group is alive"),
                       ConfigError);
  f.state.world_size = 2;  // said explicitly: fine
  CHECK(parallel::save_checkpoint(d + "/after_destroy.npz", f.state).world_size == 2);
  ::unsetenv("WORLD_SIZE");
}

TEST_CASE("a GradScaler's state travels as scaler.<key>; a file without one (older files) loads with none") {
  Fixture f;
  const std::string plain = tmp_dir() + "/no_scaler.npz";
  parallel::save_checkpoint(plain, f.state);
  CHECK(parallel::load_checkpoint(plain).state.scaler.size() == 0);

  optim::GradScaler scaler(optim::GradScalerOptions().init_scale(512).growth_interval(5));
  Tensor p = tensor(std::vector<float>{1.f}, {1}).requires_grad_();
  optim::SGD opt({p}, optim::SGDOptions(0.1));
  for (int i = 0; i < 3; ++i) {
    p.set_grad(tensor(std::vector<float>{i == 1 ? std::nanf("") : 1.f}, {1}));
    scaler.step(opt);
    scaler.update();
  }
  f.state.scaler = scaler.state_dict();
  const std::string with = tmp_dir() + "/scaler.npz";
  parallel::save_checkpoint(with, f.state);
  CHECK(load_npz(with).contains("scaler._growth_tracker"));
  const auto loaded = parallel::load_checkpoint(with);
  optim::GradScaler resumed;
  resumed.load_state_dict(loaded.state.scaler);
  CHECK(resumed.get_scale() == 256.0);
  CHECK(resumed.growth_tracker() == 1);
  CHECK(resumed.get_growth_interval() == 5);
  // The scaler's state is not trained state: the same weights at the step compare as the same.
  CHECK(parallel::compare_trained_state(with, f.state) == parallel::StepFileMatch::same);
}

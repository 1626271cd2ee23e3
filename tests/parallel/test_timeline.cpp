// PHALANX_TIMELINE (docs/timeline.md): a 2-worker DDP run writes one Chrome trace with both
// ranks' forward, backward, buckets, optimizer steps and collectives; each bucket's
// allreduce starts before the backward pass ends; off, nothing is recorded or written.
#include <doctest/doctest.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "phalanx/core/timeline.hpp"
#include "support/ddp_fixtures.hpp"
#include "support/multirank.hpp"

using namespace phalanx;
using namespace phalanx::test;
using namespace std::chrono_literals;

namespace {

constexpr int kSteps = 3;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/phalanx_timeline_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    for (const auto& f : files()) std::remove((path + "/" + f).c_str());
    ::rmdir(path.c_str());
  }
  std::set<std::string> files() const {
    std::set<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.insert(e->d_name);
      ::closedir(d);
    }
    return out;
  }
};

std::shared_ptr<nn::Module> model() {
  Generator g(5);
  return nn::mlp({64, 128, 128, 128, 10}, "relu", &g);
}

std::int64_t gradient_bytes() {
  std::int64_t n = 0;
  for (const auto& p : model()->parameters()) n += p.numel() * 4;
  return n;
}

/// Two ranks train kSteps DDP steps (small buckets: several per backward); each calls
/// timeline::start(file) first when `file` is not empty.
/// `cwd`: the children's working directory (where a relative file would land).
/// `max_events`: the children's PHALANX_TIMELINE_MAX_EVENTS (small: the budget runs out).
std::vector<ProcResult> train_two_ranks(const std::string& file, int crash_rank = -1, const std::string& cwd = "",
                                        const char* max_events = nullptr) {
  TcpStoreServer server(TcpStoreOptions{});
  const int port = server.port();
  return run_processes(2, [&](int rank) {
    if (!cwd.empty()) REQUIRE_RANK(rank, ::chdir(cwd.c_str()) == 0, cwd);
    if (max_events) ::setenv("PHALANX_TIMELINE_MAX_EVENTS", max_events, 1);
    if (!file.empty()) timeline::start(file);
    set_rank_env(rank, 2, port);
    ::setenv("PHALANX_STORE_HOSTED", "1", 1);
    parallel::InitOptions o;
    o.timeout = 20s;
    auto pg = parallel::init_process_group(o);
    parallel::DDPOptions opts;
    opts.first_bucket_mb(0.01);
    opts.bucket_cap_mb(0.05);
    parallel::DDP ddp(model(), pg, opts);
    REQUIRE_RANK(rank, ddp.bucket_layout().size() >= 3, ddp.bucket_layout().size());
    auto opt = make_opt("sgd", ddp.parameters());
    const Data d = make_data(32, 64, 10);
    for (int step = 0; step < kSteps; ++step) {
      opt->zero_grad();
      cross_entropy(ddp.forward(d.x), d.y).backward();
      opt->step();
    }
    if (rank == crash_rank) ::_exit(0);  // as if killed: no destroy, no exit handlers
    // A budget that ran out stops the recording; the file is still written at the end.
    REQUIRE_RANK(rank, timeline::enabled() == (!file.empty() && !max_events), "recording");
    REQUIRE_RANK(rank, timeline::path() == file, timeline::path());
    parallel::destroy_process_group();
    return 0;
  }, 60s);
}

struct Ev {
  std::string name, cat, ph;
  int pid = -1, tid = -1;
  double ts = 0, dur = 0;
  nlohmann::json args;
  double end() const { return ts + dur; }
};

std::vector<Ev> read_events(const std::string& file) {
  std::ifstream f(file);
  REQUIRE(f.good());
  const nlohmann::json doc = nlohmann::json::parse(f);  // throws on a malformed file
  std::vector<Ev> out;
  for (const auto& e : doc.at("traceEvents")) {
    Ev ev;
    ev.name = e.at("name").get<std::string>();
    ev.cat = e.value("cat", std::string());
    ev.ph = e.at("ph").get<std::string>();
    ev.pid = e.at("pid").get<int>();
    ev.tid = e.at("tid").get<int>();
    ev.ts = e.value("ts", 0.0);
    ev.dur = e.value("dur", 0.0);
    ev.args = e.value("args", nlohmann::json::object());
    out.push_back(std::move(ev));
  }
  return out;
}

std::vector<Ev> select(const std::vector<Ev>& all, int pid, const std::string& cat, const std::string& name_prefix,
                       const std::string& ph = "X") {
  std::vector<Ev> out;
  for (const auto& e : all)
    if (e.pid == pid && e.cat == cat && e.ph == ph && e.name.rfind(name_prefix, 0) == 0) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE("PHALANX_TIMELINE: one Chrome trace for a 2-worker DDP run; every bucket's allreduce starts before backward ends") {
  TempDir dir;
  const std::string file = dir.path + "/job.json";
  const auto results = train_two_ranks(file);
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[1].exit_code == 0);
  // One file: the parts were merged and removed.
  CHECK(dir.files() == std::set<std::string>{"job.json"});
  const std::vector<Ev> all = read_events(file);
  for (const auto& e : all) CHECK(e.cat != "timeline");  // within the budget: no truncation marker
  const std::int64_t grad_bytes = gradient_bytes();
  std::map<int, std::vector<Ev>> allreduces;
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    bool named = false;
    for (const auto& e : all)
      if (e.pid == rank && e.ph == "M" && e.name == "process_name")
        named = e.args.at("name") == "rank " + std::to_string(rank);
    CHECK(named);
    const auto forwards = select(all, rank, "ddp", "forward");
    const auto backwards = select(all, rank, "autograd", "backward");
    const auto finalizes = select(all, rank, "ddp", "finalize");
    const auto steps = select(all, rank, "optim", "optimizer step");
    const auto launches = select(all, rank, "ddp", "launch bucket");
    const auto bucket_begins = select(all, rank, "ddp", "bucket", "b");
    const auto bucket_ends = select(all, rank, "ddp", "bucket", "e");
    const auto comm = select(all, rank, "comm", "allreduce");
    REQUIRE(forwards.size() == kSteps);
    REQUIRE(backwards.size() == kSteps);
    REQUIRE(finalizes.size() == kSteps);
    REQUIRE(steps.size() == kSteps);
    // The buckets per backward (small caps: at least 3; the children check the layout).
    REQUIRE(launches.size() % kSteps == 0);
    const int nb = static_cast<int>(launches.size() / kSteps);
    REQUIRE(nb >= 3);
    CHECK(bucket_begins.size() == launches.size());
    CHECK(bucket_ends.size() == launches.size());
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s);
      const Ev& fw = forwards[s];
      const Ev& bw = backwards[s];
      const Ev& fin = finalizes[s];
      // forward, then backward (whose end-of-pass callback is DDP's finalize), then the step
      CHECK(fw.end() <= bw.ts);
      CHECK(bw.ts <= fin.ts);
      CHECK(fin.end() <= bw.end());
      CHECK(bw.end() <= steps[s].ts);
      CHECK(fw.tid == bw.tid);
      // Every bucket but the last launched by the gradient hooks while backward still
      // computes; the last (it carries the pass flag) in finalize.
      std::int64_t launched_bytes = 0;
      for (int b = 0; b < nb; ++b) {
        CAPTURE(b);
        const Ev& l = launches[nb * s + b];
        CHECK(l.name == "launch bucket " + std::to_string(b));
        CHECK(l.ts >= bw.ts);
        if (b + 1 < nb)
          CHECK(l.end() <= fin.ts);
        else
          CHECK(l.ts >= fin.ts);
        launched_bytes += l.args.at("bytes").get<std::int64_t>();
      }
      CHECK(launched_bytes == grad_bytes + 4);  // + the pass flag
      // This backward's collectives: one allreduce per bucket, each starting after its
      // launch and before the backward pass ends, with the bucket's size.
      std::vector<Ev> mine;
      for (const auto& c : comm)
        if (c.ts >= launches[nb * s].ts && c.ts <= bw.end()) mine.push_back(c);
      REQUIRE(mine.size() == static_cast<std::size_t>(nb));
      std::int64_t reduced = 0;
      for (int b = 0; b < nb; ++b) {
        CAPTURE(b);
        CHECK(mine[b].ts >= launches[nb * s + b].ts);
        CHECK(mine[b].ts < bw.end());
        CHECK(mine[b].args.at("bytes") == launches[nb * s + b].args.at("bytes"));
        CHECK(mine[b].tid != bw.tid);  // Gloo runs collectives on the group's worker thread
        reduced += mine[b].args.at("bytes").get<std::int64_t>();
      }
      CHECK(reduced == grad_bytes + 4);
      allreduces[rank].insert(allreduces[rank].end(), mine.begin(), mine.end());
    }
  }
  // One clock for both ranks: the same allreduce overlaps in time on both (neither rank's
  // can finish before the other's started), to within 1 ms.
  REQUIRE(allreduces[0].size() == allreduces[1].size());
  for (std::size_t i = 0; i < allreduces[0].size(); ++i) {
    CAPTURE(i);
    CHECK(allreduces[0][i].end() + 1000 >= allreduces[1][i].ts);
    CHECK(allreduces[1][i].end() + 1000 >= allreduces[0][i].ts);
  }
}

TEST_CASE("PHALANX_TIMELINE unset: nothing is recorded, nothing is written") {
  REQUIRE(std::getenv("PHALANX_TIMELINE") == nullptr);  // the suite runs without it
  CHECK_FALSE(timeline::enabled());
  CHECK(timeline::path().empty());
  TempDir dir;
  const auto results = train_two_ranks("", -1, dir.path);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  CHECK(dir.files().empty());
  // A Span while off records nothing: finish() has nothing to write either.
  { const timeline::Span span("forward", "ddp"); }
  timeline::finish();
  CHECK_FALSE(timeline::enabled());
}

TEST_CASE("a rank that dies leaves no merged file, and the others' parts open on their own") {
  TempDir dir;
  const std::string file = dir.path + "/job.json";
  const auto results = train_two_ranks(file, /*crash_rank=*/1);
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[1].exit_code == 0);
  CHECK(dir.files() == std::set<std::string>{"job.json.rank0.part"});
  const auto events = read_events(file + ".rank0.part");
  CHECK(select(events, 0, "ddp", "forward").size() == kSteps);
  CHECK(select(events, 0, "comm", "allreduce").size() >= 3 * kSteps);
}

TEST_CASE("PHALANX_TIMELINE_MAX_EVENTS: a rank keeps exactly the budget, the trace says it was truncated and stays valid") {
  constexpr int kBudget = 30;  // a step records about 20 events: the budget runs out in step 2
  TempDir dir;
  const std::string file = dir.path + "/job.json";
  const auto results = train_two_ranks(file, -1, "", std::to_string(kBudget).c_str());
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[1].exit_code == 0);
  CHECK(dir.files() == std::set<std::string>{"job.json"});  // merged as usual
  const std::vector<Ev> all = read_events(file);            // valid JSON
  {
    std::ifstream f(file);
    CHECK(nlohmann::json::parse(f).at("otherData").at("truncated_ranks") == nlohmann::json::array({0, 1}));
  }
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    int kept = 0;
    std::vector<Ev> markers;
    double last = 0;
    for (const auto& e : all) {
      if (e.pid != rank || e.ph == "M") continue;
      if (e.cat == "timeline") {
        markers.push_back(e);
      } else {
        ++kept;
        last = std::max(last, e.ts);
      }
    }
    CHECK(kept == kBudget);  // memory bounded: no event kept past the budget
    REQUIRE(markers.size() == 1);
    CHECK(markers[0].name == "timeline truncated after " + std::to_string(kBudget) + " events on rank " +
                                 std::to_string(rank) + "; raise PHALANX_TIMELINE_MAX_EVENTS");
    CHECK(markers[0].ph == "i");
    CHECK(markers[0].args.at("max_events") == kBudget);
    CHECK(markers[0].ts + 1 >= last);  // where the recording stopped: after every kept event began
    // The run went on past the budget: not all three steps were recorded.
    CHECK(select(all, rank, "optim", "optimizer step").size() < static_cast<std::size_t>(kSteps));
  }
}

TEST_CASE("PHALANX_TIMELINE_MAX_EVENTS: a value that is not a positive whole number is a one-line error") {
  TempDir dir;
  for (const char* bad : {"0", "-5", "12x", "1e6", " 7", "99999999999999999999999"}) {
    CAPTURE(bad);
    ::setenv("PHALANX_TIMELINE_MAX_EVENTS", bad, 1);
    const std::string expected = "PHALANX_TIMELINE_MAX_EVENTS='" + std::string(bad) + "' is not a positive whole number";
    CHECK_THROWS_WITH_AS(timeline::start(dir.path + "/job.json"), doctest::Contains(expected.c_str()), ConfigError);
    CHECK_FALSE(timeline::enabled());
    CHECK(timeline::path().empty());
  }
  ::unsetenv("PHALANX_TIMELINE_MAX_EVENTS");
  CHECK(dir.files().empty());
}

TEST_CASE("timeline::start: a file in a folder that does not exist is a one-line error") {
  CHECK_THROWS_WITH_AS(timeline::start("/nonexistent-phalanx-dir/job.json"),
                       doctest::Contains("does not exist or is not writable"), ConfigError);
  CHECK_THROWS_WITH_AS(timeline::start(""), doctest::Contains("names no file"), ConfigError);
  CHECK_FALSE(timeline::enabled());
}

namespace {

// A dataset whose batches take a while to gather: the consumer of a prefetching loader waits.
class SlowDataset : public samplers::Dataset {
 public:
  std::int64_t size() const override { return 8; }
  Shape feature_shape() const override { return {2}; }
  void gather(const std::int64_t* idx, std::int64_t count, Tensor& x, Tensor& y) const override {
    std::this_thread::sleep_for(5ms);
    for (std::int64_t i = 0; i < count; ++i) {
      x.data<float>()[2 * i] = x.data<float>()[2 * i + 1] = static_cast<float>(idx[i]);
      y.data<std::int64_t>()[i] = idx[i] % 2;
    }
  }
};

}  // namespace

TEST_CASE("the timeline shows the input pipeline (load batch, wait for batch) and gradient clipping") {
  TempDir dir;
  const std::string file = dir.path + "/pipeline.json";
  const auto results = run_processes(1, [&](int) {
    timeline::start(file);
    auto ds = std::make_shared<SlowDataset>();
    samplers::DataLoader ahead(ds, samplers::DataLoaderOptions(2).prefetch(2));
    for (samplers::Batch& b : ahead) (void)b;
    samplers::DataLoader inline_loader(ds, {4});
    for (samplers::Batch& b : inline_loader) (void)b;
    Generator g(1);
    auto net = nn::mlp({2, 3, 2}, "relu", &g);
    cross_entropy(net->forward(randn({4, 2}, &g)), tensor(std::vector<std::int64_t>{0, 1, 0, 1}, {4})).backward();
    nn::clip_grad_norm_(net->parameters(), 1.0);
    nn::clip_grad_value_(net->parameters(), 0.5);
    timeline::finish();
    return 0;
  }, 60s);
  REQUIRE(results[0].exit_code == 0);
  const std::vector<Ev> all = read_events(file);
  const auto loads = select(all, 0, "data", "load batch");
  const auto waits = select(all, 0, "data", "wait for batch");
  CHECK(loads.size() == 4 + 2);  // 4 batches prefetched, 2 collated inline
  REQUIRE(!waits.empty());
  // The prefetched batches are loaded on the prefetch thread, named; the wait is the consumer's.
  int prefetch_tid = -1;
  for (const auto& e : all)
    if (e.ph == "M" && e.name == "thread_name" && e.args.value("name", std::string()) == "data loader prefetch")
      prefetch_tid = e.tid;
  REQUIRE(prefetch_tid >= 0);
  CHECK(std::count_if(loads.begin(), loads.end(), [&](const Ev& e) { return e.tid == prefetch_tid; }) == 4);
  for (const auto& w : waits) CHECK(w.tid != prefetch_tid);
  CHECK(select(all, 0, "optim", "clip grad norm").size() == 1);
  CHECK(select(all, 0, "optim", "clip grad value").size() == 1);
}

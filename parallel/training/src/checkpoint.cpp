// Checkpoint files: the members, the manifest, the content checksum, and their checks.
// Layout (every member an .npy that numpy reads): model.<k>, optim.<k>, sched.<k>, user.<k>,
// scalar.<k> (a double's int64 bits), rng.<k> (int64[4]: state, inc, has_spare, spare bits),
// pos.step_in_epoch, then manifest.<field> (int64 scalars), manifest.checksum last.
// manifest.exact (1: written in exact mode) is optional: files from before exact mode lack it.
#include <cstring>
#include <ctime>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/file_safety.hpp"
#include "phalanx/core/npy.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/parallel/checkpoint.hpp"
#include "checkpoint_internal.hpp"

namespace phalanx::parallel {

namespace {

constexpr std::uint64_t kPrime = 0x100000001b3ull, kBasis = 0xcbf29ce484222325ull;

// FNV-1a over 8-byte words (then the tail bytes), each word mixed by a multiply and rotate:
// fast enough for large models, and any changed byte changes the result.
struct Hasher {
  std::uint64_t h = kBasis;
  void word(std::uint64_t w) {
    h ^= w;
    h *= kPrime;
    h ^= h >> 29;
  }
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    std::uint64_t tail = 0;
    for (std::size_t k = 0; i + k < n; ++k) tail |= static_cast<std::uint64_t>(p[i + k]) << (8 * k);
    word(tail ^ (static_cast<std::uint64_t>(n) << 56));
  }
  void text(const std::string& s) { bytes(s.data(), s.size()); }
  void meta(const std::string& name, const Tensor& t) {
    text(name);
    word(static_cast<std::uint64_t>(t.dtype()));
    word(t.shape().size());
    for (auto d : t.shape()) word(static_cast<std::uint64_t>(d));
  }
};

std::string hex64(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

Tensor i64(std::int64_t v) { return tensor(std::vector<std::int64_t>{v}, {}); }
Tensor u64(std::uint64_t v) { return i64(static_cast<std::int64_t>(v)); }
Tensor dbl(double v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return i64(bits);
}

// A setting's text as int64 character codes (numpy: ''.join(map(chr, a))).
Tensor text_tensor(const std::string& v) {
  std::vector<std::int64_t> c(v.begin(), v.end());
  for (auto& x : c) x &= 0xff;
  return tensor(c, {static_cast<std::int64_t>(c.size())});
}

const char* const kManifestFields[] = {"format_version", "world_size", "global_batch", "micro_batch", "step",
                                       "epoch", "model_fingerprint", "optimizer_fingerprint", "written_unix"};

// The first difference between two state dicts' names/shapes/dtypes, for a mismatch message.
std::string first_difference(const TensorMap& stored, const TensorMap& current) {
  auto desc = [](const std::string& k, const Tensor& t) {
    return k + " " + shape_str(t.shape()) + " " + dtype_name(t.dtype());
  };
  auto s = stored.begin(), c = current.begin();
  for (; s != stored.end() && c != current.end(); ++s, ++c)
    if (s->first != c->first || s->second.shape() != c->second.shape() || s->second.dtype() != c->second.dtype())
      return "stored " + desc(s->first, s->second) + ", current " + desc(c->first, c->second);
  if (s != stored.end()) return "stored has " + desc(s->first, s->second) + " that the current one lacks";
  if (c != current.end()) return "current has " + desc(c->first, c->second) + " that the stored one lacks";
  return "same entries";
}

// The content checksum over (name, tensor) items in order, "manifest.checksum" left out.
template <class Items>
std::uint64_t checksum_of(const Items& items) {
  Hasher h;
  for (const auto& [k, v] : items) {
    if (k == "manifest.checksum") continue;
    h.meta(k, v);
    const Tensor host = v.contiguous().to(Device::cpu());  // a view (a model's buffer) by its values
    h.bytes(host.raw_data(), host.nbytes());
  }
  return h.h;
}

// The trained state's members: model, optimizer and scheduler (what one step changes).
bool is_trained_member(const std::string& k) {
  return k.rfind("model.", 0) == 0 || k.rfind("optim.", 0) == 0 || k.rfind("sched.", 0) == 0;
}

LoadedCheckpoint verify(const std::string& path, const TensorMap& m, const NpzReadInfo& info,
                        const CheckpointExpect& expect);

}  // namespace

std::string CheckpointManifest::written_at() const {
  const std::time_t t = static_cast<std::time_t>(written_unix);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[40];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return b;
}

std::uint64_t fingerprint(const TensorMap& state) {
  Hasher h;
  for (const auto& [k, v] : state) h.meta(k, v);
  return h.h;
}

std::uint64_t optimizer_fingerprint(const TensorMap& optimizer_state) {
  Hasher h;
  for (const auto& [k, v] : optimizer_state)
    if (k.rfind("param_groups.", 0) == 0 && !(k.size() > 11 && k.compare(k.size() - 11, 11, ".initial_lr") == 0))
      h.text(k);
  return h.h;
}

std::uint64_t content_checksum(const TensorMap& members) { return checksum_of(members); }

void ckpt_internal::require_step_set(std::int64_t step) {
  if (step == -1)
    throw ConfigError("CheckpointState.step is not set: set it to the optimizer steps taken so far, so each save gets "
                      "its own file");
  if (step < 0)
    throw ConfigError(detail::concat("CheckpointState.step is ", step,
                                     ": set it to the optimizer steps taken so far (>= 0), so each save gets its own file"));
}

CheckpointManifest save_checkpoint(const std::string& path, const CheckpointState& s) {
  ckpt_internal::require_step_set(s.step);
  if (s.world_size < 0)
    throw ConfigError(detail::concat("CheckpointState.world_size is ", s.world_size,
                                     ": set it to the number of workers, or leave it 0 for the default world's size"));
  TensorMap m;
  for (const auto& [k, v] : s.model) m.set("model." + k, v);
  for (const auto& [k, v] : s.optimizer) m.set("optim." + k, v);
  for (const auto& [k, v] : s.scheduler) m.set("sched." + k, v);
  for (const auto& [k, v] : s.scaler) m.set("scaler." + k, v);
  for (const auto& [k, v] : s.user) m.set("user." + k, v);
  for (const auto& [k, v] : s.scalars) m.set("scalar." + k, dbl(v));
  for (const auto& [k, g] : s.generators) {
    std::int32_t spare_bits;
    std::memcpy(&spare_bits, &g.spare, sizeof spare_bits);
    m.set("rng." + k, tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(g.state), static_cast<std::int64_t>(g.inc),
                                                       g.has_spare ? 1 : 0, spare_bits},
                             {4}));
  }
  for (const auto& [k, v] : s.config) m.set("config." + k, text_tensor(v));
  m.set("pos.step_in_epoch", i64(s.step_in_epoch));
  CheckpointManifest man;
  if (s.world_size <= 0 && !default_world().initialized && launch_world_size() > 1)
    throw ConfigError(detail::concat(
        "checkpoint ", path, ": CheckpointState.world_size is not set and no process group is alive to take it "
        "from (the launch environment says ", launch_world_size(), " workers): save before "
        "destroy_process_group(), or set world_size"));
  man.world_size = s.world_size > 0 ? s.world_size : default_world().size;
  man.global_batch = s.global_batch;
  man.micro_batch = s.micro_batch;
  man.step = s.step;
  man.epoch = s.epoch;
  man.model_fingerprint = fingerprint(s.model);
  man.optimizer_fingerprint = optimizer_fingerprint(s.optimizer);
  man.written_unix = static_cast<std::int64_t>(std::time(nullptr));
  m.set("manifest.format_version", i64(man.format_version));
  m.set("manifest.world_size", i64(man.world_size));
  m.set("manifest.global_batch", i64(man.global_batch));
  m.set("manifest.micro_batch", i64(man.micro_batch));
  m.set("manifest.step", i64(man.step));
  m.set("manifest.epoch", i64(man.epoch));
  m.set("manifest.model_fingerprint", u64(man.model_fingerprint));
  m.set("manifest.optimizer_fingerprint", u64(man.optimizer_fingerprint));
  m.set("manifest.written_unix", i64(man.written_unix));
  man.exact = s.exact;
  m.set("manifest.exact", i64(man.exact ? 1 : 0));
  man.checksum = content_checksum(m);
  m.set("manifest.checksum", u64(man.checksum));
  save_npz(path, m, files::private_file_mode());
  return man;
}

LoadedCheckpoint load_checkpoint(const std::string& path, const CheckpointExpect& expect) {
  NpzReadInfo info;
  const TensorMap m = load_npz(path, &info);  // verifies the file's and each member's CRC-32
  return verify(path, m, info, expect);
}

StepFileMatch compare_trained_state(const std::string& path, const CheckpointState& state) {
  TensorMap m;
  LoadedCheckpoint stored;
  try {
    NpzReadInfo info;
    m = load_npz(path, &info);
    CheckpointExpect any;
    any.world_size = kAnyWorld;
    stored = verify(path, m, info, any);
  } catch (const IoError&) {
    return StepFileMatch::damaged;
  }
  // The file's members in its order, with `state`'s model and optimizer tensors in place of
  // its own: the stored checksum covers them, so it is reproduced exactly when they are the
  // same. The scheduler's position is not compared: a loop that steps its scheduler per
  // epoch saves the same trained state at one step twice (a periodic save, then the
  // epoch's), the second a little later in the schedule.
  std::vector<std::pair<std::string, Tensor>> fresh;
  for (const auto& [k, v] : state.model) fresh.emplace_back("model." + k, v);
  for (const auto& [k, v] : state.optimizer) fresh.emplace_back("optim." + k, v);
  std::vector<std::pair<std::string, Tensor>> mixed;
  mixed.reserve(m.size());
  std::size_t next = 0;
  for (const auto& [k, v] : m) {
    if (!is_trained_member(k) || k.rfind("sched.", 0) == 0) {
      mixed.emplace_back(k, v);
      continue;
    }
    if (next == fresh.size() || fresh[next].first != k) return StepFileMatch::different;
    mixed.push_back(std::move(fresh[next++]));
  }
  if (next != fresh.size()) return StepFileMatch::different;
  return checksum_of(mixed) == stored.manifest.checksum ? StepFileMatch::same : StepFileMatch::different;
}

namespace {

LoadedCheckpoint verify(const std::string& path, const TensorMap& m, const NpzReadInfo& info,
                        const CheckpointExpect& expect) {
  const std::string what = "checkpoint " + path;
  if (!info.file_checksum)
    throw IoError(what + ": no file checksum at its end (damaged, or not written by Phalanx's save_checkpoint)");
  auto scalar = [&](const std::string& key) -> std::int64_t {
    const Tensor* t = m.find(key);
    if (!t) {
      if (key == "manifest.checksum" || !m.contains("manifest.checksum"))
        throw IoError(what + ": not a Phalanx checkpoint (no " + key + "); was it written by another program?");
      throw IoError(what + ": the manifest has no " + key + ": the file is damaged");
    }
    if (t->dtype() != DType::Int64 || t->numel() != 1)
      throw IoError(what + ": " + key + " must be one int64, got " + shape_str(t->shape()) + " " + dtype_name(t->dtype()) +
                    ": the file is damaged");
    return t->item_int();
  };
  LoadedCheckpoint out;
  CheckpointManifest& man = out.manifest;
  man.checksum = static_cast<std::uint64_t>(scalar("manifest.checksum"));
  const std::uint64_t have = content_checksum(m);
  if (have != man.checksum)
    throw IoError(what + ": checksum mismatch (stored " + hex64(man.checksum) + ", computed " + hex64(have) +
                  "): the file is damaged; it was left as it is");
  man.format_version = scalar("manifest.format_version");
  if (man.format_version < 1 || man.format_version > kCheckpointFormat)
    throw IoError(detail::concat(what, ": format version ", man.format_version, ", this Phalanx reads up to ",
                                 kCheckpointFormat, ": load it with the Phalanx that wrote it"));
  for (const char* f : kManifestFields) scalar(std::string("manifest.") + f);
  man.world_size = scalar("manifest.world_size");
  man.global_batch = scalar("manifest.global_batch");
  man.micro_batch = scalar("manifest.micro_batch");
  man.step = scalar("manifest.step");
  man.epoch = scalar("manifest.epoch");
  man.model_fingerprint = static_cast<std::uint64_t>(scalar("manifest.model_fingerprint"));
  man.optimizer_fingerprint = static_cast<std::uint64_t>(scalar("manifest.optimizer_fingerprint"));
  man.written_unix = scalar("manifest.written_unix");
  if (m.contains("manifest.exact")) {
    const std::int64_t e = scalar("manifest.exact");
    if (e != 0 && e != 1) throw IoError(detail::concat(what, ": manifest.exact must be 0 or 1, got ", e, ": the file is damaged"));
    man.exact = e == 1;
  }

  CheckpointState& s = out.state;
  s.world_size = man.world_size;
  s.global_batch = man.global_batch;
  s.micro_batch = man.micro_batch;
  s.step = man.step;
  s.epoch = man.epoch;
  s.exact = man.exact;
  s.step_in_epoch = scalar("pos.step_in_epoch");
  if (s.step < 0 || s.epoch < 0 || s.step_in_epoch < 0 || s.world_size < 1)
    throw IoError(detail::concat(what, ": impossible position (step ", s.step, ", epoch ", s.epoch, ", step in epoch ",
                                 s.step_in_epoch, ", world size ", s.world_size, ")"));
  for (const auto& [k, v] : m) {
    const auto dot = k.find('.');
    const std::string kind = k.substr(0, dot), rest = dot == std::string::npos ? "" : k.substr(dot + 1);
    if (kind == "model") s.model.set(rest, v);
    else if (kind == "optim") s.optimizer.set(rest, v);
    else if (kind == "sched") s.scheduler.set(rest, v);
    else if (kind == "scaler") s.scaler.set(rest, v);
    else if (kind == "user") s.user.set(rest, v);
    else if (kind == "scalar") {
      const std::int64_t bits = scalar(k);
      double d;
      std::memcpy(&d, &bits, sizeof d);
      s.scalars[rest] = d;
    } else if (kind == "rng") {
      if (v.dtype() != DType::Int64 || v.numel() != 4) throw IoError(what + ": " + k + " must be 4 int64 values");
      const auto r = v.to_vector<std::int64_t>();
      Generator::State g{static_cast<std::uint64_t>(r[0]), static_cast<std::uint64_t>(r[1]) | 1u, r[2] != 0, 0.f};
      const auto spare_bits = static_cast<std::int32_t>(r[3]);
      std::memcpy(&g.spare, &spare_bits, sizeof g.spare);
      s.generators[rest] = g;
    } else if (kind == "config") {
      if (v.dtype() != DType::Int64 || v.dim() != 1) throw IoError(what + ": " + k + " must be int64 character codes");
      std::string text;
      for (auto ch : v.to_vector<std::int64_t>()) {
        if (ch < 0 || ch > 255) throw IoError(what + ": " + k + " holds a character code out of range");
        text += static_cast<char>(ch);
      }
      s.config[rest] = text;
    } else if (kind != "manifest" && kind != "pos") {
      throw IoError(what + ": unexpected member '" + detail::printable(k) + "'");
    }
  }
  // The stored fingerprints must describe what the file holds (a consistent writer).
  if (fingerprint(s.model) != man.model_fingerprint || optimizer_fingerprint(s.optimizer) != man.optimizer_fingerprint)
    throw IoError(what + ": the manifest's fingerprints do not match the stored state: the file is damaged");

  // Then: was it written by a run like this one?
  auto check = [&](const char* name, std::int64_t stored, std::int64_t current, const char* fix) {
    if (current >= 0 && stored != current)
      throw ConfigError(detail::concat(what, " was written with ", name, " ", stored, ", this run has ", current,
                                       ": ", fix));
  };
  if (expect.exact >= 0 && man.exact != (expect.exact != 0))
    throw ConfigError(man.exact ? detail::concat(what, " was written in exact mode (micro-batch ", man.micro_batch,
                                                 ") and this run is not: resume with --exact --micro-batch ",
                                                 man.micro_batch)
                                : what + " was written in normal mode and this run is in exact mode: resume without "
                                         "--exact (only a checkpoint written in exact mode resumes in it)");
  const bool exact = man.exact && expect.exact == 1;
  // 0: the default world, the one this process trains in (a caller that forgets to say).
  const std::int64_t world = expect.world_size == 0 ? default_world().size : expect.world_size;
  check("global batch", man.global_batch, expect.global_batch, "resume with the same --global-batch");
  if (exact) {
    // Exact mode: the state is the same on every world size; any W that divides the
    // micro-batches of a step computes the same steps.
    check("micro-batch", man.micro_batch, expect.micro_batch, "resume with the same --micro-batch");
    const std::int64_t per_step = man.micro_batch > 0 ? man.global_batch / man.micro_batch : 0;
    if (world > 0 && (per_step < 1 || per_step % world != 0))
      throw ConfigError(detail::concat(what, " was written in exact mode with ", per_step,
                                       " micro-batches a step (global batch ", man.global_batch, " / micro-batch ",
                                       man.micro_batch, "), which ", world,
                                       " workers do not divide: resume on a number of workers that divides ", per_step));
  } else {
    check("world size", man.world_size, world,
          expect.world_size == 0
              ? "resume with the same number of workers (only a checkpoint written in exact mode, --exact, resumes "
                "on another; CheckpointExpect::world_size = kAnyWorld skips this check)"
              : "resume with the same number of workers (only a checkpoint written in exact mode, --exact, resumes on "
                "another)");
    check("micro-batch", man.micro_batch, expect.micro_batch, "resume with the same per-worker batch");
  }
  if (expect.model && fingerprint(*expect.model) != man.model_fingerprint)
    throw ConfigError(what + " holds another model (fingerprint " + hex64(man.model_fingerprint) + ", this run's " +
                      hex64(fingerprint(*expect.model)) + "; " + first_difference(s.model, *expect.model) +
                      "): resume with the same --model");
  if (expect.optimizer && optimizer_fingerprint(*expect.optimizer) != man.optimizer_fingerprint)
    throw ConfigError(what + " holds another optimizer's state (fingerprint " + hex64(man.optimizer_fingerprint) +
                      ", this run's " + hex64(optimizer_fingerprint(*expect.optimizer)) +
                      "): resume with the same --optimizer");
  // The settings: each one the file records must be this run's (a file recording none
  // predates stored settings and is not checked).
  if (expect.config && !s.config.empty())
    for (const auto& [k, current] : *expect.config) {
      const auto it = s.config.find(k);
      if (it == s.config.end())
        throw ConfigError(what + " does not record the setting '" + k + "' that this run has (" + current +
                          "): it was written by another kind of run");
      if (it->second != current)
        throw ConfigError(what + " was written with " + k + " " + it->second + ", this run has " + current +
                          ": resume with the same " + k + " (docs/checkpoints.md lists what may change on resume)");
    }
  return out;
}

}  // namespace

}  // namespace phalanx::parallel

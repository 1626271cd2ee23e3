// The transformer's layout and mask ops (docs/transformer_ops.md) at the GPT example's sizes,
// 1 thread: each against memcpy of the same bytes (the limit a copy can reach) and against
// PyTorch 1.13 materialising the same result (peers/torch_layout_ops.py), in the same run.
// usage: bench_layout_ops [--iters N] [--no-peer]
#include <cmath>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

int main(int argc, char** argv) {
  int iters = 200;
  bool skip_peer = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--iters" && i + 1 < argc) iters = std::max(10, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "bench_layout_ops: unknown argument %s (usage: bench_layout_ops [--iters N] [--no-peer])\n",
                   a.c_str());
      return 2;
    }
  }
  set_num_threads(1);
  NoGradGuard no_grad;
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_layout_ops.py");
  bench::print_environment("bench_layout_ops");
  std::printf("us per call: median [fastest, slowest] of 5 runs of %d calls; GB/s counts bytes read + written\n",
              iters);
  std::printf("%-20s %9s %24s %7s %24s %7s %24s %9s\n", "case", "MiB", "phalanx_us", "GB/s", "memcpy_us", "GB/s",
              "torch_us", "phx/torch");
  Generator g(0);
  struct Case {
    const char* name;
    std::function<void()> fn;
    std::size_t bytes;  // the output's bytes (what memcpy copies)
  };
  Tensor bhtd = randn({16, 4, 128, 32}, &g);  // k^T of attention: the last two dims swapped
  Tensor bthd = randn({16, 128, 4, 32}, &g), big = randn({16, 512, 8, 64}, &g), sq = randn({1024, 1024}, &g);
  Tensor qkv = randn({16, 128, 384}, &g);
  // permute/transpose/split return views: each case materialises them (.contiguous()), as the
  // peer does, so the rows time the copies.
  std::vector<Tensor> parts = split(qkv, 128, 2);
  for (Tensor& p : parts) p = p.contiguous();  // cat's inputs are tensors of their own, as the peer's
  Tensor scores = randn({16, 4, 128, 128}, &g), causal = triu(ones({128, 128}, DType::Bool), 1);
  const std::vector<Case> cases = {
      {"permute_bthd", [&] { (void)permute(bthd, {0, 2, 1, 3}).contiguous(); }, bthd.nbytes()},
      {"permute_bthd_big", [&] { (void)permute(big, {0, 2, 1, 3}).contiguous(); }, big.nbytes()},
      {"transpose_1024", [&] { (void)permute(sq, {1, 0}).contiguous(); }, sq.nbytes()},
      {"transpose_kT", [&] { (void)transpose(bhtd, 2, 3).contiguous(); }, bhtd.nbytes()},
      {"split_qkv", [&] {
         for (const Tensor& p : split(qkv, 128, 2)) (void)p.contiguous();
       }, qkv.nbytes()},
      {"cat_qkv", [&] { (void)cat(parts, 2); }, qkv.nbytes()},
      {"masked_fill_causal", [&] { (void)masked_fill(scores, causal, -INFINITY); }, scores.nbytes()},
  };
  for (const Case& c : cases) {
    const bench::Summary ours = bench::time_us(iters, c.fn);
    const bench::Summary mc = bench::memcpy_us(c.bytes, iters);
    bench::Summary theirs;
    if (!skip_peer)
      theirs = bench::run_peer_summary("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + bench::python() + " " + peer +
                                           " " + std::to_string(iters) + " " + c.name,
                                       5);
    std::printf("%-20s %9.2f %24s %7.1f %24s %7.1f %24s %9.2f\n", c.name, c.bytes / 1048576.0,
                bench::show(ours, "").c_str(), bench::copy_gbs(c.bytes, ours.median), bench::show(mc, "").c_str(),
                bench::copy_gbs(c.bytes, mc.median), theirs.ok() ? bench::show(theirs, "").c_str() : "n/a",
                theirs.ok() ? ours.median / theirs.median : 0.0);
    std::fflush(stdout);
  }
  bench::print_load_at_end();
  return 0;
}

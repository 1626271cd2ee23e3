// The textbook's minimal data-parallel program, in Phalanx.
//
//   phalanx-run --nproc-per-node 4 build/examples/seed_ddp_demo     # 4 workers
//   build/examples/seed_ddp_demo                                    # one process, unchanged
//
// Four beats: split the data (DistributedSampler), compute separately (each worker's own
// forward/backward on its shard), average the gradients (DDP, during backward), update in
// sync (every worker applies the same SGD step). The three changes from a single-device
// script are marked [1], [2], [3].
#include <cstdio>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

int run() {
  auto pg = parallel::init_process_group();  // [1] rank and world size from the launcher
  const int rank = pg->rank();

  Generator g(0);  // the same seed on every rank: the same data, and (before the broadcast) weights
  auto model = std::make_shared<parallel::DDP>(std::make_shared<nn::Linear>(64, 10, true, &g));  // [2]
  auto data = std::make_shared<samplers::TensorDataset>(randn({512, 64}, &g), randint(10, {512}, &g));
  auto sampler = std::make_shared<samplers::DistributedSampler>(512);  // [3] a disjoint shard per worker
  samplers::DataLoader loader(data, {32}, sampler);
  optim::SGD opt(model->parameters(), optim::SGDOptions{0.05});

  // ---- TRAINING LOOP ----
  for (int epoch = 0; epoch < 5; ++epoch) {
    sampler->set_epoch(epoch);  // a new shuffle every epoch, the same on every rank
    double sum = 0;
    int steps = 0;
    for (samplers::Batch& b : loader) {
      opt.zero_grad();
      Tensor loss = cross_entropy(model->forward(b.x), b.y);
      loss.backward();  // gradients are averaged across workers here
      opt.step();
      sum += loss.item();
      ++steps;
    }
    std::printf("rank %d epoch %d: %d steps of 32 samples, mean loss %.4f\n", rank, epoch, steps, sum / steps);
  }
  // ---- END TRAINING LOOP ----

  // Every worker holds the same weights: their checksums agree (max == min over ranks).
  float checksum = 0;
  for (auto& p : model->parameters())
    for (float v : p.to_vector<float>()) checksum += v;
  Tensor extremes = tensor(std::vector<float>{checksum, -checksum}, {2});
  pg->allreduce(extremes, ReduceOp::Max)->wait();
  const bool same = extremes.data<float>()[0] == -extremes.data<float>()[1];
  std::printf("rank %d of %d: weight checksum %.6f, %s on every rank\n", rank, pg->size(), checksum,
              same ? "the same" : "NOT THE SAME");
  parallel::destroy_process_group();
  return same ? 0 : 1;
}

int main() {
  try {
    return run();
  } catch (const std::exception& e) {  // a clear one-line error, never an abort
    std::fprintf(stderr, "seed_ddp_demo: %s\n", e.what());
    return 1;
  }
}

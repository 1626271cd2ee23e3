#include "phalanx/core/half.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/parallel/comm_hook.hpp"

namespace phalanx::parallel {

namespace {

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  // Sum first, then one correctly rounded division by the world size: one rounding after the
  // sum (none when the world size is a power of two). For a CPU bucket that is the backend's
  // avg (reduce_op.hpp; gloo, shm, mpi, hierarchical: the same bits), which shared memory
  // folds into its reduction pass instead of a second pass over the bucket here. Other
  // devices keep the division here (NCCL's native avg is not a division after the sum).
  static bool backend_divides(const GradBucket& b) { return b.buffer.device().is_cpu(); }
  void launch(ProcessGroup& pg, GradBucket& b) override {
    b.work = pg.allreduce(b.buffer, backend_divides(b) ? ReduceOp::Avg : ReduceOp::Sum);
  }
  void finish(ProcessGroup& pg, GradBucket& b) override {
    b.work->wait();
    b.work.reset();
    if (pg.size() > 1 && !backend_divides(b))
      kernels_for(b.buffer.device()).divide(b.buffer, static_cast<float>(pg.size()));
  }
};

class CompressHook final : public CommHook {
 public:
  explicit CompressHook(DType dtype) : dtype_(dtype) {}
  std::string name() const override { return dtype_ == DType::Float16 ? "fp16_compress" : "bf16_compress"; }
  void launch(ProcessGroup& pg, GradBucket& b) override {
    // Divide before compressing, as PyTorch's hook does: the sum of W values then stays in
    // range of the 16-bit format.
    if (pg.size() > 1) kernels_for(b.buffer.device()).scale(b.buffer, 1.f / static_cast<float>(pg.size()));
    if (!b.scratch.defined() || b.scratch.numel() != b.buffer.numel() || b.scratch.dtype() != dtype_)
      b.scratch = Tensor::empty(b.buffer.shape(), dtype_, b.buffer.device());
    convert_into(b.buffer, b.scratch);
    b.work = pg.allreduce(b.scratch, ReduceOp::Sum);
  }
  void finish(ProcessGroup&, GradBucket& b) override {
    b.work->wait();
    b.work.reset();
    convert_into(b.scratch, b.buffer);
  }

 private:
  DType dtype_;
};

}  // namespace

CommHookPtr allreduce_hook() { return std::make_shared<AllreduceHook>(); }
CommHookPtr fp16_compress_hook() { return std::make_shared<CompressHook>(DType::Float16); }
CommHookPtr bf16_compress_hook() { return std::make_shared<CompressHook>(DType::BFloat16); }

}  // namespace phalanx::parallel

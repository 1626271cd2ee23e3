#include "phalanx/parallel/all_reduce_scalar.hpp"

#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/parallel/init.hpp"

namespace phalanx::parallel {

namespace {
ProcessGroupPtr group_or_default(ProcessGroupPtr pg) { return pg ? std::move(pg) : default_process_group(); }
}  // namespace

double all_reduce_scalar(double value, ReduceOp op, ProcessGroupPtr pg) {
  return all_reduce_scalar(value, op, std::move(pg), local_device());
}

double all_reduce_scalar(double value, ReduceOp op, ProcessGroupPtr pg, Device device) {
  pg = group_or_default(std::move(pg));
  Tensor t = full({1}, value, DType::Float32, device);
  pg->allreduce(t, op)->synchronize();  // read on the host: its failure too
  return t.item();
}

std::int64_t all_reduce_scalar(std::int64_t value, ReduceOp op, ProcessGroupPtr pg) {
  return all_reduce_scalar(value, op, std::move(pg), local_device());
}

std::int64_t all_reduce_scalar(std::int64_t value, ReduceOp op, ProcessGroupPtr pg, Device device) {
  if (op == ReduceOp::Avg)
    throw ValueError("all_reduce_scalar: Avg of an integer is not an integer; pass a double "
                     "(all_reduce_scalar(double(v), ReduceOp::Avg)) or reduce with Sum and divide");
  pg = group_or_default(std::move(pg));
  Tensor t = tensor(std::vector<std::int64_t>{value}, {1}).to(device);  // exact beyond 2^53
  pg->allreduce(t, op)->synchronize();
  return t.item_int();
}

}  // namespace phalanx::parallel

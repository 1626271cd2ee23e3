#include "phalanx/backends/reduce_op.hpp"

namespace phalanx {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

}  // namespace phalanx

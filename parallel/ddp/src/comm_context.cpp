#include "comm_context.hpp"

#include "phalanx/backends/comm_error.hpp"

namespace phalanx::parallel {

void rethrow_with_context(const std::exception_ptr& error, const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerFailedError&) {
    throw;
  } catch (const PeerFinishedError& e) {
    throw PeerFinishedError(context + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(context + e.what());
  } catch (const DesyncError& e) {
    throw DesyncError(context + e.what());
  } catch (const CommError& e) {
    throw CommError(context + e.what());
  }
}

}  // namespace phalanx::parallel

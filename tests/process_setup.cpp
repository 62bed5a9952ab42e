// Linked into every test binary: the process-wide setting the slicetrain binary's main() makes.
// Ranks run as threads of one test process; one that fails closes its sockets while another may
// still be writing to them: that write must fail with EPIPE, not raise a SIGPIPE that ends the
// whole test binary (comm::CatchSigpipe).
#include "comm/group.h"

namespace {

const bool kSigpipeCaught = [] {
  st::comm::CatchSigpipe();
  return true;
}();

}  // namespace

// Linked into every test binary: the process-wide setting the slicetrain binary's main() makes.
// Ranks run as threads of one test process; one that fails closes its sockets while another may
// still be writing to them (Gloo's TCP pairs use writev): that write must fail with EPIPE, not
// raise a SIGPIPE that ends the whole test binary. A no-op handler, not SIG_IGN, so that the
// programs a test starts get the default disposition back at exec.
#include <signal.h>

namespace {

const bool kSigpipeCaught = [] {
  struct sigaction a {};
  a.sa_handler = [](int) {};
  a.sa_flags = SA_RESTART;
  sigemptyset(&a.sa_mask);
  return sigaction(SIGPIPE, &a, nullptr) == 0;
}();

}  // namespace

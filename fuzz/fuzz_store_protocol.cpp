// Fuzzes the TCP store's server-side request decoding (DecodeStoreRequest: what a client, or
// anyone who reached the port after the handshake, can send) and serves every decoded request
// against a fresh table. Timeouts are forced to 0 so that get/wait return at once; no sockets.
#include <cstdint>
#include <string_view>

#include "comm/store/store.h"
#include "comm/store/tcp_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  st::comm::KvTable table;
  // Several requests per input: each one is prefixed by a 2-byte length, as a stream of frames.
  while (!in.empty()) {
    size_t n = in.size() >= 2 ? (static_cast<uint8_t>(in[0]) | static_cast<uint8_t>(in[1]) << 8)
                              : in.size();
    std::string_view frame = in.size() >= 2 ? in.substr(2, n) : in;
    in.remove_prefix(in.size() >= 2 ? 2 + frame.size() : in.size());
    st::StatusOr<st::comm::StoreRequest> q = st::comm::DecodeStoreRequest(frame);
    if (!q.ok()) continue;
    const int64_t asked = q->number;
    if (q->op == st::comm::StoreRequest::Op::kGet || q->op == st::comm::StoreRequest::Op::kWait)
      q->number = asked < 0 ? asked : 0;  // keep negative timeouts: they must not block either
    (void)st::comm::ServeStoreRequest(table, *q);
  }
  return 0;
}

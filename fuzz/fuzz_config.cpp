// Fuzzes config.json parsing and validation (ParseGemma4Config). An accepted config must describe
// every layer consistently and survive a round trip through ToTextJson.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st::StatusOr<st::Gemma4Config> c =
      st::ParseGemma4Config(std::string(reinterpret_cast<const char*>(data), size));
  if (!c.ok()) return 0;
  int64_t sum = 0;
  for (int64_t i = 0; i < c->num_hidden_layers; ++i)
    sum += c->HeadDim(i) + c->KvHeads(i) + c->MlpWidth(i) + c->KvSourceLayer(i);
  (void)sum;
  st::StatusOr<st::Gemma4Config> again = st::ParseGemma4Config(c->ToTextJson().dump());
  if (!again.ok()) {
    std::fprintf(stderr, "accepted config does not round-trip: %s\n",
                 again.status().message().c_str());
    std::abort();
  }
  return 0;
}

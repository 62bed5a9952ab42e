// Helpers shared by the fuzz targets: a per-process scratch file for readers that only take a
// path. Not part of the library.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace st::fuzz {

// A file path unique to this process under $TMPDIR (default /tmp), with the given suffix.
inline std::string ScratchPath(const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/slicetrain_fuzz_" + std::to_string(getpid()) +
         suffix;
}

// Overwrites path with the bytes; aborts if the scratch file cannot be written (a broken
// environment, not a finding).
inline void WriteScratch(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

}  // namespace st::fuzz

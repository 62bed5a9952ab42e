// A compiled PCRE2 pattern (UTF-8, Unicode properties), for tokenizer normalizers and
// pre-tokenizers whose patterns need look-around and \p{..} classes that RE2 lacks. Move-only;
// FindAll is const and thread-safe (match data is allocated per call).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace st {

class Regex {
 public:
  static StatusOr<Regex> Compile(const std::string& pattern);
  // A pattern matching `literal` exactly.
  static StatusOr<Regex> Literal(const std::string& literal);
  Regex(Regex&& other) noexcept : code_(std::exchange(other.code_, nullptr)) {}
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // Non-overlapping matches, left to right, as [begin, end) byte offsets. Empty matches are kept
  // (the scan then advances one character).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace st

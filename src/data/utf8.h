// Small UTF-8 helpers for the tokenizers (no normalization, no case mapping). Invalid bytes count
// as one-byte characters, so every loop over a string makes progress.
#pragma once

#include <cstdint>
#include <string_view>

namespace st {

// Length of the character starting with byte c (1 for ASCII, continuation or invalid bytes).
inline int Utf8Len(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  if (u < 0xC0) return 1;
  if (u < 0xE0) return 2;
  if (u < 0xF0) return 3;
  if (u < 0xF8) return 4;
  return 1;
}

// The code point starting at byte pos (the byte itself when the sequence is malformed).
inline uint32_t DecodeUtf8At(std::string_view s, size_t pos) {
  const unsigned char u = static_cast<unsigned char>(s[pos]);
  const int n = Utf8Len(s[pos]);
  if (n == 1 || pos + n > s.size()) return u;
  uint32_t cp = u & (0xFF >> (n + 1));
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  return cp;
}

// Start of the character that ends at byte pos (pos > 0).
inline size_t PrevCharStart(std::string_view s, size_t pos) {
  size_t p = pos - 1;
  while (p > 0 && pos - p < 4 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  return p;
}

// Unicode White_Space (what Rust's char::is_whitespace tests).
inline bool IsWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Python's str.strip(): Unicode whitespace (and the separators U+001C..U+001F) at both ends.
inline std::string_view StripPythonWhitespace(std::string_view s) {
  auto space = [](uint32_t c) { return IsWhitespace(c) || (c >= 0x1C && c <= 0x1F); };
  size_t b = 0, e = s.size();
  while (b < e && space(DecodeUtf8At(s, b))) b += static_cast<size_t>(Utf8Len(s[b]));
  while (e > b) {
    const size_t p = PrevCharStart(s, e);
    if (!space(DecodeUtf8At(s, p))) break;
    e = p;
  }
  return s.substr(b, e - b);
}

// Strict UTF-8 validation (no overlongs, no surrogates, at most U+10FFFF).
inline bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char u = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t min;
    if (u < 0x80) {
      ++i;
      continue;
    } else if ((u & 0xE0) == 0xC0) {
      n = 2;
      min = 0x80;
    } else if ((u & 0xF0) == 0xE0) {
      n = 3;
      min = 0x800;
    } else if ((u & 0xF8) == 0xF0) {
      n = 4;
      min = 0x10000;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    uint32_t cp = u & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) {
      const unsigned char c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace st

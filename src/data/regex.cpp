#include "data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace st {
namespace {
pcre2_code* Code(void* p) {
  return static_cast<pcre2_code*>(p);
}
}  // namespace

StatusOr<Regex> Regex::Compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return InvalidArgument(StrCat("bad regex '", pattern, "' at offset ", err_off, ": ",
                                  reinterpret_cast<const char*>(buf)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; falls back to the interpreter
  Regex r;
  r.code_ = code;
  return r;
}

StatusOr<Regex> Regex::Literal(const std::string& literal) {
  return Compile("\\Q" + literal + "\\E");
}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_) pcre2_code_free(Code(code_));
    code_ = std::exchange(other.code_, nullptr);
  }
  return *this;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(Code(code_));
}

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(Code(code_), nullptr);
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(Code(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                         0, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {  // empty match: step over one UTF-8 character
      pos = e + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace st

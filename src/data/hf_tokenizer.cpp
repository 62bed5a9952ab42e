// The tokenizer.json pipeline (Hugging Face `tokenizers` format), written from the format's
// documented behaviour:
//   added tokens split out (leftmost-longest; lstrip / rstrip / single_word; non-normalized ones on
//   the raw text, normalized ones after normalization) -> normalizer -> pre-tokenizer splits -> BPE
//   model per split (merges by rank, byte fallback, fused unk) -> post-processor template.
// Decoding: ids -> tokens (special ones optionally skipped) -> decoder chain.
// Supported components: normalizers Replace, Prepend, Strip, Sequence; pre-tokenizers Split,
// Sequence; model BPE; decoders Replace, ByteFallback, Fuse, Strip, Sequence; post-processors
// TemplateProcessing (single sequence), ByteLevel (no-op for ids), Sequence. Anything else is
// rejected at load time.
#include "data/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <unordered_map>
#include <variant>

#include "data/regex.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

namespace st {
namespace {

using json = nlohmann::json;

// Heterogeneous-lookup string map (find by string_view without building a std::string).
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

// A Split / Replace pattern: {"String": literal} or {"Regex": pcre}.
class Pattern {
 public:
  static StatusOr<Pattern> FromJson(const json& j) {
    Pattern p;
    if (j.is_object() && j.contains("String") && j["String"].is_string()) {
      p.literal_ = j["String"].get<std::string>();
      return p;
    }
    if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
      ST_ASSIGN_OR_RETURN(Regex r, Regex::Compile(j["Regex"].get<std::string>()));
      p.regex_ = std::make_shared<Regex>(std::move(r));
      return p;
    }
    return InvalidArgument("pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const {
    if (regex_) return regex_->FindAll(text);
    std::vector<std::pair<size_t, size_t>> out;
    if (literal_.empty()) return out;
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size()))
      out.emplace_back(pos, pos + literal_.size());
    return out;
  }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

std::string ReplaceAll(std::string_view s, const Pattern& p, const std::string& content) {
  auto m = p.FindAll(s);
  if (m.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + m.size() * content.size());
  size_t prev = 0;
  for (auto [b, e] : m) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

// ---------------------------------------------------------------- normalizers
struct Normalizer {
  enum class Kind { kReplace, kPrepend, kStrip } kind;
  std::optional<Pattern> pattern;
  std::string content;  // Replace: replacement; Prepend: prefix
  bool left = false, right = false;
};

Status ParseNormalizer(const json& j, std::vector<Normalizer>* out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& n : j.value("normalizers", json::array()))
      ST_RETURN_IF_ERROR(ParseNormalizer(n, out));
    return Status::Ok();
  }
  Normalizer n;
  if (type == "Replace") {
    n.kind = Normalizer::Kind::kReplace;
    ST_ASSIGN_OR_RETURN(Pattern p, Pattern::FromJson(j.value("pattern", json())));
    n.pattern = std::move(p);
    n.content = j.value("content", "");
  } else if (type == "Prepend") {
    n.kind = Normalizer::Kind::kPrepend;
    n.content = j.value("prepend", "");
  } else if (type == "Strip") {
    n.kind = Normalizer::Kind::kStrip;
    n.left = j.value("strip_left", false);
    n.right = j.value("strip_right", false);
  } else {
    return Unimplemented(StrCat(
        "normalizer '", type, "' is not supported (supported: Replace, Prepend, Strip, Sequence)"));
  }
  out->push_back(std::move(n));
  return Status::Ok();
}

std::string Normalize(const std::vector<Normalizer>& ns, std::string_view text) {
  std::string s(text);
  for (const Normalizer& n : ns) {
    switch (n.kind) {
      case Normalizer::Kind::kReplace:
        s = ReplaceAll(s, *n.pattern, n.content);
        break;
      case Normalizer::Kind::kPrepend:
        if (!s.empty()) s = n.content + s;
        break;
      case Normalizer::Kind::kStrip: {
        size_t b = 0, e = s.size();
        if (n.left)
          while (b < e && IsWhitespace(DecodeUtf8At(s, b))) b += Utf8Len(s[b]);
        if (n.right)
          while (e > b) {
            size_t p = PrevCharStart(s, e);
            if (!IsWhitespace(DecodeUtf8At(s, p))) break;
            e = p;
          }
        s = s.substr(b, e - b);
        break;
      }
    }
  }
  return s;
}

// ---------------------------------------------------------------- pre-tokenizers
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  Pattern pattern;
  SplitBehavior behavior;
  bool invert = false;
};

Status ParsePreTokenizer(const json& j, std::vector<PreTokenizer>* out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& p : j.value("pretokenizers", json::array()))
      ST_RETURN_IF_ERROR(ParsePreTokenizer(p, out));
    return Status::Ok();
  }
  if (type != "Split")
    return Unimplemented(
        StrCat("pre-tokenizer '", type, "' is not supported (supported: Split, Sequence)"));
  ST_ASSIGN_OR_RETURN(Pattern p, Pattern::FromJson(j.value("pattern", json())));
  static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  auto it = kBehaviors.find(j.value("behavior", ""));
  if (it == kBehaviors.end())
    return InvalidArgument(StrCat("Split behavior '", j.value("behavior", ""), "' is unknown"));
  out->push_back(PreTokenizer{std::move(p), it->second, j.value("invert", false)});
  return Status::Ok();
}

struct Piece {
  size_t b, e;
  bool match;
};

// Splits [b, e) of s with one Split pre-tokenizer, appending the non-empty pieces to out.
void ApplySplit(const PreTokenizer& pt, std::string_view s, size_t b, size_t e,
                std::vector<std::pair<size_t, size_t>>* out) {
  std::vector<Piece> pieces;
  size_t prev = b;
  for (auto [mb, me] : pt.pattern.FindAll(s.substr(b, e - b))) {
    mb += b;
    me += b;
    if (mb > prev) pieces.push_back({prev, mb, pt.invert});
    if (me > mb) pieces.push_back({mb, me, !pt.invert});
    prev = me;
  }
  if (prev < e) pieces.push_back({prev, e, pt.invert});
  std::vector<Piece> merged;
  switch (pt.behavior) {
    case SplitBehavior::kRemoved:
      for (const Piece& p : pieces)
        if (!p.match) merged.push_back(p);
      break;
    case SplitBehavior::kIsolated:
      merged = pieces;
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const Piece& p : pieces) {
        if (p.match && !prev_match && !merged.empty())
          merged.back().e = p.e;
        else
          merged.push_back(p);
        prev_match = p.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool next_match = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->match && !next_match && !merged.empty())
          merged.back().b = it->b;
        else
          merged.push_back(*it);
        next_match = it->match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (i > 0 && pieces[i].match == pieces[i - 1].match)
          merged.back().e = pieces[i].e;
        else
          merged.push_back(pieces[i]);
      }
      break;
    }
  }
  for (const Piece& p : merged)
    if (p.e > p.b) out->emplace_back(p.b, p.e);
}

// ---------------------------------------------------------------- BPE model
class Bpe {
 public:
  Status Parse(const json& m);
  // llama.cpp's gemma4 rule (HfPipelineOptions::whole_newline_runs).
  void set_whole_newline_runs(bool on) { whole_newline_runs_ = on; }
  // Appends the ids of one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  const TokenMap& vocab() const { return vocab_; }
  const std::optional<std::string>& unk_token() const { return unk_token_; }

 private:
  struct Merge {
    int32_t rank, id;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint64_t(uint32_t(b));
  }
  TokenMap vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> token ids, -1 when absent
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  bool whole_newline_runs_ = false;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
};

Status Bpe::Parse(const json& m) {
  if (m.value("type", "BPE") != "BPE")
    return Unimplemented(
        StrCat("model '", m.value("type", ""), "' is not supported (only BPE models are)"));
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return InvalidArgument("model.vocab is missing or not an object");
  vocab_.reserve(m["vocab"].size());
  std::unordered_map<int32_t, std::string>
      by_id;  // two tokens with one id would decode ambiguously
  for (auto& [tok, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      return InvalidArgument(StrCat("model.vocab['", tok, "'] is not a valid id"));
    auto [it, fresh] = by_id.emplace(id.get<int32_t>(), tok);
    if (!fresh)
      return InvalidArgument(StrCat("model.vocab gives id ", it->first, " to both '", it->second,
                                    "' and '", tok, "'"));
    vocab_.emplace(tok, id.get<int32_t>());
  }
  auto str_or_empty = [&](const char* key) {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  prefix_ = str_or_empty("continuing_subword_prefix");
  suffix_ = str_or_empty("end_of_word_suffix");
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);
  ignore_merges_ = m.value("ignore_merges", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    unk_token_ = m["unk_token"].get<std::string>();
    auto it = vocab_.find(*unk_token_);
    if (it == vocab_.end())
      return InvalidArgument(StrCat("unk_token '", *unk_token_, "' is not in the vocabulary"));
    unk_id_ = it->second;
  }
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  const json& merges = m.contains("merges") ? m["merges"] : json::array();
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const json& e = merges[r];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return InvalidArgument(StrCat("merge ", r, " '", s, "' is not two tokens"));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return InvalidArgument(StrCat("merge ", r, " is neither \"a b\" nor [a, b]"));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end())
      return InvalidArgument(StrCat("merge ", r, " uses a token missing from the vocabulary"));
    std::string joined = a + (b.compare(0, prefix_.size(), prefix_) == 0 && !prefix_.empty()
                                  ? b.substr(prefix_.size())
                                  : b);
    auto ij = vocab_.find(joined);
    if (ij == vocab_.end())
      return InvalidArgument(
          StrCat("merge ", r, " makes '", joined, "', missing from the vocabulary"));
    merges_.emplace(Key(ia->second, ib->second), Merge{int32_t(r), ij->second});
  }
  return Status::Ok();
}

void Bpe::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_ ||
      (whole_newline_runs_ && word.find_first_not_of('\n') == std::string_view::npos)) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // Symbols of the word, as a doubly linked list over arrays.
  std::vector<int32_t> id;
  id.reserve(word.size());
  // An unknown character is held back and emitted just before the next character found in the
  // vocabulary (or at the end), so byte-fallback tokens of characters in between come first and a
  // run of unknown characters fuses across them. This is the `tokenizers` package's behaviour.
  bool pending_unk = false;
  std::string buf;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min<size_t>(Utf8Len(word[i]), word.size() - i);
    std::string_view ch = word.substr(i, n);
    bool first = i == 0, last = i + n == word.size();
    int32_t tid = -1;
    if ((first || prefix_.empty()) && (!last || suffix_.empty())) {
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) tid = it->second;
    } else {
      buf.assign(first ? "" : prefix_).append(ch).append(last ? suffix_ : "");
      auto it = vocab_.find(buf);
      if (it != vocab_.end()) tid = it->second;
    }
    i += n;
    if (tid >= 0) {
      if (pending_unk) id.push_back(unk_id_);
      pending_unk = false;
      id.push_back(tid);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) id.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) id.push_back(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) id.push_back(unk_id_);
  const int n = static_cast<int>(id.size());
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  std::vector<char> alive(n, 1);
  // Min-heap on (rank, position): the lowest-ranked merge first, the leftmost among equals.
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(Key(id[pos], id[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    auto it = merges_.find(Key(id[c.pos], id[next[c.pos]]));
    if (it == merges_.end() || it->second.id != c.new_id) continue;  // stale candidate
    int right = next[c.pos];
    id[c.pos] = c.new_id;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i < n; ++i)
    if (alive[i]) out->push_back(id[i]);
}

// ---------------------------------------------------------------- decoders
struct Decoder {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip } kind;
  std::optional<Pattern> pattern;
  std::string content;  // Replace: replacement; Strip: the character stripped
  int start = 0, stop = 0;
};

Status ParseDecoder(const json& j, std::vector<Decoder>* out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& d : j.value("decoders", json::array()))
      ST_RETURN_IF_ERROR(ParseDecoder(d, out));
    return Status::Ok();
  }
  Decoder d;
  if (type == "Replace") {
    d.kind = Decoder::Kind::kReplace;
    ST_ASSIGN_OR_RETURN(Pattern p, Pattern::FromJson(j.value("pattern", json())));
    d.pattern = std::move(p);
    d.content = j.value("content", "");
  } else if (type == "ByteFallback") {
    d.kind = Decoder::Kind::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::Kind::kFuse;
  } else if (type == "Strip") {
    d.kind = Decoder::Kind::kStrip;
    d.content = j.value("content", " ");
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else {
    return Unimplemented(StrCat("decoder '", type,
                                "' is not supported (supported: Replace, ByteFallback, Fuse, "
                                "Strip, Sequence)"));
  }
  out->push_back(std::move(d));
  return Status::Ok();
}

// "<0xAB>" -> 0xAB, or -1.
int ByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

void ApplyDecoder(const Decoder& d, std::vector<std::string>* toks) {
  switch (d.kind) {
    case Decoder::Kind::kReplace:
      for (std::string& t : *toks) t = ReplaceAll(t, *d.pattern, d.content);
      break;
    case Decoder::Kind::kByteFallback: {
      std::vector<std::string> out;
      std::string bytes;
      int nbytes = 0;
      auto flush = [&] {
        if (nbytes == 0) return;
        if (IsValidUtf8(bytes)) {
          out.push_back(bytes);
        } else {
          for (int i = 0; i < nbytes; ++i) out.push_back("\xEF\xBF\xBD");  // U+FFFD per byte
        }
        bytes.clear();
        nbytes = 0;
      };
      for (std::string& t : *toks) {
        int b = ByteToken(t);
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
          ++nbytes;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      *toks = std::move(out);
      break;
    }
    case Decoder::Kind::kFuse: {
      std::string all;
      for (const std::string& t : *toks) all += t;
      toks->assign(1, std::move(all));
      break;
    }
    case Decoder::Kind::kStrip:
      for (std::string& t : *toks) {
        size_t b = 0, e = t.size();
        for (int i = 0; i < d.start && t.compare(b, d.content.size(), d.content) == 0 &&
                        b + d.content.size() <= e;
             ++i)
          b += d.content.size();
        for (int i = 0; i < d.stop && e >= b + d.content.size() &&
                        t.compare(e - d.content.size(), d.content.size(), d.content) == 0;
             ++i)
          e -= d.content.size();
        t = t.substr(b, e - b);
      }
      break;
  }
}

// ---------------------------------------------------------------- added tokens
struct AddedToken {
  std::string content;  // as matched: normalized when `normalized`
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
};

// Leftmost-longest matcher over a set of added tokens: a byte trie, so that tokenizers with
// thousands of added tokens (Gemma has ~6000 reserved ones) match in O(text x token length).
class AddedMatcher {
 public:
  AddedMatcher() : nodes_(1) {}
  void Add(int index, const std::string& content) {
    if (content.empty()) return;
    int n = 0;
    for (unsigned char c : content) {
      auto it = std::lower_bound(nodes_[n].next.begin(), nodes_[n].next.end(), std::make_pair(c, 0),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
      if (it == nodes_[n].next.end() || it->first != c) {
        const int child = static_cast<int>(nodes_.size());
        it = nodes_[n].next.insert(it, {c, child});
        nodes_.emplace_back();
      }
      n = it->second;
    }
    if (nodes_[n].token < 0) nodes_[n].token = index;  // the first of duplicate contents wins
    first_[static_cast<unsigned char>(content[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // Next match at or after pos: (begin, index), or index -1.
  std::pair<size_t, int> Find(std::string_view s, size_t pos) const {
    for (size_t i = pos; i < s.size(); ++i) {
      if (!first_[static_cast<unsigned char>(s[i])]) continue;
      int n = 0, best = -1;
      for (size_t j = i; j < s.size(); ++j) {
        const auto& next = nodes_[n].next;
        const unsigned char c = static_cast<unsigned char>(s[j]);
        auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, 0),
                                   [](const auto& a, const auto& b) { return a.first < b.first; });
        if (it == next.end() || it->first != c) break;
        n = it->second;
        if (nodes_[n].token >= 0) best = nodes_[n].token;
      }
      if (best >= 0) return {i, best};
    }
    return {s.size(), -1};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;  // sorted by byte
    int token = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

bool IsWordChar(uint32_t c) {
  return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= 0x80 && !IsWhitespace(c));
}

// ---------------------------------------------------------------- the pipeline
class HfTokenizer final : public TokenizerBackend {
 public:
  explicit HfTokenizer(HfPipelineOptions options) : options_(std::move(options)) {
    bpe_.set_whole_newline_runs(options_.whole_newline_runs);
  }
  Status Parse(const json& j);
  void EncodePlain(std::string_view text, std::vector<int32_t>* out) const override;
  void TemplateSpecials(std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) const override {
    bool after = false;
    for (const auto& [is_seq, ids] : template_) {
      if (is_seq)
        after = true;
      else
        (after ? suffix : prefix)->insert((after ? suffix : prefix)->end(), ids.begin(), ids.end());
    }
  }
  std::string Decode(std::span<const int32_t> ids, bool skip_special) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = added_by_content_.find(token);
    if (it != added_by_content_.end()) return it->second;
    auto v = bpe_.vocab().find(token);
    if (v != bpe_.vocab().end()) return v->second;
    return std::nullopt;
  }
  std::string IdToToken(int32_t id) const override {
    return id >= 0 && id < int32_t(id_to_token_.size()) ? id_to_token_[id] : std::string();
  }
  std::optional<std::string> UnkToken() const override { return bpe_.unk_token(); }
  std::string kind() const override { return options_.kind; }

 private:
  // Splits s (from pos) on the tokens of `matcher`, calling on_text(b, e) for text between
  // matches and on_token(index) for each match.
  template <typename OnText, typename OnToken>
  void SplitAdded(const AddedMatcher& matcher, std::string_view s, OnText on_text,
                  OnToken on_token) const;
  void EncodeNormalized(std::string_view normalized, std::vector<int32_t>* out) const;

  HfPipelineOptions options_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;
  Bpe bpe_;
  std::vector<Decoder> decoders_;
  std::vector<AddedToken> added_;
  TokenMap added_by_content_;  // raw content -> id
  AddedMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> id_to_token_;
  std::vector<char> is_special_;
  std::vector<std::pair<bool, std::vector<int32_t>>> template_;  // (is $A, special ids)
};

Status ParseTemplate(const json& pp, const TokenMap& specials_map,
                     std::vector<std::pair<bool, std::vector<int32_t>>>* out) {
  if (pp.is_null()) return Status::Ok();
  std::string type = pp.value("type", "");
  if (type == "Sequence") {
    for (const json& p : pp.value("processors", json::array()))
      ST_RETURN_IF_ERROR(ParseTemplate(p, specials_map, out));
    return Status::Ok();
  }
  if (type == "ByteLevel") return Status::Ok();  // only changes offsets
  if (type != "TemplateProcessing")
    return Unimplemented(StrCat("post-processor '", type,
                                "' is not supported (supported: TemplateProcessing, ByteLevel, "
                                "Sequence)"));
  if (!out->empty()) return Unimplemented("more than one TemplateProcessing post-processor");
  const json& specials = pp.value("special_tokens", json::object());
  for (const json& item : pp.value("single", json::array())) {
    if (item.contains("Sequence")) {
      out->push_back({true, {}});
    } else if (item.contains("SpecialToken")) {
      std::string name = item["SpecialToken"].value("id", "");
      std::vector<int32_t> ids;
      if (specials.contains(name) && specials[name].contains("ids")) {
        for (const json& i : specials[name]["ids"]) {
          const int64_t id = i.get<int64_t>();
          if (id < 0 || id > INT32_MAX)
            return InvalidArgument(StrCat("post-processor token '", name, "' has id ", id));
          ids.push_back(static_cast<int32_t>(id));
        }
      } else if (auto it = specials_map.find(name); it != specials_map.end()) {
        ids.push_back(it->second);
      } else {
        return InvalidArgument(StrCat("post-processor token '", name, "' is unknown"));
      }
      out->push_back({false, std::move(ids)});
    }
  }
  return Status::Ok();
}

Status HfTokenizer::Parse(const json& j) {
  if (!j.is_object()) return InvalidArgument("tokenizer.json is not a JSON object");
  if (!j.contains("model")) return InvalidArgument("tokenizer.json has no 'model'");
  ST_RETURN_IF_ERROR(bpe_.Parse(j["model"]).WithContext("model"));
  ST_RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", json()), &normalizers_));
  ST_RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", json()), &pre_tokenizers_));
  ST_RETURN_IF_ERROR(ParseDecoder(j.value("decoder", json()), &decoders_));
  int32_t max_id = -1;
  for (const auto& [t, id] : bpe_.vocab()) max_id = std::max(max_id, id);
  for (const json& a : j.value("added_tokens", json::array())) {
    const int64_t id = a.value("id", int64_t{-1});
    if (id > INT32_MAX) return InvalidArgument(StrCat("added token id ", id, " is too large"));
    AddedToken t{a.value("content", ""),      static_cast<int32_t>(id),
                 a.value("special", false),   a.value("lstrip", false),
                 a.value("rstrip", false),    a.value("single_word", false),
                 a.value("normalized", false)};
    if (t.content.empty() || t.id < 0)
      return InvalidArgument("an added token has no content or a negative id");
    added_by_content_[t.content] = t.id;
    max_id = std::max(max_id, t.id);
    if (t.normalized) t.content = Normalize(normalizers_, t.content);
    added_.push_back(std::move(t));
  }
  // Ids index dense tables: a file whose ids are far larger than its number of tokens would make
  // them huge (an id of 2^31 - 1 alone would ask for 64 GiB), so it is refused.
  const int64_t tokens = static_cast<int64_t>(bpe_.vocab().size() + added_.size());
  if (max_id >= 2 * tokens + 1024)
    return InvalidArgument(StrCat("the largest token id is ", max_id, " but there are only ",
                                  tokens, " tokens; ids must be (nearly) dense from 0"));
  id_to_token_.assign(max_id + 1, std::string());
  is_special_.assign(max_id + 1, 0);
  for (const auto& [t, id] : bpe_.vocab()) id_to_token_[id] = t;
  for (const auto& [t, id] : added_by_content_) id_to_token_[id] = t;
  for (size_t i = 0; i < added_.size(); ++i) {
    is_special_[added_[i].id] = added_[i].special;
    (added_[i].normalized ? normalized_matcher_ : raw_matcher_).Add(int(i), added_[i].content);
  }
  TokenMap all(added_by_content_);
  for (const auto& kv : bpe_.vocab()) all.insert(kv);
  ST_RETURN_IF_ERROR(ParseTemplate(j.value("post_processor", json()), all, &template_));
  for (const auto& [is_text, ids] : template_)
    for (int32_t id : ids)
      if (id < 0 || id > max_id)
        return InvalidArgument(StrCat("post-processor special token id ", id,
                                      " is outside the vocabulary [0, ", max_id, "]"));
  return Status::Ok();
}

template <typename OnText, typename OnToken>
void HfTokenizer::SplitAdded(const AddedMatcher& matcher, std::string_view s, OnText on_text,
                             OnToken on_token) const {
  size_t done = 0;  // text before `done` has been emitted
  size_t pos = 0;
  while (!matcher.empty()) {
    auto [b, idx] = matcher.Find(s, pos);
    if (idx < 0) break;
    const AddedToken& t = added_[idx];
    size_t e = b + t.content.size();
    if (t.single_word) {
      bool left_ok = b == 0 || !IsWordChar(DecodeUtf8At(s, PrevCharStart(s, b)));
      bool right_ok = e == s.size() || !IsWordChar(DecodeUtf8At(s, e));
      if (!left_ok || !right_ok) {
        pos = b + 1;
        continue;
      }
    }
    if (t.lstrip) {
      while (b > done) {
        size_t p = PrevCharStart(s, b);
        if (!IsWhitespace(DecodeUtf8At(s, p))) break;
        b = p;
      }
    }
    if (t.rstrip) {
      while (e < s.size() && IsWhitespace(DecodeUtf8At(s, e))) e += Utf8Len(s[e]);
    }
    if (b > done) on_text(done, b);
    on_token(idx);
    done = pos = e;
  }
  if (done < s.size()) on_text(done, s.size());
}

void HfTokenizer::EncodeNormalized(std::string_view normalized, std::vector<int32_t>* out) const {
  // Pre-tokenize: each pre-tokenizer refines the pieces of the previous one.
  std::vector<std::pair<size_t, size_t>> pieces = {{0, normalized.size()}}, next;
  for (const PreTokenizer& pt : pre_tokenizers_) {
    next.clear();
    for (auto [b, e] : pieces) ApplySplit(pt, normalized, b, e, &next);
    pieces.swap(next);
  }
  for (auto [b, e] : pieces) bpe_.EncodeWord(normalized.substr(b, e - b), out);
}

void HfTokenizer::EncodePlain(std::string_view text, std::vector<int32_t>* out) const {
  SplitAdded(
      raw_matcher_, text,
      [&](size_t b, size_t e) {
        std::string norm = Normalize(normalizers_, text.substr(b, e - b));
        std::string_view ns(norm);
        SplitAdded(
            normalized_matcher_, ns,
            [&](size_t nb, size_t ne) { EncodeNormalized(ns.substr(nb, ne - nb), out); },
            [&](int idx) { out->push_back(added_[idx].id); });
      },
      [&](int idx) { out->push_back(added_[idx].id); });
}

std::string HfTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= int32_t(id_to_token_.size()) || id_to_token_[id].empty()) continue;
    if (skip_special && is_special_[id]) continue;
    toks.push_back(id_to_token_[id]);
  }
  if (decoders_.empty()) {  // the `tokenizers` default: tokens joined by spaces
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  for (const Decoder& d : decoders_) ApplyDecoder(d, &toks);
  std::string s;
  for (const std::string& t : toks) s += t;
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<TokenizerBackend>> LoadHfTokenizerParsed(
    const json& j, const HfPipelineOptions& options) {
  auto t = std::make_unique<HfTokenizer>(options);
  // Parse checks the fields it relies on; a field of an unexpected JSON type elsewhere throws from
  // nlohmann's accessors, which must not cross this boundary.
  try {
    ST_RETURN_IF_ERROR(t->Parse(j));
  } catch (const json::exception& e) {
    return InvalidArgument(StrCat("a field has an unexpected JSON type: ", e.what()));
  }
  return std::unique_ptr<TokenizerBackend>(std::move(t));
}

StatusOr<std::unique_ptr<TokenizerBackend>> LoadHfTokenizerJson(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("not valid JSON");
  return LoadHfTokenizerParsed(j, HfPipelineOptions{});
}

}  // namespace st

// `slicetrain tokenize`: text -> token ids (or ids -> text with --decode) with a tokenizer.json,
// a SentencePiece .model, a directory holding one (plus tokenizer_config.json), or the vocabulary
// of a GGUF file.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "data/tokenizer.h"

namespace st::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer, text, file, data_dir;
  bool decode = false, no_special = false, show_tokens = false, skip_special = false;
  bool jsonl = false;
};

StatusOr<std::vector<int32_t>> ParseIds(const std::string& line) {
  std::vector<int32_t> ids;
  std::string s = line;
  for (char& c : s)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream is(s);
  std::string tok;
  while (is >> tok) {
    char* end = nullptr;
    long v = std::strtol(tok.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX)
      return InvalidArgument(StrCat("'", tok, "' is not a token id"));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

Status Run(const TokenizeArgs& a) {
  std::string path = a.tokenizer;
  if (path.empty()) {
    ST_ASSIGN_OR_RETURN(const std::string data, FindBundledData(a.data_dir));
    path = data + "/tokenizer";
  }
  ST_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(path));
  std::vector<std::string> inputs;
  if (!a.file.empty()) {
    std::ifstream f(a.file);
    if (!f) return NotFound(StrCat(a.file, ": cannot open"));
    int64_t n = 0;
    for (std::string line; std::getline(f, line);) {
      ++n;
      if (!a.jsonl || a.decode) {
        inputs.push_back(line);
        continue;
      }
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_string())
        return InvalidArgument(
            StrCat(a.file, ":", n, ": not a JSON string (--jsonl takes one per line)"));
      inputs.push_back(j.get<std::string>());
    }
  } else {
    inputs.push_back(a.text);
  }
  int64_t total = 0;
  for (const std::string& in : inputs) {
    if (a.decode) {
      ST_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIds(in));
      const std::string text = tok.Decode(ids, a.skip_special);
      if (a.jsonl) {
        std::printf("%s\n", nlohmann::json(text)
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                .c_str());
      } else {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fputc('\n', stdout);
      }
      continue;
    }
    std::vector<int32_t> ids = tok.Encode(in, !a.no_special);
    total += static_cast<int64_t>(ids.size());
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      line += (i ? " " : "") + std::to_string(ids[i]);
      if (a.show_tokens) line += "=" + tok.IdToToken(ids[i]);
    }
    std::printf("%s\n", line.c_str());
  }
  if (!a.decode && !a.file.empty())
    std::fprintf(stderr, "tokenize: %zu lines, %lld tokens (%s, vocab %lld)\n", inputs.size(),
                 static_cast<long long>(total), tok.kind().c_str(),
                 static_cast<long long>(tok.vocab_size()));
  return Status::Ok();
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  auto a = std::make_shared<TokenizeArgs>();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "tokenizer.json, SentencePiece .model, a directory holding one, or a GGUF file "
                  "(its vocabulary, tokenized as llama.cpp does) (default: the bundled tokenizer)");
  AddDataDirOption(cmd, &a->data_dir);
  auto* text = cmd->add_option("--text", a->text, "Text to encode (or ids to decode)");
  auto* file = cmd->add_option("--file", a->file, "File to encode (or decode) line by line");
  text->excludes(file);
  cmd->add_flag("--jsonl", a->jsonl,
                "The text side is JSON strings, one per line (texts with newlines): each line of "
                "--file is one to encode, or with --decode each decoded text is printed as one")
      ->needs(file);
  cmd->add_flag("--decode", a->decode, "Input is token ids (space or comma separated)");
  cmd->add_flag("--no-special", a->no_special, "Do not add bos/eos when encoding");
  cmd->add_flag("--skip-special", a->skip_special, "Drop special tokens when decoding");
  cmd->add_flag("--show-tokens", a->show_tokens, "Print id=token pairs");
  cmd->callback([&ctx, a] {
    Status s = Run(*a);
    if (!s.ok()) ctx.exit_code = ReportError("tokenize", s);
  });
}

}  // namespace st::cli

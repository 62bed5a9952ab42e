// Instruction data sets from local data files or data set repositories: JSON Lines, JSON (an array,
// or the array under --dataset-field), CSV/TSV and Parquet, one or several files per split. A
// directory is resolved as the `datasets` library resolves a repository (README `configs:`, else
// its default split patterns; see data/data_files.h); a single file or a glob is the `train` split.
// Rows come in Dolly's layout (instruction, context, response), Alpaca's (instruction, input,
// output), as conversations (a `messages` column of role/content turns, or ShareGPT's
// `conversations` of from/value turns), or under field names given explicitly; the layout is
// detected from the columns of the first file. Hugging Face split syntax selects the rows across
// the concatenated files (`train`, `train[:1024]`, `train[100:200]`, `train[:10%]`,
// `train[-10%:]`). Files are read streaming (one record, or one Parquet row group, in memory at a
// time). Malformed records are skipped, counted and reported by line or row; a split with no
// usable record is an error. The hub download is io/hub.h's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/formats/json.h"
#include "data/formats/rows.h"

namespace st {

// `name[begin:end]` with absolute or percent bounds, negative counting from the end (Python
// slices).
// The longest record a text reader accepts (data/formats/json.h).
constexpr size_t kMaxDatasetRecordBytes = kMaxRecordBytes;

struct SplitSpec {
  struct Bound {
    bool set = false;
    int64_t value = 0;  // records, or percent when `percent`
    bool percent = false;
  };
  std::string name = "train";
  Bound begin, end;

  bool needs_count() const;  // true when resolving needs the number of records
  // [begin, end) over n records; percents are rounded to the closest record (halves to even), as
  // the `datasets` library does.
  std::pair<int64_t, int64_t> Resolve(int64_t n) const;
  std::string ToString() const;
};

StatusOr<SplitSpec> ParseSplit(std::string_view text);

// One turn of a conversation. Roles are normalised: user (ShareGPT's human), assistant (gpt),
// system; others are kept as written.
struct ChatMessage {
  std::string role, content;
  // A turn whose content list holds images ({"type": "image"} parts): the text between them,
  // images + 1 pieces, each the turn's text parts in that stretch stripped and joined, as Gemma
  // 4's chat template renders them (`content` is then the pieces joined). Empty for a text-only
  // turn.
  std::vector<std::string> segments = {};
  int64_t images() const {
    return segments.empty() ? 0 : static_cast<int64_t>(segments.size()) - 1;
  }
};

// An image of a record as the data set holds it: the encoded file (datasets' Image feature in
// Parquet is a struct of `bytes` and `path`), or a path to read it from (a string, or that struct
// with no bytes; relative to the data file's folder). `path` also names an embedded image in
// messages.
struct ImageRef {
  std::string bytes;  // the encoded image (JPEG, PNG, WebP), or empty: read `path`
  std::string path;
};

// One instruction record. `line` is the 1-based line (text files) or row (Parquet) of its file.
// A conversation record has `messages` and empty instruction/context/response.
struct InstructionRecord {
  int64_t line = 0;
  std::string instruction, context, response;
  std::vector<ChatMessage> messages;
  // The record's images, in the order of the image parts of its turns (TRL's vision layout: an
  // `images` list column, or one `image`).
  std::vector<ImageRef> images;
  // A preference record (DatasetLayout::kPreference, TRL's layouts): the prompt and the two
  // completions, as text or (conversational) as turns. An implicit prompt (only chosen and
  // rejected, each holding the whole exchange) is extracted as TRL's extract_prompt does: the
  // longest common prefix of turns, or of characters for text.
  bool conversational = false;
  std::string prompt, chosen, rejected;
  std::vector<ChatMessage> prompt_turns, chosen_turns, rejected_turns;
  // A prompt-only record (DatasetLayout::kPrompt, online RL): `prompt` or `prompt_turns` (with
  // `conversational`), and every other column of the row as it was read (what a reward sees).
  nlohmann::json columns;
};

enum class DatasetLayout { kDetect, kDolly, kAlpaca, kCustom, kConversation, kPreference, kPrompt };

struct DatasetOptions {
  // A data file (.jsonl, .json, .csv, .tsv, .parquet), a glob of data files, or a directory
  // holding a data set repository (a hub snapshot, or files named by split).
  std::string path;
  std::string split = "train";
  // Field names. Empty = from the layout: Dolly (instruction, context, response) or Alpaca
  // (instruction, input, output), detected from the first usable record. Setting any field name
  // makes the layout custom (the others default to Dolly's names).
  std::string instruction_field, context_field, response_field;
  std::string config;      // the README config of a directory ("" = its default)
  std::string json_field;  // the key of the records' array in a top-level JSON object
  // The conversation column ("" = detected: messages, then conversations).
  std::string messages_field;
  // Preference data (`chosen` and `rejected`, with or without `prompt`) for DPO and ORPO; false:
  // instruction data, and a preference set is refused with the flag that reads it.
  bool preference = false;
  // Prompt-only data (a `prompt` column, text or conversation, TRL's GRPOTrainer layout) for
  // online RL; every column is kept for the rewards.
  bool prompts = false;
  // The image column of a conversation set ("" = detected: images, then image).
  std::string images_field = {};
};

// What reading a split found. Skipped records are listed (up to kMaxListed) with their reasons.
struct DatasetReport {
  static constexpr int kMaxListed = 20;
  std::string file;  // the file, or "<first> and N more files"
  DatasetLayout layout = DatasetLayout::kDetect;
  int64_t begin = 0, end = 0;  // the resolved slice over record positions
  int64_t used = 0, skipped = 0;
  std::vector<std::pair<int64_t, std::string>> skipped_lines;  // (line or row, reason)
  std::string unit = "line";                                   // "row" for Parquet files
  // "dataset data/x.jsonl split train[:10]: 10 records used, 1 skipped (line 7: no field
  // 'response')"
  std::string Summary() const;
};

const char* LayoutName(DatasetLayout layout);

class InstructionDataset {
 public:
  // Resolves the file and the split, detects the layout; reads the file only as far as needed
  // (counting records only when a bound is negative or a percentage).
  static StatusOr<InstructionDataset> Open(const DatasetOptions& options);

  // Streams the records of the split, in file order, to fn (which may stop the scan by returning
  // an error). Fills report. Fails when the split holds no usable record.
  Status ForEach(const std::function<Status(const InstructionRecord&)>& fn,
                 DatasetReport* report) const;

  const std::string& file() const { return files_.front().path(); }
  // The files of the split, in reading order.
  std::vector<std::string> files() const;
  const std::string& config() const { return config_; }  // "" for a single file or a glob
  DatasetLayout layout() const { return layout_; }
  std::pair<int64_t, int64_t> range() const { return {begin_, end_}; }
  // What a record's `line` counts: "row" (Parquet) or "line".
  const char* position_unit() const { return files_.front().position_unit(); }

 private:
  bool ToRecord(const Row& row, InstructionRecord* r, std::string* why) const;
  bool ToPreference(nlohmann::json& rec, InstructionRecord* r, std::string* why) const;
  std::vector<RowFile> files_;
  std::string config_;
  SplitSpec split_;
  DatasetLayout layout_ = DatasetLayout::kDetect;
  std::string f_instruction_, f_context_, f_response_, f_messages_, f_images_;
  std::vector<std::string> columns_;  // the columns a record needs (Parquet reads only these)
  int64_t begin_ = 0, end_ = INT64_MAX;
};

// The prompt a record becomes: `{instruction}`, `{context}` and `{response}` are replaced, `{{` and
// `}}` are literal braces. The context template is used for records with a non-empty context.
struct PromptTemplate {
  static constexpr const char* kDefault = "Instruction: {instruction}\nResponse: {response}";
  static constexpr const char* kDefaultWithContext =
      "Instruction: {instruction}\nContext: {context}\nResponse: {response}";
  std::string plain = kDefault;
  std::string with_context = kDefaultWithContext;

  Status Validate() const;  // unknown placeholders or unbalanced braces
  // A conversation becomes one prompt per (user, assistant) exchange, joined by newlines, with a
  // system turn as the context of the exchange that follows it (the model's own chat format is
  // data/chat_template.h's). responses, when given, receives the byte range of every response in
  // the result (offset by base).
  struct CharSpan {
    size_t begin = 0, end = 0;
  };
  std::string Format(const InstructionRecord& r, std::vector<CharSpan>* responses = nullptr,
                     size_t base = 0) const;
};

}  // namespace st

// Reward functions of online RL (finetune --objective grpo), as TRL's GRPOTrainer reward_funcs:
// each scores a batch of completions, one number per completion (NaN = "no reward", TRL's None).
// - A reward program (--reward-command CMD): started once per worker (by /bin/sh -c CMD, in the
//   worker's directory, its stderr the worker's), fed one JSON object per line on stdin and
//   answering one number per line on stdout, in order, each as soon as it is known (flushed: a
//   program that holds answers back until more input or EOF arrives times out). The object is what
//   TRL passes a reward function for one completion: {"prompt": <the row's prompt, text or
//   messages>, "completion": <text, or [{"role": "assistant", "content": text}] for a
//   conversational prompt>, "completion_ids": [...], <every other column of the row>}. An answer is
//   a JSON number, or null / None / nan for no reward (case-insensitive, surrounding whitespace
//   allowed); inf is not a number. A program that exits, does not answer within the timeout or
//   writes something that is not a number is an error naming the command and the completion (and
//   the line).
// - Built-ins for the common cases (--reward SPEC): exact:COLUMN, numeric:COLUMN, regex:PATTERN,
//   overlong:MAX:CACHE (below).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace st {

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // The name metrics use (TRL's rewards/<name>/mean): a built-in's spec kind and argument
  // (e.g. "exact_answer"), a command's program file name (e.g. "reward.py").
  virtual const std::string& name() const = 0;
  // One reward per input object (the JSON above), in order. Errors: one line naming the reward.
  virtual StatusOr<std::vector<double>> Score(const std::vector<nlohmann::json>& inputs) = 0;
};

// The completion's text of an input object: "completion" as a string, or the content of the
// last message when it is a list of messages (the "text" of its parts joined when the content
// is a list of parts); "" when the object has neither.
std::string CompletionText(const nlohmann::json& input);

// A reward program: `command` run by /bin/sh -c in a process group of its own, started on the
// first Score and kept running (each Score writes its lines and reads as many answers, without
// deadlock however large the batch: it writes while it reads). `timeout_s` bounds the wait for
// each answer, counted from when the answer before it arrived and its own line began to be
// written; the program's group is then killed. Errors name completions by their index in the
// Score call (from 0) and answer lines by their number in the program's output (from 1). After
// an error the program is gone and every later Score returns the same error. Codes: Unavailable
// for a timeout, Internal for a program that exits or is killed, InvalidArgument for an answer
// that is not a number (or an extra answer), IoError when it cannot be started. The process group
// is killed (and reaped) when the object is destroyed, after closing the program's stdin and a
// grace period of 1 s. SIGPIPE is blocked in the calling thread while it writes. Score is not
// thread-safe (one caller at a time).
// name(): the base name of the command's first word that has a file extension (letters after a
// dot: "python3 -u reward.py" -> "reward.py"), else of its first word ("./score" -> "score").
// InvalidArgument for an empty command or a timeout that is not > 0.
StatusOr<std::unique_ptr<RewardFunction>> MakeCommandReward(const std::string& command,
                                                            double timeout_s);

// The transport of reward and environment programs: `command` run by /bin/sh -c (its own
// process group, started on the first Ask and kept), one compact JSON object per line written to
// its stdin and one answer line read back per object, in order (writing and reading at once, so
// large batches cannot deadlock), each within `timeout_s` of the one before. A program that exits,
// closes its stdout, hangs or writes more lines than it was asked for is an error naming it
// ("<what> '<command>'") and, for a hang, `flag`; after an error every Ask returns it.
class JsonLinesProgram {
 public:
  virtual ~JsonLinesProgram() = default;
  // Why an answer line is unusable ("" = it is fine): checked as each line arrives, so a bad
  // answer stops the exchange at once ("... answered line K (completion k) with '...', <why>").
  using AnswerCheck = std::function<std::string(std::string_view line)>;
  // One answer line (whitespace trimmed) per input.
  virtual StatusOr<std::vector<std::string>> Ask(const std::vector<nlohmann::json>& inputs,
                                                 const AnswerCheck& check = {}) = 0;
  // Answer lines read over the program's life (for error messages naming a line).
  virtual int64_t lines_read() const = 0;
  // "<what> '<command>'".
  virtual std::string Quoted() const = 0;
  // Kills the program and makes `s` its error from now on; returns s.
  virtual Status Fail(Status s) = 0;
};
StatusOr<std::unique_ptr<JsonLinesProgram>> MakeJsonLinesProgram(const std::string& command,
                                                                 double timeout_s,
                                                                 const std::string& what,
                                                                 const std::string& flag);

// A built-in reward from its spec:
// - exact:COLUMN     1 when the completion's text, trimmed, equals the row's COLUMN (trimmed;
//                    a string, or a number or boolean as JSON writes it), else 0; a null COLUMN
//                    gets no reward (NaN). Name "exact_COLUMN".
// - numeric:COLUMN   1 when the last number in the completion's text equals the row's COLUMN (a
//                    JSON number, or a string: its last number, so GSM8K's "... #### 72" works)
//                    within 1e-6 relative (1e-9 absolute near zero), else 0; a row whose COLUMN
//                    holds no number gets no reward (NaN). A number is an optional sign (one that
//                    does not follow a letter or digit: "5-3" ends in 3), digits with an optional
//                    decimal part ("1,234.5": commas between groups of three) and an optional
//                    exponent ("1.5e3"). Name "numeric_COLUMN".
// - regex:PATTERN    1 when PATTERN matches the whole completion text, else 0. The syntax is
//                    PCRE2's (Python re's for the common cases); as there, '.' does not match a
//                    newline: write [\s\S] or start with (?s). Name "regex".
// - overlong:MAX:CACHE  TRL's get_soft_overlong_punishment over completion_ids' length L:
//                    0 when L <= MAX - CACHE, (MAX - CACHE - L) / CACHE up to MAX, -1 beyond
//                    (0 < MAX, 0 <= CACHE <= MAX). Name "soft_overlong_punishment_reward".
// InvalidArgument naming the spec and the accepted forms when it is malformed; Score's
// InvalidArgument names the spec and the completion whose row lacks COLUMN (or completion_ids).
StatusOr<std::unique_ptr<RewardFunction>> MakeBuiltinReward(const std::string& spec);

}  // namespace st

// Reward functions of online RL (src/train/rewards.h): the built-ins (exact, numeric, regex and
// TRL's soft overlong punishment) on edge cases and malformed specs, and the reward program run
// through /bin/sh: answers in order from one long-lived process, no reward, each failure (exit,
// signal, hang, garbage, extra lines) as one clear error, a large batch without pipe deadlock, and
// no process left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "train/rewards.h"

namespace st {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// An input object as the trainer builds it: prompt, completion, completion_ids, other columns.
json Input(const json& completion, json columns = json::object(), int64_t num_ids = 3) {
  columns["prompt"] = "What is 6 * 7?";
  columns["completion"] = completion;
  columns["completion_ids"] = std::vector<int64_t>(static_cast<size_t>(num_ids), 7);
  return columns;
}

std::unique_ptr<RewardFunction> Builtin(const std::string& spec) {
  StatusOr<std::unique_ptr<RewardFunction>> r = MakeBuiltinReward(spec);
  EXPECT_TRUE(r.ok()) << spec << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<RewardFunction> Command(const std::string& command, double timeout_s = 10) {
  StatusOr<std::unique_ptr<RewardFunction>> r = MakeCommandReward(command, timeout_s);
  EXPECT_TRUE(r.ok()) << command << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::vector<double> ScoreOk(RewardFunction& f, const std::vector<json>& inputs) {
  StatusOr<std::vector<double>> r = f.Score(inputs);
  EXPECT_TRUE(r.ok()) << f.name() << ": " << r.status().message();
  return r.ok() ? r.value() : std::vector<double>();
}

double ScoreOne(RewardFunction& f, const json& input) {
  const std::vector<double> r = ScoreOk(f, {input});
  return r.size() == 1 ? r[0] : -12345;
}

// The error of a Score that must fail.
Status ScoreError(RewardFunction& f, const std::vector<json>& inputs) {
  StatusOr<std::vector<double>> r = f.Score(inputs);
  EXPECT_FALSE(r.ok()) << f.name() << " scored " << inputs.size() << " inputs";
  return r.status();
}

// True when this process has no child left, running or zombie.
bool NoChildren() {
  return ::waitpid(-1, nullptr, WNOHANG) == -1 && errno == ECHILD;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// n inputs of `bytes`-character completions (ASCII: a program's length in bytes is the text's).
std::vector<json> LargeBatch(int n, size_t bytes) {
  std::vector<json> inputs;
  for (int i = 0; i < n; ++i)
    inputs.push_back(Input(std::string(bytes + static_cast<size_t>(i % 7), 'a' + i % 26)));
  return inputs;
}

// ---- CompletionText ----------------------------------------------------------------------------

TEST(CompletionText, TextMessagesAndParts) {
  EXPECT_EQ(CompletionText(Input("plain")), "plain");
  EXPECT_EQ(CompletionText(Input(json::array({{{"role", "assistant"}, {"content", "hi"}}}))), "hi");
  EXPECT_EQ(CompletionText(Input(json::array({{{"role", "user"}, {"content", "q"}},
                                              {{"role", "assistant"}, {"content", "last"}}}))),
            "last");
  const json parts = json::array(
      {{{"type", "text"}, {"text", "a"}}, {{"type", "image"}}, {{"type", "text"}, {"text", "b"}}});
  EXPECT_EQ(CompletionText(Input(json::array({{{"role", "assistant"}, {"content", parts}}}))),
            "ab");
  EXPECT_EQ(CompletionText(json::object()), "");
  EXPECT_EQ(CompletionText(Input(json::array())), "");
  EXPECT_EQ(CompletionText(json("not an object")), "");
}

// ---- exact -------------------------------------------------------------------------------------

TEST(ExactReward, TrimmedTextEqualsTheColumn) {
  auto f = Builtin("exact:answer");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->name(), "exact_answer");
  EXPECT_EQ(ScoreOne(*f, Input(" Paris\n", {{"answer", "Paris "}})), 1.0);
  EXPECT_EQ(ScoreOne(*f, Input("paris", {{"answer", "Paris"}})), 0.0);
  EXPECT_EQ(ScoreOne(*f, Input("The answer is Paris", {{"answer", "Paris"}})), 0.0);
  EXPECT_EQ(ScoreOne(*f, Input("", {{"answer", ""}})), 1.0);
  // Numbers and booleans as JSON writes them; a conversational completion's last message.
  EXPECT_EQ(ScoreOne(*f, Input("42\n", {{"answer", 42}})), 1.0);
  EXPECT_EQ(ScoreOne(*f, Input("42.0", {{"answer", 42}})), 0.0);
  EXPECT_EQ(ScoreOne(*f, Input("true", {{"answer", true}})), 1.0);
  EXPECT_EQ(ScoreOne(*f, Input(json::array({{{"role", "assistant"}, {"content", " 7 "}}}),
                               {{"answer", "7"}})),
            1.0);
  // A null column gets no reward.
  EXPECT_TRUE(std::isnan(ScoreOne(*f, Input("x", {{"answer", nullptr}}))));
}

TEST(ExactReward, MissingOrUnusableColumnIsAnError) {
  auto f = Builtin("exact:answer");
  ASSERT_TRUE(f);
  const std::vector<json> inputs = {Input("a", {{"answer", "a"}}), Input("b", {{"answer", "b"}}),
                                    Input("c", {{"solution", "c"}})};
  Status s = ScoreError(*f, inputs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "reward exact:answer: completion 2's row has no column 'answer'");
  s = ScoreError(*f, {Input("a", {{"answer", json::array({"a"})}})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("completion 0's column 'answer' holds array"), std::string::npos)
      << s.message();
}

// ---- numeric -----------------------------------------------------------------------------------

TEST(NumericReward, LastNumberOfTheCompletion) {
  auto f = Builtin("numeric:answer");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->name(), "numeric_answer");
  struct Case {
    const char* text;
    double answer;
    double want;
  };
  const Case cases[] = {
      {"6 * 7 = 42", 42, 1},
      {"The answer is 1,234.5.", 1234.5, 1},  // commas between groups, a full stop
      {"about 1,000,000 people", 1e6, 1},
      {"12,3456", 3456, 1},  // not a group of three: two numbers
      {"1,2,3", 3, 1},       // a list
      {"so x=-3", -3, 1},    // a sign after '='
      {"(-0.25)", -0.25, 1},
      {"5-3", 3, 1},  // a minus after a digit is not a sign
      {"5-3", -3, 0},
      {"1.5e3 apples", 1500, 1},  // scientific notation
      {"2E-2", 0.02, 1},
      {"3 eggs", 3, 1},  // 'e' without digits is no exponent
      {"it costs $.5", 0.5, 1},
      {"version 1.2.3", 3, 1},
      {"first 3, then 4", 3, 0},  // the last number counts
      {"no digits here", 7, 0},
      {"", 0, 0},
      {"42", 42 * (1 + 2e-7), 1},  // within 1e-6 relative
      {"42", 42.001, 0},
      {"0.0000000001", 0, 1},  // 1e-10 from zero: 1e-9 absolute
      {"0.00001", 0, 0},
      {"1e999", 0, 0},  // out of range: equals nothing
  };
  for (const Case& c : cases)
    EXPECT_EQ(ScoreOne(*f, Input(c.text, {{"answer", c.answer}})), c.want)
        << "'" << c.text << "' vs " << c.answer;
}

TEST(NumericReward, ColumnAsStringNullOrMissing) {
  auto f = Builtin("numeric:answer");
  ASSERT_TRUE(f);
  // GSM8K's answer column: a worked solution ending in "#### 72"; its last number counts.
  EXPECT_EQ(ScoreOne(*f, Input("So 72.", {{"answer", "48 + 24 = 72\n#### 72"}})), 1.0);
  EXPECT_EQ(ScoreOne(*f, Input("So 72.", {{"answer", " 7,200 "}})), 0.0);
  EXPECT_EQ(ScoreOne(*f, Input("So 7200", {{"answer", " 7,200 "}})), 1.0);
  EXPECT_TRUE(std::isnan(ScoreOne(*f, Input("72", {{"answer", "n/a"}}))));
  EXPECT_TRUE(std::isnan(ScoreOne(*f, Input("72", {{"answer", nullptr}}))));
  EXPECT_TRUE(std::isnan(ScoreOne(*f, Input("1e999", {{"answer", "1e999"}}))));
  const Status s = ScoreError(*f, {Input("1", {{"answer", 1}}), Input("2")});
  EXPECT_EQ(s.message(), "reward numeric:answer: completion 1's row has no column 'answer'");
}

// ---- regex -------------------------------------------------------------------------------------

TEST(RegexReward, MatchesTheWholeText) {
  auto f = Builtin(R"(regex:<think>[\s\S]*?</think>\s*<answer>\d+</answer>)");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->name(), "regex");
  EXPECT_EQ(ScoreOne(*f, Input("<think>6*7\nis 42</think>\n<answer>42</answer>")), 1.0);
  EXPECT_EQ(ScoreOne(*f, Input("<think>x</think><answer>42</answer> and more")), 0.0);
  EXPECT_EQ(ScoreOne(*f, Input("Sure! <think>x</think><answer>42</answer>")), 0.0);
  EXPECT_EQ(ScoreOne(*f, Input("<think>x</think><answer>forty</answer>")), 0.0);
  // Alternatives are anchored as a whole, not only the first and last.
  auto alt = Builtin("regex:yes|no");
  ASSERT_TRUE(alt);
  EXPECT_EQ(ScoreOk(*alt, {Input("yes"), Input("yes or no"), Input("no"), Input("nope")}),
            (std::vector<double>{1, 0, 1, 0}));
}

TEST(RegexReward, DotDoesNotMatchNewlineUnlessAsked) {
  auto plain = Builtin("regex:a.*b");
  auto dotall = Builtin("regex:(?s)a.*b");
  ASSERT_TRUE(plain && dotall);
  EXPECT_EQ(ScoreOne(*plain, Input("a x b")), 1.0);
  EXPECT_EQ(ScoreOne(*plain, Input("a\nb")), 0.0);
  EXPECT_EQ(ScoreOne(*dotall, Input("a\nb")), 1.0);
}

// std::regex overflows the stack on such a text, and PCRE2's JIT runs out of its default
// 32 KiB stack on "(.|\n)*" after a few thousand characters.
TEST(RegexReward, LongCompletionAndInvalidUtf8) {
  auto f = Builtin(R"(regex:(.|\n)*<answer>\d+</answer>)");
  ASSERT_TRUE(f);
  std::string text;
  for (int i = 0; i < 4000; ++i) text += "some reasoning, line " + std::to_string(i) + "\n";
  ASSERT_GT(text.size(), size_t{100000});
  EXPECT_EQ(ScoreOne(*f, Input(text + "<answer>42</answer>")), 1.0);
  EXPECT_EQ(ScoreOne(*f, Input(text + "<answer>x</answer>")), 0.0);
  // A completion cut inside a UTF-8 character is matched, not an error.
  EXPECT_EQ(ScoreOne(*f, Input("caf\xC3<answer>1</answer>")), 1.0);
}

// ---- overlong ----------------------------------------------------------------------------------

TEST(OverlongReward, TrlSoftPunishment) {
  auto f = Builtin("overlong:100:20");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->name(), "soft_overlong_punishment_reward");
  // TRL's documented example (max_completion_len 100, soft_punish_cache 20): 90 tokens -> -0.5.
  std::vector<json> inputs;
  for (int64_t len : {0, 80, 81, 90, 100, 101, 500}) inputs.push_back(Input("x", {}, len));
  const std::vector<double> r = ScoreOk(*f, inputs);
  ASSERT_EQ(r.size(), inputs.size());
  EXPECT_EQ(r[0], 0.0);
  EXPECT_EQ(r[1], 0.0);
  EXPECT_DOUBLE_EQ(r[2], -0.05);
  EXPECT_DOUBLE_EQ(r[3], -0.5);
  EXPECT_DOUBLE_EQ(r[4], -1.0);
  EXPECT_EQ(r[5], -1.0);
  EXPECT_EQ(r[6], -1.0);
  // No cache: a step from 0 to -1.
  auto step = Builtin("overlong:100:0");
  ASSERT_TRUE(step);
  EXPECT_EQ(ScoreOk(*step, {Input("x", {}, 100), Input("x", {}, 101)}),
            (std::vector<double>{0, -1}));
  json no_ids = Input("x");
  no_ids.erase("completion_ids");
  const Status s = ScoreError(*f, {Input("x"), no_ids});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "reward overlong:100:20: completion 1 has no completion_ids list");
}

// ---- malformed specs ---------------------------------------------------------------------------

TEST(BuiltinReward, MalformedSpecsNameTheSpecAndTheForms) {
  for (const char* spec :
       {"", "exact", "exact:", "numeric: ", "fuzzy:answer", "regex:", "regex:(unclosed",
        "regex:a{2,1}", "overlong:100", "overlong:0:0", "overlong:-5:0", "overlong:100:-1",
        "overlong:10:20", "overlong:1.5:1", "overlong:abc:1", "overlong:100:20:3", "overlong::"}) {
    StatusOr<std::unique_ptr<RewardFunction>> r = MakeBuiltinReward(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << spec;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind(StrCat("reward spec '", spec, "': "), 0), 0u) << m;
    EXPECT_NE(m.find("exact:COLUMN, numeric:COLUMN, regex:PATTERN and overlong:MAX:CACHE"),
              std::string::npos)
        << m;
  }
  const Status s = MakeBuiltinReward("regex:(unclosed").status();
  EXPECT_NE(s.message().find("bad pattern at offset"), std::string::npos) << s.message();
}

// ---- the reward program ------------------------------------------------------------------------

TEST(CommandReward, NamesTheProgram) {
  const std::pair<const char*, const char*> cases[] = {
      {"python3 reward.py", "reward.py"},
      {"python3 -u /opt/rewards/math_reward.py --strict", "math_reward.py"},
      {"python3.11 r.py", "r.py"},
      {"/usr/bin/env python3 'my.py'", "my.py"},
      {"./score", "score"},
      {"  /usr/local/bin/judge --fast", "judge"},
      {"sleep 30", "sleep"},
  };
  for (const auto& [command, name] : cases) {
    auto f = Command(command);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->name(), name) << command;
  }
  EXPECT_TRUE(NoChildren());  // nothing starts before the first Score
}

TEST(CommandReward, RejectsEmptyCommandAndBadTimeout) {
  EXPECT_EQ(MakeCommandReward("  ", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCommandReward("true", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCommandReward("true", -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCommandReward("true", std::nan("")).status().code(), StatusCode::kInvalidArgument);
}

// A Python program that reads TRL's objects: the text's length, plus 1000 per completion id, plus
// 0.5 when the row's "answer" column is "yes".
TEST(CommandReward, PythonProgramScoresTheObjects) {
  const std::string dir = test::TempDir("rewards");
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/reward.py") << R"(import json, sys
for line in sys.stdin:
    d = json.loads(line)
    c = d["completion"]
    text = c if isinstance(c, str) else c[-1]["content"]
    score = len(text) + 1000 * len(d["completion_ids"]) + (0.5 if d.get("answer") == "yes" else 0)
    print(score, flush=True)
)";
  {
    auto f = Command("python3 " + dir + "/reward.py");
    ASSERT_TRUE(f);
    EXPECT_EQ(f->name(), "reward.py");
    const json conversational = json::array({{{"role", "assistant"}, {"content", "héllo"}}});
    EXPECT_EQ(ScoreOk(*f, {Input("abc", {{"answer", "yes"}}, 2), Input(conversational, {}, 0),
                           Input("", {{"answer", "no"}}, 1)}),
              (std::vector<double>{2003.5, 5, 1000}));
    EXPECT_EQ(ScoreOk(*f, {}), std::vector<double>{});
    EXPECT_EQ(ScoreOk(*f, {Input("xy", {}, 0)}), std::vector<double>{2});
  }
  EXPECT_TRUE(NoChildren());
  std::filesystem::remove_all(dir);
}

// The program is started once: it counts the lines it has read across Score calls.
TEST(CommandReward, OneProcessAcrossScoreCalls) {
  {
    auto f = Command("n=0; while read -r line; do n=$((n + 1)); echo $n; done");
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreOk(*f, {Input("a"), Input("b"), Input("c")}), (std::vector<double>{1, 2, 3}));
    EXPECT_EQ(ScoreOk(*f, {Input("d"), Input("e")}), (std::vector<double>{4, 5}));
    EXPECT_EQ(ScoreOk(*f, {Input("f")}), (std::vector<double>{6}));
  }
  EXPECT_TRUE(NoChildren());
}

TEST(CommandReward, NullNoneAndNanAreNoReward) {
  auto f = Command(
      "for a in null ' None ' NaN nan 2.5 -1e-3 ' 7 '; do read -r line; echo \"$a\"; done; "
      "cat >/dev/null");
  ASSERT_TRUE(f);
  const std::vector<double> r = ScoreOk(*f, std::vector<json>(7, Input("x")));
  ASSERT_EQ(r.size(), 7u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(r[static_cast<size_t>(i)])) << i;
  EXPECT_EQ(r[4], 2.5);
  EXPECT_EQ(r[5], -0.001);
  EXPECT_EQ(r[6], 7);
}

// Each answer has the whole timeout from when it is awaited, not the whole batch.
TEST(CommandReward, TimeoutCountsPerAnswer) {
  auto f = Command("while read -r line; do sleep 0.2; echo 1; done", 0.6);
  ASSERT_TRUE(f);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(ScoreOk(*f, std::vector<json>(5, Input("x"))), std::vector<double>(5, 1.0));
  EXPECT_GT(Seconds(t0), 0.9);  // longer than the timeout in all
}

TEST(CommandReward, ProgramThatExits) {
  {
    auto f = Command("exit 3");
    ASSERT_TRUE(f);
    const std::string want =
        "reward command 'exit 3' exited (status 3) before answering completion 0";
    EXPECT_EQ(ScoreError(*f, {Input("a"), Input("b")}).message(), want);
    EXPECT_EQ(ScoreError(*f, {Input("c")}).message(), want);  // unusable from now on
  }
  {
    // Exits after answering the first of two.
    auto f = Command("read -r line; echo 1");
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreError(*f, {Input("a"), Input("b")}).message(),
              "reward command 'read -r line; echo 1' exited (status 0) before answering "
              "completion 1");
  }
  {
    auto f = Command("no-such-reward-program-xyz");
    ASSERT_TRUE(f);
    EXPECT_NE(ScoreError(*f, {Input("a")})
                  .message()
                  .find("exited (status 127) before answering "
                        "completion 0 (127: command not found?)"),
              std::string::npos);
  }
  EXPECT_TRUE(NoChildren());
}

// It exits while a large batch is being written: the write fails with EPIPE, and even with
// SIGPIPE's default action (which would end this process) no signal is raised.
TEST(CommandReward, ExitWhileWritingRaisesNoSigpipe) {
  struct sigaction old {};
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ASSERT_EQ(sigaction(SIGPIPE, &dfl, &old), 0);
  {
    auto f = Command("read -r line; exit 4");
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreError(*f, LargeBatch(500, 2048)).message(),
              "reward command 'read -r line; exit 4' exited (status 4) before answering "
              "completion 0");
  }
  sigaction(SIGPIPE, &old, nullptr);
  EXPECT_TRUE(NoChildren());
}

TEST(CommandReward, ProgramKilledBySignal) {
  {
    auto f = Command("read -r line; echo 1; read -r line; kill -9 $$");
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreError(*f, {Input("a"), Input("b"), Input("c")}).message(),
              "reward command 'read -r line; echo 1; read -r line; kill -9 $$' was killed by "
              "SIGKILL (signal 9) before answering completion 1");
  }
  EXPECT_TRUE(NoChildren());
}

TEST(CommandReward, ProgramThatHangs) {
  for (int n : {1, 2000}) {  // 2000 x 2 KB: more than the pipe holds, and it reads nothing
    auto f = Command("sleep 30", 0.5);
    ASSERT_TRUE(f);
    const Clock::time_point t0 = Clock::now();
    const Status s = ScoreError(*f, n == 1 ? std::vector<json>{Input("a")} : LargeBatch(n, 2048));
    EXPECT_EQ(s.message(),
              "reward command 'sleep 30' gave no answer for completion 0 within 0.5 s "
              "(--reward-timeout)");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_LT(Seconds(t0), 3.0);
    EXPECT_EQ(ScoreError(*f, {Input("b")}).message(), s.message());
  }
  {
    // Answers the first, then hangs: the second is named.
    auto f = Command("read -r line; echo 1; sleep 30", 0.3);
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreError(*f, {Input("a"), Input("b")}).message(),
              "reward command 'read -r line; echo 1; sleep 30' gave no answer for completion 1 "
              "within 0.3 s (--reward-timeout)");
  }
  EXPECT_TRUE(NoChildren());
}

TEST(CommandReward, AnswerThatIsNotANumber) {
  for (const char* bad : {"hello", "inf", "True", "", "1 2", "0x"}) {
    const std::string command =
        StrCat("read -r line; echo 0.5; read -r line; echo '", bad, "'; cat >/dev/null");
    auto f = Command(command);
    ASSERT_TRUE(f);
    const Status s = ScoreError(*f, {Input("a"), Input("b"), Input("c")});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), StrCat("reward command '", command,
                                  "' answered line 2 (completion 1) "
                                  "with '",
                                  bad, "', not a number (nor null, None or nan)"));
  }
  {
    // Line numbers run over the program's life; completions count from 0 in each call.
    auto f = Command("read -r line; echo 1; read -r line; echo 2; read -r line; echo x; cat");
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreOk(*f, {Input("a"), Input("b")}), (std::vector<double>{1, 2}));
    EXPECT_NE(ScoreError(*f, {Input("c")}).message().find("answered line 3 (completion 0)"),
              std::string::npos);
  }
  EXPECT_TRUE(NoChildren());
}

TEST(CommandReward, MoreAnswersThanCompletions) {
  auto f = Command("read -r line; printf '1\\n2\\n'; cat >/dev/null");
  ASSERT_TRUE(f);
  EXPECT_EQ(ScoreError(*f, {Input("a")}).message(),
            "reward command 'read -r line; printf '1\\n2\\n'; cat >/dev/null' wrote more answers "
            "than it was given completions (1): an extra line '2'");
}

// A program that answers each line as it reads it fills its stdout pipe while we still write:
// writing everything before reading would deadlock. (Not awk: mawk holds the last line back until
// it sees more input or EOF.)
TEST(CommandReward, LargeBatchWithoutDeadlock) {
  const std::vector<json> inputs = LargeBatch(2000, 2048);
  auto f =
      Command("python3 -c 'import sys\nfor line in sys.stdin: print(len(line) - 1, flush=True)'");
  ASSERT_TRUE(f);
  const Clock::time_point t0 = Clock::now();
  const std::vector<double> r = ScoreOk(*f, inputs);
  ASSERT_EQ(r.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    ASSERT_EQ(r[i], static_cast<double>(inputs[i].dump().size())) << i;
  EXPECT_LT(Seconds(t0), 10.0);
  EXPECT_EQ(ScoreOk(*f, {Input("ab")}).size(), 1u);
}

// Destruction closes stdin, waits 1 s, then kills the whole group: nothing is left behind. This
// process is made the subreaper of the group's orphans (the shell's sleep) to see them die.
TEST(CommandReward, DestructorKillsWhatIsLeft) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  pid_t group = 0;
  Clock::time_point t0;
  {
    // The sleep starts before the answer, so that it runs when the destructor comes however slowly
    // a loaded machine schedules the shell (started after `cat`, it could miss the kill).
    auto f = Command("sleep 30 & read -r line; echo $$; cat >/dev/null; wait");
    ASSERT_TRUE(f);
    const std::vector<double> r = ScoreOk(*f, {Input("a")});
    ASSERT_EQ(r.size(), 1u);
    group = static_cast<pid_t>(r[0]);
    ASSERT_GT(group, 1);
    EXPECT_EQ(::kill(-group, 0), 0);  // its own process group, alive
    t0 = Clock::now();
  }
  const double took = Seconds(t0);
  EXPECT_GT(took, 0.5);  // the grace period: the shell was still running its sleep
  EXPECT_LT(took, 3.0);
  // The orphaned sleep, now this process's child, must be dead already: reap it.
  int reaped = 0;
  for (const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);;) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
      ++reaped;
    } else if (p < 0) {
      break;  // no children left
    } else if (Clock::now() > deadline) {
      ADD_FAILURE() << "a process of the reward program's group still runs";
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  EXPECT_EQ(reaped, 1);
  EXPECT_EQ(::kill(-group, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  EXPECT_TRUE(NoChildren());
}

TEST(CommandReward, ClosedStdoutWithoutExiting) {
  {
    auto f = Command("exec >&-; sleep 30");
    ASSERT_TRUE(f);
    EXPECT_EQ(ScoreError(*f, {Input("a")}).message(),
              "reward command 'exec >&-; sleep 30' closed its stdout before answering "
              "completion 0");
  }
  EXPECT_TRUE(NoChildren());
}

}  // namespace
}  // namespace st

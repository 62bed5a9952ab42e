// slicetrain: distributed fine-tuning of Gemma 4 models on multi-host slices, in C++.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "launch/supervisor.h"
#include "launch/worker.h"

namespace st::cli {

std::string BundledDataDir(const std::string& flag) {
  namespace fs = std::filesystem;
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("SLICETRAIN_DATA_DIR")) return env;
  const fs::path exe = fs::path(launch::SelfExecutable()).parent_path();
  for (const fs::path& p :
       {exe / ".." / "data", exe / ".." / "share" / "slicetrain" / "data", fs::path("data")}) {
    std::error_code ec;
    if (fs::exists(p / "tiny_instruct" / "train.jsonl", ec))
      return fs::weakly_canonical(p).string();
  }
  return "data";
}

HubOptions HubFromEnvironment() {
  HubOptions o = HubOptions::FromEnvironment();
  o.log = [](const std::string& line) { std::fprintf(stderr, "slicetrain: %s\n", line.c_str()); };
  return o;
}

void AddDatasetFieldOptions(CLI::App* cmd, std::string* instruction, std::string* context,
                            std::string* response) {
  cmd->add_option("--instruction-field", *instruction,
                  "Field of the instruction (default: detected, Dolly's or Alpaca's layout)");
  cmd->add_option("--context-field", *context,
                  "Field of the optional context (default: context, Alpaca's input)");
  cmd->add_option("--response-field", *response,
                  "Field of the response (default: response, Alpaca's output)");
}

int ReportError(const std::string& command, const Status& status) {
  std::fprintf(stderr, "slicetrain %s: error: %s\n", command.c_str(), status.message().c_str());
  if (status.code() == StatusCode::kInvalidArgument) return 2;
  // A lost peer or a timeout: a supervisor with --max-failures restarts the group (EX_TEMPFAIL).
  if (status.code() == StatusCode::kUnavailable) return launch::kExitUnavailable;
  return 1;
}

}  // namespace st::cli

int main(int argc, char** argv) {
  CLI::App app{"slicetrain: fine-tune Gemma 4 models over a slice of devices (CPU workers here)",
               "slicetrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "slicetrain 0.1.0");
  st::cli::Context ctx;
  st::cli::RegisterInfoCommand(app, ctx);
  st::cli::RegisterStepCommand(app, ctx);
  st::cli::RegisterFinetuneCommand(app, ctx);
  st::cli::RegisterEvaluateCommand(app, ctx);
  st::cli::RegisterTokenizeCommand(app, ctx);
  st::cli::RegisterDownloadCommand(app, ctx);
  st::cli::RegisterLaunchCommand(app, ctx);
  st::cli::RegisterCollectivesCommand(app, ctx);
  st::cli::RegisterAllReduceLoopCommand(app, ctx);
  st::cli::RegisterRunsCommand(app, ctx);
  st::cli::RegisterDashboardCommand(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0; a bad flag is one error line and exit 2 (argparse's
    // and torchrun's code for a usage error), naming the command and where its flags are listed.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string command;
    if (argc > 1) {
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        if (sub->get_name() == argv[1]) command = sub->get_name();
    }
    const std::string where = command.empty() ? "slicetrain" : "slicetrain " + command;
    std::string what = e.what();
    if (command.empty() && argc > 1 && argv[1][0] != '-') {
      what = st::StrCat("unknown command '", argv[1], "'; the commands are");
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        what += " " + sub->get_name();
    }
    for (char& ch : what)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "%s: error: %s (see '%s --help')\n", where.c_str(), what.c_str(),
                 where.c_str());
    return 2;
  }
  return ctx.exit_code;
}

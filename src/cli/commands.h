// Every subcommand lives in its own file (src/cli/<name>.cpp) and registers itself with the
// top-level CLI11 app here. A command's callback stores its exit code in the context; errors are
// printed as one line "slicetrain <command>: error: <what and what to do>" (docs/errors.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "io/hub.h"

namespace st::cli {

struct Context {
  int exit_code = 0;
};

// The bundled data directory (the default tokenizer and instruction set): `flag` (--data-dir) if
// set, else $SLICETRAIN_DATA_DIR, else data/ next to the binary, <prefix>/share/slicetrain/data
// beside an installed binary, or the source tree the binary was built from. NotFound says where
// it looked and what to set. Works from any working directory.
StatusOr<std::string> FindBundledData(const std::string& flag);
// The same for a command that may not need it: "" when it is not found and not `needed`.
StatusOr<std::string> BundledDataDir(const std::string& flag, bool needed);

// --data-dir: where the bundled data is, for the commands that use it.
void AddDataDirOption(CLI::App* cmd, std::string* data_dir);

// Compute threads of a one-process command (evaluate, step, info): `flag` (--threads) if > 0,
// else OMP_NUM_THREADS, else the CPUs this process may use (affinity mask, cgroup quota).
Status SetProcessThreads(int flag);

// Hub settings from the environment (HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_CACHE,
// HF_HUB_OFFLINE), logging download progress to stderr.
HubOptions HubFromEnvironment();

// --instruction-field, --context-field, --response-field, --messages-field, --images-field...:
// the data set's field names (finetune and evaluate).
void AddDatasetFieldOptions(CLI::App* cmd, std::string* instruction, std::string* context,
                            std::string* response, std::string* messages, std::string* json_field,
                            std::string* config, std::string* revision, std::string* images);

// Prints a failed Status as the one-line error of `command` and returns the exit code to use.
int ReportError(const std::string& command, const Status& status);

void RegisterInfoCommand(CLI::App& app, Context& ctx);
void RegisterStepCommand(CLI::App& app, Context& ctx);
void RegisterFinetuneCommand(CLI::App& app, Context& ctx);
void RegisterEvaluateCommand(CLI::App& app, Context& ctx);
void RegisterGenerateCommand(CLI::App& app, Context& ctx);  // generate and chat
void RegisterExportCommand(CLI::App& app, Context& ctx);
void RegisterTokenizeCommand(CLI::App& app, Context& ctx);
void RegisterImagesCommand(CLI::App& app, Context& ctx);
void RegisterDownloadCommand(CLI::App& app, Context& ctx);
void RegisterLaunchCommand(CLI::App& app, Context& ctx);
void RegisterCollectivesCommand(CLI::App& app, Context& ctx);
void RegisterAllReduceLoopCommand(CLI::App& app, Context& ctx);  // hidden, for fault tests
void RegisterRunsCommand(CLI::App& app, Context& ctx);
void RegisterDashboardCommand(CLI::App& app, Context& ctx);

}  // namespace st::cli

// slicetrain: distributed fine-tuning of Gemma 4 models on multi-host slices, in C++.
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "comm/group.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"
#include "launch/cluster_env.h"
#include "launch/resources.h"
#include "launch/supervisor.h"
#include "launch/worker.h"

namespace st::cli {

namespace {

// The data's marker: every bundled data directory holds the default tokenizer.
bool HoldsBundledData(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "tokenizer" / "tokenizer.json", ec);
}

}  // namespace

StatusOr<std::string> FindBundledData(const std::string& flag) {
  namespace fs = std::filesystem;
  // Asked for by name: that directory or an error, never a silent fallback elsewhere.
  for (const auto& [what, dir] :
       {std::pair<std::string, std::string>{"--data-dir", flag},
        {"SLICETRAIN_DATA_DIR", launch::ReadProcessEnvironment()["SLICETRAIN_DATA_DIR"]}}) {
    if (dir.empty()) continue;
    if (!HoldsBundledData(dir))
      return NotFound(StrCat(what, " ", dir, " holds no bundled data (tokenizer/tokenizer.json)"));
    return fs::weakly_canonical(dir).string();
  }
  const fs::path exe = fs::path(launch::SelfExecutable()).parent_path();
  std::vector<fs::path> candidates = {exe / "data",  // a build tree or an unpacked archive
                                      exe / ".." / "share" / "slicetrain" / "data"};  // install
#ifdef SLICETRAIN_SOURCE_DATA_DIR
  candidates.emplace_back(SLICETRAIN_SOURCE_DATA_DIR);  // the checkout this binary was built from
#endif
  std::string looked;
  for (const fs::path& p : candidates) {
    if (HoldsBundledData(p)) return fs::weakly_canonical(p).string();
    looked += (looked.empty() ? "" : ", ") + fs::weakly_canonical(p).string();
  }
  return NotFound(StrCat("the bundled data (tokenizer, tiny_instruct) was not found; looked in ",
                         looked,
                         "; set SLICETRAIN_DATA_DIR or --data-dir to the slicetrain data "
                         "directory, or pass --dataset and --tokenizer"));
}

StatusOr<std::string> BundledDataDir(const std::string& flag, bool needed) {
  StatusOr<std::string> found = FindBundledData(flag);
  if (found.ok() || needed) return found;
  return std::string();
}

void AddDataDirOption(CLI::App* cmd, std::string* data_dir) {
  cmd->add_option("--data-dir", *data_dir,
                  "Bundled data directory (default: $SLICETRAIN_DATA_DIR, else found beside the "
                  "binary, in <prefix>/share/slicetrain/data or the source tree)");
}

Status SetProcessThreads(int flag) {
  if (flag < 0) return InvalidArgument("--threads must be >= 0 (0: derived from the CPUs)");
  int requested = flag;
  if (requested == 0) {
    ST_ASSIGN_OR_RETURN(launch::ClusterEnv env,
                        launch::DetectClusterEnv(launch::ReadProcessEnvironment()));
    requested = env.threads;
  }
  cpu::SetNumThreads(launch::ThreadsPerWorker(launch::ReadCpuBudget(), 1, requested));
  return Status::Ok();
}

HubOptions HubFromEnvironment() {
  HubOptions o = HubOptions::FromEnvironment();
  o.log = [](const std::string& line) { std::fprintf(stderr, "slicetrain: %s\n", line.c_str()); };
  // A progress bar on a terminal; in a log (not a terminal), a line every 15 s and at the end.
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  o.progress = [tty, last = std::chrono::steady_clock::time_point{}](
                   const std::string& file, int64_t done, int64_t total) mutable {
    const bool end = total >= 0 && done >= total;
    const auto now = std::chrono::steady_clock::now();
    if (!tty && !end && now - last < std::chrono::seconds(15)) return;
    last = now;
    const double mb = static_cast<double>(done) / 1e6, tmb = static_cast<double>(total) / 1e6;
    if (total > 0) {
      const int pct =
          static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
      const int filled = pct / 4;
      std::fprintf(stderr, "%sslicetrain: %s [%s%s] %3d%% %.1f/%.1f MB%s", tty ? "\r" : "",
                   file.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(25 - std::min(filled, 25)), ' ').c_str(), pct,
                   mb, tmb, tty && !end ? "" : "\n");
    } else {
      std::fprintf(stderr, "%sslicetrain: %s %.1f MB%s", tty ? "\r" : "", file.c_str(), mb,
                   tty && !end ? "" : "\n");
    }
    std::fflush(stderr);
  };
  return o;
}

void AddDatasetFieldOptions(CLI::App* cmd, std::string* instruction, std::string* context,
                            std::string* response, std::string* messages, std::string* json_field,
                            std::string* config, std::string* revision, std::string* images) {
  cmd->add_option("--dataset-config", *config,
                  "Config of a data set repository (its README `configs:`; default: its default)");
  cmd->add_option("--dataset-revision", *revision,
                  "Branch, tag or commit of a hub data set (default: main)");
  cmd->add_option("--dataset-field", *json_field,
                  "Key of the records' list in a top-level JSON object (datasets' field=)");
  cmd->add_option("--messages-field", *messages,
                  "Column of conversation turns (default: detected, messages or conversations)");
  cmd->add_option("--images-field", *images,
                  "Column of a conversation set's images, taken in order by its turns' "
                  "{\"type\": \"image\"} parts: a list (datasets' Image structs or paths "
                  "relative to the data file) or one image (default: images, then image)");
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
  // Buffers of 128 KiB and more get pages of their own and give them back when freed. glibc would
  // otherwise raise that threshold after the first large free and serve later ones from the heap,
  // which it keeps: a checkpoint's per-tensor buffers then made a worker's RSS creep epoch after
  // epoch (Memory.WorkerMemoryIsFlatAcrossEpochs).
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  // OpenBLAS's fallback kernels on a CPU model newer than Debian's OpenBLAS: once, re-executed
  // with the kernels the CPU's vector width runs (4.7x the fp32 GEMM speed on a 5th-gen Xeon).
  st::cpu::ReexecWithBlasCore(argv);
  // A dead peer's socket must fail a write with EPIPE, not end this process silently before the
  // collective names the lost rank (PeerKilled.SurvivorsReportItWithinTheTimeout/tcp); writes to
  // a closed stdout pipe fail the same way, as in Python.
  st::comm::CatchSigpipe();
  // A bad SLICETRAIN_MAX_CPU_ISA, or a -march=native build on another CPU: one line, not SIGILL
  // somewhere later.
  if (st::Status isa = st::cpu::CheckKernelIsa(); !isa.ok()) {
    std::fprintf(stderr, "slicetrain: error: %s\n", isa.message().c_str());
    return 2;
  }
  CLI::App app{"slicetrain: fine-tune Gemma 4 models over a slice of devices (CPU workers here)",
               "slicetrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "slicetrain 0.1.0");
  st::cli::Context ctx;
  st::cli::RegisterInfoCommand(app, ctx);
  st::cli::RegisterStepCommand(app, ctx);
  st::cli::RegisterFinetuneCommand(app, ctx);
  st::cli::RegisterEvaluateCommand(app, ctx);
  st::cli::RegisterGenerateCommand(app, ctx);
  st::cli::RegisterExportCommand(app, ctx);
  st::cli::RegisterTokenizeCommand(app, ctx);
  st::cli::RegisterImagesCommand(app, ctx);
  st::cli::RegisterDownloadCommand(app, ctx);
  st::cli::RegisterLaunchCommand(app, ctx);
  st::cli::RegisterCollectivesCommand(app, ctx);
  st::cli::RegisterAllReduceLoopCommand(app, ctx);
  st::cli::RegisterRunsCommand(app, ctx);
  st::cli::RegisterDashboardCommand(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const std::bad_alloc& e) {
    // A buffer the machine could not give (st::OutOfMemory names it): a user-facing resource
    // error, one line and exit 1, never an abort (docs/errors.md).
    const std::string command = argc > 1 && argv[1][0] != '-' ? argv[1] : "";
    const bool named = dynamic_cast<const st::OutOfMemory*>(&e) != nullptr;
    std::fprintf(stderr,
                 "slicetrain%s%s: error: %s; this process cannot get that much memory (%s): run "
                 "fewer workers on this host, a smaller --batch-size-per-device or "
                 "--max-seq-len, or a smaller model (see docs/errors.md)\n",
                 command.empty() ? "" : " ", command.c_str(),
                 named ? e.what() : "out of memory (std::bad_alloc)",
                 st::launch::DescribeAvailableMemory().c_str());
    return 1;
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

// `slicetrain finetune`: the seed's ray_train_llm_finetune.py. Fully sharded fine-tuning of a
// Gemma 4 causal LM on an instruction data set over every worker of the slice. Run without
// `launch`, it spawns the whole slice as local CPU workers; under `launch` (or any launcher that
// sets RANK/WORLD_SIZE/...) each process is one rank.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "data/hub_dataset.h"
#include "io/files.h"
#include "io/gguf.h"
#include "io/model_loader.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"
#include "launch/cluster_env.h"
#include "launch/resources.h"
#include "launch/topology.h"
#include "launch/worker.h"
#include "model/gemma4.h"
#include "model/params.h"
#include "model/vision/image_encoder.h"
#include "model/vision/vision_tower.h"
#include "observe/dashboard.h"
#include "observe/plot.h"
#include "observe/recorder.h"
#include "train/checkpoint.h"
#include "train/memory_estimate.h"
#include "train/objectives/grpo_step.h"
#include "train/trainable.h"
#include "train/trainer.h"

namespace st::cli {

namespace {

struct FinetuneArgs {
  FinetuneOptions o;
  int num_workers = 0;  // 0 = the topology's
  int timeout_ms = 120000;
  bool timeout_given = false;  // --timeout-ms on the command line: it wins over the launcher's
  int max_failures = 0;        // restarts of the worker group from the latest checkpoint
  // Rank 0's dashboard (docs/observe.md).
  std::string dashboard_host = "127.0.0.1";
  int dashboard_port = 8265;  // 0: any free port
  bool no_dashboard = false;
  std::string report_to = "tensorboard";  // tensorboard | none (metrics.jsonl is always written)
  double dashboard_linger_s = 0;          // after the run, serve until idle this long
  int threads = 0;       // compute threads per local worker; 0 = OMP_NUM_THREADS, else derived
  bool dry_run = false;  // print the memory plan and exit
};

std::vector<std::string> WorkerCommand(const FinetuneArgs& a) {
  const FinetuneOptions& o = a.o;
  auto s = [](auto v) { return std::to_string(v); };
  char lr[32], wd[32], clip[32];
  std::snprintf(lr, sizeof(lr), "%.17g", o.lr);
  std::snprintf(wd, sizeof(wd), "%.17g", o.weight_decay);
  std::snprintf(clip, sizeof(clip), "%.17g", o.max_grad_norm);
  auto Num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  std::vector<std::string> cmd = {"finetune",
                                  "--model-id",
                                  o.model_id,
                                  "--tokenizer",
                                  o.tokenizer,
                                  "--dataset",
                                  o.dataset,
                                  "--dataset-split",
                                  o.dataset_split,
                                  "--instruction-field",
                                  o.instruction_field,
                                  "--context-field",
                                  o.context_field,
                                  "--response-field",
                                  o.response_field,
                                  "--dataset-config",
                                  o.dataset_config,
                                  "--dataset-field",
                                  o.dataset_field,
                                  "--messages-field",
                                  o.messages_field,
                                  "--images-field",
                                  o.images_field,
                                  "--num-epochs",
                                  s(o.num_epochs),
                                  "--batch-size-per-device",
                                  s(o.batch_size_per_device),
                                  "--max-seq-len",
                                  s(o.max_seq_len),
                                  "--gradient-accumulation-steps",
                                  s(o.gradient_accumulation_steps),
                                  "--lr-scheduler",
                                  o.lr_scheduler,
                                  "--warmup-steps",
                                  s(o.warmup_steps),
                                  "--warmup-ratio",
                                  Num(o.warmup_ratio),
                                  "--min-lr-ratio",
                                  Num(o.min_lr_ratio),
                                  "--decay-steps",
                                  s(o.decay_steps),
                                  "--max-steps",
                                  s(o.max_steps),
                                  "--eval-split",
                                  o.eval_split,
                                  "--eval-dataset",
                                  o.eval_dataset,
                                  "--eval-steps",
                                  s(o.eval_steps),
                                  "--early-stopping-patience",
                                  s(o.early_stopping_patience),
                                  "--sample-prompts",
                                  o.sample_prompts,
                                  "--sample-max-new-tokens",
                                  s(o.sample_max_new_tokens),
                                  "--template",
                                  o.chat_template,
                                  "--train-on",
                                  o.train_on,
                                  "--padding",
                                  o.padding,
                                  "--topology",
                                  o.topology,
                                  "--accelerator-type",
                                  o.accelerator_type,
                                  "--storage-path",
                                  o.storage_path,
                                  "--run-name",
                                  o.run_name,
                                  "--lr",
                                  lr,
                                  "--weight-decay",
                                  wd,
                                  "--max-grad-norm",
                                  clip,
                                  "--seed",
                                  s(o.seed),
                                  "--num-to-keep",
                                  s(o.num_to_keep),
                                  "--save-steps",
                                  s(o.save_steps),
                                  "--fsdp-units",
                                  o.fsdp_units,
                                  "--activation-checkpointing",
                                  o.activation_checkpointing,
                                  "--precision",
                                  o.precision,
                                  "--objective",
                                  o.objective,
                                  "--beta",
                                  Num(o.beta),
                                  "--loss-type",
                                  o.loss_type,
                                  "--label-smoothing",
                                  Num(o.label_smoothing),
                                  "--freeze",
                                  o.freeze,
                                  "--lora-rank",
                                  s(o.lora_rank),
                                  "--lora-alpha",
                                  Num(o.lora_alpha),
                                  "--lora-dropout",
                                  Num(o.lora_dropout),
                                  "--lora-target-modules",
                                  o.lora_target_modules,
                                  "--modules-to-save",
                                  o.modules_to_save,
                                  "--save-dtype",
                                  o.save_dtype,
                                  "--max-shard-size",
                                  o.max_shard_size,
                                  "--data-dir",
                                  o.data_dir,
                                  "--checkpoint-score-attribute",
                                  o.score_attribute,
                                  "--checkpoint-score-order",
                                  o.score_order,
                                  "--progress",
                                  o.progress,
                                  "--timeout-ms",
                                  s(a.timeout_ms)};
  if (o.resume) cmd.push_back("--resume");
  if (o.use_rslora) cmd.push_back("--use-rslora");
  if (o.precompute_ref_log_probs) cmd.push_back("--precompute-ref-log-probs");
  cmd.insert(cmd.end(), {"--num-generations",
                         s(o.num_generations),
                         "--max-completion-length",
                         s(o.max_completion_length),
                         "--temperature",
                         Num(o.temperature),
                         "--top-p",
                         Num(o.top_p),
                         "--top-k",
                         s(o.top_k),
                         "--epsilon",
                         Num(o.epsilon),
                         "--epsilon-high",
                         Num(o.epsilon_high),
                         "--scale-rewards",
                         o.scale_rewards,
                         "--num-iterations",
                         s(o.num_iterations),
                         "--reward-timeout",
                         Num(o.reward_timeout),
                         "--log-completions",
                         s(o.log_completions),
                         "--max-turns",
                         s(o.max_turns)});
  if (!o.environment_command.empty())
    cmd.insert(cmd.end(), {"--environment-command", o.environment_command});
  if (!o.tools_file.empty()) cmd.insert(cmd.end(), {"--tools", o.tools_file});
  if (o.mask_truncated_completions) cmd.push_back("--mask-truncated-completions");
  for (const std::string& r : o.rewards) cmd.insert(cmd.end(), {"--reward", r});
  for (const std::string& r : o.reward_commands) cmd.insert(cmd.end(), {"--reward-command", r});
  for (double w : o.reward_weights) cmd.insert(cmd.end(), {"--reward-weights", Num(w)});
  cmd.push_back("--packing=" + o.packing);
  if (o.group_by_length) cmd.push_back("--group-by-length");
  if (o.sync_each_batch) cmd.push_back("--sync-each-batch");
  char linger[32];
  std::snprintf(linger, sizeof(linger), "%.17g", a.dashboard_linger_s);
  cmd.insert(cmd.end(), {"--dashboard-host", a.dashboard_host, "--dashboard-port",
                         s(a.dashboard_port), "--dashboard-linger", linger});
  if (a.no_dashboard) cmd.push_back("--no-dashboard");
  cmd.insert(cmd.end(), {"--report-to", a.report_to});
  return cmd;
}

// --report-to: a comma-separated list of tensorboard, jsonl:PATH and none (alone).
struct ReportTo {
  bool tensorboard = false;
  std::string jsonl;  // "" = none
};
StatusOr<ReportTo> ParseReportTo(const std::string& flag) {
  ReportTo r;
  if (flag == "none") return r;
  size_t start = 0;
  while (start <= flag.size()) {
    const size_t comma = std::min(flag.find(',', start), flag.size());
    const std::string item = flag.substr(start, comma - start);
    if (item == "tensorboard") {
      r.tensorboard = true;
    } else if (item.rfind("jsonl:", 0) == 0 && item.size() > 6 && r.jsonl.empty()) {
      r.jsonl = item.substr(6);
    } else {
      return InvalidArgument(
          "--report-to takes tensorboard, jsonl:PATH (one), both as "
          "'tensorboard,jsonl:PATH', or none; got '" +
          flag + "'");
    }
    start = comma + 1;
  }
  return r;
}

// Rank 0: the run with its recorder (metrics.jsonl, run.json), the dashboard when asked for (a
// port that cannot be bound costs a warning, not the run) and the plot at the end.
Status RunRankZero(const FinetuneArgs& a, launch::Worker& worker) {
  observe::RunRecorder recorder;
  ST_ASSIGN_OR_RETURN(const ReportTo report, ParseReportTo(a.report_to));
  recorder.EnableTensorBoard(report.tensorboard);
  if (!report.jsonl.empty())
    ST_RETURN_IF_ERROR(recorder.AddJsonlSink(report.jsonl).WithContext("--report-to"));
  std::unique_ptr<observe::Dashboard> dashboard;
  if (!a.no_dashboard) {
    observe::DashboardOptions d;
    d.host = a.dashboard_host;
    d.port = a.dashboard_port;
    d.storage_path = a.o.storage_path.empty() ? "runs" : a.o.storage_path;
    d.token = observe::DashboardToken(
        d.host, launch::ReadProcessEnvironment()["SLICETRAIN_DASHBOARD_TOKEN"]);
    auto started = observe::Dashboard::Start(d, &recorder);
    if (started.ok()) {
      dashboard = std::move(*started);
      recorder.SetDashboardUrl(dashboard->url());  // run.json: never the token
      std::printf("Dashboard: %s\n", dashboard->login_url().c_str());
    } else {
      std::fprintf(stderr, "slicetrain finetune: warning: %s; training goes on without it\n",
                   started.status().message().c_str());
    }
    std::fflush(stdout);
  }
  const Status trained = RunFinetune(a.o, worker.world(), worker.collective(), &recorder);
  recorder.Finish(trained);
  if (recorder.started()) {
    auto plot = observe::WriteTrainingCurves(recorder.run_dir(), recorder.run_name());
    if (plot.ok()) {
      std::string paths;
      for (const std::string& p : *plot) paths += (paths.empty() ? "" : ", ") + p;
      std::printf("Training curves: %s\nMetrics: %s/metrics.jsonl\n", paths.c_str(),
                  recorder.run_dir().c_str());
    } else {
      std::fprintf(stderr, "slicetrain finetune: warning: %s\n", plot.status().message().c_str());
    }
    std::fflush(stdout);
  }
  const Status left = worker.Shutdown(trained.ok());
  if (dashboard && a.dashboard_linger_s > 0) {
    std::printf("Dashboard stays at %s until nobody has asked for %g s\n", dashboard->url().c_str(),
                a.dashboard_linger_s);
    std::fflush(stdout);
    dashboard->WaitUntilIdle(a.dashboard_linger_s);
  }
  return trained.ok() ? left : trained;
}

// What the driver prints before restarting the group: what failed and where the run resumes.
std::string RestartLine(int attempt, int max_failures, const launch::SupervisorResult& failure,
                        const std::string& run_dir) {
  std::string line = StrCat("Worker group failed: ", failure.message);
  if (!failure.peer_report.empty()) line += StrCat("; ", failure.peer_report);
  const std::vector<CheckpointEntry> ckpts = ListCheckpoints(run_dir);
  line += StrCat("\nRestarting the workers (restart ", attempt, " of --max-failures ", max_failures,
                 ") ",
                 ckpts.empty() ? std::string("from the beginning: no checkpoint yet")
                               : StrCat("from the latest good checkpoint of ", run_dir,
                                        " (newest: epoch ", ckpts.front().epoch, ")"));
  return line;
}

Status Run(FinetuneArgs& a, int* exit_code) {
  ST_ASSIGN_OR_RETURN(launch::Topology topo,
                      launch::ResolveTopology(a.o.accelerator_type, a.o.topology));
  if (a.num_workers != 0 && a.num_workers != topo.world_size())
    return InvalidArgument(
        StrCat("--num-workers ", a.num_workers, " contradicts ", topo.ToString()));
  if (a.o.storage_path.empty()) {
    const char* env = std::getenv("STORAGE_PATH");
    a.o.storage_path = env ? env : "runs";
  }
  if (a.o.resume && a.o.run_name.empty())
    return InvalidArgument("--resume needs --run-name: the name of the run to continue");
  if (a.max_failures < 0) return InvalidArgument("--max-failures must be >= 0");
  if (a.threads < 0) return InvalidArgument("--threads must be >= 0 (0: derived from the CPUs)");
  ST_ASSIGN_OR_RETURN(launch::ClusterEnv env,
                      launch::DetectClusterEnv(launch::ReadProcessEnvironment()));
  if (a.o.run_name.empty()) {
    // Every rank, and every restart of a launched job, must agree on the name: under a launcher
    // it comes from the job's secret (shared by all hosts, never shown), else from the clock.
    a.o.run_name = env.is_worker() && !env.secret.empty()
                       ? StrCat("slicetrain_gemma4_fsdp_sft_", HashText(env.secret).substr(0, 12))
                       : StrCat("slicetrain_gemma4_fsdp_sft_", std::time(nullptr));
  }
  // A restarted group continues from the run's latest good checkpoint, or starts over if the
  // first attempt failed before writing one.
  if (env.restart_attempt > 0) a.o.resume_if_any = true;
  ST_RETURN_IF_ERROR(ValidateFinetuneOptions(a.o));
  {
    // A sink rank 0 could not open would fail the run after the workers started: try it here.
    ST_ASSIGN_OR_RETURN(const ReportTo report, ParseReportTo(a.report_to));
    if (!report.jsonl.empty() && !std::ofstream(report.jsonl, std::ios::app).is_open())
      return IoError(StrCat("--report-to jsonl:", report.jsonl,
                            ": cannot open for appending: ", std::strerror(errno)));
  }
  ST_ASSIGN_OR_RETURN(a.o.model_id, ResolveModelSource(a.o.model_id, HubFromEnvironment()));
  {
    // A hub data set id becomes its local snapshot here, before any worker starts: the launcher
    // downloads once and the workers read the cache.
    ST_ASSIGN_OR_RETURN(DatasetSource src,
                        ResolveDatasetSource(a.o.dataset, a.o.dataset_config, a.o.dataset_revision,
                                             a.o.dataset_split, HubFromEnvironment()));
    a.o.dataset = src.path, a.o.dataset_split = src.split, a.o.dataset_config = src.config;
    if (!a.o.eval_dataset.empty()) {
      ST_ASSIGN_OR_RETURN(
          DatasetSource eval,
          ResolveDatasetSource(a.o.eval_dataset, a.o.dataset_config, a.o.dataset_revision,
                               a.o.eval_split, HubFromEnvironment()));
      a.o.eval_dataset = eval.path, a.o.eval_split = eval.split;
    }
  }
  {
    // The bundled data is needed for the default data set, and for the tokenizer of a preset.
    std::error_code ec;
    const bool needed = a.o.dataset.empty() ||
                        (a.o.tokenizer.empty() && !std::filesystem::is_directory(a.o.model_id, ec));
    ST_ASSIGN_OR_RETURN(a.o.data_dir, BundledDataDir(a.o.data_dir, needed));
    if (std::filesystem::is_regular_file(a.o.model_id, ec) && IsGgufFile(a.o.model_id))
      return InvalidArgument(StrCat(
          "--model-id ", a.o.model_id,
          " is a GGUF file: generate, chat and evaluate read GGUF models, finetune does not; "
          "fine-tune the Hugging Face model (or a slicetrain checkpoint) it was made from"));
    // A --tokenizer that is not there: one line now, not one per worker after the setup lines.
    if (!a.o.tokenizer.empty() && !std::filesystem::exists(a.o.tokenizer, ec))
      return NotFound(
          StrCat("--tokenizer ", a.o.tokenizer,
                 ": no such file or directory (pass tokenizer.json, a directory holding "
                 "it, or a GGUF file)"));
  }
  std::string precision_note;  // why auto chose fp32, printed once the job is accepted
  {
    // The memory plan: --activation-checkpointing auto resolved to the least recomputation that
    // fits, and a job whose local workers cannot fit in this host's memory refused here, before
    // any worker allocates, with what would make it fit (not killed by the kernel halfway). A
    // config that does not load is the workers' to report.
    std::error_code ec;
    const bool from_dir = std::filesystem::is_directory(a.o.model_id, ec);
    StatusOr<Gemma4Config> cfg =
        from_dir ? LoadGemma4Config(a.o.model_id + "/config.json") : PresetConfig(a.o.model_id);
    if (a.o.activation_checkpointing != "auto")
      ST_RETURN_IF_ERROR(ParseActivationCheckpointing(a.o.activation_checkpointing).status());
    // auto becomes bf16 or fp32 here, once, so that the workers (started with the resolved
    // value) and a launcher's ranks on other hosts never disagree on what they compute in.
    {
      std::string why;
      ST_ASSIGN_OR_RETURN(const Precision p, cpu::ResolvePrecision(a.o.precision, &why));
      // Printed once every check has passed: a refused job prints its error line alone.
      if (a.o.precision == "auto" && p == Precision::kFp32 && (!env.is_worker() || env.rank == 0))
        precision_note =
            StrCat("Precision: fp32 (", why,
                   cpu::HasNativeBf16Gemm() ? ")\n" : "; bf16 would be emulated and slower)\n");
      a.o.precision = PrecisionName(p);
    }
    if (!cfg.ok() && a.dry_run) return cfg.status();
    if (cfg.ok()) {
      ParamRegistry registry = BuildParamRegistry(*cfg);
      if (const std::optional<PeftAdapterConfig> adapter = AdapterConfigOf(a.o)) {
        ST_ASSIGN_OR_RETURN(const LoraSpec spec, LoraSpecFor(*cfg, registry, *adapter,
                                                             vision::LoraModulesOf(a.o.model_id)));
        AddLoraAdapters(&registry, spec);
      }
      ST_ASSIGN_OR_RETURN(const Trainable trainable, TrainableTensors(registry, a.o.freeze));
      const int local = env.is_worker() ? env.local_world_size : topo.world_size();
      const size_t available = launch::AvailableMemoryBytes();
      WorkerShape shape;
      shape.generated_weights = !from_dir;  // a preset
      shape.world = topo.world_size();
      shape.batch = a.o.batch_size_per_device;
      shape.seq = a.o.objective == "sft" ? a.o.max_seq_len : 2 * a.o.max_seq_len;  // pairs
      if (a.o.objective == "grpo") {  // a completion a row; the sampler beside the trainer
        shape.seq = a.o.max_seq_len + a.o.max_completion_length;
        const Precision p = *cpu::ResolvePrecision(a.o.precision);
        shape.rollout_bytes = GrpoSamplerBytes(
            *cfg, registry, trainable.mask, a.o.max_seq_len, a.o.max_completion_length,
            a.o.batch_size_per_device * a.o.gradient_accumulation_steps, a.o.num_generations, p);
        shape.reference_shards = GrpoKeepsReferenceShards(a.o);
      }
      if (from_dir && a.o.objective == "sft") {  // a multimodal model on an image set
        StatusOr<std::unique_ptr<vision::ImageEncoder>> encoder =
            vision::ImageEncoder::Load(a.o.model_id);
        if (encoder.ok()) {
          ST_ASSIGN_OR_RETURN(const vision::TowerParameters parts,
                              vision::CountTowerParameters(a.o.model_id));
          int64_t lora_values = 0;
          if (const std::optional<PeftAdapterConfig> adapter = AdapterConfigOf(a.o)) {
            ST_ASSIGN_OR_RETURN(const vision::VisionTower::AdaptedParts adapted,
                                vision::VisionTower::PartsOf((*encoder)->config(), adapter->targets,
                                                             adapter->modules_to_save));
            lora_values =
                vision::VisionTower::LoraValues((*encoder)->config(), adapted.slots, adapter->r);
            // The projection trained in full (modules_to_save) trains the tower's outputs too.
            if (adapted.projection) lora_values += parts.vision_projection;
          }
          shape.vision_bytes = vision::TowerWorkingBytes(
              **encoder, parts, lora_values, a.o.batch_size_per_device * a.o.max_seq_len);
        } else if (encoder.status().code() != StatusCode::kNotFound) {
          return encoder.status();
        }
      }
      shape.layer_units = a.o.fsdp_units == "layer";
      shape.accumulation = a.o.sync_each_batch ? 1 : a.o.gradient_accumulation_steps;
      shape.threads = a.threads > 0     ? a.threads
                      : env.threads > 0 ? env.threads
                                        : std::max(1, cpu::NumThreads() / std::max(1, local));
      if (a.o.activation_checkpointing == "auto")
        a.o.activation_checkpointing = ActivationCheckpointingName(
            ChooseCheckpointing(*cfg, registry, trainable.mask, shape, local, available));
      shape.checkpointing = *ParseActivationCheckpointing(a.o.activation_checkpointing);
      shape.precision = *cpu::ResolvePrecision(a.o.precision);  // resolved above
      const WorkerMemoryEstimate estimate =
          EstimateWorkerMemory(*cfg, registry, trainable.mask, shape);
      if (a.dry_run) {
        // The frozen tensors a checkpoint leaves in its mapped files (headers only: nothing read).
        double mapped = 0;
        if (from_dir) {
          ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(a.o.model_id, 42, false));
          mapped = MappedFrozenBytes(*m.weights, registry, trainable.mask);
        }
        std::fputs(precision_note.c_str(), stdout);
        precision_note.clear();
        std::printf("slicetrain finetune --dry-run: %s, %d worker(s), %d on this host\n%s",
                    a.o.model_id.c_str(), topo.world_size(), local,
                    FormatMemoryPlan(estimate, shape, local, mapped, available).c_str());
        std::fflush(stdout);
      }
      if (a.dry_run || !env.is_worker() || env.local_rank == 0) {
        EngineOptions engine;
        engine.checkpointing = shape.checkpointing;
        engine.precision = shape.precision;
        engine.lora = LoraSpecOf(registry);
        ST_RETURN_IF_ERROR(CheckActivationMemory(*cfg, shape.batch, shape.seq, engine));
        ST_RETURN_IF_ERROR(CheckHostMemory(estimate, local, available, a.o.model_id));
      }
      if (a.dry_run) return Status::Ok();
    }
  }
  if (a.o.progress == "auto") a.o.progress = isatty(STDOUT_FILENO) ? "bar" : "lines";
  if (a.o.progress != "bar" && a.o.progress != "lines" && a.o.progress != "off")
    return InvalidArgument("--progress must be auto, bar, lines or off, got '" + a.o.progress +
                           "'");
  if (a.dashboard_port < 0 || a.dashboard_port > 65535 || a.dashboard_linger_s < 0)
    return InvalidArgument("--dashboard-port must be 0..65535 and --dashboard-linger >= 0");
  std::fputs(precision_note.c_str(), stdout);
  std::fflush(stdout);
  if (!env.is_worker()) {
    launch::LocalSliceOptions lo;
    lo.collective_timeout_ms = a.timeout_ms;
    lo.max_failures = a.max_failures;
    lo.threads = a.threads > 0 ? a.threads : env.threads;
    lo.on_restart = [&a](int attempt, const launch::SupervisorResult& failure) {
      std::printf("%s\n",
                  RestartLine(attempt, a.max_failures, failure,
                              (std::filesystem::path(a.o.storage_path) / a.o.run_name).string())
                      .c_str());
      std::fflush(stdout);
    };
    return launch::RunLocalSlice(topo, WorkerCommand(a), lo, exit_code);
  }
  ST_RETURN_IF_ERROR(launch::CheckAgainstTopology(env, topo));
  if (env.rank == 0 && env.restart_attempt == 0) {
    std::printf(
        "Starting slicetrain FSDP %s job: model=%s, topology=%s, accelerator_type=%s, "
        "num_workers=%d\n",
        a.o.objective == "dpo"    ? "DPO"
        : a.o.objective == "orpo" ? "ORPO"
        : a.o.objective == "grpo" ? "GRPO"
                                  : "SFT",
        a.o.model_id.c_str(), topo.shape.c_str(), topo.accelerator_type.c_str(), topo.world_size());
    std::fflush(stdout);
  }
  // Under `launch` (or torchrun-style spawners) the collective timeout comes from
  // SLICETRAIN_TIMEOUT_MS unless the worker command names its own.
  if (a.timeout_given) env.collective_timeout_ms = a.timeout_ms;
  ST_ASSIGN_OR_RETURN(auto worker, launch::Worker::Init(env));
  if (worker->rank() != 0) {
    ST_RETURN_IF_ERROR(RunFinetune(a.o, worker->world(), worker->collective()));
    return worker->Shutdown();
  }
  return RunRankZero(a, *worker);
}

}  // namespace

void RegisterFinetuneCommand(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<FinetuneArgs>();
  FinetuneOptions& o = a->o;
  auto* cmd = app.add_subcommand(
      "finetune", "Fully sharded (FSDP) fine-tuning of a Gemma 4 causal LM (the seed's job 2)");
  cmd->add_option("--model-id", o.model_id,
                  "Preset (gemma4-tiny, gemma4-small) or local HF model directory")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json, a directory, or a GGUF file's vocabulary (default: the model's, "
                  "else the bundled one)");
  cmd->add_option("--dataset", o.dataset,
                  "Instruction data set: a hub data set id (org/name), a .jsonl/.json/.csv/"
                  ".tsv/.parquet file or glob, or a data set directory (default: bundled)");
  cmd->add_option("--dataset-split", o.dataset_split,
                  "HF split syntax: train, train[:1024], train[:10%]...")
      ->capture_default_str();
  AddDatasetFieldOptions(cmd, &o.instruction_field, &o.context_field, &o.response_field,
                         &o.messages_field, &o.dataset_field, &o.dataset_config,
                         &o.dataset_revision, &o.images_field);
  cmd->add_option("--num-epochs", o.num_epochs, "Epochs")->capture_default_str();
  cmd->add_option("--batch-size-per-device", o.batch_size_per_device,
                  "Sequences per worker per step")
      ->capture_default_str();
  cmd->add_option("--max-seq-len", o.max_seq_len,
                  "Tokens per row: longer examples are truncated (or split: --packing split); "
                  "the seed uses 512")
      ->capture_default_str();
  cmd->add_option("--gradient-accumulation-steps", o.gradient_accumulation_steps,
                  "Micro-batches of --batch-size-per-device per optimizer step (one update as "
                  "from a batch this many times larger)")
      ->capture_default_str();
  cmd->add_flag("--sync-each-batch", o.sync_each_batch,
                "With --gradient-accumulation-steps: reduce-scatter every micro-batch's gradients "
                "into the shards instead of keeping each unit's unsharded fp32 gradient until the "
                "last one (as Accelerate's sync_each_batch: 1/workers of that memory, one "
                "reduce-scatter per micro-batch)");
  cmd->add_option("--lr-scheduler", o.lr_scheduler,
                  "Learning-rate schedule, as transformers' get_scheduler: constant, "
                  "constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial, wsd")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", o.warmup_steps,
                  "Linear warm-up steps (optimizer steps; 0: --warmup-ratio)")
      ->capture_default_str();
  cmd->add_option("--warmup-ratio", o.warmup_ratio,
                  "Warm-up as a fraction of the run's optimizer steps (rounded up)")
      ->capture_default_str();
  cmd->add_option("--min-lr-ratio", o.min_lr_ratio,
                  "Floor of cosine, polynomial and wsd as a fraction of --lr")
      ->capture_default_str();
  cmd->add_option("--decay-steps", o.decay_steps,
                  "wsd: steps of the final decay (0: a tenth of the run)")
      ->capture_default_str();
  cmd->add_option("--max-steps", o.max_steps,
                  "Stop after this many optimizer steps (overrides --num-epochs; 0: off)")
      ->capture_default_str();
  cmd->add_option("--eval-split", o.eval_split,
                  "Held-out split evaluated at every epoch's end (and --eval-steps): HF split "
                  "syntax over --eval-dataset, e.g. 'train[-5%:]' (it must not overlap "
                  "--dataset-split on the same data set)");
  cmd->add_option("--eval-dataset", o.eval_dataset,
                  "Data set of --eval-split (default: --dataset's): hub id, file, glob or "
                  "directory");
  cmd->add_option("--eval-steps", o.eval_steps, "Also evaluate every N optimizer steps (0: off)")
      ->capture_default_str();
  cmd->add_option("--early-stopping-patience", o.early_stopping_patience,
                  "Stop after this many evaluations without a lower eval_loss (0: off)")
      ->capture_default_str();
  cmd->add_option("--sample-prompts", o.sample_prompts,
                  "Prompts (one per line, or JSON lines with \"prompt\") that each epoch's "
                  "checkpoint answers greedily; printed and stored in metrics.jsonl");
  cmd->add_option("--sample-max-new-tokens", o.sample_max_new_tokens,
                  "Tokens each --sample-prompts answer may have")
      ->capture_default_str();
  cmd->add_option("--template", o.chat_template,
                  "How records become text: auto (gemma-chat when the tokenizer has Gemma 4's "
                  "<|turn> tokens, else instruction), instruction, gemma-chat, none")
      ->capture_default_str();
  cmd->add_option("--train-on", o.train_on,
                  "Tokens the loss covers: auto (responses with gemma-chat, else all), "
                  "responses (the model's turns), all")
      ->capture_default_str();
  cmd->add_option("--packing", o.packing,
                  "Examples packed into rows of --max-seq-len tokens, each with its own "
                  "attention and positions: truncate (longer examples cut), split (cut into "
                  "pieces), off (one example per row, padded as --padding says)")
      ->expected(0, 1)
      ->default_str("truncate")
      ->capture_default_str();
  cmd->add_option("--padding", o.padding,
                  "With --packing off: longest (each batch padded to its longest example, a "
                  "multiple of 8) or max_length (every row padded to --max-seq-len, the seed's)")
      ->capture_default_str();
  cmd->add_flag("--group-by-length", o.group_by_length,
                "With --packing off: batches of examples of similar length (transformers' "
                "group_by_length)");
  cmd->add_option("--num-workers", a->num_workers,
                  "Total workers (must match the topology; 0 = the topology's)");
  cmd->add_option("--topology", o.topology, "Slice shape (CPU: D or HxD; TPU-V6E: 4x4 ...)")
      ->capture_default_str();
  cmd->add_option("--accelerator-type", o.accelerator_type, "CPU, TPU-V6E, TPU-V7X, GPU-<name>")
      ->capture_default_str();
  cmd->add_option("--storage-path", o.storage_path,
                  "Where runs and checkpoints go (default: $STORAGE_PATH, else ./runs)");
  cmd->add_option("--run-name", o.run_name,
                  "Run directory name (default: slicetrain_gemma4_fsdp_sft_<time>)");
  cmd->add_option(
      "--lr", o.lr,
      "AdamW learning rate (default: 2e-5 for a checkpoint, 1e-3 for a preset from scratch)");
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  cmd->add_option("--max-grad-norm", o.max_grad_norm,
                  "Clip gradients to this global norm (0 = off)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the preset's initialisation and the data order")
      ->capture_default_str();
  cmd->add_option("--num-to-keep", o.num_to_keep, "Checkpoints kept (best by loss)")
      ->capture_default_str();
  cmd->add_option("--save-steps", o.save_steps,
                  "Also checkpoint every N steps inside an epoch, so that a restart redoes at most "
                  "N steps (0 = at epoch ends only; HF's save_steps)")
      ->capture_default_str();
  cmd->add_option("--fsdp-units", o.fsdp_units,
                  "mlp (each layer's MLP is a unit, as the seed) or layer")
      ->capture_default_str();
  cmd->add_option("--activation-checkpointing", o.activation_checkpointing,
                  "auto, none, mlp or layer: activations the backward recomputes instead of "
                  "keeping (mlp: each MLP's intermediates; layer: all but each layer's input). "
                  "auto: the least recomputation the memory plan fits on this host")
      ->capture_default_str();
  cmd->add_option("--precision", o.precision,
                  "auto, bf16 or fp32: the operands of every matmul (bf16: rounded to bf16, "
                  "accumulated in fp32; master weights, optimizer, norms and loss stay fp32). "
                  "auto: bf16 where its products are the faster (AMX-BF16, AMD's AVX512_BF16)")
      ->capture_default_str();
  auto* pref = cmd->add_option_group(
      "Preference objective", "DPO and ORPO on prompt/chosen/rejected data, as TRL's DPOConfig");
  pref->add_option("--objective", o.objective,
                   "sft (the mean token loss), dpo (with --lora-rank the reference is the base "
                   "with the adapters off; full fine-tuning precomputes the reference's "
                   "log-probs), orpo (no reference) or grpo (online RL from rewards); dpo/orpo "
                   "read preference data: prompt/chosen/rejected as text or conversations, or "
                   "implicit prompts; grpo reads prompt-only data")
      ->capture_default_str();
  pref->add_option("--beta", o.beta,
                   "DPO's beta (IPO's tau): how far the policy may move from the reference; "
                   "ORPO's lambda: the weight of the odds-ratio term; GRPO's KL coefficient "
                   "(default 0.1 for DPO and ORPO, 0 for GRPO, as TRL)");
  pref->add_option("--loss-type", o.loss_type,
                   "DPO's loss: sigmoid (default), hinge, ipo or robust; GRPO's: dapo (default), "
                   "grpo, bnpo or dr_grpo");
  pref->add_flag("--precompute-ref-log-probs", o.precompute_ref_log_probs,
                 "DPO: the reference's log-probs of every pair computed once before training and "
                 "stored with the run (always so for full fine-tuning, which keeps no second "
                 "model), instead of a reference forward every step");
  pref->add_option("--label-smoothing", o.label_smoothing,
                   "robust DPO: the probability that a pair's preference is flipped, in [0, 0.5)")
      ->capture_default_str();
  auto* grpo = cmd->add_option_group(
      "Online RL (--objective grpo)",
      "GRPO on prompt-only data, as TRL's GRPOConfig: completions sampled from the policy, "
      "scored by reward functions, trained on their group advantages");
  grpo->add_option("--num-generations", o.num_generations,
                   "Completions per prompt (G); --batch-size-per-device counts completions and "
                   "must be a multiple of it")
      ->capture_default_str();
  grpo->add_option("--max-completion-length", o.max_completion_length,
                   "The most tokens a completion may have (longer ones are cut and counted in "
                   "completions/clipped_ratio); --max-seq-len bounds the prompts")
      ->capture_default_str();
  grpo->add_option("--temperature", o.temperature, "Sampling temperature (> 0)")
      ->capture_default_str();
  grpo->add_option("--top-p", o.top_p, "Nucleus sampling (1 = off)")->capture_default_str();
  grpo->add_option("--top-k", o.top_k, "Top-k sampling (0 = off)")->capture_default_str();
  grpo->add_option("--epsilon", o.epsilon,
                   "Clipping: the probability ratio to the round's policy within "
                   "[1 - epsilon, 1 + epsilon-high]")
      ->capture_default_str();
  grpo->add_option("--epsilon-high", o.epsilon_high,
                   "The upper clipping bound (DAPO's clip-higher); default --epsilon");
  grpo->add_option("--scale-rewards", o.scale_rewards,
                   "Advantages divided by the std of the group's rewards (group), of the whole "
                   "batch's (batch), or not (none)")
      ->capture_default_str();
  grpo->add_option("--num-iterations", o.num_iterations,
                   "Optimizer steps per generation round (TRL's num_iterations, mu)")
      ->capture_default_str();
  grpo->add_flag("--mask-truncated-completions", o.mask_truncated_completions,
                 "Leave completions cut at --max-completion-length out of the loss");
  grpo->add_option("--reward", o.rewards,
                   "A built-in reward (repeatable): exact:COLUMN (1 when the completion equals "
                   "the row's COLUMN), numeric:COLUMN (its last number equals COLUMN's), "
                   "regex:PATTERN (the whole completion matches), overlong:MAX:CACHE (TRL's soft "
                   "overlong punishment)");
  grpo->add_option("--reward-command", o.reward_commands,
                   "A reward program (repeatable), started once per worker by /bin/sh: one JSON "
                   "object per line on stdin (prompt, completion, completion_ids and the row's "
                   "other columns), one number per line on stdout (null: no reward)");
  grpo->add_option("--reward-weights", o.reward_weights,
                   "One weight per reward function: the --reward ones first, then the "
                   "--reward-command ones (default 1 each)");
  grpo->add_option("--reward-timeout", o.reward_timeout,
                   "Seconds a reward program may take for one answer before the run stops")
      ->capture_default_str();
  grpo->add_option("--environment-command", o.environment_command,
                   "Multi-turn episodes: a program (JSON lines, as a reward program) answering "
                   "each finished model turn with the next user turn ({\"content\": ...}), the "
                   "results of the tools it called ({\"role\": \"tool\", ...}) or the end "
                   "(null); the loss covers the model's turns only");
  grpo->add_option("--tools", o.tools_file,
                   "A JSON file listing the tools the prompts declare (OpenAI-style function "
                   "schemas, rendered in the system turn as Gemma 4's template does) for rows "
                   "without a 'tools' column");
  grpo->add_option("--max-turns", o.max_turns,
                   "The most model turns of an episode with --environment-command")
      ->capture_default_str();
  grpo->add_option("--log-completions", o.log_completions,
                   "Completions (prompt, text, rewards, advantage) of the first worker printed "
                   "and recorded in metrics.jsonl at each generation round (0 = none)")
      ->capture_default_str();
  cmd->add_flag("--dry-run", a->dry_run,
                "Print the memory plan per worker and per host and exit (non-zero when the job "
                "cannot fit); nothing is started");
  cmd->add_option("--freeze", o.freeze,
                  "Regex of tensor names to freeze (no gradient or optimizer state; read from "
                  "--model-id as needed, never copied whole)")
      ->capture_default_str();
  cmd->add_option("--lora-rank", o.lora_rank,
                  "LoRA rank R: train low-rank adapters (PEFT's LoRA) on a frozen base instead of "
                  "every weight; checkpoints are PEFT adapter directories. 0 = full fine-tuning")
      ->capture_default_str();
  cmd->add_option("--lora-alpha", o.lora_alpha,
                  "LoRA alpha: the adapters' output is scaled by alpha / R (default 2 x R)");
  cmd->add_option("--lora-dropout", o.lora_dropout,
                  "Dropout on the adapters' input, as PEFT's lora_dropout (default 0)");
  cmd->add_option(
      "--lora-target-modules", o.lora_target_modules,
      "Comma-separated module names to adapt, as PEFT's target_modules (q_proj, k_proj, "
      "v_proj, o_proj, gate_proj, up_proj, down_proj, per_layer_input_gate, "
      "per_layer_projection, per_layer_model_projection) or all-linear; default "
      "PEFT's for Gemma: q_proj,v_proj");
  cmd->add_option("--modules-to-save", o.modules_to_save,
                  "With --lora-rank: comma-separated base modules trained in full beside the "
                  "adapters and saved in the adapter file, as PEFT's modules_to_save (plain suffix "
                  "match over module names, e.g. norm, embed_tokens)");
  cmd->add_flag("--use-rslora", o.use_rslora,
                "Rank-stabilised LoRA: scale by alpha / sqrt(R) instead of alpha / R");
  cmd->add_option("--save-dtype", o.save_dtype,
                  "dtype of the trained tensors in each checkpoint's model files: bf16, fp16 or "
                  "fp32 (default: the --model-id checkpoint's, fp32 for a preset); frozen tensors "
                  "keep theirs");
  cmd->add_option("--max-shard-size", o.max_shard_size,
                  "Largest model file of a checkpoint; a larger model is split into files with a "
                  "model.safetensors.index.json, as transformers' max_shard_size")
      ->capture_default_str();
  AddDataDirOption(cmd, &o.data_dir);
  cmd->add_option("--checkpoint-score-attribute", o.score_attribute,
                  "Metric that ranks checkpoints: loss, eval_loss (needs --eval-split), epoch, "
                  "epoch_time_s, tokens_per_s")
      ->capture_default_str();
  cmd->add_option("--checkpoint-score-order", o.score_order, "min or max: which score is best")
      ->capture_default_str();
  cmd->add_option("--progress", o.progress,
                  "auto (a bar on a terminal, else a line per tenth of an epoch), bar, lines, off")
      ->capture_default_str();
  cmd->add_flag("--resume", o.resume,
                "Continue the run --run-name from its latest good checkpoint (same workers)");
  cmd->add_option("--threads", a->threads,
                  "Compute threads per local worker (default: $OMP_NUM_THREADS, else the CPUs this "
                  "process may use, from its affinity mask and cgroup quota, / workers)");
  cmd->add_option("--timeout-ms", a->timeout_ms,
                  "Timeout of every collective; a rank blocked longer fails the group (under "
                  "`launch` the default is $SLICETRAIN_TIMEOUT_MS)")
      ->capture_default_str()
      ->each([a](const std::string&) { a->timeout_given = true; });
  cmd->add_option("--max-failures", a->max_failures,
                  "Restart all workers from the latest checkpoint after a lost worker or a "
                  "collective timeout, at most this many times (Ray Train's FailureConfig)")
      ->capture_default_str();
  cmd->add_option("--dashboard-host", a->dashboard_host,
                  "Address rank 0's dashboard binds (loopback unless set, e.g. 0.0.0.0)")
      ->capture_default_str();
  cmd->add_option("--dashboard-port", a->dashboard_port,
                  "Dashboard port (0 = any free port; busy = a warning, training goes on)")
      ->capture_default_str();
  cmd->add_option("--report-to", a->report_to,
                  "tensorboard: event files in <run dir>/tensorboard (tensorboard --logdir "
                  "<storage path>); jsonl:PATH: every metrics.jsonl record also appended to PATH "
                  "as it happens (a file or pipe another tracker tails); a comma-separated list "
                  "of both; none: only metrics.jsonl, which every run writes")
      ->capture_default_str();
  cmd->add_flag("--no-dashboard", a->no_dashboard,
                "Serve no dashboard (metrics are still written)");
  cmd->add_option("--dashboard-linger", a->dashboard_linger_s,
                  "After the run, keep the dashboard up until no request came for this many s")
      ->capture_default_str();
  cmd->callback([&ctx, a] {
    int code = 0;
    Status st = Run(*a, &code);
    if (!st.ok()) {
      const int rc = ReportError("finetune", st);
      ctx.exit_code = code != 0 ? code : rc;
    } else if (code != 0) {
      ctx.exit_code = code;
    }
  });
}

}  // namespace st::cli

#include "train/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/rng.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "io/files.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/safetensors.h"
#include "model/gemma4.h"
#include "parallel/fsdp.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/progress.h"
#include "train/train_state.h"
#include "train/train_step.h"

namespace st {

namespace fs = std::filesystem;

std::vector<std::vector<int64_t>> EpochBatches(int64_t n, int world, int rank, int64_t batch,
                                               uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  Rng rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.Below(i + 1)]);
  const int64_t total = (n + world - 1) / world * world;
  for (int64_t i = n; i < total; ++i) perm.push_back(perm[i - n]);  // pad with the head
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total; i += world) mine.push_back(perm[i]);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s + batch <= static_cast<int64_t>(mine.size()); s += batch)
    out.emplace_back(mine.begin() + s, mine.begin() + s + batch);
  return out;
}

StatusOr<InstructionData> LoadInstructionData(const Gemma4Config& config,
                                              const std::string& model_id,
                                              const std::string& tokenizer_flag, DatasetOptions dso,
                                              int64_t max_seq_len, const std::string& data_dir) {
  std::error_code ec;
  const std::string tok_dir = !tokenizer_flag.empty()          ? tokenizer_flag
                              : fs::is_directory(model_id, ec) ? model_id
                                                               : data_dir + "/tokenizer";
  if (fs::is_directory(tok_dir, ec))
    ST_RETURN_IF_ERROR(VerifyChecksumsIfListed(
                           tok_dir, {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"})
                           .WithContext("tokenizer " + tok_dir));
  ST_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(tok_dir));
  if (tok.vocab_size() > config.vocab_size)
    return InvalidArgument(StrCat("the tokenizer at ", tok_dir, " has ", tok.vocab_size(),
                                  " tokens but the model's vocabulary is ", config.vocab_size));
  if (dso.path.empty()) dso.path = data_dir + "/tiny_instruct/train.jsonl";
  ST_ASSIGN_OR_RETURN(InstructionDataset ds, InstructionDataset::Open(dso));
  CollateOptions co;
  co.max_seq_len = max_seq_len;
  DatasetReport report;
  ST_ASSIGN_OR_RETURN(TokenizedSet set, TokenizeDataset(ds, PromptTemplate{}, tok, co, &report));
  return InstructionData{tok_dir, std::move(tok), std::move(set), std::move(report)};
}

DatasetOptions DatasetOf(const FinetuneOptions& o) {
  DatasetOptions d;
  d.path = o.dataset;
  d.split = o.dataset_split;
  d.instruction_field = o.instruction_field;
  d.context_field = o.context_field;
  d.response_field = o.response_field;
  return d;
}

Status ValidateFinetuneOptions(const FinetuneOptions& o) {
  if (o.num_epochs < 1 || o.batch_size_per_device < 1 || o.max_seq_len < 2)
    return InvalidArgument(
        "--num-epochs, --batch-size-per-device must be >= 1 and --max-seq-len >= 2");
  if (o.score_attribute != "loss" && o.score_attribute != "epoch" &&
      o.score_attribute != "epoch_time_s" && o.score_attribute != "tokens_per_s")
    return InvalidArgument(
        "--checkpoint-score-attribute must be loss, epoch, epoch_time_s or tokens_per_s, got '" +
        o.score_attribute + "'");
  if (o.score_order != "min" && o.score_order != "max")
    return InvalidArgument("--checkpoint-score-order must be min or max, got '" + o.score_order +
                           "'");
  if (o.fsdp_units != "mlp" && o.fsdp_units != "layer")
    return InvalidArgument("--fsdp-units must be 'mlp' or 'layer', got '" + o.fsdp_units + "'");
  if (o.num_to_keep < 1) return InvalidArgument("--num-to-keep must be >= 1");
  if (o.save_steps < 0) return InvalidArgument("--save-steps must be >= 0 (0: at epoch ends only)");
  if (o.lr < 0 || o.weight_decay < 0 || o.max_grad_norm < 0)
    return InvalidArgument("--lr, --weight-decay and --max-grad-norm must not be negative");
  return Status::Ok();
}

Status RunFinetune(const FinetuneOptions& o, dist::ProcessGroup& pg,
                   const dist::CollectiveOptions& collective, TrainingObserver* observer) {
  const int rank = pg.rank(), world = pg.size();
  ST_RETURN_IF_ERROR(ValidateFinetuneOptions(o));

  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(o.model_id, o.seed));
  const bool from_dir = fs::is_directory(o.model_id);
  ST_ASSIGN_OR_RETURN(InstructionData data,
                      LoadInstructionData(m.config, o.model_id, o.tokenizer, DatasetOf(o),
                                          o.max_seq_len, o.data_dir));
  const TokenizedSet& set = data.examples;
  const DatasetReport& report = data.report;
  const std::string& tokenizer_dir = data.tokenizer_dir;
  const int64_t steps_per_epoch = static_cast<int64_t>(
      EpochBatches(set.size(), world, rank, o.batch_size_per_device, o.seed, 0).size());
  if (steps_per_epoch == 0)
    return InvalidArgument(StrCat("the data set has ", set.size(), " examples: too few for ", world,
                                  " workers x --batch-size-per-device ", o.batch_size_per_device));

  // Trainable tensors: everything but buffers and what --freeze matches.
  std::vector<bool> trainable(m.registry.layout.size());
  std::regex freeze;
  try {
    if (!o.freeze.empty()) freeze = std::regex(o.freeze);
  } catch (const std::regex_error& e) {
    return InvalidArgument("--freeze '" + o.freeze + "' is not a valid regular expression");
  }
  int64_t frozen = 0;
  for (int i = 0; i < m.registry.layout.size(); ++i) {
    const bool match =
        !o.freeze.empty() && std::regex_search(m.registry.layout.entry(i).name, freeze);
    trainable[i] = !m.registry.is_buffer[i] && !match;
    if (match) frozen += m.registry.layout.entry(i).numel;
  }

  Gemma4Engine engine(m.config, o.batch_size_per_device, o.max_seq_len);
  FsdpOptions fo;
  fo.units = o.fsdp_units == "layer" ? FsdpUnitMode::kLayer : FsdpUnitMode::kMlp;
  fo.collective = collective;
  FsdpModel fsdp(m.config, m.registry, pg, trainable, fo);
  fsdp.LoadFull(m.params.data());
  AdamWConfig adam;
  adam.lr = o.lr > 0 ? o.lr : (from_dir ? 2e-5 : 1e-3);
  adam.weight_decay = o.weight_decay;

  const std::string storage = o.storage_path.empty() ? "runs" : o.storage_path;
  const std::string run_name =
      o.run_name.empty() ? StrCat("slicetrain_gemma4_fsdp_sft_", std::time(nullptr)) : o.run_name;
  if (run_name.find('/') != std::string::npos || run_name == "." || run_name == "..")
    return InvalidArgument("--run-name must be a plain name, got '" + run_name + "'");
  const std::string run_dir = (fs::path(storage) / run_name).string();
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec)
      return IoError(StrCat("cannot create the run directory ", run_dir, ": ", ec.message(),
                            " (check --storage-path)"));
    if (const int stale = RemoveStalePendingCheckpoints(run_dir); stale > 0)
      std::printf("Removed %d unfinished checkpoint(s) that an interrupted run left in %s\n", stale,
                  run_dir.c_str());
  }
  ProgressReporter reporter(rank, o.progress, o.num_epochs, observer);
  SetupSummary summary;
  summary.data = report.Summary();
  summary.examples = set.size();
  summary.max_seq_len = o.max_seq_len;
  summary.truncated = set.truncated;
  summary.steps_per_epoch = steps_per_epoch;
  summary.world = world;
  summary.batch_size_per_device = o.batch_size_per_device;
  summary.lr = adam.lr;
  summary.trainable_parameters = m.registry.layout.total() - frozen;
  summary.frozen_parameters = frozen;
  reporter.Setup(summary);

  // Who the ranks are (one all_gather), for rank 0's observer; the step metrics use the count of
  // trainable parameters for model FLOP/s.
  ST_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, GatherWorkerInfo(pg, collective));
  const int64_t trainable_parameters = m.registry.layout.total() - frozen;

  CheckpointerOptions co;
  co.run_dir = run_dir;
  co.tokenizer_dir = tokenizer_dir;
  co.steps_per_epoch = steps_per_epoch;
  co.num_to_keep = o.num_to_keep;
  co.score_attribute = o.score_attribute;
  co.lower_is_better = o.score_order == "min";
  co.run_state = {{"seed", o.seed},
                  {"model_id", o.model_id},
                  {"fsdp_units", o.fsdp_units},
                  {"dataset_split", o.dataset_split}};
  Checkpointer checkpointer(std::move(co), m, fsdp, pg, collective);
  // Where the run stands; a --save-steps checkpoint resumes inside epoch state.epoch + 1: its
  // first state.step_in_epoch steps are done, and the loss sum over them continues the epoch's
  // mean.
  TrainState state;
  if (o.resume || o.resume_if_any) {
    ST_ASSIGN_OR_RETURN(state, checkpointer.Resume(/*required=*/o.resume));
  }
  const int64_t first_epoch = state.epoch;
  {
    RunInfo info;
    info.run_name = run_name;
    info.run_dir = run_dir;
    info.storage_path = storage;
    info.flags = FinetuneOptionsJson(o);
    info.world_size = world;
    info.num_epochs = o.num_epochs;
    info.first_epoch = first_epoch;
    info.resumed_step = state.global_step;
    info.steps_per_epoch = steps_per_epoch;
    info.tokens_per_step = o.batch_size_per_device * world * o.max_seq_len;
    info.trainable_parameters = trainable_parameters;
    info.workers = workers;
    reporter.Start(info);
  }
  const StepParts parts{engine, fsdp, adam, o.max_grad_norm, pg, collective};
  for (int64_t epoch = first_epoch; epoch < o.num_epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto batches =
        EpochBatches(set.size(), world, rank, o.batch_size_per_device, o.seed, epoch);
    // Resumed inside this epoch: its first `skip` steps are in the checkpoint; the epoch's time
    // and throughput then cover the steps run since.
    const int64_t skip = state.step_in_epoch;
    int64_t real_tokens = 0;
    for (size_t bi = static_cast<size_t>(skip); bi < batches.size(); ++bi) {
      ST_ASSIGN_OR_RETURN(StepResult step, TrainStep(parts, set, batches[bi], state));
      real_tokens += step.real_tokens;
      const int64_t step_in_epoch = state.step_in_epoch;
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      reporter.Step(state, static_cast<int64_t>(batches.size()), step_in_epoch - skip, elapsed,
                    adam.lr, std::move(step));
      if (o.save_steps > 0 && step_in_epoch % o.save_steps == 0 &&
          step_in_epoch < static_cast<int64_t>(batches.size())) {
        ST_RETURN_IF_ERROR(checkpointer.SaveInsideEpoch(state));
      }
    }
    float real = static_cast<float>(real_tokens);
    ST_RETURN_IF_ERROR(pg.AllReduce(&real, 1, DType::kF32, dist::ReduceOp::kSum, collective));
    const double epoch_time =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double loss = state.epoch_loss_sum / static_cast<double>(batches.size());
    const double tokens_per_s = static_cast<double>(static_cast<int64_t>(batches.size()) - skip) *
                                o.batch_size_per_device * world * o.max_seq_len / epoch_time;
    EpochMetrics em;
    em.epoch = epoch + 1;
    em.global_step = state.global_step;
    em.loss = loss;
    em.epoch_time_s = epoch_time;
    em.tokens_per_s = tokens_per_s;
    em.real_tokens_per_s = real / epoch_time;
    reporter.Epoch(em);
    state = TrainState{epoch + 1, state.global_step, 0, 0};
    ST_RETURN_IF_ERROR(checkpointer.SaveEpoch(state, em));
  }
  // Per-worker memory: the sharded state falls as 1/N; RSS adds the engine's activations, the
  // gathered units and the replicated (frozen) tensors.
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  float rss_mib = static_cast<float>(ru.ru_maxrss) / 1024.0f;
  ST_RETURN_IF_ERROR(pg.AllReduce(&rss_mib, 1, DType::kF32, dist::ReduceOp::kMax, collective));
  reporter.Finish(
      {fsdp.ShardedStateBytes(), fsdp.ReplicatedBytes(), engine.ActivationBytes(), rss_mib},
      checkpointer.BestPath());
  return Status::Ok();
}

}  // namespace st

#include "train/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "train/checkpoint.h"

namespace st {

namespace fs = std::filesystem;

namespace {

std::string TimeStamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H-%M-%S", &tm);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  return StrCat(buf, ".", std::string(6 - std::to_string(us).size(), '0'), us);
}

// The checkpoint score: one field of the trainer state (CheckpointConfig's score attribute).
double Score(const nlohmann::json& state, const std::string& attribute) {
  auto it = state.find(attribute);
  return it != state.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options, const LoadedModel& model, FsdpModel& fsdp,
                           comm::ProcessGroup& pg, const comm::CollectiveOptions& collective)
    : options_(std::move(options)), model_(model), fsdp_(fsdp), pg_(pg), collective_(collective) {}

StatusOr<TrainState> Checkpointer::Resume(bool required) {
  const int rank = pg_.rank(), world = pg_.size();
  TrainState state;
  // Newest first; a checkpoint is used only when every rank could read its shard.
  const auto candidates = ListCheckpoints(options_.run_dir);
  bool resumed = false;
  for (const CheckpointEntry& point : candidates) {
    Status s = LoadCheckpointShard(point.dir, fsdp_, rank, world);
    if (s.ok() && options_.vision_lora)
      s = options_.vision_lora->LoadState((fs::path(point.dir) / kVisionLoraStateFile).string());
    float ok = s.ok() ? 1.0f : 0.0f;
    ST_RETURN_IF_ERROR(pg_.AllReduce(&ok, 1, DType::kF32, comm::ReduceOp::kMin, collective_));
    if (!s.ok())
      std::fprintf(stderr, "rank %d: checkpoint %s is damaged or incomplete, skipping it: %s\n",
                   rank, point.dir.c_str(), s.message().c_str());
    if (ok < 1.0f) continue;
    state.epoch = point.epoch;
    state.global_step = point.global_step;
    state.step_in_epoch = point.step_in_epoch;
    if (auto it = point.state.find("epoch_loss_sum"); it != point.state.end() && it->is_number())
      state.epoch_loss_sum = it->get<double>();
    if (auto it = point.state.find("best_eval_loss"); it != point.state.end() && it->is_number())
      state.best_eval_loss = it->get<double>();
    if (auto it = point.state.find("evals_since_best"); it != point.state.end() && it->is_number())
      state.evals_since_best = it->get<int64_t>();
    if (state.step_in_epoch >= options_.steps_per_epoch)
      return InvalidArgument(StrCat(point.dir, " was taken at step ", state.step_in_epoch,
                                    " of an epoch, but this data set and batch size give ",
                                    options_.steps_per_epoch, " steps per epoch"));
    resumed = true;
    if (rank == 0) PrintResumed(point.dir, state);
    break;
  }
  if (!resumed && !required) {
    if (rank == 0) {
      std::printf("No usable checkpoint of %s yet: starting from the beginning\n",
                  options_.run_dir.c_str());
      std::fflush(stdout);
    }
  } else if (!resumed) {
    return NotFound(StrCat("--resume: no usable checkpoint in ", options_.run_dir,
                           candidates.empty() ? " (none found)" : " (all damaged)"));
  }
  if (rank == 0 && resumed)
    for (const CheckpointEntry& point : candidates)
      kept_.push_back(
          {point.dir, Score(point.state, options_.score_attribute), point.step_in_epoch > 0});
  return state;
}

void Checkpointer::PrintResumed(const std::string& dir, const TrainState& state) const {
  if (state.step_in_epoch > 0)
    std::printf(
        "Resuming from %s (epoch %lld done and %lld of %lld steps of epoch %lld, "
        "step %lld)\n",
        dir.c_str(), (long long)state.epoch, (long long)state.step_in_epoch,
        (long long)options_.steps_per_epoch, (long long)state.epoch + 1,
        (long long)state.global_step);
  else
    std::printf("Resuming from %s (epoch %lld done, step %lld)\n", dir.c_str(),
                (long long)state.epoch, (long long)state.global_step);
  std::fflush(stdout);
}

Status Checkpointer::SaveEpoch(const TrainState& state, const EpochMetrics& epoch) {
  char json[320];
  char eval[64] = "";
  if (epoch.eval_loss >= 0)
    std::snprintf(eval, sizeof(eval), ", \"eval_loss\": %.6f", epoch.eval_loss);
  std::snprintf(
      json, sizeof(json),
      "{\"epoch\": %lld, \"loss\": %.6f, \"epoch_time_s\": %.3f, \"tokens_per_s\": %.1f%s}",
      (long long)epoch.epoch, epoch.loss, epoch.epoch_time_s, epoch.tokens_per_s, eval);
  // The state holds every score attribute (--checkpoint-score-attribute ranks by it, also after a
  // resume).
  nlohmann::json fields = {{"epoch", epoch.epoch},
                           {"loss", epoch.loss},
                           {"epoch_time_s", epoch.epoch_time_s},
                           {"tokens_per_s", epoch.tokens_per_s}};
  if (epoch.eval_loss >= 0) fields["eval_loss"] = epoch.eval_loss;
  return Save(state, json, fields);
}

Status Checkpointer::SaveInsideEpoch(const TrainState& state) {
  const double partial = state.epoch_loss_sum / static_cast<double>(state.step_in_epoch);
  return Save(state,
              StrCat("{\"epoch\": ", state.epoch + 1, ", \"step_in_epoch\": ", state.step_in_epoch,
                     ", \"loss_so_far\": ", partial, "}"),
              {{"epoch", state.epoch}, {"loss_so_far", partial}});
}

// Every rank writes its shard into a pending directory, rank 0 the Hugging Face model (streamed
// tensor by tensor from every rank's pieces), and rank 0 commits it with a rename.
Status Checkpointer::Save(const TrainState& state, const std::string& metrics_json,
                          nlohmann::json fields) {
  const int rank = pg_.rank(), world = pg_.size();
  const bool inside_epoch = state.step_in_epoch > 0;
  const std::string pending = inside_epoch
                                  ? PendingStepCheckpointDir(options_.run_dir, state.global_step)
                                  : PendingCheckpointDir(options_.run_dir, state.epoch);
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(pending, ec);
    fs::create_directories(fs::path(pending) / "shards", ec);
    if (ec) return IoError(StrCat("cannot create ", pending, ": ", ec.message()));
  }
  ST_RETURN_IF_ERROR(pg_.Barrier(collective_));
  ST_RETURN_IF_ERROR(
      WriteCheckpointShard(pending, fsdp_, rank, world, state.epoch, state.global_step));
  if (options_.vision_lora && rank == 0)
    ST_RETURN_IF_ERROR(
        options_.vision_lora->SaveState((fs::path(pending) / kVisionLoraStateFile).string()));
  if (options_.adapter)  // LoRA: the adapters as PEFT saves them; the base stays where it is
    ST_RETURN_IF_ERROR(WritePeftAdapter(pending, model_, fsdp_, pg_, *options_.adapter,
                                        options_.adapter_dtype, options_.vision_lora));
  else
    ST_RETURN_IF_ERROR(
        WriteHfModel(pending, model_, fsdp_, pg_, collective_, options_.export_options));
  ST_RETURN_IF_ERROR(pg_.Barrier(collective_));
  if (rank != 0) return Status::Ok();
  const std::string dir = (fs::path(options_.run_dir) / ("checkpoint_" + TimeStamp())).string();
  fields["global_step"] = state.global_step;
  fields["world_size"] = world;
  for (const auto& [key, value] : options_.run_state.items()) fields[key] = value;
  if (inside_epoch) {
    fields["step_in_epoch"] = state.step_in_epoch;
    fields["epoch_loss_sum"] = state.epoch_loss_sum;
  }
  if (state.best_eval_loss >= 0) {
    fields["best_eval_loss"] = state.best_eval_loss;
    fields["evals_since_best"] = state.evals_since_best;
  }
  ST_RETURN_IF_ERROR(
      CommitCheckpoint(pending, dir, {options_.tokenizer_dir, metrics_json, fields.dump(2)}));
  if (inside_epoch)
    std::printf("Step checkpoint created at: %s (epoch %lld, step %lld of %lld)\n", dir.c_str(),
                (long long)state.epoch + 1, (long long)state.step_in_epoch,
                (long long)options_.steps_per_epoch);
  else
    std::printf("Checkpoint successfully created at: %s\n", dir.c_str());
  std::fflush(stdout);
  Retain(dir, Score(fields, options_.score_attribute), inside_epoch);
  last_saved_ = dir;
  return Status::Ok();
}

void Checkpointer::Retain(const std::string& dir, double score, bool inside_epoch) {
  // A checkpoint inside an epoch is only a restart point: the next checkpoint replaces it.
  for (size_t i = kept_.size(); i-- > 0;) {
    if (!kept_[i].inside_epoch) continue;
    std::error_code ec;
    fs::remove_all(kept_[i].path, ec);
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  kept_.push_back({dir, score, inside_epoch});
  if (inside_epoch) return;
  // Keep the best --num-to-keep by the score (CheckpointConfig(num_to_keep, score attribute,
  // order)), and always the newest, which a resume needs, until a newer one exists.
  const bool lower_is_better = options_.lower_is_better;
  std::stable_sort(kept_.begin(), kept_.end(), [&](const Kept& a, const Kept& b) {
    return lower_is_better ? a.score < b.score : a.score > b.score;
  });
  const size_t budget = static_cast<size_t>(std::max(1, options_.num_to_keep));
  for (size_t i = kept_.size(); i-- > budget;) {
    if (kept_[i].path == dir) continue;  // the newest stays beside the best ones
    std::error_code ec;
    fs::remove_all(kept_[i].path, ec);
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

std::string Checkpointer::BestPath() const {
  return kept_.empty() ? "" : kept_.front().path;
}

}  // namespace st

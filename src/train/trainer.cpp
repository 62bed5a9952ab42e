#include "train/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/rng.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "io/files.h"
#include "io/gguf.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/safetensors.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"
#include "model/gemma4.h"
#include "model/vision/image_encoder.h"
#include "optim/adamw.h"
#include "parallel/fsdp.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/generation.h"
#include "train/lr_schedule.h"
#include "train/objectives/grpo_step.h"
#include "train/objectives/preference_step.h"
#include "train/progress.h"
#include "train/train_state.h"
#include "train/train_step.h"
#include "train/trainable.h"

namespace st {

namespace fs = std::filesystem;

StatusOr<RunTokenizer> LoadRunTokenizer(const Gemma4Config& config, const std::string& model_id,
                                        const std::string& tokenizer_flag,
                                        const std::string& data_dir) {
  std::error_code ec;
  // --tokenizer, else the model directory's, a GGUF model's own vocabulary, else the bundled one.
  const std::string tok_dir = !tokenizer_flag.empty() ? tokenizer_flag
                              : fs::is_directory(model_id, ec) ||
                                      (fs::is_regular_file(model_id, ec) && IsGgufFile(model_id))
                                  ? model_id
                                  : data_dir + "/tokenizer";
  if (fs::is_directory(tok_dir, ec))
    ST_RETURN_IF_ERROR(
        VerifyChecksumsIfListed(tok_dir, kTokenizerFiles).WithContext("tokenizer " + tok_dir));
  ST_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(tok_dir));
  if (tok.vocab_size() > config.vocab_size)
    return InvalidArgument(StrCat("the tokenizer at ", tok_dir, " has ", tok.vocab_size(),
                                  " tokens but the model's vocabulary is ", config.vocab_size));
  return RunTokenizer{tok_dir, std::move(tok)};
}

StatusOr<InstructionData> LoadInstructionData(const RunTokenizer& tokenizer, DatasetOptions dso,
                                              int64_t max_seq_len, const std::string& data_dir,
                                              const TextOptions& text) {
  const Tokenizer& tok = tokenizer.tokenizer;
  if (dso.path.empty()) {
    if (text.preference)
      return InvalidArgument(
          "--objective dpo/orpo needs a preference data set: --dataset with prompt/chosen/"
          "rejected records (a file, a directory or a hub id such as "
          "trl-lib/ultrafeedback_binarized)");
    dso.path = data_dir + "/tiny_instruct/train.jsonl";
  }
  if (dso.path.empty() && text.prompts)
    return InvalidArgument(
        "--objective grpo needs prompt-only data: --dataset with a 'prompt' column (text or a "
        "conversation) and the columns the rewards read, e.g. trl-lib/DeepMath-103K's layout");
  dso.preference = text.preference;
  dso.prompts = text.prompts;
  ST_ASSIGN_OR_RETURN(InstructionDataset ds, InstructionDataset::Open(dso));
  CollateOptions co;
  co.max_seq_len = max_seq_len;
  co.split_long = text.split_long;
  ST_ASSIGN_OR_RETURN(const int32_t pad_id, ResolvePadId(tok, co));
  InstructionData data{tokenizer.dir,   tok,         TokenizedSet{},
                       PreferenceSet{}, PromptSet{}, DatasetReport{}};
  ST_ASSIGN_OR_RETURN(ExampleRenderer renderer,
                      ExampleRenderer::Create(data.tokenizer, text.kind, text.train_on));
  if (text.images.count) renderer.SetImageTokens(text.images);
  if (text.prompts) {
    data.prompts = PromptSet(max_seq_len);
    if (!text.tools_file.empty()) {
      ST_ASSIGN_OR_RETURN(const std::string t, ReadTextFile(text.tools_file));
      data.prompts.tools = nlohmann::json::parse(t, nullptr, false);
      if (data.prompts.tools.is_discarded() || !data.prompts.tools.is_array())
        return InvalidArgument(StrCat("--tools ", text.tools_file,
                                      " is not a JSON list of tool schemas ([{\"type\": "
                                      "\"function\", \"function\": {\"name\": ...}}, ...])"));
    }
    const bool chat = renderer.kind() == TemplateKind::kGemmaChat;
    ST_RETURN_IF_ERROR(ds.ForEach(
        [&](const InstructionRecord& r) {
          return data.prompts.Add(r, data.tokenizer, chat ? &renderer : nullptr)
              .WithContext(
                  StrCat("prompt record at ", ds.position_unit(), " ", r.line, " of ", ds.file()));
        },
        &data.report));
    if (data.prompts.size() == 0)
      return InvalidArgument(StrCat(data.report.Summary(), ": every prompt is longer than ",
                                    "--max-seq-len ", max_seq_len, ": raise --max-seq-len"));
  } else if (text.preference) {
    data.pairs = PreferenceSet(max_seq_len);
    const bool chat = renderer.kind() == TemplateKind::kGemmaChat;
    PreferenceTokens pt;
    ST_RETURN_IF_ERROR(ds.ForEach(
        [&](const InstructionRecord& r) {
          ST_RETURN_IF_ERROR(TokenizePreference(r, data.tokenizer, chat ? &renderer : nullptr, &pt)
                                 .WithContext(StrCat("preference record at ", ds.position_unit(),
                                                     " ", r.line, " of ", ds.file())));
          data.pairs.Add(pt, r.line);
          return Status::Ok();
        },
        &data.report));
    if (data.pairs.size() == 0)
      return InvalidArgument(StrCat(data.report.Summary(),
                                    ": every pair's prompt fills --max-seq-len ", max_seq_len,
                                    " (TRL drops such pairs): raise --max-seq-len"));
  } else {
    ST_ASSIGN_OR_RETURN(data.examples, TokenizeDataset(ds, renderer, co, &data.report));
  }
  data.kind = renderer.kind();
  data.train_on = renderer.train_on();
  data.pad_id = pad_id;
  return data;
}

StatusOr<InstructionData> LoadInstructionData(const Gemma4Config& config,
                                              const std::string& model_id,
                                              const std::string& tokenizer_flag,
                                              DatasetOptions dataset, int64_t max_seq_len,
                                              const std::string& data_dir,
                                              const TextOptions& text) {
  ST_ASSIGN_OR_RETURN(RunTokenizer tok,
                      LoadRunTokenizer(config, model_id, tokenizer_flag, data_dir));
  return LoadInstructionData(tok, std::move(dataset), max_seq_len, data_dir, text);
}

TextOptions TextOf(const FinetuneOptions& o) {
  TextOptions t;  // the flags parse: ValidateFinetuneOptions checked them
  t.kind = ParseTemplateKind(o.chat_template).value();
  t.train_on = ParseTrainOn(o.train_on).value();
  t.split_long = o.packing == "split";
  t.preference = o.objective == "dpo" || o.objective == "orpo";
  t.prompts = o.objective == "grpo";
  t.tools_file = o.tools_file;
  return t;
}

ObjectiveOptions ObjectiveOf(const FinetuneOptions& o) {
  ObjectiveOptions b;
  b.objective = o.objective;
  if (o.beta >= 0) b.beta = o.beta;
  if (!o.loss_type.empty()) b.loss_type = o.loss_type;
  b.label_smoothing = o.label_smoothing;
  return b;
}

GrpoOptions GrpoOf(const FinetuneOptions& o) {
  GrpoOptions g;
  g.num_generations = o.num_generations;
  if (!o.loss_type.empty()) g.loss_type = o.loss_type;
  if (o.beta >= 0) g.beta = o.beta;
  g.epsilon = o.epsilon;
  g.epsilon_high = o.epsilon_high;
  g.scale_rewards = o.scale_rewards;
  g.num_iterations = o.num_iterations;
  g.max_completion_length = o.max_completion_length;
  g.mask_truncated_completions = o.mask_truncated_completions;
  g.reward_weights = o.reward_weights;
  return g;
}

BatchingOptions BatchingOf(const FinetuneOptions& o, int32_t pad_id) {
  BatchingOptions b;
  b.max_seq_len = o.objective == "sft" ? o.max_seq_len : 2 * o.max_seq_len;
  b.batch_size = o.batch_size_per_device;
  if (o.objective == "grpo") {  // rows of prompts, G completions each, one completion a row
    b.max_seq_len = o.max_seq_len + o.max_completion_length;
    b.batch_size = std::max<int64_t>(1, o.batch_size_per_device / o.num_generations);
  }
  b.packing = o.packing != "off" && o.objective != "grpo";
  b.padding = o.padding == "max_length" ? PaddingMode::kMaxLength : PaddingMode::kLongest;
  b.group_by_length = o.group_by_length;
  b.pad_id = pad_id;
  b.seed = o.seed;
  return b;
}

bool GrpoKeepsReferenceShards(const FinetuneOptions& o) {
  return o.objective == "grpo" && o.beta != 0 && (o.lora_rank <= 0 || !o.modules_to_save.empty());
}

DatasetOptions DatasetOf(const FinetuneOptions& o) {
  DatasetOptions d;
  d.path = o.dataset;
  d.split = o.dataset_split;
  d.instruction_field = o.instruction_field;
  d.context_field = o.context_field;
  d.response_field = o.response_field;
  d.config = o.dataset_config;
  d.json_field = o.dataset_field;
  d.messages_field = o.messages_field;
  d.images_field = o.images_field;
  return d;
}

Status ValidateFinetuneOptions(const FinetuneOptions& o) {
  if (o.objective == "grpo") {
    ST_RETURN_IF_ERROR(ValidateGrpoOptions(
        GrpoOf(o), static_cast<int64_t>(o.rewards.size() + o.reward_commands.size())));
    if (o.batch_size_per_device % o.num_generations != 0)
      return InvalidArgument(
          StrCat("--batch-size-per-device counts completions (TRL's per_device_train_batch_size): ",
                 o.batch_size_per_device, " is not a multiple of --num-generations ",
                 o.num_generations, "; e.g. --batch-size-per-device ", o.num_generations));
    if (!o.eval_split.empty())
      return InvalidArgument("--eval-split is not supported with --objective grpo yet");
    if (o.packing == "split" || o.padding != "longest" || o.group_by_length)
      return InvalidArgument(
          "--objective grpo trains one completion a row, padded to the longest: drop "
          "--packing split, --padding and --group-by-length");
    if (o.save_steps % o.num_iterations != 0)
      return InvalidArgument(StrCat("--save-steps ", o.save_steps,
                                    " must be a multiple of --num-iterations ", o.num_iterations,
                                    ": checkpoints fall between generation rounds"));
    if (!(o.temperature > 0))
      return InvalidArgument("--temperature must be > 0 (GRPO samples its completions)");
    if (!(o.reward_timeout > 0)) return InvalidArgument("--reward-timeout must be > 0");
    if (o.log_completions < 0) return InvalidArgument("--log-completions must be >= 0");
    if (o.max_turns < 1) return InvalidArgument("--max-turns must be >= 1");
    SamplingOptions so;
    so.temperature = o.temperature;
    so.top_p = o.top_p;
    so.top_k = o.top_k;
    ST_RETURN_IF_ERROR(so.Validate());
  } else {
    ST_RETURN_IF_ERROR(ValidateObjectiveOptions(ObjectiveOf(o)));
    if (!o.rewards.empty() || !o.reward_commands.empty() || !o.environment_command.empty() ||
        !o.tools_file.empty())
      return InvalidArgument(
          "--reward, --reward-command, --environment-command and --tools are for --objective "
          "grpo");
  }
  if (o.precompute_ref_log_probs && o.objective != "dpo")
    return InvalidArgument("--precompute-ref-log-probs is DPO's (ORPO and SFT have no reference)");
  if (o.objective != "sft" && o.packing == "split")
    return InvalidArgument(
        "--packing split cuts examples apart; preference pairs are truncated as TRL does: use "
        "--packing truncate (pairs packed into rows) or off (one pair a row)");
  if (o.num_epochs < 1 || o.batch_size_per_device < 1 || o.max_seq_len < 2 ||
      o.gradient_accumulation_steps < 1)
    return InvalidArgument(
        "--num-epochs, --batch-size-per-device, --gradient-accumulation-steps must be >= 1 and "
        "--max-seq-len >= 2");
  if (o.score_attribute != "loss" && o.score_attribute != "epoch" &&
      o.score_attribute != "epoch_time_s" && o.score_attribute != "tokens_per_s" &&
      o.score_attribute != "eval_loss")
    return InvalidArgument(
        "--checkpoint-score-attribute must be loss, eval_loss, epoch, epoch_time_s or "
        "tokens_per_s, got '" +
        o.score_attribute + "'");
  if (o.score_order != "min" && o.score_order != "max")
    return InvalidArgument("--checkpoint-score-order must be min or max, got '" + o.score_order +
                           "'");
  if (o.fsdp_units != "mlp" && o.fsdp_units != "layer")
    return InvalidArgument("--fsdp-units must be 'mlp' or 'layer', got '" + o.fsdp_units + "'");
  if (o.activation_checkpointing != "auto")
    ST_RETURN_IF_ERROR(ParseActivationCheckpointing(o.activation_checkpointing).status());
  ST_RETURN_IF_ERROR(cpu::ResolvePrecision(o.precision).status());
  ST_RETURN_IF_ERROR(ParseTemplateKind(o.chat_template).status());
  ST_RETURN_IF_ERROR(ParseTrainOn(o.train_on).status());
  if (o.packing != "truncate" && o.packing != "split" && o.packing != "off")
    return InvalidArgument("--packing must be truncate (the default), split or off, got '" +
                           o.packing + "'");
  if (o.padding != "longest" && o.padding != "max_length")
    return InvalidArgument("--padding must be longest or max_length, got '" + o.padding + "'");
  if (o.packing != "off" && (o.padding != "longest" || o.group_by_length))
    return InvalidArgument(
        "--padding and --group-by-length apply to unpacked rows: add --packing off (packing is "
        "on by default)");
  ST_RETURN_IF_ERROR(ParseLrScheduler(o.lr_scheduler).status());
  if (o.warmup_steps < 0 || o.decay_steps < 0 || o.max_steps < 0)
    return InvalidArgument("--warmup-steps, --decay-steps and --max-steps must not be negative");
  if (o.warmup_ratio < 0 || o.warmup_ratio > 1)
    return InvalidArgument(StrCat("--warmup-ratio must be in [0, 1], got ", o.warmup_ratio));
  if (o.min_lr_ratio < 0 || o.min_lr_ratio >= 1)
    return InvalidArgument(StrCat("--min-lr-ratio must be in [0, 1), got ", o.min_lr_ratio));
  if (!o.eval_dataset.empty() && o.eval_split.empty())
    return InvalidArgument("--eval-dataset needs --eval-split (e.g. train or validation)");
  if (o.eval_split.empty() &&
      (o.eval_steps > 0 || o.early_stopping_patience > 0 || o.score_attribute == "eval_loss"))
    return InvalidArgument(
        "--eval-steps, --early-stopping-patience and --checkpoint-score-attribute eval_loss need "
        "a held-out split: --eval-split (e.g. 'train[-5%:]')");
  if (o.eval_steps < 0 || o.early_stopping_patience < 0)
    return InvalidArgument("--eval-steps and --early-stopping-patience must not be negative");
  if (o.num_to_keep < 1) return InvalidArgument("--num-to-keep must be >= 1");
  if (o.sample_max_new_tokens < 1)
    return InvalidArgument(
        StrCat("--sample-max-new-tokens must be >= 1, got ", o.sample_max_new_tokens));
  if (!o.sample_prompts.empty())
    ST_RETURN_IF_ERROR(ReadPromptFile(o.sample_prompts).status().WithContext("--sample-prompts"));
  if (o.save_steps < 0) return InvalidArgument("--save-steps must be >= 0 (0: at epoch ends only)");
  if (o.lr < 0 || o.weight_decay < 0 || o.max_grad_norm < 0)
    return InvalidArgument("--lr, --weight-decay and --max-grad-norm must not be negative");
  if (!o.save_dtype.empty())
    ST_RETURN_IF_ERROR(ParseDTypeFlag(o.save_dtype).status().WithContext("--save-dtype"));
  ST_RETURN_IF_ERROR(ParseByteSize(o.max_shard_size).status().WithContext("--max-shard-size"));
  if (o.lora_rank < 0 || o.lora_alpha < 0)
    return InvalidArgument("--lora-rank and --lora-alpha must not be negative");
  if (o.lora_dropout < 0 || o.lora_dropout >= 1)
    return InvalidArgument(StrCat("--lora-dropout must be in [0, 1), got ", o.lora_dropout));
  if (o.lora_rank == 0 &&
      (o.lora_alpha > 0 || o.lora_dropout > 0 || !o.lora_target_modules.empty() || o.use_rslora ||
       !o.modules_to_save.empty()))
    return InvalidArgument(
        "--lora-alpha, --lora-dropout, --lora-target-modules, --use-rslora and "
        "--modules-to-save need --lora-rank");
  if (o.lora_rank > 0 && o.freeze != FinetuneOptions{}.freeze)
    return InvalidArgument(
        "--freeze has no effect with --lora-rank: the base model is frozen and only the adapters "
        "train; to train chosen base modules in full beside them, name them with "
        "--modules-to-save (PEFT's modules_to_save)");
  return Status::Ok();
}

std::optional<PeftAdapterConfig> AdapterConfigOf(const FinetuneOptions& o) {
  if (o.lora_rank <= 0) return std::nullopt;
  PeftAdapterConfig c;
  c.r = o.lora_rank;
  c.lora_alpha = o.lora_alpha > 0 ? o.lora_alpha : 2.0 * static_cast<double>(o.lora_rank);
  c.lora_dropout = o.lora_dropout;
  c.use_rslora = o.use_rslora;
  c.targets = o.lora_target_modules.empty() ? DefaultLoraTargets()
                                            : ParseLoraTargets(o.lora_target_modules);
  c.modules_to_save = ParseLoraTargets(o.modules_to_save).names;
  c.base_model_name_or_path = o.model_id;
  return c;
}

Status ApplyLora(const FinetuneOptions& o, LoadedModel* model) {
  const std::optional<PeftAdapterConfig> c = AdapterConfigOf(o);
  if (!c) return Status::Ok();
  ST_ASSIGN_OR_RETURN(LoraSpec spec, LoraSpecFor(model->config, model->registry, *c,
                                                 vision::LoraModulesOf(o.model_id)));
  return AttachLora(model, spec, o.seed);
}

namespace {

using Clock = std::chrono::steady_clock;

// The model and data of a run, loaded and checked on every rank before anything is sharded.
struct RunInputs {
  LoadedModel model;
  bool from_dir = false;  // --model-id is a model directory (default lr 2e-5), not a preset
  InstructionData data;
  std::optional<InstructionData> eval;  // --eval-split's examples
  BatchingOptions batching;
  int64_t steps_per_epoch = 0;
  Trainable trainable;
  // A model with a vision tower: its processor and tower (image parts in the data).
  std::unique_ptr<vision::ImageEncoder> images;
  // LoRA on that tower (targets that select its linears, a data set with images); null: frozen.
  std::unique_ptr<VisionLoraTrainer> vision_lora;
};

// The split name of HF split syntax: "train" of "train[:10%]".
std::string SplitName(const std::string& split) {
  return split.substr(0, split.find('['));
}

// A held-out split of the training files must not share a record with the training split.
Status CheckDisjoint(const DatasetReport& train, const std::string& train_split,
                     const DatasetReport& eval, const std::string& eval_split) {
  if (train.file != eval.file || SplitName(train_split) != SplitName(eval_split))
    return Status::Ok();
  if (eval.begin < train.end && train.begin < eval.end)
    return InvalidArgument(StrCat("--eval-split ", eval_split, " (records [", eval.begin, ", ",
                                  eval.end, ")) overlaps the training split ", train_split,
                                  " (records [", train.begin, ", ", train.end,
                                  ")): hold out records the training does not read, e.g. "
                                  "--dataset-split 'train[:95%]' --eval-split 'train[-5%:]'"));
  return Status::Ok();
}

StatusOr<RunInputs> LoadRunInputs(const FinetuneOptions& o, int world, int rank) {
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(o.model_id, o.seed));
  ST_RETURN_IF_ERROR(ApplyLora(o, &m));
  const bool from_dir = fs::is_directory(o.model_id);
  // One tokenizer for the training and the evaluation split (a real one's tokenizer.json takes
  // a while to parse; copies share it).
  ST_ASSIGN_OR_RETURN(RunTokenizer tok,
                      LoadRunTokenizer(m.config, o.model_id, o.tokenizer, o.data_dir));
  // A model with a vision tower reads image parts (its tower's weights only once a batch has
  // images).
  std::unique_ptr<vision::ImageEncoder> images;
  if (from_dir) {
    StatusOr<std::unique_ptr<vision::ImageEncoder>> loaded = vision::ImageEncoder::Load(o.model_id);
    if (loaded.ok())
      images = std::move(*loaded);
    else if (loaded.status().code() != StatusCode::kNotFound)
      return loaded.status();
  }
  TextOptions text = TextOf(o);
  if (images) text.images = images->Tokens();
  ST_ASSIGN_OR_RETURN(InstructionData data,
                      LoadInstructionData(tok, DatasetOf(o), o.max_seq_len, o.data_dir, text));
  const TokenizedSet& set = o.objective == "sft"    ? data.examples
                            : o.objective == "grpo" ? data.prompts.prompts
                                                    : data.pairs.pairs;
  // LoRA on the vision tower: targets that select its linears (PEFT's rules; all-linear is every
  // one), for a data set with images.
  std::unique_ptr<VisionLoraTrainer> vision_lora;
  if (const std::optional<PeftAdapterConfig> c = AdapterConfigOf(o); c && images) {
    ST_ASSIGN_OR_RETURN(
        const vision::VisionTower::AdaptedParts parts,
        vision::VisionTower::PartsOf(images->config(), c->targets, c->modules_to_save));
    const std::vector<int>& slots = parts.slots;
    if (parts.projection && set.images.empty())
      return InvalidArgument(StrCat(
          "--modules-to-save ", o.modules_to_save,
          " names the vision tower's projection (embed_vision.embedding_projection), but the ",
          o.objective == "sft" ? "data set has no image parts" : "objective reads no images",
          ": leave it out or train on an image chat set"));
    const bool named =
        c->targets.regex.empty() && c->targets.names != std::vector<std::string>{"all-linear"};
    if (!slots.empty() && set.images.empty() && named)
      return InvalidArgument(StrCat(
          "--lora-target-modules ", LoraTargetsString(c->targets),
          " select vision tower linears, but the ", o.objective == "sft" ? "data set" : "objective",
          o.objective == "sft" ? " has no image parts" : " reads no images (text data only)",
          ": drop those targets or train on an image chat set"));
    if (parts.any() && !set.images.empty()) {
      ST_ASSIGN_OR_RETURN(vision::VisionTower * tower, images->MutableTower());
      if (!slots.empty())
        ST_RETURN_IF_ERROR(
            tower->EnableLora(c->targets, c->r, m.registry.lora_scaling, o.seed).status());
      vision_lora = std::make_unique<VisionLoraTrainer>(tower, parts.projection);
    }
  }
  // A frozen tower gives an image the same soft tokens every time: each is computed once and
  // reused by later epochs (and the eval split), up to this much per worker.
  if (images && !vision_lora) images->EnableCache(vision::kSoftTokenCacheBytes);
  const BatchingOptions batching = BatchingOf(o, data.pad_id);
  // The same on every rank and in every epoch (FFD's bins depend only on the lengths).
  // Optimizer steps: the plan's micro-batches, --gradient-accumulation-steps at a time (the
  // epoch's last step may take fewer, as transformers' last accumulation window does).
  const int64_t micro_steps = static_cast<int64_t>(PlanEpoch(set, batching, world, rank, 0).size());
  const int64_t K = o.gradient_accumulation_steps;
  // A GRPO round (one planned step) serves --num-iterations optimizer steps.
  const int64_t steps_per_epoch =
      (micro_steps + K - 1) / K * (o.objective == "grpo" ? o.num_iterations : 1);
  if (steps_per_epoch == 0)
    return InvalidArgument(StrCat("the data set has ", set.size(),
                                  o.objective == "sft"    ? " examples"
                                  : o.objective == "grpo" ? " prompts"
                                                          : " pairs",
                                  ": too few for ", world, " workers x --batch-size-per-device ",
                                  o.batch_size_per_device));
  std::optional<InstructionData> eval;
  if (!o.eval_split.empty()) {
    DatasetOptions d = DatasetOf(o);
    if (!o.eval_dataset.empty()) d.path = o.eval_dataset;
    d.split = o.eval_split;
    StatusOr<InstructionData> loaded = LoadInstructionData(tok, d, o.max_seq_len, o.data_dir, text);
    if (!loaded.ok()) return loaded.status().WithContext("--eval-split " + o.eval_split);
    InstructionData e = std::move(*loaded);
    ST_RETURN_IF_ERROR(CheckDisjoint(data.report, o.dataset_split, e.report, o.eval_split));
    eval = std::move(e);
  }
  ST_ASSIGN_OR_RETURN(Trainable trainable, TrainableTensors(m.registry, o.freeze));
  return RunInputs{std::move(m),         from_dir,          std::move(data),
                   std::move(eval),      batching,          steps_per_epoch,
                   std::move(trainable), std::move(images), std::move(vision_lora)};
}

// Where the run writes: <storage>/<run name>. Rank 0 creates it and clears the pending
// checkpoints an interrupted run left there.
struct RunDir {
  std::string storage, name, dir;
};

StatusOr<RunDir> OpenRunDir(const FinetuneOptions& o, int rank) {
  RunDir r;
  r.storage = o.storage_path.empty() ? "runs" : o.storage_path;
  r.name =
      o.run_name.empty() ? StrCat("slicetrain_gemma4_fsdp_sft_", std::time(nullptr)) : o.run_name;
  if (r.name.find('/') != std::string::npos || r.name == "." || r.name == "..")
    return InvalidArgument("--run-name must be a plain name, got '" + r.name + "'");
  r.dir = (fs::path(r.storage) / r.name).string();
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(r.dir, ec);
    if (ec)
      return IoError(StrCat("cannot create the run directory ", r.dir, ": ", ec.message(),
                            " (check --storage-path)"));
    if (const int stale = RemoveStalePendingCheckpoints(r.dir); stale > 0)
      std::printf("Removed %d unfinished checkpoint(s) that an interrupted run left in %s\n", stale,
                  r.dir.c_str());
  }
  return r;
}

// The engine of a run: "auto" has been resolved by the memory plan before the workers started
// (a trainer built directly, as in tests, takes none for it).
EngineOptions EngineOptionsOf(const FinetuneOptions& o, const LoadedModel& m) {
  EngineOptions e;
  e.lora = m.lora;
  StatusOr<ActivationCheckpointing> c = ParseActivationCheckpointing(o.activation_checkpointing);
  if (c.ok()) e.checkpointing = *c;
  StatusOr<Precision> p = cpu::ResolvePrecision(o.precision);  // checked in ValidateOptions
  if (p.ok()) e.precision = *p;
  return e;
}

FsdpOptions FsdpOptionsOf(const FinetuneOptions& o, const comm::CollectiveOptions& collective) {
  FsdpOptions fo;
  fo.units = o.fsdp_units == "layer" ? FsdpUnitMode::kLayer : FsdpUnitMode::kMlp;
  fo.collective = collective;
  return fo;
}

// The epochs a run covers: --num-epochs, or with --max-steps as many as its steps reach into.
int64_t EpochsOf(const FinetuneOptions& o, int64_t steps_per_epoch) {
  return o.max_steps > 0 ? (o.max_steps + steps_per_epoch - 1) / steps_per_epoch : o.num_epochs;
}

StatusOr<LrSchedule> ScheduleOf(const FinetuneOptions& o, double lr, int64_t steps_per_epoch) {
  LrSchedule s;
  s.type = ParseLrScheduler(o.lr_scheduler).value();
  s.lr = lr;
  s.total_steps = o.max_steps > 0 ? o.max_steps : o.num_epochs * steps_per_epoch;
  s.warmup_steps = WarmupSteps(o.warmup_steps, o.warmup_ratio, s.total_steps);
  s.min_lr_ratio = o.min_lr_ratio;
  if (s.type == LrSchedulerType::kWsd) {
    s.decay_steps = o.decay_steps > 0
                        ? o.decay_steps
                        : static_cast<int64_t>(std::ceil(0.1 * static_cast<double>(s.total_steps)));
    if (s.warmup_steps + s.decay_steps > s.total_steps)
      return InvalidArgument(StrCat("--lr-scheduler wsd: warm-up (", s.warmup_steps,
                                    ") and decay (", s.decay_steps, ") steps exceed the run's ",
                                    s.total_steps,
                                    " optimizer steps; lower --warmup-steps or --decay-steps"));
  }
  if (s.type == LrSchedulerType::kPolynomial && s.warmup_steps >= s.total_steps)
    return InvalidArgument(StrCat("--lr-scheduler polynomial needs fewer warm-up steps (",
                                  s.warmup_steps, ") than the run's ", s.total_steps, " steps"));
  return s;
}

AdamWConfig AdamWOf(const FinetuneOptions& o, bool from_dir) {
  AdamWConfig adam;
  adam.lr = o.lr > 0 ? o.lr : (from_dir ? 2e-5 : 1e-3);
  adam.weight_decay = o.weight_decay;
  return adam;
}

// The job's components on one rank, as torchtitan's Trainer holds them: the model parts (model,
// engine, FSDP shards, optimizer), the data, the checkpointer and the reporter. Create sets them
// up, Start resumes, RunEpoch runs one epoch (steps, then the epoch's line and checkpoint), Finish
// reports. A new capability (adapters, schedules, accumulation, evaluation) is a new member
// called from here, not a branch in the loop.
class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Create(const FinetuneOptions& o, comm::ProcessGroup& pg,
                                                   const comm::CollectiveOptions& collective,
                                                   TrainingObserver* observer);
  // Where training starts: a checkpoint's state (--resume, or a restart's resume_if_any), else
  // the beginning; announced to the reporter (and so to the observer).
  StatusOr<TrainState> Start();
  // The rest of epoch state.epoch + 1: its steps, step checkpoints, line and epoch checkpoint.
  Status RunEpoch(TrainState& state);
  int64_t epochs() const { return epochs_; }
  bool stopped_early() const { return stop_; }
  // The end-of-run memory line (peak RSS all-reduced over ranks) and the final lines.
  Status Finish();

 private:
  Trainer(const FinetuneOptions& o, comm::ProcessGroup& pg,
          const comm::CollectiveOptions& collective, TrainingObserver* observer, RunInputs in);
  Status EndEpoch(TrainState& state, Clock::time_point t0, int64_t real_tokens, int64_t tokens);
  // The held-out loss (every rank takes part), reported; updates the early-stopping count in
  // state (kept in checkpoints, so a resume or restart continues it).
  StatusOr<double> Evaluate(TrainState& state, bool at_epoch_end);
  // DPO with a precomputed reference (--precompute-ref-log-probs; full fine-tuning and
  // --modules-to-save, whose reference weights the run overwrites): the table of every training
  // and held-out pair, read from the run directory, else computed (rank 0 stores it).
  Status PrepareReference(const TrainState& state);
  bool PrecomputesReference() const {
    return objective_ && objective_->needs_reference() &&
           (o_.precompute_ref_log_probs || o_.lora_rank <= 0 || !o_.modules_to_save.empty());
  }
  std::vector<float> ref_train_, ref_eval_;  // [2 x pairs] chosen, rejected; empty: none
  // An evaluation's result reported, and the early-stopping count updated; returns its loss.
  StatusOr<double> Evaluated(TrainState& state, const EvalMetrics& m, bool at_epoch_end);
  // Rank 0, after an epoch's checkpoint: --sample-prompts answered by the checkpoint just written
  // (loaded as `generate` loads it), printed and recorded. A failure is reported, not fatal.
  void Sample(const TrainState& state);
  std::vector<PromptLine> sample_prompts_;
  std::unique_ptr<Objective> objective_;  // --objective dpo | orpo; null: the mean token loss
  std::unique_ptr<GrpoRun> grpo_;         // --objective grpo
  Status CreateGrpo();
  // The rows the epoch plans over: the examples, a preference run's pairs or a GRPO run's prompts.
  const TokenizedSet& Rows() const {
    return objective_ ? in_.data.pairs.pairs : grpo_ ? in_.data.prompts.prompts : in_.data.examples;
  }
  // Optimizer steps per planned step: a GRPO round serves --num-iterations of them.
  int64_t Reuse() const { return grpo_ ? grpo_->options.num_iterations : 1; }
  bool stop_ = false;  // early stopping fired
  // The last evaluation's step and loss: the epoch's end reuses one taken at its last step.
  int64_t last_eval_step_ = -1;
  double last_eval_loss_ = 0;
  SetupSummary Summary() const;
  // Parameters the optimizer updates (the step metrics' model FLOP/s count them).
  int64_t TrainableParameters() const {
    int64_t n = 0;  // elements, not the arena's total (which has alignment gaps)
    for (int i = 0; i < in_.model.registry.layout.size(); ++i)
      if (in_.trainable.mask[static_cast<size_t>(i)]) n += in_.model.registry.layout.entry(i).numel;
    return n;
  }
  CheckpointerOptions CheckpointerOptionsOf() const;

  const FinetuneOptions& o_;
  comm::ProcessGroup& pg_;
  const comm::CollectiveOptions collective_;
  const int rank_, world_;
  RunInputs in_;
  Gemma4Engine engine_;
  FsdpModel fsdp_;  // refers to in_.model's config and registry
  const AdamWConfig adam_;
  const int64_t epochs_;  // --num-epochs, or what --max-steps reaches into
  LrSchedule schedule_;   // set by Create
  ProgressReporter reporter_;
  RunDir run_;
  std::vector<WorkerInfo> workers_;           // [world]
  std::optional<Checkpointer> checkpointer_;  // once the run directory exists
};

Trainer::Trainer(const FinetuneOptions& o, comm::ProcessGroup& pg,
                 const comm::CollectiveOptions& collective, TrainingObserver* observer,
                 RunInputs in)
    : o_(o),
      pg_(pg),
      collective_(collective),
      rank_(pg.rank()),
      world_(pg.size()),
      in_(std::move(in)),
      engine_(in_.model.config, o.batch_size_per_device, in_.batching.max_seq_len,
              EngineOptionsOf(o, in_.model)),
      fsdp_(in_.model.config, in_.model.registry, pg, in_.trainable.mask, *in_.model.weights,
            FsdpOptionsOf(o, collective)),
      adam_(AdamWOf(o, in_.from_dir)),
      epochs_(EpochsOf(o, in_.steps_per_epoch)),
      reporter_(pg.rank(), o.progress, epochs_, observer) {
  fsdp_.Load();  // this rank's ranges of each tensor, straight into its shards
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const FinetuneOptions& o, comm::ProcessGroup& pg,
                                                   const comm::CollectiveOptions& collective,
                                                   TrainingObserver* observer) {
  ST_RETURN_IF_ERROR(ValidateFinetuneOptions(o));
  ST_ASSIGN_OR_RETURN(RunInputs in, LoadRunInputs(o, pg.size(), pg.rank()));
  std::unique_ptr<Trainer> t(new Trainer(o, pg, collective, observer, std::move(in)));
  if (o.objective == "grpo") {
    ST_RETURN_IF_ERROR(t->CreateGrpo());
  } else if (o.objective != "sft") {
    ST_ASSIGN_OR_RETURN(t->objective_, MakeObjective(ObjectiveOf(o)));
  }
  ST_ASSIGN_OR_RETURN(t->schedule_, ScheduleOf(o, t->adam_.lr, t->in_.steps_per_epoch));
  ST_ASSIGN_OR_RETURN(t->run_, OpenRunDir(o, pg.rank()));
  t->reporter_.Setup(t->Summary());
  // Who the ranks are (one all_gather), for rank 0's observer.
  ST_ASSIGN_OR_RETURN(t->workers_, GatherWorkerInfo(pg, collective));
  t->checkpointer_.emplace(t->CheckpointerOptionsOf(), t->in_.model, t->fsdp_, pg, collective);
  if (!o.sample_prompts.empty()) {
    StatusOr<std::vector<PromptLine>> prompts = ReadPromptFile(o.sample_prompts);
    if (!prompts.ok()) return prompts.status().WithContext("--sample-prompts");
    t->sample_prompts_ = *std::move(prompts);
  }
  return t;
}

Status Trainer::CreateGrpo() {
  auto g = std::make_unique<GrpoRun>();
  g->options = GrpoOf(o_);
  g->rollout.sampling.temperature = o_.temperature;
  g->rollout.sampling.top_p = o_.top_p;
  g->rollout.sampling.top_k = o_.top_k;
  g->rollout.sampling.seed = o_.seed;
  g->rollout.num_generations = o_.num_generations;
  g->rollout.max_completion_length = o_.max_completion_length;
  // A completion ends at eos, the config's eos ids or the chat template's end of turn.
  const Tokenizer& tok = in_.data.tokenizer;
  for (const int64_t id : {static_cast<int64_t>(tok.eos_id()), in_.model.config.eos_token_id,
                           static_cast<int64_t>(tok.TokenToId("<turn|>").value_or(-1))})
    if (id >= 0 &&
        std::find(g->rollout.stops.begin(), g->rollout.stops.end(), id) == g->rollout.stops.end())
      g->rollout.stops.push_back(static_cast<int32_t>(id));
  for (const std::string& spec : o_.rewards) {
    ST_ASSIGN_OR_RETURN(std::unique_ptr<RewardFunction> r, MakeBuiltinReward(spec));
    g->rewards.push_back(std::move(r));
  }
  for (const std::string& cmd : o_.reward_commands) {
    ST_ASSIGN_OR_RETURN(std::unique_ptr<RewardFunction> r,
                        MakeCommandReward(cmd, o_.reward_timeout));
    g->rewards.push_back(std::move(r));
  }
  g->prompts = &in_.data.prompts;
  g->tokenizer = &in_.data.tokenizer;
  g->registry = &in_.model.registry;
  g->config = in_.model.config;
  g->precision = cpu::ResolvePrecision(o_.precision).value();
  g->reference_is_base = o_.lora_rank > 0;
  if (GrpoKeepsReferenceShards(o_)) {
    // Before Start: a resumed run's master is read after this, so the copy is the starting model.
    fsdp_.KeepReference();
    g->reference_in_fsdp = true;
  }
  g->log_completions = o_.log_completions;
  if (!o_.environment_command.empty()) {
    ST_ASSIGN_OR_RETURN(ExampleRenderer r,
                        ExampleRenderer::Create(in_.data.tokenizer, in_.data.kind, TrainOn::kAll));
    g->renderer = std::make_unique<ExampleRenderer>(std::move(r));
    ST_ASSIGN_OR_RETURN(g->environment,
                        MakeCommandEnvironment(o_.environment_command, o_.reward_timeout,
                                               *g->renderer, in_.data.tokenizer));
    g->rollout.max_turns = o_.max_turns;
    // A model turn that calls tools stops at <|tool_response> for the environment's results.
    if (const int32_t id = g->environment->tool_stop(); id >= 0) g->rollout.stops.push_back(id);
  }
  grpo_ = std::move(g);
  return Status::Ok();
}

// The Parts line's words for the vision tower and projection.
std::string VisionPartsOf(VisionLoraTrainer* trainer, double lora_dropout) {
  if (!trainer) return " frozen (their soft tokens enter the text model)";
  const size_t linears = trainer->tower().LoraSlots().size();
  const std::string replicated =
      StrCat(", replicated on every worker",
             linears > 0 && lora_dropout > 0 ? "; no LoRA dropout in the tower" : "", ")");
  const std::string projection =
      StrCat("the projection trained in full (modules_to_save, ",
             trainer->parameters() - trainer->adapter_parameters(), " trainable");
  if (linears == 0) return StrCat(": the tower frozen, ", projection, replicated);
  const std::string lora = StrCat(" frozen under LoRA on ", linears, " of their linears (",
                                  trainer->adapter_parameters(), " trainable");
  return trainer->trains_projection() ? StrCat(lora, "), ", projection, replicated)
                                      : StrCat(lora, replicated);
}

SetupSummary Trainer::Summary() const {
  SetupSummary s;
  s.data = in_.data.report.Summary();
  s.examples = Rows().size();
  s.max_seq_len = o_.max_seq_len;
  s.truncated = objective_ ? in_.data.pairs.truncated : in_.data.examples.truncated;
  s.tokens = Rows().tokens();
  s.split = in_.data.examples.split;
  s.untrained = in_.data.examples.untrained;
  if (grpo_) {
    const GrpoOptions& g = grpo_->options;
    const std::string reference = g.beta == 0 ? std::string()
                                  : grpo_->reference_in_fsdp
                                      ? "; reference: the initial weights, a copy of each shard"
                                  : grpo_->reference_is_base ? "; reference: the base, adapters off"
                                                             : "";
    s.objective =
        StrCat("grpo (", g.loss_type, ", beta ", g.beta, reference, ", ", g.num_generations,
               " completions a prompt of at most ", g.max_completion_length,
               " tokens, temperature ", o_.temperature, ", ", grpo_->rewards.size(),
               " reward function", grpo_->rewards.size() == 1 ? "" : "s", ")");
    s.dropped = in_.data.prompts.dropped;
  }
  if (objective_) {
    s.pairs = true;
    s.dropped = in_.data.pairs.dropped;
    s.objective =
        o_.objective == "dpo"
            ? StrCat("dpo (", ObjectiveOf(o_).loss_type, ", beta ", ObjectiveOf(o_).beta,
                     "; reference: ",
                     o_.lora_rank > 0 && o_.modules_to_save.empty() ? "the base, adapters off"
                                                                    : "the initial weights",
                     PrecomputesReference() ? ", log-probs precomputed)" : ")")
            : StrCat("orpo (lambda ", ObjectiveOf(o_).beta, ")");
  }
  const BatchingOptions& b = in_.batching;
  s.layout = StrCat("template ", TemplateKindName(in_.data.kind), ", loss on ",
                    objective_ ? std::string("the completions") : TrainOnName(in_.data.train_on),
                    "; ", objective_ && !b.packing ? "one pair a row, " : "",
                    b.packing ? StrCat("packed into rows of ", b.max_seq_len, " tokens")
                    : b.padding == PaddingMode::kMaxLength
                        ? StrCat("padded to ", b.max_seq_len)
                        : std::string(b.group_by_length ? "padded to the batch's longest, "
                                                          "grouped by length"
                                                        : "padded to the batch's longest"));
  s.steps_per_epoch = in_.steps_per_epoch;
  s.world = world_;
  s.batch_size_per_device = o_.batch_size_per_device;
  s.accumulation = o_.gradient_accumulation_steps;
  s.sync_each_batch = o_.sync_each_batch;
  s.lr = adam_.lr;
  s.lr_schedule = schedule_.Describe();
  s.trainable_parameters = TrainableParameters();
  s.frozen_parameters = in_.trainable.frozen;
  s.compute = ComputeSummary(engine_.options().precision, cpu::NumThreads());
  if (const std::optional<PeftAdapterConfig> c = AdapterConfigOf(o_)) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "LoRA r=%lld, alpha=%g (scaling %g%s) on %zu modules (%s)",
                  static_cast<long long>(c->r), c->lora_alpha, in_.model.registry.lora_scaling,
                  c->use_rslora ? ", rsLoRA" : "", in_.model.lora.targets.size(),
                  LoraTargetsString(c->targets).c_str());
    s.adapters = buf;
    if (!in_.model.lora.full.empty())
      s.adapters += StrCat(" + ", in_.model.lora.full.size(), " tensors trained in full (",
                           o_.modules_to_save, ")");
  }
  if (in_.images) {  // a multimodal checkpoint: say what trains in each part
    const StatusOr<vision::TowerParameters> t = vision::CountTowerParameters(o_.model_id);
    if (t.ok())
      s.parts =
          StrCat("Parts: text ", s.trainable_parameters + s.frozen_parameters, " parameters (",
                 s.trainable_parameters, " trainable); vision tower ", t->vision, " + projection ",
                 t->vision_projection, VisionPartsOf(in_.vision_lora.get(), o_.lora_dropout),
                 t->audio + t->audio_projection > 0
                     ? StrCat("; audio tower ", t->audio + t->audio_projection, " not read")
                     : std::string());
  }
  return s;
}

CheckpointerOptions Trainer::CheckpointerOptionsOf() const {
  CheckpointerOptions c;
  c.run_dir = run_.dir;
  c.tokenizer_dir = in_.data.tokenizer_dir;
  c.steps_per_epoch = in_.steps_per_epoch;
  c.num_to_keep = o_.num_to_keep;
  c.score_attribute = o_.score_attribute;
  c.lower_is_better = o_.score_order == "min";
  // Both parse: ValidateFinetuneOptions checked them.
  c.export_options.dtype =
      o_.save_dtype.empty() ? in_.model.weights->dtype() : ParseDTypeFlag(o_.save_dtype).value();
  c.export_options.max_shard_bytes = ParseByteSize(o_.max_shard_size).value();
  c.adapter = AdapterConfigOf(o_);
  c.vision_lora = in_.vision_lora.get();
  // Adapters are saved as trained (fp32, as PEFT saves them) unless --save-dtype says otherwise.
  if (!o_.save_dtype.empty()) c.adapter_dtype = ParseDTypeFlag(o_.save_dtype).value();
  c.run_state = {{"seed", o_.seed},
                 {"model_id", o_.model_id},
                 {"fsdp_units", o_.fsdp_units},
                 {"dataset_split", o_.dataset_split},
                 {"template", TemplateKindName(in_.data.kind)},
                 {"packing", o_.packing},
                 {"padding", o_.padding}};
  return c;
}

Status Trainer::PrepareReference(const TrainState& state) {
  const std::string path = (fs::path(run_.dir) / "reference_logps.safetensors").string();
  const int64_t n = in_.data.pairs.size(), m = in_.eval ? in_.eval->pairs.size() : 0;
  // A resumed run reads the table its first start stored, when every rank sees it (one
  // all-reduce, so that all ranks take the same path: reading, or computing together); a fresh
  // start computes it, replacing what an earlier run of the same name may have left.
  std::error_code ec;
  float have = state.global_step > 0 && fs::exists(path, ec) ? 1.0f : 0.0f;
  ST_RETURN_IF_ERROR(pg_.AllReduce(&have, 1, DType::kF32, comm::ReduceOp::kMin, collective_));
  if (have > 0) {
    ST_ASSIGN_OR_RETURN(SafeTensorsFile f, SafeTensorsFile::Open(path));
    ref_train_.resize(static_cast<size_t>(2 * n));
    Status s = f.ReadF32("train", ref_train_.data(), {n, 2});
    if (s.ok() && m > 0) {
      ref_eval_.resize(static_cast<size_t>(2 * m));
      s = f.ReadF32("eval", ref_eval_.data(), {m, 2});
    }
    if (!s.ok())
      return InvalidArgument(StrCat(path, " does not hold this run's ", n, " training and ", m,
                                    " held-out pairs (", s.message(),
                                    "): the data changed since it was computed; start a new run "
                                    "(another --run-name)"));
    if (rank_ == 0)
      std::printf("Reference log-probs: %s (%lld pairs)\n", path.c_str(), (long long)(n + m));
    return Status::Ok();
  }
  if (state.global_step > 0 && (o_.lora_rank <= 0 || !o_.modules_to_save.empty()))
    return InvalidArgument(
        StrCat("the run has trained ", state.global_step, " steps but ", path,
               " is missing (on this or another worker's host: it must be shared storage): the "
               "reference weights are gone; start a new run (another --run-name)"));
  const auto t0 = Clock::now();
  ST_ASSIGN_OR_RETURN(ref_train_, PrecomputeReferenceLogps(engine_, fsdp_, in_.data.pairs,
                                                           in_.batching, pg_, collective_));
  if (m > 0) {
    ST_ASSIGN_OR_RETURN(ref_eval_, PrecomputeReferenceLogps(engine_, fsdp_, in_.eval->pairs,
                                                            in_.batching, pg_, collective_));
  }
  if (rank_ != 0) return Status::Ok();
  std::vector<TensorToWrite> tensors = {{"train", DType::kF32, {n, 2}, ref_train_.data()}};
  if (m > 0) tensors.push_back({"eval", DType::kF32, {m, 2}, ref_eval_.data()});
  ST_RETURN_IF_ERROR(WriteSafeTensors(
      path, tensors,
      {{"format", "slicetrain DPO reference log-probs: [pairs, 2] chosen, rejected sums"},
       {"reference", o_.lora_rank > 0 && o_.modules_to_save.empty() ? "the base, adapters off"
                                                                    : "the initial weights"}}));
  std::printf("Reference log-probs of %lld pairs computed in %.1fs and stored in %s\n",
              (long long)(n + m), std::chrono::duration<double>(Clock::now() - t0).count(),
              path.c_str());
  std::fflush(stdout);
  return Status::Ok();
}

StatusOr<TrainState> Trainer::Start() {
  TrainState state;
  if (o_.resume || o_.resume_if_any) {
    ST_ASSIGN_OR_RETURN(state, checkpointer_->Resume(/*required=*/o_.resume));
  }
  if (PrecomputesReference()) ST_RETURN_IF_ERROR(PrepareReference(state));
  RunInfo info;
  info.run_name = run_.name;
  info.run_dir = run_.dir;
  info.storage_path = run_.storage;
  info.flags = FinetuneOptionsJson(o_);
  info.world_size = world_;
  info.num_epochs = epochs_;
  info.first_epoch = state.epoch;
  info.resumed_step = state.global_step;
  info.steps_per_epoch = in_.steps_per_epoch;
  info.tokens_per_step = o_.batch_size_per_device * world_ * o_.max_seq_len;
  info.trainable_parameters = TrainableParameters();
  info.workers = workers_;
  reporter_.Start(info);
  return state;
}

Status Trainer::RunEpoch(TrainState& state) {
  const auto t0 = Clock::now();
  const std::vector<StepRows> plan = PlanEpoch(Rows(), in_.batching, world_, rank_, state.epoch);
  const int64_t K = o_.gradient_accumulation_steps;
  // Optimizer steps: a GRPO round (one planned step) serves --num-iterations of them.
  const int64_t R = Reuse();
  const int64_t steps = (static_cast<int64_t>(plan.size()) + K - 1) / K * R;
  // Resumed inside this epoch: its first `skip` steps are in the checkpoint; the epoch's time and
  // throughput then cover the steps run since.
  const int64_t skip = state.step_in_epoch;
  int64_t real_tokens = 0, tokens = 0;
  for (int64_t i = skip; i < steps; ++i) {
    if (o_.max_steps > 0 && state.global_step >= o_.max_steps) break;
    AdamWConfig adam = adam_;  // this step's learning rate
    adam.lr = schedule_.At(state.global_step);
    const StepParts parts{engine_,
                          fsdp_,
                          adam,
                          o_.max_grad_norm,
                          pg_,
                          collective_,
                          o_.seed,
                          o_.sync_each_batch,
                          in_.images.get(),
                          in_.vision_lora.get()};
    const int64_t j = i / R;  // the planned step (a GRPO round's)
    const std::span<const StepRows> micro = std::span<const StepRows>(plan).subspan(
        static_cast<size_t>(j * K),
        static_cast<size_t>(std::min<int64_t>(K, static_cast<int64_t>(plan.size()) - j * K)));
    StatusOr<StepResult> result =
        grpo_        ? GrpoTrainStep(parts, *grpo_, micro, state, i % R == 0 || i == skip)
        : objective_ ? PreferenceTrainStep(parts, *objective_, in_.data.pairs, micro, in_.batching,
                                           state, ref_train_.empty() ? nullptr : &ref_train_)
                     : TrainStep(parts, in_.data.examples, micro, in_.batching, state);
    ST_ASSIGN_OR_RETURN(StepResult step, std::move(result));
    real_tokens += step.real_tokens;
    tokens += step.tokens;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    reporter_.Step(state, steps, state.step_in_epoch - skip, elapsed, adam.lr, std::move(step));
    if (o_.save_steps > 0 && state.step_in_epoch % o_.save_steps == 0 &&
        state.step_in_epoch < steps)
      ST_RETURN_IF_ERROR(checkpointer_->SaveInsideEpoch(state));
    if (in_.eval && o_.eval_steps > 0 && state.global_step % o_.eval_steps == 0) {
      ST_RETURN_IF_ERROR(Evaluate(state, false).status());
      if (stop_) break;
    }
  }
  return EndEpoch(state, t0, real_tokens, tokens);
}

// The epoch's figures (the token counts all-reduced), its line, then its checkpoint.
Status Trainer::EndEpoch(TrainState& state, Clock::time_point t0, int64_t real_tokens,
                         int64_t tokens) {
  float counts[2] = {static_cast<float>(real_tokens), static_cast<float>(tokens)};
  ST_RETURN_IF_ERROR(pg_.AllReduce(counts, 2, DType::kF32, comm::ReduceOp::kSum, collective_));
  EpochMetrics em;
  em.epoch_time_s = std::chrono::duration<double>(Clock::now() - t0).count();
  em.epoch = state.epoch + 1;
  em.global_step = state.global_step;
  // The steps this epoch ran (fewer than its plan's when --max-steps ends it early).
  em.loss = state.epoch_loss_sum / static_cast<double>(std::max<int64_t>(1, state.step_in_epoch));
  // The seed's tokens/s: positions computed, padding included (with max_length padding, batch x
  // world x max_seq_len per step); real tokens/s counts only the examples' tokens.
  em.tokens_per_s = counts[1] / em.epoch_time_s;
  em.real_tokens_per_s = counts[0] / em.epoch_time_s;
  if (in_.eval && last_eval_step_ == state.global_step) {
    em.eval_loss = last_eval_loss_;  // --eval-steps evaluated this very step
  } else if (in_.eval) {
    ST_ASSIGN_OR_RETURN(em.eval_loss, Evaluate(state, true));
  }
  reporter_.Epoch(em);
  if (stop_ && rank_ == 0)
    std::printf(
        "Early stopping: eval_loss has not improved on %.4f for %lld evaluations "
        "(--early-stopping-patience)\n",
        state.best_eval_loss, (long long)state.evals_since_best);
  state = TrainState{state.epoch + 1,      state.global_step,     0, 0,
                     state.best_eval_loss, state.evals_since_best};
  ST_RETURN_IF_ERROR(checkpointer_->SaveEpoch(state, em));
  if (rank_ == 0 && !sample_prompts_.empty()) Sample(state);
  return Status::Ok();
}

void Trainer::Sample(const TrainState& state) {
  const auto t0 = Clock::now();
  const std::string dir = checkpointer_->LastSavedPath();
  // A LoRA checkpoint is an adapter over the run's base model.
  const bool adapter = o_.lora_rank > 0;
  const int64_t capacity = std::min<int64_t>(in_.model.config.max_position_embeddings,
                                             o_.max_seq_len + o_.sample_max_new_tokens + 1);
  SampleMetrics s;
  s.step = state.global_step;
  s.epoch = state.epoch;
  s.checkpoint = dir;
  auto failed = [&](const Status& why) {
    std::printf("Samples skipped: %s\n", why.ToString().c_str());
    std::fflush(stdout);
  };
  StatusOr<std::unique_ptr<TextGenerator>> g =
      TextGenerator::Load(adapter ? o_.model_id : dir, adapter ? dir : "", in_.data.tokenizer_dir,
                          "", in_.data.kind, capacity, o_.seed);
  if (!g.ok()) return failed(g.status());
  Conversation conv(**g, capacity);
  GenerateOptions go;
  go.max_new_tokens = o_.sample_max_new_tokens;
  for (const PromptLine& p : sample_prompts_) {
    conv.Reset();
    const std::vector<ImageRef> images = ImageRefsOf(p.images);
    StatusOr<Generation> r = conv.Reply(p.text, "", go, {}, images);
    if (!r.ok()) return failed(r.status().WithContext("prompt '" + p.text + "'"));
    s.answers.push_back({p.text, r->text, r->stop, static_cast<int64_t>(r->ids.size())});
  }
  s.generate_s = std::chrono::duration<double>(Clock::now() - t0).count();
  s.unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  reporter_.Samples(s);
}

StatusOr<double> Trainer::Evaluate(TrainState& state, bool at_epoch_end) {
  const auto t0 = Clock::now();
  // Every example once, the same number of forwards on every rank, in the run's row layout
  // (max_length rows would drop a partial batch: the held-out rows are padded to their longest).
  BatchingOptions b = in_.batching;
  b.padding = PaddingMode::kLongest;
  b.group_by_length = false;
  if (objective_) {  // the objective's loss and metrics over the held-out pairs
    ST_ASSIGN_OR_RETURN(const std::vector<double> sums,
                        PreferenceEvaluate(engine_, fsdp_, *objective_, in_.eval->pairs, b, pg_,
                                           collective_, ref_eval_.empty() ? nullptr : &ref_eval_));
    EvalMetrics m;
    m.step = state.global_step;
    m.epoch = state.epoch + 1;
    m.eval_loss = sums[0];
    m.tokens = in_.eval->pairs.pairs.tokens();
    for (size_t i = 1; i < sums.size(); ++i)
      m.objective_metrics.emplace_back(objective_->metric_names()[i], sums[i]);
    m.eval_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return Evaluated(state, m, at_epoch_end);
  }
  const TokenizedSet& set = in_.eval->examples;
  double loss_sum = 0;
  int64_t targets = 0;
  engine_.SetDropout(false);
  for (const StepRows& rows : PlanEpoch(set, b, world_, rank_, 0)) {
    TokenBatch tb = CollateStep(set, rows, b);
    if (Status s = EncodeImages(in_.images.get(), tb); !s.ok()) {
      engine_.SetDropout(true);
      return s;
    }
    const Batch batch = BatchOf(tb);
    StatusOr<ForwardResult> r = fsdp_.Forward(engine_, batch);
    if (!r.ok()) {
      engine_.SetDropout(true);
      return r.status();
    }
    loss_sum += r->loss_sum;  // already the whole global batch's
    targets += r->num_valid;
  }
  engine_.SetDropout(true);
  if (targets == 0)
    return InvalidArgument("--eval-split " + o_.eval_split +
                           " has no target to evaluate (every answer truncated or empty?)");
  EvalMetrics m;
  m.step = state.global_step;
  m.epoch = state.epoch + 1;
  m.eval_loss = loss_sum / static_cast<double>(targets);
  m.tokens = targets;
  m.eval_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return Evaluated(state, m, at_epoch_end);
}

StatusOr<double> Trainer::Evaluated(TrainState& state, const EvalMetrics& m, bool at_epoch_end) {
  reporter_.Eval(m, at_epoch_end);
  last_eval_step_ = state.global_step;
  last_eval_loss_ = m.eval_loss;
  if (state.best_eval_loss < 0 || m.eval_loss < state.best_eval_loss) {
    state.best_eval_loss = m.eval_loss;
    state.evals_since_best = 0;
  } else if (++state.evals_since_best >= o_.early_stopping_patience &&
             o_.early_stopping_patience > 0) {
    stop_ = true;
  }
  return m.eval_loss;
}

Status Trainer::Finish() {
  // Per-worker memory: the sharded state falls as 1/N; RSS adds the engine's activations, the
  // gathered units and the frozen tensors converted to fp32 (outside the layers, and two layers).
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  float rss_mib = static_cast<float>(ru.ru_maxrss) / 1024.0f;
  ST_RETURN_IF_ERROR(pg_.AllReduce(&rss_mib, 1, DType::kF32, comm::ReduceOp::kMax, collective_));
  reporter_.Finish({fsdp_.ShardedStateBytes(), fsdp_.FrozenBytes(), engine_.ActivationBytes(),
                    rss_mib, ActivationCheckpointingName(engine_.options().checkpointing)},
                   checkpointer_->BestPath());
  return Status::Ok();
}

}  // namespace

// Set-up, resume, the epochs, the report; each a component above (see Trainer).
Status RunFinetune(const FinetuneOptions& o, comm::ProcessGroup& pg,
                   const comm::CollectiveOptions& collective, TrainingObserver* observer) {
  ST_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(o, pg, collective, observer));
  ST_ASSIGN_OR_RETURN(TrainState state, trainer->Start());
  while (state.epoch < trainer->epochs() && !trainer->stopped_early())
    ST_RETURN_IF_ERROR(trainer->RunEpoch(state));
  return trainer->Finish();
}

}  // namespace st

// The `finetune` job on one rank: the seed's ray_train_llm_finetune.py train_func. Loads the model
// and tokenizer, tokenizes the instruction data set, shards parameters with FSDP over the world
// group, runs epochs of AdamW steps over a DistributedSampler-style data order, prints the seed's
// per-epoch lines on rank 0 and writes a Hugging Face checkpoint per epoch (best kept).
// Each checkpoint also holds every rank's FSDP shard (master weights, AdamW moments) and the
// trainer state, so --resume continues exactly where it stopped: at an epoch boundary, or inside
// an epoch from a --save-steps checkpoint. A restarted group (--max-failures) resumes the same way
// (resume_if_any).
// RunFinetune only wires components, one file each: set-up and the epoch loop (trainer.cpp), one
// step (train_step.h), the Checkpointer (checkpointer.h) and rank 0's ProgressReporter
// (progress.h), over a TrainState (train_state.h). A new capability adds a component, not a
// branch in the loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "data/batching.h"
#include "data/chat_template.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/preference.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "io/peft_adapter.h"
#include "model/config.h"
#include "train/objectives/grpo.h"
#include "train/objectives/objective.h"
#include "train/step_metrics.h"

namespace st {

struct FinetuneOptions {
  std::string model_id = "gemma4-tiny";
  std::string tokenizer;  // "" = the model directory's, else the bundled one
  std::string dataset;    // "" = the bundled instruction set
  std::string dataset_split = "train[:1024]";
  // The data set's field names ("" = detected: Dolly's or Alpaca's; see DatasetOptions).
  std::string instruction_field, context_field, response_field;
  // A data set repository's config and revision, a JSON file's records key, the conversation
  // column (see DatasetOptions; hub ids are resolved to a local snapshot before the run).
  std::string dataset_config, dataset_revision, dataset_field, messages_field;
  std::string images_field;  // a conversation set's image column ("" = images, then image)
  int64_t num_epochs = 3;
  int64_t batch_size_per_device = 4;
  // Micro-batches of batch_size_per_device per optimizer step (transformers'
  // gradient_accumulation_steps): the same update as one batch this many times larger.
  int64_t gradient_accumulation_steps = 1;
  // With accumulation: reduce-scatter every micro-batch's gradients into the shards (1/N of the
  // memory, K times the gradient traffic; Accelerate's sync_each_batch, FSDP2's default) instead of
  // keeping every unit's unsharded gradient until the window's last one (FSDP2's no-sync).
  bool sync_each_batch = false;
  int64_t max_seq_len = 64;
  // How records become rows (data/chat_template.h, data/batching.h): --template
  // (auto|instruction|gemma-chat|none), --train-on (auto|responses|all), --packing (truncate |
  // split | off), and with --packing off --padding (longest | max_length) and --group-by-length.
  std::string chat_template = "auto";
  std::string train_on = "auto";
  std::string packing = "truncate";
  std::string padding = "longest";
  bool group_by_length = false;
  std::string topology = "2";
  std::string accelerator_type = "CPU";
  std::string storage_path;  // "" = $STORAGE_PATH, else ./runs
  std::string run_name;      // "" = slicetrain_gemma4_fsdp_sft_<unix time>
  double lr = 0;             // 0 = 2e-5 for a checkpoint, 1e-3 for a preset trained from scratch
  // The learning-rate schedule (train/lr_schedule.h; transformers' get_scheduler): its type,
  // warm-up (steps, else a ratio of the run's optimizer steps), the floor of the decaying
  // schedules as a ratio of lr, and WSD's decay steps (0 = a tenth of the run).
  std::string lr_scheduler = "constant";
  int64_t warmup_steps = 0;
  double warmup_ratio = 0;
  double min_lr_ratio = 0;
  int64_t decay_steps = 0;
  int64_t max_steps = 0;  // > 0: stop after this many optimizer steps (overrides --num-epochs)
  // Evaluation on a held-out split (transformers' eval_dataset): --eval-split turns it on, over
  // --eval-dataset ("" = --dataset's, then the split must not overlap the training split); at
  // every epoch's end and, with eval_steps > 0, every eval_steps optimizer steps. Early stopping
  // after this many evaluations without a lower eval_loss (0 = off).
  std::string eval_dataset, eval_split;
  int64_t eval_steps = 0;
  int64_t early_stopping_patience = 0;
  // Prompts (a file as `generate --prompts` reads) answered greedily by each epoch's checkpoint,
  // printed and stored in metrics.jsonl; up to sample_max_new_tokens tokens each.
  std::string sample_prompts;
  int64_t sample_max_new_tokens = 64;
  double weight_decay = 0.01;
  double max_grad_norm = 0;  // 0 = no clipping
  uint64_t seed = 42;
  int num_to_keep = 1;
  // Also checkpoint every this many steps inside an epoch (HF TrainingArguments.save_steps), so a
  // restart redoes at most that many steps; such a checkpoint is replaced by the next one. 0 = at
  // epoch ends only.
  int64_t save_steps = 0;
  std::string score_attribute = "loss";  // loss | epoch | epoch_time_s | tokens_per_s
  std::string score_order = "min";       // min | max: which checkpoints are best
  std::string progress = "auto";         // auto (bar on a terminal, else lines) | bar | lines | off
  bool resume = false;             // continue the run --run-name from its latest good checkpoint
  bool resume_if_any = false;      // the same, but start over when there is none (a restart)
  std::string fsdp_units = "mlp";  // mlp | layer
  // none | mlp | layer; "auto" (the CLI's default) is resolved by the memory plan before workers
  // start: the least recomputation that fits.
  std::string activation_checkpointing = "auto";
  // The Linear products' operands: auto (bf16 where it is the faster: cpu::AutoPicksBf16) | bf16 |
  // fp32. The CLI resolves auto before workers start, so every rank computes alike.
  std::string precision = "auto";
  // What the loss is (train/objectives/): sft (the mean token loss) | dpo | orpo, and the
  // preference objectives' flags as TRL's DPOConfig names them: beta (ORPO's lambda), the DPO
  // loss type (sigmoid | hinge | ipo | robust) and robust DPO's label smoothing. The reference
  // of DPO is the base model with the LoRA adapters off (--lora-rank is needed).
  // GRPO (--objective grpo) is online RL on prompt-only data (objectives/grpo.h): beta is the
  // weight of its KL to the reference and loss_type one of grpo | bnpo | dr_grpo | dapo. beta < 0
  // and loss_type "" are each objective's default (DPO/ORPO 0.1 and sigmoid, GRPO 0 and dapo, as
  // TRL's configs).
  std::string objective = "sft";
  double beta = -1;
  std::string loss_type;
  double label_smoothing = 0;
  // DPO's reference log-probs computed once before the first step and stored with the run
  // (<run>/reference_logps.safetensors, so a resume does not redo them), instead of a reference
  // forward every step. Full fine-tuning (no adapters to switch off) always does this.
  bool precompute_ref_log_probs = false;
  // GRPO, as TRL's GRPOConfig names them: completions per prompt (--batch-size-per-device counts
  // completions and must be a multiple of it), their sampling and length, the clipping range
  // (epsilon_high < 0: epsilon), the advantages' scaling, the optimizer steps per generation
  // round, and masking truncated completions out of the loss.
  int64_t num_generations = 8;
  int64_t max_completion_length = 256;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double epsilon = 0.2;
  double epsilon_high = -1;
  std::string scale_rewards = "group";
  int64_t num_iterations = 1;
  bool mask_truncated_completions = false;
  // The reward functions (train/rewards.h): built-ins (--reward SPEC) first, then programs
  // (--reward-command CMD), weighted by reward_weights (empty: 1 each) as TRL's reward_funcs.
  std::vector<std::string> rewards, reward_commands;
  std::vector<double> reward_weights;
  double reward_timeout = 60;  // seconds a program may take for one answer
  // Multi-turn episodes (train/environment.h): a program answering each finished model turn with
  // the next user turn or the end of the episode; at most max_turns model turns per episode.
  std::string environment_command;
  int64_t max_turns = 4;
  // The tools the prompts declare (a JSON file: a list of function schemas, data/tool_calls.h),
  // for rows without a `tools` column of their own.
  std::string tools_file;
  // Completions (prompt, text, rewards, advantage) of rank 0 printed and recorded in
  // metrics.jsonl at each round's first step (TRL's log_completions; 0 = none).
  int64_t log_completions = 0;
  std::string freeze = "^embed_tokens_per_layer";  // regex over HF tensor names; "" = none
  // LoRA (PEFT's LoraConfig): rank 0 = full fine-tuning. With a rank the base model is frozen and
  // only the adapters train; checkpoints are PEFT adapter directories.
  int64_t lora_rank = 0;
  double lora_alpha = 0;  // 0 = 2 x rank
  double lora_dropout = 0;
  std::string lora_target_modules;  // "" = PEFT's default for Gemma (q_proj,v_proj)
  bool use_rslora = false;
  std::string modules_to_save;  // PEFT's modules_to_save: base modules trained in full beside
  std::string data_dir;         // where the bundled data lives
  // The Hugging Face model of each checkpoint: the dtype of the trained tensors ("" = the source
  // checkpoint's, fp32 for a preset) and the largest weight file (transformers' max_shard_size).
  std::string save_dtype;
  std::string max_shard_size = "5GB";
};

// The tokenized examples of a run, shared by finetune and evaluate: the tokenizer (tokenizer_flag,
// else the model directory's, else the bundled one), checked against the model's vocabulary, and
// the data set's split (`dataset.path`, else the bundled set) formatted with the prompt template,
// truncated and padded to max_seq_len.
// The PEFT adapter of a --lora-rank run (its rank, alpha, dropout, targets, base model), none
// without one.
std::optional<PeftAdapterConfig> AdapterConfigOf(const FinetuneOptions& o);
// Adds the adapters of a --lora-rank run to a loaded base model (initialised as PEFT does);
// nothing without one.
Status ApplyLora(const FinetuneOptions& o, LoadedModel* model);

// How records become token sequences: the template, what the loss covers, and whether examples
// longer than max_seq_len are cut (the default) or split.
struct TextOptions {
  TemplateKind kind = TemplateKind::kAuto;
  TrainOn train_on = TrainOn::kAuto;
  bool split_long = false;
  // Preference pairs (--objective dpo | orpo) into InstructionData::pairs instead of examples.
  bool preference = false;
  // Prompt-only records (--objective grpo) into InstructionData::prompts; tools_file: the tools
  // they declare when a row has no `tools` column ("" = none).
  bool prompts = false;
  std::string tools_file;
  // A vision model's image parts (vision::ImageEncoder::Tokens); unset: records with images are
  // refused.
  ImageTokens images;
};

struct InstructionData {
  std::string tokenizer_dir;
  Tokenizer tokenizer;
  TokenizedSet examples;
  PreferenceSet pairs;  // a preference run's pairs (TextOptions::preference); examples empty
  PromptSet prompts;    // an online RL run's prompts (TextOptions::prompts); examples empty
  DatasetReport report;
  TemplateKind kind = TemplateKind::kInstruction;  // resolved (never kAuto)
  TrainOn train_on = TrainOn::kAll;                // resolved
  int32_t pad_id = 0;
};
// The run's tokenizer: --tokenizer, else the model directory's, else the bundled one (checksums
// verified where listed); refused when it has more tokens than the model's vocabulary.
struct RunTokenizer {
  std::string dir;
  Tokenizer tokenizer;
};
StatusOr<RunTokenizer> LoadRunTokenizer(const Gemma4Config& config, const std::string& model_id,
                                        const std::string& tokenizer_flag,
                                        const std::string& data_dir);
// A split of the data set (dataset.path "" = the bundled one) tokenized with `tokenizer`.
StatusOr<InstructionData> LoadInstructionData(const RunTokenizer& tokenizer, DatasetOptions dataset,
                                              int64_t max_seq_len, const std::string& data_dir,
                                              const TextOptions& text = {});
// Both: the tokenizer, then the split.
StatusOr<InstructionData> LoadInstructionData(const Gemma4Config& config,
                                              const std::string& model_id,
                                              const std::string& tokenizer_flag,
                                              DatasetOptions dataset, int64_t max_seq_len,
                                              const std::string& data_dir,
                                              const TextOptions& text = {});

// The text and batching options of a run's flags (checked by ValidateFinetuneOptions). A
// preference run's rows hold pairs: twice --max-seq-len tokens.
TextOptions TextOf(const FinetuneOptions& options);
BatchingOptions BatchingOf(const FinetuneOptions& options, int32_t pad_id);
// The objective flags of a run (each objective's defaults resolved).
ObjectiveOptions ObjectiveOf(const FinetuneOptions& options);
GrpoOptions GrpoOf(const FinetuneOptions& options);
// A GRPO run with a KL term (--beta > 0) whose trained tensors themselves move (full fine-tuning,
// --modules-to-save): each worker keeps a copy of its starting fp32 shard as the reference.
bool GrpoKeepsReferenceShards(const FinetuneOptions& options);

// The data set of a run's flags: --dataset, --dataset-split and the field names.
DatasetOptions DatasetOf(const FinetuneOptions& options);

// Flag checks that need no files: the CLI runs them before starting workers, RunFinetune again.
Status ValidateFinetuneOptions(const FinetuneOptions& options);

// Runs the job as `rank` of `pg` (every rank calls it with the same options). Every rank gathers
// its step metrics to all (one small all_gather per step); `observer` (rank 0's, may be null)
// gets the run, each step and each epoch.
Status RunFinetune(const FinetuneOptions& options, comm::ProcessGroup& pg,
                   const comm::CollectiveOptions& collective, TrainingObserver* observer = nullptr);

// The options as JSON (the run's flags on the dashboard and in run.json).
nlohmann::json FinetuneOptionsJson(const FinetuneOptions& options);

}  // namespace st

// `slicetrain evaluate`: the loss and perplexity of a model (a checkpoint directory or a preset) on
// an instruction data set, with the same tokenization, template and loss as `finetune`. One
// process; how a user checks a checkpoint.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "data/hub_dataset.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "kernels/cpu/cpu_features.h"
#include "model/frozen_weights.h"
#include "model/gemma4.h"
#include "model/vision/image_encoder.h"
#include "train/objectives/preference_step.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace st::cli {

namespace {

DatasetOptions WithSplit(const std::string& split) {
  DatasetOptions d;
  d.split = split;
  return d;
}

struct EvaluateArgs {
  std::string model_id, adapter, tokenizer, data_dir, dataset_revision;
  DatasetOptions dataset = WithSplit("train[:1024]");
  int64_t max_seq_len = 64, batch_size = 8;
  std::string chat_template = "auto", train_on = "auto";
  bool json = false;
  int threads = 0;                 // 0 = OMP_NUM_THREADS, else the usable CPUs
  std::string precision = "auto";  // --precision, resolved by cpu::ResolvePrecision
  ObjectiveOptions objective;      // --objective dpo | orpo: the preference loss on pairs
};

// The preference objective's loss and metrics over every pair (batches of --batch-size pairs,
// each pair a row; the reference of DPO is the model with the adapter off).
Status RunPreference(const EvaluateArgs& a, const InstructionData& data, Gemma4Engine& engine,
                     const ParamTable& table, FrozenWeights& frozen, Precision precision) {
  ST_ASSIGN_OR_RETURN(std::unique_ptr<Objective> objective, MakeObjective(a.objective));
  if (objective->needs_reference() && a.adapter.empty())
    return InvalidArgument(
        "evaluate --objective dpo needs --adapter: its reference is --model-id with the adapter "
        "off (as the run trained it)");
  const PreferenceSet& set = data.pairs;
  std::vector<int64_t> order(static_cast<size_t>(set.size()));
  for (int64_t i = 0; i < set.size(); ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return set.pairs.length(x) > set.pairs.length(y); });
  std::vector<StepRows> plan;
  for (int64_t start = 0; start < set.size(); start += a.batch_size) {
    StepRows rows;
    for (int64_t i = start; i < std::min(set.size(), start + a.batch_size); ++i)
      rows.push_back({order[static_cast<size_t>(i)]});
    plan.push_back(std::move(rows));
  }
  BatchingOptions b;
  b.max_seq_len = 2 * a.max_seq_len;
  b.pad_id = data.pad_id;
  const PairForward forward = [&](const Batch& batch) {
    engine.Forward(table, batch, &frozen);
    return Status::Ok();
  };
  ST_ASSIGN_OR_RETURN(const std::vector<double> sums,
                      EvaluatePairs(engine, forward, *objective, set, plan, b, nullptr, {}));
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  const std::vector<std::string>& names = objective->metric_names();
  if (a.json) {
    nlohmann::json j = {{"objective", a.objective.objective},
                        {"loss", sums[0]},
                        {"pairs", set.size()},
                        {"dropped", set.dropped},
                        {"peak_rss_mib", peak_mib},
                        {"precision", PrecisionName(precision)}};
    for (size_t i = 1; i < names.size(); ++i) j[names[i]] = sums[i];
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string line = StrCat(a.objective.objective, " loss=", sums[0]);
    for (size_t i = 1; i < names.size(); ++i) line += StrCat(" ", names[i], "=", sums[i]);
    std::printf("%s pairs=%lld dropped=%lld peak_rss=%.0fMiB precision=%s\n", line.c_str(),
                (long long)set.size(), (long long)set.dropped, peak_mib, PrecisionName(precision));
  }
  return Status::Ok();
}

Status Run(const EvaluateArgs& a) {
  if (a.max_seq_len < 2 || a.batch_size < 1)
    return InvalidArgument("--max-seq-len must be >= 2 and --batch-size >= 1");
  ST_RETURN_IF_ERROR(ValidateObjectiveOptions(a.objective));
  const bool pairs = a.objective.objective != "sft";
  ST_ASSIGN_OR_RETURN(std::string model_id, ResolveModelSource(a.model_id, HubFromEnvironment()));
  ST_ASSIGN_OR_RETURN(DatasetSource src,
                      ResolveDatasetSource(a.dataset.path, a.dataset.config, a.dataset_revision,
                                           a.dataset.split, HubFromEnvironment()));
  DatasetOptions dataset = a.dataset;
  dataset.path = src.path, dataset.split = src.split, dataset.config = src.config;
  ST_RETURN_IF_ERROR(SetProcessThreads(a.threads));
  std::error_code ec;
  ST_ASSIGN_OR_RETURN(
      const std::string data_dir,
      BundledDataDir(a.data_dir,
                     a.dataset.path.empty() ||
                         (a.tokenizer.empty() && !std::filesystem::is_directory(model_id, ec))));
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModelWithAdapter(model_id, a.adapter));
  // Forward only: one layer's activations at a time, the loss in tiles.
  EngineOptions forward_only;
  forward_only.training = false;
  ST_ASSIGN_OR_RETURN(forward_only.precision, cpu::ResolvePrecision(a.precision));
  forward_only.lora = m.lora;
  const int64_t row_len = pairs ? 2 * a.max_seq_len : a.max_seq_len;
  ST_RETURN_IF_ERROR(CheckActivationMemory(m.config, a.batch_size, row_len, forward_only));
  // A model with a vision tower reads image parts: the processor counts each image's soft
  // tokens for the template, and each batch's images run through the tower (with the adapter's
  // tower adapters, if it has any).
  std::unique_ptr<vision::ImageEncoder> encoder;
  if (std::filesystem::is_directory(model_id, ec)) {
    auto loaded = vision::ImageEncoder::Load(model_id);
    if (loaded.ok()) {
      encoder = std::move(*loaded);
      if (!a.adapter.empty()) encoder->UseAdapter(a.adapter);
    } else if (loaded.status().code() != StatusCode::kNotFound)
      return loaded.status();
  }
  TextOptions text;
  text.preference = pairs;
  if (encoder) text.images = encoder->Tokens();
  ST_ASSIGN_OR_RETURN(text.kind, ParseTemplateKind(a.chat_template));
  ST_ASSIGN_OR_RETURN(text.train_on, ParseTrainOn(a.train_on));
  ST_ASSIGN_OR_RETURN(
      InstructionData data,
      LoadInstructionData(m.config, model_id, a.tokenizer, dataset, a.max_seq_len, data_dir, text));
  Gemma4Engine engine(m.config, a.batch_size, row_len, forward_only);
  // Nothing is trained: every tensor is served as FrozenWeights serves frozen ones (the lookup
  // table's rows from the mapped files, each layer converted when the engine enters it).
  FrozenWeights frozen(m.registry, *m.weights,
                       std::vector<bool>(static_cast<size_t>(m.registry.layout.size()), true));
  ParamTable table;
  table.param.assign(m.registry.layout.size(), nullptr);
  table.grad.assign(m.registry.layout.size(), nullptr);
  frozen.Bind(&table);
  if (pairs) return RunPreference(a, data, engine, table, frozen, forward_only.precision);
  const TokenizedSet& set = data.examples;
  // Batches of similar lengths, each padded to its longest (the loss is a sum over targets, so
  // the order does not change it).
  std::vector<int64_t> order(static_cast<size_t>(set.size()));
  for (int64_t i = 0; i < set.size(); ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return set.length(x) > set.length(y); });
  double loss_sum = 0;
  int64_t tokens = 0;
  // Progress on stderr, a line per tenth, when the run is long enough to need it.
  const int64_t batches = (set.size() + a.batch_size - 1) / a.batch_size;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t done = 0, next_report = std::max<int64_t>(1, batches / 10);
  for (int64_t start = 0; start < set.size(); start += a.batch_size) {
    std::vector<int64_t> rows;
    for (int64_t i = start; i < std::min(set.size(), start + a.batch_size); ++i)
      rows.push_back(order[static_cast<size_t>(i)]);
    const int64_t longest = set.length(rows.front());
    TokenBatch tb = Collate(set, rows, data.pad_id, false,
                            std::min(a.max_seq_len, std::max<int64_t>(8, (longest + 7) / 8 * 8)));
    ST_RETURN_IF_ERROR(EncodeImages(encoder.get(), tb));
    ForwardResult r = engine.Forward(table, BatchOf(tb), &frozen);
    loss_sum += r.loss_sum;
    tokens += r.num_valid;
    ++done;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (done == next_report && done < batches && s > 10) {
      std::fprintf(stderr, "evaluate: %lld/%lld batches, %.0f s, about %.0f s left\n",
                   (long long)done, (long long)batches, s, s / done * (batches - done));
      next_report += std::max<int64_t>(1, batches / 10);
    } else if (done == next_report) {
      next_report += std::max<int64_t>(1, batches / 10);
    }
  }
  if (tokens == 0) return InvalidArgument("the data set has no tokens to evaluate");
  const double loss = loss_sum / static_cast<double>(tokens);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  if (a.json)
    std::printf(
        "{\"loss\": %.6f, \"perplexity\": %.6f, \"tokens\": %lld, \"examples\": %lld, "
        "\"peak_rss_mib\": %.1f, \"precision\": \"%s\"}\n",
        loss, std::exp(loss), (long long)tokens, (long long)set.size(), peak_mib,
        PrecisionName(forward_only.precision));
  else
    std::printf("loss=%.4f perplexity=%.4f tokens=%lld peak_rss=%.0fMiB precision=%s\n", loss,
                std::exp(loss), (long long)tokens, peak_mib, PrecisionName(forward_only.precision));
  return Status::Ok();
}

}  // namespace

void RegisterEvaluateCommand(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<EvaluateArgs>();
  auto* cmd = app.add_subcommand("evaluate", "Loss and perplexity of a checkpoint on a data set");
  cmd->add_option("--model-id", a->model_id,
                  "Checkpoint / HF model directory, a gemma4 GGUF file, or a preset")
      ->required();
  cmd->add_option("--adapter", a->adapter,
                  "PEFT LoRA adapter directory (a --lora-rank checkpoint, or one PEFT saved) "
                  "applied to --model-id");
  cmd->add_option(
      "--tokenizer", a->tokenizer,
      "tokenizer.json, a directory, or a GGUF file's vocabulary (default: the model's)");
  cmd->add_option("--dataset", a->dataset.path,
                  "Instruction data set: hub id, data file, glob or directory (default: bundled)");
  cmd->add_option("--dataset-split", a->dataset.split, "HF split syntax")->capture_default_str();
  AddDatasetFieldOptions(cmd, &a->dataset.instruction_field, &a->dataset.context_field,
                         &a->dataset.response_field, &a->dataset.messages_field,
                         &a->dataset.json_field, &a->dataset.config, &a->dataset_revision,
                         &a->dataset.images_field);
  cmd->add_option("--max-seq-len", a->max_seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--template", a->chat_template,
                  "How records become text: auto (gemma-chat when the tokenizer has Gemma 4's "
                  "turn tokens), instruction, gemma-chat, none; use the run's")
      ->capture_default_str();
  cmd->add_option("--train-on", a->train_on,
                  "Tokens the loss covers: auto (responses with gemma-chat, else all), "
                  "responses, all; use the run's")
      ->capture_default_str();
  cmd->add_option("--batch-size", a->batch_size, "Sequences per forward pass")
      ->capture_default_str();
  AddDataDirOption(cmd, &a->data_dir);
  cmd->add_option("--threads", a->threads,
                  "Compute threads (default: $OMP_NUM_THREADS, else the CPUs this process may "
                  "use, from its affinity mask and cgroup quota)");
  cmd->add_option("--precision", a->precision,
                  "auto, bf16 or fp32: the matmuls' operands (auto: bf16 where its products are "
                  "the faster; a checkpoint trained in either evaluates in either)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON object");
  auto* pref =
      cmd->add_option_group("Preference objective", "the loss on prompt/chosen/rejected pairs");
  pref->add_option("--objective", a->objective.objective,
                   "sft (the mean token loss), dpo (needs --adapter: the reference is --model-id "
                   "with the adapter off) or orpo; with dpo/orpo --dataset holds preference pairs "
                   "and --max-seq-len applies to each side")
      ->capture_default_str();
  pref->add_option("--beta", a->objective.beta, "DPO's beta; ORPO's lambda")->capture_default_str();
  pref->add_option("--loss-type", a->objective.loss_type,
                   "DPO's loss: sigmoid, hinge, ipo or robust")
      ->capture_default_str();
  pref->add_option("--label-smoothing", a->objective.label_smoothing,
                   "robust DPO: the probability that a preference is flipped")
      ->capture_default_str();
  cmd->callback([&ctx, a] {
    Status st = Run(*a);
    if (!st.ok()) ctx.exit_code = ReportError("evaluate", st);
  });
}

}  // namespace st::cli

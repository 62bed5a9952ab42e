// `slicetrain generate` and `slicetrain chat`: text from a model (a checkpoint, a Hugging Face
// model directory or a preset, with an optional PEFT adapter) through the KV-cached decoder.
// generate answers prompts given as flags or a file; chat keeps one conversation on stdin.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "io/files.h"
#include "kernels/cpu/cpu_features.h"
#include "train/generation.h"

namespace st::cli {

namespace {

struct GenerateArgs {
  std::string model_id, adapter, tokenizer, data_dir, prompts_file, system, chat_template = "auto";
  std::vector<std::string> prompts;
  std::vector<std::string> images;  // shown before each prompt (chat: before the first turn)
  std::string prompt_ids;
  std::string weights_dtype = "auto";
  std::string precision = "fp32";
  GenerateOptions gen;
  int64_t max_seq_len = 0;  // 0: 4096, or the model's positions when fewer
  bool json = false;
  int threads = 0;
};

void AddModelAndSamplingOptions(CLI::App* cmd, GenerateArgs* a) {
  cmd->add_option("--model-id", a->model_id,
                  "Checkpoint / HF model directory, hub id, a gemma4 GGUF file (its quantized "
                  "matrices decoded as stored, its vocabulary the default tokenizer) or preset")
      ->required();
  cmd->add_option("--adapter", a->adapter,
                  "PEFT LoRA adapter directory (a --lora-rank checkpoint, or one PEFT saved), "
                  "merged into --model-id's weights");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "tokenizer.json, a directory, or a GGUF file's vocabulary (default: the model's, "
                  "else the bundled one)");
  cmd->add_option("--template", a->chat_template,
                  "How a prompt is rendered: auto (gemma-chat when the tokenizer has Gemma 4's "
                  "turn tokens, else instruction), gemma-chat, instruction, none")
      ->capture_default_str();
  cmd->add_option("--system", a->system, "A system turn before the first prompt");
  cmd->add_option("--max-new-tokens", a->gen.max_new_tokens, "Tokens to generate at most")
      ->capture_default_str();
  cmd->add_option("--temperature", a->gen.sampling.temperature,
                  "Sampling temperature; 0 = greedy (the most likely token)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->gen.sampling.top_k,
                  "Sample among the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option("--top-p", a->gen.sampling.top_p,
                  "Sample among the most likely tokens whose probability reaches p (1 = all)")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", a->gen.sampling.repetition_penalty,
                  "Divide the logits of tokens already in the sequence (CTRL; 1 = off)")
      ->capture_default_str();
  cmd->add_option("--seed", a->gen.sampling.seed, "Seed of the sampling draws")
      ->capture_default_str();
  cmd->add_option("--max-seq-len", a->max_seq_len,
                  "Tokens the KV cache holds (prompt, answers and, in chat, the conversation); "
                  "default 4096, or the model's max_position_embeddings when smaller");
  cmd->add_option("--weights-dtype", a->weights_dtype,
                  "How the weight matrices are held: auto (bf16 for a bf16 checkpoint without "
                  "--adapter, else fp32), fp32, bf16 (half the memory and bytes per token; "
                  "arithmetic is fp32 either way), q8_0 or q4_0 (ggml's 8- and 4-bit blocks, "
                  "quantized on load: 1.9x and 3.6x fewer bytes than bf16), q4_k_m "
                  "(llama-quantize's Q4_K_M mixture of 4- and 6-bit super-blocks, as export "
                  "--quant q4_k_m writes it); the quantized ones are multiplied as llama.cpp "
                  "does, the activations rounded to int8 blocks")
      ->capture_default_str();
  cmd->add_option("--precision", a->precision,
                  "fp32, bf16 or auto: the prompt's matrix products (bf16: activations rounded "
                  "to bf16, bf16 weights multiplied as stored, fp32 accumulation; auto: bf16 where "
                  "its products are the faster). One-token steps are the same in either")
      ->capture_default_str();
  AddDataDirOption(cmd, &a->data_dir);
  cmd->add_option("--threads", a->threads,
                  "Compute threads (default: $OMP_NUM_THREADS, else the CPUs this process may "
                  "use)");
}

StatusOr<std::unique_ptr<TextGenerator>> LoadGenerator(const GenerateArgs& a) {
  if (a.max_seq_len != 0 && a.max_seq_len < 2) return InvalidArgument("--max-seq-len must be >= 2");
  ST_RETURN_IF_ERROR(a.gen.sampling.Validate());
  if (a.gen.max_new_tokens < 1)
    return InvalidArgument(StrCat("--max-new-tokens must be >= 1, got ", a.gen.max_new_tokens));
  ST_ASSIGN_OR_RETURN(TemplateKind kind, ParseTemplateKind(a.chat_template));
  ST_ASSIGN_OR_RETURN(std::string model_id, ResolveModelSource(a.model_id, HubFromEnvironment()));
  ST_RETURN_IF_ERROR(SetProcessThreads(a.threads));
  ST_ASSIGN_OR_RETURN(const Precision precision, cpu::ResolvePrecision(a.precision));
  ST_ASSIGN_OR_RETURN(const std::string data_dir, BundledDataDir(a.data_dir, a.tokenizer.empty()));
  ST_ASSIGN_OR_RETURN(std::unique_ptr<TextGenerator> g,
                      TextGenerator::Load(model_id, a.adapter, a.tokenizer, data_dir, kind,
                                          a.max_seq_len, 42, a.weights_dtype));
  g->precision = precision;
  return g;
}

StatusOr<std::vector<int32_t>> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  std::istringstream in(s);
  std::string tok;
  while (std::getline(in, tok, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || end == tok.c_str() || *end != '\0' || v < 0 || v > INT32_MAX)
      return InvalidArgument("--prompt-ids takes comma-separated token ids, got '" + s + "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgument("--prompt-ids is empty");
  return ids;
}

void PrintStats(const Generation& g) {
  std::fprintf(stderr,
               "[%zu new tokens (%s); prompt %lld tokens in %.2f s; %.1f tokens/s decoding]\n",
               g.ids.size(), g.stop.c_str(), (long long)g.prompt_tokens, g.prefill_s,
               g.DecodeTokensPerSecond());
}

nlohmann::json ToJson(const Generation& g) {
  return {{"completion", g.text},
          {"token_ids", g.ids},
          {"prompt_tokens", g.prompt_tokens},
          {"new_tokens", g.ids.size()},
          {"stop", g.stop},
          {"prefill_s", g.prefill_s},
          {"decode_s", g.decode_s},
          {"decode_tokens_per_s", g.DecodeTokensPerSecond()}};
}

Status RunGenerate(GenerateArgs a) {
  const int sources = (a.prompts.empty() ? 0 : 1) + (a.prompts_file.empty() ? 0 : 1) +
                      (a.prompt_ids.empty() ? 0 : 1);
  if (sources != 1)
    return InvalidArgument(
        "give the prompts one way: --prompt TEXT, --prompts FILE or --prompt-ids");
  // Each prompt's own images (a --prompts file's "images"), shown after --image's.
  std::vector<std::vector<std::string>> prompt_images(a.prompts.size());
  if (!a.prompts_file.empty()) {
    ST_ASSIGN_OR_RETURN(const std::vector<PromptLine> lines, ReadPromptFile(a.prompts_file));
    for (const PromptLine& l : lines) {
      a.prompts.push_back(l.text);
      prompt_images.push_back(l.images);
    }
  }
  std::vector<int32_t> ids;
  if (!a.prompt_ids.empty()) {
    ST_ASSIGN_OR_RETURN(ids, ParseIds(a.prompt_ids));
  }
  ST_ASSIGN_OR_RETURN(std::unique_ptr<TextGenerator> g, LoadGenerator(a));
  Conversation conv(*g, g->capacity);
  auto stream = [&](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  std::function<void(std::string_view)> on_text;
  if (!a.json) on_text = stream;
  const size_t n = ids.empty() ? a.prompts.size() : 1;
  if (!a.images.empty() && !ids.empty())
    return InvalidArgument("--image goes with --prompt or --prompts, not --prompt-ids");
  for (size_t i = 0; i < n; ++i) {
    conv.Reset();
    std::vector<std::string> paths = a.images;
    if (ids.empty()) paths.insert(paths.end(), prompt_images[i].begin(), prompt_images[i].end());
    const std::vector<ImageRef> images = ImageRefsOf(paths);
    StatusOr<Generation> r = ids.empty()
                                 ? conv.Reply(a.prompts[i], a.system, a.gen, on_text, images)
                                 : conv.Continue(ids, a.gen, on_text);
    if (!r.ok()) return r.status().WithContext(n > 1 ? StrCat("prompt ", i + 1) : "");
    if (a.json) {
      nlohmann::json j = ToJson(*r);
      // At the middle of the answer's context.
      const double flops =
          DecodeFlopsPerToken(g->model.config, g->model.registry,
                              r->prompt_tokens + static_cast<int64_t>(r->ids.size()) / 2);
      j["decode_gflop_per_s"] = r->DecodeTokensPerSecond() * flops / 1e9;
      if (ids.empty()) j["prompt"] = a.prompts[i];
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("\n");
      std::fflush(stdout);  // the answer's end before the figures on stderr
      PrintStats(*r);
    }
    std::fflush(stdout);
  }
  return Status::Ok();
}

Status RunChat(const GenerateArgs& a) {
  ST_ASSIGN_OR_RETURN(std::unique_ptr<TextGenerator> g, LoadGenerator(a));
  Conversation conv(*g, g->capacity);
  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty)
    std::fprintf(stderr,
                 "Chatting with %s (%s template). /reset starts over, /exit or Ctrl-D ends.\n",
                 g->model.source.c_str(), TemplateKindName(g->renderer->kind()));
  std::string line;
  bool first = true;
  std::vector<ImageRef> images = ImageRefsOf(a.images);  // shown with the next user turn
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      conv.Reset();
      first = true;
      images.clear();
      if (tty) std::fprintf(stderr, "(new conversation)\n");
      continue;
    }
    if (line.rfind("/image ", 0) == 0) {
      images.push_back(ImageRefsOf({line.substr(7)}).front());
      if (tty) std::fprintf(stderr, "(image %zu goes with your next message)\n", images.size());
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    StatusOr<Generation> r = conv.Reply(
        line, first ? a.system : "", a.gen,
        [](std::string_view piece) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        },
        images);
    images.clear();
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kResourceExhausted) return r.status();
      // The conversation no longer fits: say so and start a new one.
      std::fprintf(stderr, "slicetrain chat: %s; starting a new conversation\n",
                   r.status().message().c_str());
      conv.Reset();
      first = true;
      continue;
    }
    first = false;
    std::printf("\n");
    std::fflush(stdout);
    if (tty) PrintStats(*r);
  }
  return Status::Ok();
}

}  // namespace

void RegisterGenerateCommand(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand(
      "generate", "Generate text from a model (KV-cached decoding, greedy or sampled)");
  AddModelAndSamplingOptions(cmd, a.get());
  cmd->add_option("--prompt", a->prompts, "A prompt (repeat for several)");
  cmd->add_option("--prompts", a->prompts_file,
                  "A file of prompts: one per line, or JSON lines with \"prompt\" (or "
                  "\"instruction\" and \"context\")");
  cmd->add_option("--image", a->images,
                  "An image file (JPEG, PNG, WebP) shown before each prompt; repeat for several "
                  "(a model with a vision tower)");
  cmd->add_option("--prompt-ids", a->prompt_ids,
                  "Comma-separated token ids fed as they are (no template)");
  cmd->add_flag("--no-kv-cache", a->gen.no_cache,
                "Recompute the whole sequence for every token (slow; for comparison)");
  cmd->add_flag("--json", a->json, "Print one JSON object per prompt instead of streaming text");
  cmd->callback([&ctx, a] {
    Status st = RunGenerate(*a);
    if (!st.ok()) ctx.exit_code = ReportError("generate", st);
  });

  auto c = std::make_shared<GenerateArgs>();
  auto* chat = app.add_subcommand(
      "chat", "Talk to a model: one conversation on stdin, answers streamed to stdout");
  AddModelAndSamplingOptions(chat, c.get());
  chat->add_option("--image", c->images,
                   "An image file shown with the first message; repeat for several (later ones: "
                   "a line '/image PATH' attaches one to the next message)");
  chat->callback([&ctx, c] {
    Status st = RunChat(*c);
    if (!st.ok()) ctx.exit_code = ReportError("chat", st);
  });
}

}  // namespace st::cli

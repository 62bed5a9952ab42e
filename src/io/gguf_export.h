// A Gemma 4 model (a checkpoint, a preset, or a base with a LoRA adapter merged in) as one GGUF
// file that llama.cpp, Ollama and LM Studio load: llama.cpp's `gemma4` architecture with the
// hyperparameters, tensor names and layouts its loader (src/models/gemma4.cpp) expects and its
// converter (convert_hf_to_gguf.py, conversion/gemma.py) writes, the tokenizer (tokens, scores,
// token types, merges, special ids) and a chat template. docs/gguf.md lists every key and name.
//
// Streamed: tensors are read, converted and written a chunk of rows at a time, so memory stays
// bounded by a chunk whatever the model's size. Before the file is renamed into place, it is
// reopened and every tensor checked against the model's values (the conversion's error within its
// format's bound, no NaN or infinity); a failed check leaves no file behind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_loader.h"
#include "kernels/cpu/quant.h"

namespace st {

// The tokenizer as GGUF stores it (llama.cpp's `gemma4` tokenizer model: BPE over tokenizer.json's
// vocabulary and merges, with byte fallback).
struct GgufVocab {
  std::vector<std::string> tokens;  // by id, padded to the model's vocab_size with "[PAD<id>]"
  std::vector<int32_t> types;  // llama_token_type: 1 normal, 3 control, 4 user, 5 unused, 6 byte
  std::vector<std::string> merges;  // "left right"
  int64_t padding_tokens = 0;       // "[PAD<id>]" entries after the tokenizer's own
  // Special ids (-1: none) and the flags tokenizer_config.json sets.
  int64_t bos = -1, eos = -1, unk = -1, pad = -1, mask = -1;
  bool has_add_eos = false, add_eos = false;
  std::string chat_template;  // "" when none is known
  std::string chat_template_source;
  // Tokens that join a newline with other text ("s.\nResponse:"). llama.cpp's gemma4 tokenizer
  // splits text at newlines before merging, so it never produces them and tokenizes text around
  // newlines differently from the tokenizer.json (Gemma 4's own vocabulary has none).
  int64_t newline_joining_tokens = 0;
};

// Reads tokenizer.json, tokenizer_config.json and chat_template.jinja from `dir` for a model of
// `vocab_size` rows. Gemma-style BPE with byte fallback only (what llama.cpp's gemma4 tokenizer
// reads); a tokenizer with more tokens than the model has rows is refused. Without a chat template
// in the files, a tokenizer with Gemma 4's turn markers gets slicetrain's gemma-chat template.
StatusOr<GgufVocab> ReadGgufVocab(const std::string& dir, int64_t vocab_size);

// The GGUF tensor name of a registry name ("layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight"), or "" for a tensor llama.cpp's gemma4 has no place for.
std::string GgufTensorName(const std::string& registry_name);

// OK when llama.cpp's gemma4 shares the KV caches of this model's KV-shared layers as
// transformers does (it takes them from fixed layers: true of Gemma 4 E2B and E4B, not of every
// layout); otherwise one line saying which layer llama.cpp would get wrong.
Status CheckLlamaCppKvSharing(const Gemma4Config& cfg);

// What --quant asks for: one type for every matrix, or llama-quantize's Q4_K_M mixture.
struct GgufQuant {
  GgmlType type = GgmlType::kBF16;  // the matrices' type (the mixture's main one: Q4_K)
  bool q4_k_m = false;              // per tensor as llama-quantize's Q4_K_M (docs/gguf.md)
};

// The type each matrix of `reg` (its base entries, by registry entry; num_layers of them) is
// stored in for `quant`: a row that is not whole blocks falls back as llama.cpp does, and q4_k_m
// is llama-quantize's choice per matrix (docs/gguf.md). kF32 for vectors and the entries after the
// base ones. `generate --weights-dtype` holds the decoder's matrices in the same types.
std::vector<GgmlType> GgufMatrixTypes(const ParamRegistry& reg, int64_t num_layers,
                                      const GgufQuant& quant);

// --quant: f32, f16, bf16, q8_0, q6_k, q4_0 or q4_k_m (the other K-quant mixtures are refused
// with what to use instead).
StatusOr<GgufQuant> ParseGgufQuant(const std::string& name);

struct GgufExportOptions {
  std::string output;                      // the .gguf file (must not exist)
  GgmlType weight_type = GgmlType::kBF16;  // of the matrices; vectors stay F32
  // llama-quantize's Q4_K_M choice per matrix instead (weight_type must be Q4_K; not for LoRA).
  bool q4_k_m = false;
  std::string tokenizer_dir;  // tokenizer.json's directory
  std::string name;           // general.name
  bool progress = true;       // a line on stderr every 10 s
};

struct GgufExportReport {
  int64_t tensors = 0;
  int64_t parameters = 0;
  uint64_t file_bytes = 0;
  std::vector<std::pair<GgmlType, int64_t>> tensors_per_type;
  GgufVocab vocab;
  // The check after reload: the largest RMS error relative to a tensor's RMS, and where.
  double worst_relative_rms_error = 0;
  std::string worst_tensor;
  double seconds = 0;
};

// Writes the model as a GGUF file (through a temporary file renamed into place only after the
// check passed).
StatusOr<GgufExportReport> ExportGguf(const LoadedModel& model, const GgufExportOptions& options);

// The LoRA adapter attached to `model` alone, as llama.cpp's LoRA GGUF (general.type "adapter",
// adapter.type "lora", adapter.lora.alpha, and per adapted matrix "<name>.lora_a" [in, R] and
// "<name>.lora_b" [R, out] in GGUF's dims): what llama.cpp's convert_lora_to_gguf.py writes, for
// `llama-cli -m base.gguf --lora adapter.gguf`. Written and checked as ExportGguf does; an adapter
// llama.cpp cannot apply whole is refused: modules_to_save (full tensors), or a pair on
// per_layer_model_projection (llama.cpp's gemma4 multiplies by it without its LoRA hook).
StatusOr<GgufExportReport> ExportGgufLora(const LoadedModel& model,
                                          const GgufExportOptions& options);

// An Ollama Modelfile for `gguf_file` (a path relative to the Modelfile's directory): FROM, the
// chat template in Go template syntax and the stop tokens of Gemma 4's chat format.
std::string OllamaModelfile(const std::string& gguf_file, const GgufVocab& vocab);

}  // namespace st

// Bad input is a one-line error and a non-zero exit, never a crash, a hang or a silent success
// (docs/reliability.md, "Bad input"). A table of command lines runs the real binary over the
// corpus of broken files in tests/bad_inputs/ (each named for what is wrong with it), plus a few
// generated ones (a huge line, a model directory with one file replaced, a full disk), and checks
// the exit code, that exactly one line says "error:" and names the problem, and that no sanitizer,
// assertion or internal-error text appears.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/hf_model.h"
#include "model/config.h"
#include "model/params.h"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using test::Ran;
using test::RunCommand;

void Replace(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s->find(from, at)) != std::string::npos; at += to.size())
    s->replace(at, from.size(), to);
}

// One bad input. In `cmd`, {bin} is the binary, {src} the source tree, {bad} tests/bad_inputs,
// {tmp} the test's scratch directory, {model} a valid gemma4-tiny model directory in which
// `model_file` (when set) is replaced by {bad}/`broken`, and {ft} a short single-worker finetune.
struct Case {
  const char* name;
  const char* cmd;
  int code;             // the expected exit code (1 or 2)
  const char* message;  // a substring of the error line
  const char* model_file = "";
  const char* broken = "";
};

constexpr const char* kEval =
    "{bin} evaluate --model-id {model} --tokenizer {src}/data/tokenizer --data-dir {src}/data "
    "--dataset-split 'train[:16]' --max-seq-len 32";

// gtest names a failing case by this (instead of a dump of its bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

const Case kCases[] = {
    // ---- data sets (finetune spawns one worker; evaluate reads in-process) ----
    {"dataset_invalid_utf8", "{ft} --dataset {bad}/dataset/invalid_utf8.jsonl", 2,
     "line 1 is not valid JSON (invalid UTF-8)"},
    {"dataset_not_json", "{ft} --dataset {bad}/dataset/not_json.jsonl", 2,
     "line 1 is not valid JSON"},
    {"dataset_truncated_record", "{ft} --dataset {bad}/dataset/truncated_record.jsonl", 2,
     "line 1 is not valid JSON"},
    {"dataset_missing_response", "{ft} --dataset {bad}/dataset/missing_response.jsonl", 2,
     "no record has Dolly's fields"},
    {"dataset_all_records_wrong_types",
     "{ft} --dataset {bad}/dataset/all_records_wrong_types.jsonl", 2, "is not a string"},
    {"dataset_empty", "{ft} --dataset {bad}/dataset/empty.jsonl", 2, "no record has"},
    {"dataset_only_blank_lines", "{ft} --dataset {bad}/dataset/only_blank_lines.jsonl", 2,
     "no record has"},
    {"dataset_array_not_closed", "{ft} --dataset {bad}/dataset/array_not_closed.json", 2,
     "the JSON array is not closed"},
    {"dataset_object_not_array", "{ft} --dataset {bad}/dataset/object_not_array.json", 2,
     "pass --dataset-field KEY"},
    {"dataset_records_are_numbers", "{ft} --dataset {bad}/dataset/records_are_numbers.json", 2,
     "line 1 is not a JSON object"},
    {"dataset_huge_line", "{ft} --dataset {tmp}/huge_line.jsonl", 2, "longer than 16 MiB"},
    {"dataset_parquet_truncated", "{ft} --dataset {bad}/dataset/truncated.parquet", 1,
     "not a Parquet file (no PAR1 magic; truncated or another format?)"},
    {"dataset_parquet_corrupt_page", "{ft} --dataset {bad}/dataset/corrupt_page.parquet", 1,
     "corrupt_page.parquet: row group 0, column instruction: page 0: corrupt page header"},
    {"dataset_parquet_not_parquet", "{ft} --dataset {bad}/dataset/not_parquet.parquet", 1,
     "not a Parquet file"},
    {"dataset_csv_unclosed_quote", "{ft} --dataset {bad}/dataset/unclosed_quote.csv", 2,
     "unclosed_quote.csv: line 2: unclosed quote"},
    {"dataset_csv_too_many_fields", "{ft} --dataset {bad}/dataset/too_many_fields.csv", 2,
     "line 3: 3 fields, the header has 2"},
    {"dataset_unknown_type", "{ft} --dataset {bad}/dataset/unknown_type.xml", 2,
     "unknown data file type '.xml'"},
    {"dataset_unknown_config",
     "{ft} --dataset {src}/tests/fixtures/datasets/hub/acme--instruct --dataset-config nope", 1,
     "no config 'nope' (the README defines: default, jsonl, csv)"},
    {"dataset_glob_matches_nothing", "{ft} --dataset '{bad}/dataset/*.arrow'", 1,
     "*.arrow: no file matches"},
    {"dataset_missing", "{ft} --dataset {bad}/dataset/no_such_file.jsonl", 1,
     "no such data set file"},
    {"dataset_bad_split",
     "{bin} finetune --dataset-split 'train[abc:]' --topology 1 --storage-path "
     "{tmp}/runs",
     2, "is not an integer"},
    {"evaluate_dataset_invalid_utf8", "{eval} --dataset {bad}/dataset/invalid_utf8.jsonl", 2,
     "(invalid UTF-8)", "config.json", ""},
    // ---- config.json of a model directory ----
    {"config_not_json", "{eval}", 2, "config.json is not valid JSON", "config.json",
     "config/not_json.json"},
    {"config_empty", "{eval}", 2, "not valid JSON", "config.json", "config/empty.json"},
    {"config_top_level_array", "{eval}", 2, "not a JSON object", "config.json",
     "config/top_level_array.json"},
    {"config_model_type_not_a_string", "{eval}", 2, "field 'model_type' has the wrong type",
     "config.json", "config/model_type_not_a_string.json"},
    {"config_unknown_model_type", "{eval}", 2, "'llama' is not a Gemma 4 model", "config.json",
     "config/unknown_model_type.json"},
    {"config_negative_layers", "{eval}", 2, "num_hidden_layers must be in [1, 1024], got -3",
     "config.json", "config/negative_layers.json"},
    {"config_zero_hidden_size", "{eval}", 2, "hidden_size must be in", "config.json",
     "config/zero_hidden_size.json"},
    {"config_hidden_size_is_a_string", "{eval}", 2, "field 'hidden_size' has the wrong type",
     "config.json", "config/hidden_size_is_a_string.json"},
    {"config_huge_vocab_and_hidden", "{eval}", 2, "parameters", "config.json",
     "config/huge_vocab_and_hidden.json"},
    {"config_layer_types_wrong_length", "{eval}", 2, "layer_types has 2 entries", "config.json",
     "config/layer_types_wrong_length.json"},
    {"config_per_layer_config_past_layer_types", "{eval}", 2, "layer_types has 2 entries",
     "config.json", "config/per_layer_config_past_layer_types.json"},
    {"config_heads_not_divisible", "{eval}", 2, "must be a multiple of the kv heads", "config.json",
     "config/heads_not_divisible.json"},
    {"config_gemma4_without_text_config", "{eval}", 2, "no text_config object", "config.json",
     "config/gemma4_without_text_config.json"},
    {"config_rms_norm_eps_nan_string", "{eval}", 2, "field 'rms_norm_eps' has the wrong type",
     "config.json", "config/rms_norm_eps_nan_string.json"},
    {"info_config_negative_layers", "{bin} info --model-id {model}", 2,
     "num_hidden_layers must be in", "config.json", "config/negative_layers.json"},
    {"info_config_huge_vocab_and_hidden", "{bin} info --model-id {model}", 2, "parameters",
     "config.json", "config/huge_vocab_and_hidden.json"},
    // ---- model.safetensors of a model directory ----
    {"safetensors_empty_file", "{eval}", 1, "shorter than the 8-byte header length",
     "model.safetensors", "safetensors/empty_file.safetensors"},
    {"safetensors_shorter_than_length_prefix", "{eval}", 1, "not a safetensors file",
     "model.safetensors", "safetensors/shorter_than_length_prefix.safetensors"},
    {"safetensors_header_length_past_end", "{eval}", 1, "runs past the end of the",
     "model.safetensors", "safetensors/header_length_past_end.safetensors"},
    {"safetensors_header_length_absurd", "{eval}", 1, "-byte limit", "model.safetensors",
     "safetensors/header_length_absurd.safetensors"},
    {"safetensors_header_not_json", "{eval}", 1, "header is not valid JSON", "model.safetensors",
     "safetensors/header_not_json.safetensors"},
    {"safetensors_header_is_array", "{eval}", 1, "header must be a JSON object",
     "model.safetensors", "safetensors/header_is_array.safetensors"},
    {"safetensors_offsets_past_end", "{eval}", 1, "run past the end of the data section",
     "model.safetensors", "safetensors/offsets_past_end.safetensors"},
    {"safetensors_truncated_data", "{eval}", 1, "truncated file?", "model.safetensors",
     "safetensors/truncated_data.safetensors"},
    {"safetensors_offsets_do_not_match_shape", "{eval}", 1, "span 8 bytes but F32 [4] needs 16",
     "model.safetensors", "safetensors/offsets_do_not_match_shape.safetensors"},
    {"safetensors_offsets_begin_after_end", "{eval}", 1, "has begin > end", "model.safetensors",
     "safetensors/offsets_begin_after_end.safetensors"},
    {"safetensors_negative_shape", "{eval}", 1, "shape dim is negative", "model.safetensors",
     "safetensors/negative_shape.safetensors"},
    {"safetensors_shape_overflows", "{eval}", 1, "more than 2^63 elements", "model.safetensors",
     "safetensors/shape_overflows.safetensors"},
    {"safetensors_unknown_dtype", "{eval}", 1, "unknown dtype \"Q4_K\"", "model.safetensors",
     "safetensors/unknown_dtype.safetensors"},
    {"safetensors_overlapping_tensors", "{eval}", 1, "overlap in the data section",
     "model.safetensors", "safetensors/overlapping_tensors.safetensors"},
    {"safetensors_duplicate_tensor_name", "{eval}", 1, "more than once", "model.safetensors",
     "safetensors/duplicate_tensor_name.safetensors"},
    {"safetensors_embedding_wrong_shape", "{eval}", 2, "model.embed_tokens.weight",
     "model.safetensors", "safetensors/embedding_wrong_shape.safetensors"},
    {"safetensors_no_tensors", "{eval}", 1, "no Gemma 4 text weights found", "model.safetensors",
     "safetensors/no_tensors.safetensors"},
    // ---- tokenizer.json ----
    {"tokenizer_not_json", "{bin} tokenize --tokenizer {bad}/tokenizer/not_json.json --text hi", 2,
     "not valid JSON"},
    {"tokenizer_empty", "{bin} tokenize --tokenizer {bad}/tokenizer/empty.json --text hi", 2,
     "not valid JSON"},
    {"tokenizer_no_model", "{bin} tokenize --tokenizer {bad}/tokenizer/no_model.json --text hi", 2,
     "has no 'model'"},
    {"tokenizer_unsupported_model_type",
     "{bin} tokenize --tokenizer {bad}/tokenizer/unsupported_model_type.json --text hi", 1,
     "'WordPiece' is not supported"},
    {"tokenizer_merge_of_unknown_token",
     "{bin} tokenize --tokenizer {bad}/tokenizer/merge_of_unknown_token.json --text hi", 2,
     "merge 0 uses a token missing from the vocabulary"},
    {"tokenizer_merge_result_not_in_vocab",
     "{bin} tokenize --tokenizer {bad}/tokenizer/merge_result_not_in_vocab.json --text hi", 2,
     "makes 'ba', missing from the vocabulary"},
    {"tokenizer_merge_not_a_pair",
     "{bin} tokenize --tokenizer {bad}/tokenizer/merge_not_a_pair.json --text hi", 2,
     "merge 0 is neither"},
    {"tokenizer_merge_wrong_type",
     "{bin} tokenize --tokenizer {bad}/tokenizer/merge_wrong_type.json --text hi", 2,
     "merge 0 is neither"},
    {"tokenizer_negative_token_id",
     "{bin} tokenize --tokenizer {bad}/tokenizer/negative_token_id.json --text hi", 2,
     "model.vocab['c'] is not a valid id"},
    {"tokenizer_huge_token_id",
     "{bin} tokenize --tokenizer {bad}/tokenizer/huge_token_id.json --text hi", 2,
     "model.vocab['c'] is not a valid id"},
    {"tokenizer_sparse_token_id",
     "{bin} tokenize --tokenizer {bad}/tokenizer/sparse_token_id.json --text hi", 2,
     "ids must be (nearly) dense"},
    {"tokenizer_duplicate_token_id",
     "{bin} tokenize --tokenizer {bad}/tokenizer/duplicate_token_id.json --text hi", 2,
     "gives id 4 to both"},
    {"tokenizer_token_id_is_a_string",
     "{bin} tokenize --tokenizer {bad}/tokenizer/token_id_is_a_string.json --text hi", 2,
     "model.vocab['c'] is not a valid id"},
    {"tokenizer_added_token_id_out_of_range",
     "{bin} tokenize --tokenizer {bad}/tokenizer/added_token_id_out_of_range.json --text hi", 2,
     "negative id"},
    {"tokenizer_special_id_outside_vocab",
     "{bin} tokenize --tokenizer {bad}/tokenizer/special_id_outside_vocab.json --text hi", 2,
     "outside the vocabulary"},
    {"tokenizer_model_type_not_a_string",
     "{bin} tokenize --tokenizer {bad}/tokenizer/model_type_not_a_string.json --text hi", 2,
     "unexpected JSON type"},
    {"tokenizer_vocab_not_an_object",
     "{bin} tokenize --tokenizer {bad}/tokenizer/vocab_not_an_object.json --text hi", 2,
     "model.vocab is missing or not an object"},
    {"tokenizer_unk_token_not_in_vocab",
     "{bin} tokenize --tokenizer {bad}/tokenizer/unk_token_not_in_vocab.json --text hi", 2,
     "unk_token '<nope>' is not in the vocabulary"},
    {"tokenizer_missing", "{bin} tokenize --tokenizer {bad}/tokenizer/no_such.json --text hi", 1,
     "no_such.json"},
    {"finetune_tokenizer_missing", "{ft} --tokenizer {bad}/tokenizer/no_such.json", 1,
     "--tokenizer " ST_SOURCE_DIR},
    {"finetune_tokenizer_merge_of_unknown_token",
     "{ft} --tokenizer {bad}/tokenizer/merge_of_unknown_token.json", 2,
     "merge 0 uses a token missing from the vocabulary"},
    // ---- topologies, world sizes, batch sizes ----
    {"topology_zero", "{bin} finetune --topology 0", 2, "has a zero dimension"},
    {"topology_zero_dim", "{bin} finetune --topology 3x0", 2, "has a zero dimension"},
    {"topology_not_a_shape", "{bin} finetune --topology banana", 2, "banana"},
    {"topology_huge", "{bin} finetune --topology 100000x100000", 2, "100000x100000"},
    {"topology_unknown_accelerator", "{bin} finetune --accelerator-type TPU-V1 --topology 2x2", 2,
     "TPU-V1"},
    {"num_workers_contradicts_topology", "{bin} finetune --topology 2 --num-workers 3", 2,
     "--num-workers 3"},
    {"batch_size_zero", "{ft} --batch-size-per-device 0", 2, "--batch-size-per-device"},
    {"batch_size_negative", "{ft} --batch-size-per-device -4", 2, "--batch-size-per-device"},
    // With max_length padding the partial batch is dropped, as the seed's DataLoader does;
    // dynamic padding and packing run it.
    {"batch_size_larger_than_data",
     "{ft} --batch-size-per-device 200 --packing off --padding max_length", 2,
     "too few for 1 workers x --batch-size-per-device 200"},
    {"lr_scheduler_unknown", "{ft} --lr-scheduler inverse_sqrt", 2,
     "--lr-scheduler must be constant, constant_with_warmup"},
    {"warmup_ratio_above_one", "{ft} --warmup-ratio 1.5", 2, "--warmup-ratio must be in [0, 1]"},
    {"min_lr_ratio_one", "{ft} --min-lr-ratio 1", 2, "--min-lr-ratio must be in [0, 1)"},
    {"max_steps_negative", "{ft} --max-steps -3", 2, "must not be negative"},
    {"wsd_longer_than_the_run", "{ft} --lr-scheduler wsd --warmup-steps 5 --decay-steps 10", 2,
     "--lr-scheduler wsd: warm-up (5) and decay (10) steps exceed the run's 8 optimizer steps"},
    {"eval_steps_without_split", "{ft} --eval-steps 5", 2, "need a held-out split: --eval-split"},
    {"eval_dataset_without_split", "{ft} --eval-dataset {src}/data/tiny_instruct/train.jsonl", 2,
     "--eval-dataset needs --eval-split"},
    {"eval_split_missing", "{ft} --eval-split validation", 2, "--eval-split validation"},
    {"template_unknown", "{ft} --template chatml", 2, "--template must be auto, instruction"},
    {"train_on_unknown", "{ft} --train-on prompts", 2, "--train-on must be auto, responses or all"},
    {"packing_unknown", "{ft} --packing=greedy", 2, "--packing must be truncate"},
    {"padding_unknown", "{ft} --padding shortest", 2, "--padding must be longest or max_length"},
    {"packing_with_padding", "{ft} --padding max_length", 2,
     "--padding and --group-by-length apply to unpacked rows: add --packing off"},
    {"template_late_system_turn", "{ft} --dataset {bad}/dataset/late_system_turn.jsonl", 2,
     "line 1: message 2 is a system turn"},
    {"max_seq_len_huge", "{ft} --max-seq-len 2000000000", 2, "GiB of activations"},
    {"batch_and_seq_len_too_big", "{ft} --batch-size-per-device 8 --max-seq-len 100000000", 2,
     "GiB of activations"},
    {"evaluate_max_seq_len_huge",
     "{bin} evaluate --model-id {model} --tokenizer {src}/data/tokenizer --data-dir {src}/data "
     "--max-seq-len 2000000000",
     2, "GiB of activations", "config.json", ""},
    {"evaluate_batch_size_huge", "{eval} --batch-size 100000000", 2, "GiB of activations",
     "config.json", ""},
    {"max_seq_len_one", "{ft} --max-seq-len 1", 2, "--max-seq-len"},
    {"num_epochs_zero", "{ft} --num-epochs 0", 2, "--num-epochs"},
    {"evaluate_batch_size_zero", "{eval} --batch-size 0", 2, "--batch-size >= 1", "config.json",
     ""},
    {"collectives_topology_zero", "{bin} collectives --accelerator-type CPU --topology 0", 2,
     "has a zero dimension"},
    {"collectives_tpu_shape_invalid", "{bin} collectives --topology 3x3", 2,
     "is not a valid TPU-V6E slice"},
    {"collectives_batch_size_zero",
     "{bin} collectives --accelerator-type CPU --topology 2 --batch-size 0", 2, "must be positive"},
    {"collectives_batch_size_huge",
     "{bin} collectives --accelerator-type CPU --topology 2 --batch-size 100000000000", 2,
     "GiB per worker"},
    {"collectives_hidden_dim_huge",
     "{bin} collectives --accelerator-type CPU --topology 2 --hidden-dim 1000000000", 2,
     "GiB per worker"},
    // ---- flags ----
    {"flag_unknown", "{bin} finetune --epochs 1", 2,
     "slicetrain finetune: error: The following arguments were not expected: 1 --epochs (see "
     "'slicetrain finetune --help')"},
    {"flag_not_a_number", "{bin} finetune --num-epochs three", 2, "--num-epochs = three"},
    {"flag_missing_value", "{bin} evaluate --model-id", 2, "--model-id"},
    {"flag_required_missing", "{bin} evaluate", 2, "--model-id is required"},
    // ---- model.safetensors.index.json of a sharded model directory ----
    {"index_names_a_missing_shard", "{eval}", 1,
     "names the weight file model-00002-of-00002.safetensors, which is not in the directory",
     "model.safetensors.index.json", "index/missing_shard.json"},
    {"index_not_json", "{eval}", 1, "not a valid safetensors index", "model.safetensors.index.json",
     "index/not_json.json"},
    {"index_shard_outside_the_directory", "{eval}", 1, "is not a plain file name",
     "model.safetensors.index.json", "index/shard_outside_dir.json"},
    {"index_tensor_not_in_its_shard", "{eval}", 1,
     "says model.safetensors holds model.layers.0.self_attn.q_proj.lora_A, but no weight file "
     "has it",
     "model.safetensors.index.json", "index/tensor_not_in_shard.json"},
    {"command_unknown", "{bin} fintune", 2, "unknown command 'fintune'; the commands are info"},
    {"command_missing", "{bin}", 2, "A subcommand is required"},
    // ---- storage ----
    {"storage_path_under_a_file", "{ft} --storage-path {tmp}/a_regular_file/runs", 1,
     "Not a directory"},
};

class BadInput : public testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/st_bad_inputs_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = new std::string(tmpl);
    // A valid model directory: the gemma4-tiny preset, bf16 weights.
    StatusOr<Gemma4Config> cfg = PresetConfig("gemma4-tiny");
    ASSERT_TRUE(cfg.ok());
    const ParamRegistry reg = BuildParamRegistry(*cfg);
    std::vector<float> params(static_cast<size_t>(reg.layout.total()));
    InitParams(*cfg, reg, params.data(), 1);
    Status saved = SaveHfModel(*tmp_ + "/model_ok", *cfg, reg, params.data(), DType::kBF16);
    ASSERT_TRUE(saved.ok()) << saved.message();
    std::ofstream(*tmp_ + "/a_regular_file") << "not a directory\n";
    // One line of 17 MiB (the readers refuse records over 16 MiB).
    std::ofstream huge(*tmp_ + "/huge_line.jsonl", std::ios::binary);
    huge << "{\"instruction\": \"" << std::string(size_t{17} << 20, 'a')
         << "\", \"response\": \"b\"}\n";
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*tmp_, ec);
    delete tmp_;
  }
  // The model directory of a case: model_ok with one file replaced (by a copy of `broken`, or
  // nothing when broken is empty), the others linked.
  static std::string ModelDir(const Case& c) {
    if (*c.model_file == '\0') return *tmp_ + "/model_ok";
    const std::string dir = *tmp_ + "/" + c.name;
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(*tmp_ + "/model_ok")) {
      const std::string name = e.path().filename().string();
      if (name != c.model_file) fs::create_symlink(e.path(), dir + "/" + name);
    }
    if (*c.broken != '\0')
      fs::copy_file(std::string(ST_SOURCE_DIR "/tests/bad_inputs/") + c.broken,
                    dir + "/" + c.model_file);
    else
      fs::copy_file(*tmp_ + "/model_ok/" + c.model_file, dir + "/" + c.model_file);
    return dir;
  }
  static std::string Expand(std::string cmd, const std::string& model) {
    Replace(&cmd, "{eval}", kEval);
    if (cmd.rfind("{ft}", 0) == 0) {
      // A short single-worker finetune; a case's own flags replace these defaults.
      Replace(&cmd, "{ft}", "{bin} finetune --data-dir {src}/data --topology 1");
      for (const char* flag :
           {"--dataset-split 'train[:16]'", "--num-epochs 1", "--max-seq-len 32",
            "--batch-size-per-device 2", "--storage-path {tmp}/runs", "--timeout-ms 20000"}) {
        const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
        if (cmd.find(name + " ") == std::string::npos) cmd += std::string(" ") + flag;
      }
    }
    Replace(&cmd, "{bin}", ST_BINARY);
    Replace(&cmd, "{src}", ST_SOURCE_DIR);
    Replace(&cmd, "{bad}", ST_SOURCE_DIR "/tests/bad_inputs");
    Replace(&cmd, "{tmp}", *tmp_);
    Replace(&cmd, "{model}", model);
    return cmd;
  }
  static std::string* tmp_;
};
std::string* BadInput::tmp_ = nullptr;

// The checks every bad input must pass.
void ExpectOneLineError(const Ran& r, int code, const std::string& message) {
  EXPECT_EQ(r.code, code) << "exit code (124: timed out, -1: killed by a signal)\n" << r.out;
  EXPECT_TRUE(r.code == 1 || r.code == 2) << r.out;
  // Exactly one line says "error:". A spawned worker's own error line is not printed as well:
  // the driver's line quotes it.
  std::istringstream lines(r.out);
  int errors = 0;
  std::string error_line;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("error:") == std::string::npos) continue;
    ++errors;
    error_line = line;
  }
  EXPECT_EQ(errors, 1) << r.out;
  EXPECT_NE(error_line.find(message), std::string::npos)
      << "expected '" << message << "' in the error line\n"
      << r.out;
  for (const char* bad : {"internal error", "Assertion", "Aborted", "AddressSanitizer",
                          "runtime error", "terminate called", "what():", "Segmentation"})
    EXPECT_EQ(r.out.find(bad), std::string::npos) << bad << " in\n" << r.out;
}

TEST_P(BadInput, IsAOneLineErrorAndANonZeroExit) {
  const Case& c = GetParam();
  const std::string cmd = Expand(c.cmd, ModelDir(c));
  ExpectOneLineError(RunCommand("timeout 60 " + cmd), c.code, c.message);
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadInput, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& p) { return p.param.name; });

// Every file of the corpus is used by some case (a file added without a case tests nothing).
TEST(BadInputCorpus, EveryFileHasACase) {
  for (const auto& e : fs::recursive_directory_iterator(ST_SOURCE_DIR "/tests/bad_inputs")) {
    if (!e.is_regular_file()) continue;
    const std::string rel =
        fs::relative(e.path(), ST_SOURCE_DIR "/tests/bad_inputs").generic_string();
    bool used = false;
    for (const Case& c : kCases)
      used =
          used || std::string(c.broken) == rel || std::string(c.cmd).find(rel) != std::string::npos;
    EXPECT_TRUE(used) << rel << " has no case in kCases";
  }
}

// A short finetune whose storage path is a tmpfs mounted with `mount_options` in a private mount
// namespace (needs root or CAP_SYS_ADMIN). `skipped` is set where unshare is not allowed.
Ran FinetuneOnTmpfs(const std::string& mount_options, bool* skipped) {
  *skipped = RunCommand("unshare -m true").code != 0;
  if (*skipped) return {0, ""};
  char tmpl[] = "/tmp/st_storage_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return {-1, "mkdtemp failed"};
  const std::string dir = tmpl;
  const std::string ft = std::string(ST_BINARY) +
                         " finetune --data-dir " ST_SOURCE_DIR
                         "/data --dataset-split train[:16] --num-epochs 1 --max-seq-len 32 "
                         "--batch-size-per-device 2 --topology 1 --run-name r "
                         "--timeout-ms 20000 --storage-path " +
                         dir;
  const Ran r = RunCommand("timeout 120 unshare -m sh -c 'mount -t tmpfs -o " + mount_options +
                           " tmpfs " + dir + " && " + ft + "'");
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

// A full disk: a 1 MiB tmpfs.
TEST(BadInputStorage, FullDiskIsAOneLineError) {
  bool skipped = false;
  const Ran r = FinetuneOnTmpfs("size=1m", &skipped);
  if (skipped) GTEST_SKIP() << "unshare -m is not permitted here";
  ExpectOneLineError(r, 1, "No space left on device");
}

// A storage path that is not writable: a read-only tmpfs (root ignores permission bits, a
// read-only mount it cannot).
TEST(BadInputStorage, ReadOnlyStorageIsAOneLineError) {
  bool skipped = false;
  const Ran r = FinetuneOnTmpfs("ro,size=1m", &skipped);
  if (skipped) GTEST_SKIP() << "unshare -m is not permitted here";
  ExpectOneLineError(r, 1, "Read-only file system");
}

}  // namespace
}  // namespace st

// FinetuneOptions as JSON: what run.json and the dashboard's Jobs tab show as the run's flags.
#include "train/trainer.h"

namespace st {

nlohmann::json FinetuneOptionsJson(const FinetuneOptions& o) {
  return {{"model_id", o.model_id},
          {"tokenizer", o.tokenizer},
          {"dataset", o.dataset},
          {"dataset_split", o.dataset_split},
          {"instruction_field", o.instruction_field},
          {"context_field", o.context_field},
          {"response_field", o.response_field},
          {"dataset_config", o.dataset_config},
          {"dataset_revision", o.dataset_revision},
          {"dataset_field", o.dataset_field},
          {"messages_field", o.messages_field},
          {"num_epochs", o.num_epochs},
          {"batch_size_per_device", o.batch_size_per_device},
          {"max_seq_len", o.max_seq_len},
          {"template", o.chat_template},
          {"train_on", o.train_on},
          {"packing", o.packing},
          {"padding", o.padding},
          {"group_by_length", o.group_by_length},
          {"topology", o.topology},
          {"accelerator_type", o.accelerator_type},
          {"storage_path", o.storage_path},
          {"run_name", o.run_name},
          {"lr", o.lr},
          {"weight_decay", o.weight_decay},
          {"max_grad_norm", o.max_grad_norm},
          {"seed", o.seed},
          {"num_to_keep", o.num_to_keep},
          {"save_steps", o.save_steps},
          {"checkpoint_score_attribute", o.score_attribute},
          {"checkpoint_score_order", o.score_order},
          {"fsdp_units", o.fsdp_units},
          {"activation_checkpointing", o.activation_checkpointing},
          {"freeze", o.freeze},
          {"lora_rank", o.lora_rank},
          {"lora_alpha", o.lora_alpha},
          {"lora_dropout", o.lora_dropout},
          {"lora_target_modules", o.lora_target_modules},
          {"use_rslora", o.use_rslora},
          {"modules_to_save", o.modules_to_save},
          {"save_dtype", o.save_dtype},
          {"max_shard_size", o.max_shard_size},
          {"resume", o.resume}};
}

}  // namespace st

// Hugging Face hub client and cache: `org/name` -> local files, in the cache layout of the Python
// huggingface_hub library (models--org--name/{blobs,refs,snapshots/<commit>}), so files already
// downloaded by Python tools are reused and ours are reused by them. Downloads resume from
// `.incomplete` files, are checked against the hub's ETag (sha256 for LFS files, git blob sha1 for
// others) and committed with a rename; a lock file serialises ranks downloading the same blob.
// The token is sent only as an `Authorization: Bearer` header and never appears in logs, errors or
// files. Model and data set repositories (which files a data set split needs is
// data/hub_dataset.h's). Not an uploader.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace st {

struct HubOptions {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT
  std::string token;                                // HF_TOKEN, HF_TOKEN_PATH or $HF_HOME/token
  std::string
      cache_dir;         // HF_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/..
  bool offline = false;  // HF_HUB_OFFLINE=1: only the cache is used
  int64_t timeout_s = 60;  // connect / stall timeout of one request
  int max_attempts = 4;    // per file; each retry resumes the partial download
  // Progress and decisions, one line each ("downloading x (12.3 MB)"). Never sees the token.
  std::function<void(const std::string&)> log;
  // Download progress of one file: (file name, bytes so far, total or -1), at most twice a second
  // and once at the end. The CLI draws a progress bar from it.
  std::function<void(const std::string& file, int64_t done, int64_t total)> progress;

  // Reads the environment variables above (the one place this layer reads getenv).
  static HubOptions FromEnvironment();
};

// Models live under /{repo}, data sets under /datasets/{repo} (and /api/datasets/...), cached
// under models--org--name and datasets--org--name.
enum class RepoType { kModel, kDataset };

// `org/name` (or `name`) as the hub spells it: letters, digits, '-', '_', '.'; no '--' or '..'.
Status ValidateRepoId(const std::string& repo_id);
// "models--org--name" / "datasets--org--name"
std::string RepoCacheFolder(const std::string& repo_id, RepoType type = RepoType::kModel);

struct RepoInfo {
  std::string sha;                 // the commit the revision resolves to
  std::vector<std::string> files;  // every file of the repository at that commit
};

class HubClient {
 public:
  explicit HubClient(HubOptions options);

  // GET {endpoint}/api/{models|datasets}/{repo}/revision/{revision}
  StatusOr<RepoInfo> GetRepoInfo(const std::string& repo_id, const std::string& revision,
                                 RepoType type = RepoType::kModel) const;

  // One file into the cache; returns its path under snapshots/<commit>/. Offline (or when the hub
  // cannot be reached) a cached copy is used when there is one.
  StatusOr<std::string> DownloadFile(const std::string& repo_id, const std::string& filename,
                                     const std::string& revision = "main",
                                     RepoType type = RepoType::kModel) const;
  // The same with the commit the revision resolved to (from GetRepoInfo), so that every file of
  // one download comes from the same commit.
  StatusOr<std::string> DownloadFileAt(const std::string& repo_id, const std::string& filename,
                                       const std::string& revision, const std::string& commit,
                                       RepoType type = RepoType::kModel) const;
  // The snapshot directory the cache holds for the revision (a branch or tag through refs/).
  StatusOr<std::string> CachedSnapshot(const std::string& repo_id, const std::string& revision,
                                       RepoType type = RepoType::kModel) const;

  // The files a Gemma fine-tuning run needs: config.json, generation_config.json, the tokenizer
  // files, and model.safetensors or every shard named by model.safetensors.index.json. Returns the
  // snapshot directory (a model directory LoadModel accepts).
  StatusOr<std::string> DownloadModel(const std::string& repo_id,
                                      const std::string& revision = "main") const;

  const HubOptions& options() const { return options_; }

 private:
  StatusOr<std::string> CachedFile(const std::string& repo_id, const std::string& filename,
                                   const std::string& revision, RepoType type) const;
  void Log(const std::string& line) const;

  HubOptions options_;
};

}  // namespace st

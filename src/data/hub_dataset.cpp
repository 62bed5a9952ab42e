// Hub data set repositories: list, read the README, resolve the split, download its files.
#include "data/hub_dataset.h"

#include <algorithm>
#include <filesystem>

#include "data/data_files.h"
#include "data/dataset.h"
#include "io/files.h"

namespace st {
namespace {

namespace fs = std::filesystem;

constexpr const char* kParquetBranch = "refs/convert/parquet";

// The split's folder of the Parquet conversion: <config>/<split>/ (or partial-<split>/ for sets
// the hub converted only in part).
StatusOr<std::vector<std::string>> ParquetBranchFiles(const std::vector<std::string>& files,
                                                      const std::string& config,
                                                      const std::string& split,
                                                      std::string* folder) {
  for (const std::string& dir : {config + "/" + split, config + "/partial-" + split}) {
    std::vector<std::string> out;
    for (const std::string& f : files)
      if (f.rfind(dir + "/", 0) == 0 && f.find('/', dir.size() + 1) == std::string::npos &&
          f.size() > 8 && f.compare(f.size() - 8, 8, ".parquet") == 0)
        out.push_back(f);
    if (!out.empty()) {
      std::sort(out.begin(), out.end());
      *folder = dir;
      return out;
    }
  }
  return NotFound(StrCat("the Parquet conversion has no ", config, "/", split, "/ folder"));
}

std::string RenamedSplit(const std::string& split) {
  const size_t lb = split.find('[');
  return "train" + (lb == std::string::npos ? std::string() : split.substr(lb));
}

}  // namespace

bool IsHubDatasetId(const std::string& dataset) {
  std::error_code ec;
  if (dataset.empty() || fs::exists(dataset, ec)) return false;
  if (dataset.find_first_of("*?[") != std::string::npos) return false;
  if (std::count(dataset.begin(), dataset.end(), '/') != 1) return false;
  if (dataset.front() == '.' || dataset.front() == '/') return false;
  if (IsDataFileName(dataset)) return false;  // a missing local file, reported as such
  return ValidateRepoId(dataset).ok();
}

StatusOr<DatasetSource> ResolveDatasetSource(const std::string& dataset, const std::string& config,
                                             const std::string& revision_in,
                                             const std::string& split_text, const HubOptions& hub) {
  DatasetSource src{dataset, split_text, config, ""};
  if (!IsHubDatasetId(dataset)) return src;
  const std::string revision = revision_in.empty() ? "main" : revision_in;
  ST_ASSIGN_OR_RETURN(SplitSpec split, ParseSplit(split_text));
  const std::string what = StrCat("--dataset ", dataset);
  HubClient client(hub);
  auto log = [&](const std::string& line) {
    if (hub.log) hub.log(line);
  };

  // From the cache alone (offline, or the hub unreachable): the snapshot must hold the split.
  auto from_cache = [&](const Status& why) -> StatusOr<DatasetSource> {
    for (const std::string& rev : {revision, std::string(kParquetBranch)}) {
      StatusOr<std::string> snap = client.CachedSnapshot(dataset, rev, RepoType::kDataset);
      if (!snap.ok()) continue;
      ST_ASSIGN_OR_RETURN(std::vector<std::string> files, ListRepoFiles(*snap));
      if (rev == revision) {
        std::string readme;
        if (fs::exists(*snap + "/README.md")) {
          ST_ASSIGN_OR_RETURN(readme, ReadTextFile(*snap + "/README.md"));
        }
        if (ResolveSplitFiles(files, readme, config, split.name).ok()) {
          log(StrCat(dataset, "@", revision, ": using the cached snapshot ", *snap));
          return DatasetSource{*snap, split_text, config, StrCat(dataset, "@", revision)};
        }
      } else {
        std::string folder;
        if (ParquetBranchFiles(files, config.empty() ? "default" : config, split.name, &folder)
                .ok()) {
          log(StrCat(dataset, ": using the cached Parquet conversion ", *snap));
          return DatasetSource{*snap + "/" + folder, RenamedSplit(split_text), "",
                               StrCat(dataset, "@", kParquetBranch)};
        }
      }
    }
    return NotFound(StrCat(what, ": ", why.message(), "; the cache ", hub.cache_dir,
                           " holds no snapshot with this split",
                           hub.offline ? " (HF_HUB_OFFLINE=1 forbids downloading it)" : ""));
  };
  if (hub.offline) return from_cache(NotFound("HF_HUB_OFFLINE=1 is set"));

  StatusOr<RepoInfo> info = client.GetRepoInfo(dataset, revision, RepoType::kDataset);
  if (!info.ok() && info.status().code() == StatusCode::kIo) return from_cache(info.status());
  if (!info.ok()) return info.status().WithContext(what);
  std::string readme;
  if (std::find(info->files.begin(), info->files.end(), "README.md") != info->files.end()) {
    ST_ASSIGN_OR_RETURN(std::string p, client.DownloadFileAt(dataset, "README.md", revision,
                                                             info->sha, RepoType::kDataset));
    ST_ASSIGN_OR_RETURN(readme, ReadTextFile(p));
  }
  StatusOr<SplitFiles> sf = ResolveSplitFiles(info->files, readme, config, split.name);
  if (!sf.ok()) {
    // No data files of its own (a script data set): the hub's Parquet conversion, if there is
    // one. A repository with data files that the config or split does not match is an error.
    if (HoldsDataFiles(info->files)) return sf.status().WithContext(what);
    StatusOr<RepoInfo> conv = client.GetRepoInfo(dataset, kParquetBranch, RepoType::kDataset);
    if (!conv.ok())
      return sf.status().WithContext(
          StrCat(what, " (and no Parquet conversion: ", conv.status().message(), ")"));
    std::string folder;
    const std::string cfg = config.empty() ? "default" : config;
    StatusOr<std::vector<std::string>> files =
        ParquetBranchFiles(conv->files, cfg, split.name, &folder);
    if (!files.ok()) return files.status().WithContext(what);
    log(StrCat(dataset, ": no data files in ", revision, "; reading the hub's Parquet conversion (",
               files->size(), " files in ", folder, "/)"));
    std::string snapshot;
    for (const std::string& f : *files) {
      ST_ASSIGN_OR_RETURN(std::string p, client.DownloadFileAt(dataset, f, kParquetBranch,
                                                               conv->sha, RepoType::kDataset));
      snapshot = p.substr(0, p.size() - f.size() - 1);
    }
    return DatasetSource{snapshot + "/" + folder, RenamedSplit(split_text), "",
                         StrCat(dataset, "@", conv->sha)};
  }
  log(StrCat(dataset, "@", revision, ": config ", sf->config, ", split ", split.name, ": ",
             sf->files.size(), " file", sf->files.size() == 1 ? "" : "s"));
  std::string snapshot;
  for (const std::string& f : sf->files) {
    ST_ASSIGN_OR_RETURN(std::string p,
                        client.DownloadFileAt(dataset, f, revision, info->sha, RepoType::kDataset));
    snapshot = p.substr(0, p.size() - f.size() - 1);
  }
  return DatasetSource{snapshot, split_text, config, StrCat(dataset, "@", info->sha)};
}

}  // namespace st

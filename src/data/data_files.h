// Which files make a split of a data set repository (a hub snapshot or a local directory),
// resolved as the `datasets` library resolves them:
//   1. the README's YAML front matter `configs:` (config_name, default, data_files as a string,
//      a list, a list of {split, path} or a {split: path} map; paths are globs);
//   2. otherwise the default patterns: data/{split}-NNNNN-of-NNNNN*.* shards, then split names in
//      directory names (train/, dev-x/), then in file names (train.jsonl, my_test-1.csv), then
//      every data file as `train`.
// Globs as fsspec matches them: `*` and `?` within one path component, `**` across components
// (also none), [..] classes. Hidden files and directories (. and __ prefixes) and the metadata
// files datasets ignores (README.md, config.json, dataset_info.json, ...) never count. Matches are
// in path order; the split's files are those of the most common data file type among them.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace st {

struct SplitFiles {
  std::string config;               // the config used ("default" without README configs)
  std::vector<std::string> files;   // relative paths, in reading order
  std::vector<std::string> splits;  // every split the config defines, in datasets' order
};

// `files`: every file of the repository (relative, '/'-separated, any order). `readme`: the
// README.md text ("" when there is none). `config` "" = the default config.
StatusOr<SplitFiles> ResolveSplitFiles(const std::vector<std::string>& files,
                                       const std::string& readme, const std::string& config,
                                       const std::string& split);

// Whether any of `files` is a data file that counts (not hidden, not metadata): a repository
// without one is a script data set, read from the hub's Parquet conversion.
bool HoldsDataFiles(const std::vector<std::string>& files);

// Every regular file under dir (following symbolic links, as in a hub snapshot), relative and
// sorted; hidden entries skipped.
StatusOr<std::vector<std::string>> ListRepoFiles(const std::string& dir);

// fsspec-style glob match of a relative path.
bool GlobMatch(const std::string& pattern, const std::string& path);

}  // namespace st

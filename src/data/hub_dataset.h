// `--dataset org/name`: a data set repository on the Hugging Face hub, fetched as `datasets`
// fetches it. The README (for its `configs:`) and the repository's file list decide which files
// the requested config and split need (data/data_files.h); only those are downloaded, into the
// huggingface_hub cache (datasets--org--name/snapshots/<commit>/), resumably, with the token and
// offline rules of io/hub.h. A repository with no data files of its own (a script data set) is
// read from its Parquet conversion (the refs/convert/parquet branch: <config>/<split>/*.parquet).
#pragma once

#include <string>

#include "core/status.h"
#include "io/hub.h"

namespace st {

// What InstructionDataset::Open then reads: a local path, split and config.
struct DatasetSource {
  std::string path;    // the snapshot directory (or, for the Parquet conversion, its split folder)
  std::string split;   // as given, or `train[...]` for a split folder of the Parquet conversion
  std::string config;  // as given ("" for the Parquet conversion's split folder)
  std::string origin;  // "acme/instruct@<commit>" for messages; "" for a local path
};

// Whether `dataset` names a hub repository (org/name, not a local file, directory or glob).
bool IsHubDatasetId(const std::string& dataset);

// A local path is returned unchanged; a hub id is downloaded (or found in the cache).
StatusOr<DatasetSource> ResolveDatasetSource(const std::string& dataset, const std::string& config,
                                             const std::string& revision, const std::string& split,
                                             const HubOptions& hub);

}  // namespace st

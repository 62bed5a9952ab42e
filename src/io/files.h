// Durable file operations for checkpoints and caches: content hashes, fsync of files and
// directories, and write-then-rename commits that leave either the old or the new file, never a
// torn one, even if the process is killed or the machine loses power half-way.
// Not a file-system abstraction: plain POSIX paths only.
#pragma once

#include <string>

#include "core/status.h"

namespace st {

enum class HashKind { kSha256, kSha1 };

// Hex digest of `prefix` followed by the file's bytes (prefix: git's "blob <size>\0" header, or
// empty). Reads in 1 MiB chunks.
StatusOr<std::string> HashFile(const std::string& path, HashKind kind = HashKind::kSha256,
                               const std::string& prefix = "");

// Hex SHA-256 of a string (names derived from a secret without showing it).
std::string HashText(const std::string& text);

// fsync of a regular file / of a directory (so that entries renamed into it survive a crash).
// File systems that cannot fsync a directory (EINVAL) are accepted as they are.
Status FsyncFile(const std::string& path);
Status FsyncDir(const std::string& dir);

// Writes `text` to path through `path.tmp<pid>`, fsync, rename, fsync of the parent directory.
Status WriteFileDurably(const std::string& path, const std::string& text);

// rename(2) of a file or directory, then fsync of the destination's parent directory.
Status RenameDurably(const std::string& from, const std::string& to);

}  // namespace st

// Durable file operations for checkpoints and caches: content hashes, fsync of files and
// directories, and write-then-rename commits that leave either the old or the new file, never a
// torn one, even if the process is killed or the machine loses power half-way.
// Not a file-system abstraction: plain POSIX paths only.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

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

// Writes all of buf to fd, retrying short writes and EINTR; an error names path (and says the
// disk may be full on ENOSPC).
Status WriteAll(int fd, const void* buf, size_t size, const std::string& path);

// The whole file as a string (small text files: a README, a config); an error names the path.
StatusOr<std::string> ReadTextFile(const std::string& path);

// Writes `text` to path through `path.tmp<pid>`, fsync, rename, fsync of the parent directory.
Status WriteFileDurably(const std::string& path, const std::string& text);

// Gives the pages of a read-only file mapping that lie wholly inside [begin, begin + bytes) back
// to the kernel (madvise MADV_DONTNEED): a partly covered page may still be in use by a neighbour
// and is kept. The values read again from the file when touched; for streaming a large tensor
// without holding the file in the process.
void DropPages(const void* begin, size_t bytes);

// rename(2) of a file or directory, then fsync of the destination's parent directory.
Status RenameDurably(const std::string& from, const std::string& to);

// A directory's manifest of SHA-256 checksums in sha256sum's format (`<hex>  <relative path>`),
// as a committed checkpoint holds it.
inline constexpr const char* kChecksumsFile = "checksums.sha256";

// <dir>/checksums.sha256 as {relative path: hex digest}; a missing or malformed manifest is an
// error.
StatusOr<std::map<std::string, std::string>> ReadChecksums(const std::string& dir);

// Checks one file of `dir` (a path relative to it) against the manifest: a missing manifest, a
// file it does not list, a missing file or a different hash is an error naming the file.
Status VerifyChecksum(const std::string& dir, const std::string& relative);

// For readers of directories that may be checkpoints (--model-id, --tokenizer): when `dir` holds
// a manifest, each of `relative` that exists there must be listed and match; without a manifest
// there is nothing to check.
Status VerifyChecksumsIfListed(const std::string& dir, const std::vector<std::string>& relative);

}  // namespace st

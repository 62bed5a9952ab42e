// Hub client over libcurl; cache layout and download protocol as huggingface_hub uses them:
//   HEAD {endpoint}/{repo}/resolve/{revision}/{file}  (redirects not followed) -> X-Repo-Commit,
//        X-Linked-Etag / ETag (sha256 of LFS files, git blob sha1 of others), X-Linked-Size /
//        Content-Length, Location (the LFS download URL)
//   GET  the download URL, with `Range: bytes=N-` to resume blobs/<etag>.incomplete
//   then blobs/<etag> (renamed after the hash check) and snapshots/<commit>/<file> ->
//   ../../blobs/<etag>
#include "io/hub.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/files.h"

namespace st {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool IsHex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Percent-encodes everything but unreserved characters (and '/' when keep_slash).
std::string UrlEncode(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string HumanBytes(int64_t n) {
  char buf[32];
  if (n >= (int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GB", n / 1e9);
  else if (n >= (int64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f MB", n / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(n));
  return buf;
}

// ------------------------------------------------------------------ HTTP
struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

struct HttpResult {
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names, of the last response
  std::string body;                            // when no sink file
  bool transport_ok() const { return curl == CURLE_OK; }
};

struct Transfer {
  HttpResult* result;
  std::FILE* sink = nullptr;
  int64_t offset = 0;  // bytes already in the sink when resuming
  bool restarted = false;
  CURL* curl = nullptr;
  // Progress of a download: bytes in the sink, reported at most twice a second and at the end.
  const HubOptions* options = nullptr;
  const std::string* label = nullptr;
  int64_t total = -1, done = 0;
  std::chrono::steady_clock::time_point last_report{};
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) t->result->headers.clear();  // a new response (redirect)
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string value = line.substr(colon + 1);
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front())))
      value.erase(0, 1);
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())))
      value.pop_back();
    t->result->headers[Lower(line.substr(0, colon))] = value;
  }
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (!t->sink) {
    t->result->body.append(data, size * n);
    return size * n;
  }
  long code = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
  if (code != 200 && code != 206) return size * n;  // error bodies are not written to the blob
  if (code == 200 && t->offset > 0 && !t->restarted) {
    // The server ignored the Range header: start the file over.
    t->restarted = true;
    if (std::fflush(t->sink) != 0 || ftruncate(fileno(t->sink), 0) != 0 ||
        std::fseek(t->sink, 0, SEEK_SET) != 0)
      return 0;
  }
  if (std::fwrite(data, 1, size * n, t->sink) != size * n) return 0;
  t->done = static_cast<int64_t>(std::ftell(t->sink));  // the whole file so far (append mode)
  if (t->options && t->options->progress && t->label) {
    const auto now = std::chrono::steady_clock::now();
    if (now - t->last_report > std::chrono::milliseconds(500)) {
      t->last_report = now;
      t->options->progress(*t->label, t->done, t->total);
    }
  }
  return size * n;
}

HttpResult HttpOnce(const std::string& method, const std::string& url, const HubOptions& o,
                    bool send_token, std::FILE* sink, int64_t range_from, const std::string* label,
                    int64_t total) {
  static CurlGlobal global;
  HttpResult r;
  CURL* c = curl_easy_init();
  if (!c) {
    r.curl = CURLE_FAILED_INIT;
    r.curl_error = "curl_easy_init failed";
    return r;
  }
  Transfer t{&r, sink, range_from, false, c, &o, label, total, range_from, {}};
  char err[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "slicetrain/0.1 (hub client)");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, static_cast<long>(o.timeout_s));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(o.timeout_s));
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  if (send_token && !o.token.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
    curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, o.token.c_str());
  }
  if (method == "HEAD") curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  std::string range;
  if (range_from > 0) {
    range = StrCat(range_from, "-");
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  r.curl = curl_easy_perform(c);
  if (r.curl != CURLE_OK) r.curl_error = err[0] ? err : curl_easy_strerror(r.curl);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_easy_cleanup(c);
  if (sink && label && o.progress && r.curl == CURLE_OK) o.progress(*label, t.done, total);
  return r;
}

// "scheme://host:port" of a URL.
std::string Origin(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t slash = url.find('/', scheme + 3);
  return url.substr(0, slash);
}

// One request; with `follow`, redirects are followed here (not by libcurl) so that the token is
// sent only to the hub's own origin, never to the storage host an LFS download is redirected to.
HttpResult Http(const std::string& method, const std::string& url, const HubOptions& o, bool follow,
                std::FILE* sink = nullptr, int64_t range_from = 0,
                const std::string* label = nullptr, int64_t total = -1) {
  const std::string hub_origin = Origin(o.endpoint);
  std::string current = url;
  for (int hop = 0;; ++hop) {
    HttpResult r =
        HttpOnce(method, current, o, Origin(current) == hub_origin, sink, range_from, label, total);
    auto loc = r.headers.find("location");
    if (!follow || !r.transport_ok() || r.status < 300 || r.status >= 400 ||
        loc == r.headers.end() || hop >= 10)
      return r;
    current = loc->second.rfind("/", 0) == 0 ? Origin(current) + loc->second : loc->second;
  }
}

// One line for an HTTP failure, with what to do. Never includes the token.
Status HttpError(const HttpResult& r, const std::string& repo_id, const std::string& what,
                 const HubOptions& o, RepoType type = RepoType::kModel) {
  const char* kind = type == RepoType::kDataset ? "data set" : "model";
  const std::string page =
      StrCat(o.endpoint, type == RepoType::kDataset ? "/datasets/" : "/", repo_id);
  if (!r.transport_ok())
    return IoError(StrCat(what, ": cannot reach ", o.endpoint, ": ", r.curl_error,
                          " (set HF_HUB_OFFLINE=1 to use only the local cache)"));
  auto code_it = r.headers.find("x-error-code");
  const std::string ecode = code_it == r.headers.end() ? "" : code_it->second;
  if (r.status == 401 || r.status == 403 || ecode == "GatedRepo") {
    return InvalidArgument(StrCat(
        repo_id, ": access denied (HTTP ", r.status, "). If the ", kind,
        " is gated, accept its licence at ", page, " and set HF_TOKEN to a token with read access",
        o.token.empty() ? " (HF_TOKEN is not set)" : " (the hub refused the token in HF_TOKEN)"));
  }
  if (r.status == 404) {
    if (ecode == "RevisionNotFound") return NotFound(StrCat(what, ": revision not found"));
    if (ecode == "EntryNotFound") return NotFound(StrCat(what, ": no such file in the repository"));
    return NotFound(
        StrCat(what, ": not found on ", o.endpoint, " (check the ", kind, " id and revision)"));
  }
  return IoError(StrCat(what, ": HTTP ", r.status, " from ", o.endpoint));
}

bool Retryable(const HttpResult& r) {
  return !r.transport_ok() || r.status >= 500 || r.status == 429;
}

// ------------------------------------------------------------------ hashes
// sha256 of the file (LFS ETag) or git's blob sha1 ("blob <size>\0" + content).
StatusOr<std::string> FileDigest(const std::string& path, bool git_sha1) {
  if (!git_sha1) return HashFile(path, HashKind::kSha256);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return IoError(StrCat(path, ": cannot open for the hash check: ", ec.message()));
  return HashFile(path, HashKind::kSha1, StrCat("blob ", size, std::string(1, '\0')));
}

// ------------------------------------------------------------------ files
Status WriteAtomically(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  return WriteFileDurably(path.string(), text);
}

// Move-only exclusive flock on a lock file.
class FileLock {
 public:
  static StatusOr<FileLock> Acquire(const fs::path& path) {
    int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) return IoError(StrCat(path.string(), ": ", std::strerror(errno)));
    if (::flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      return IoError(StrCat(path.string(), ": flock: ", std::strerror(errno)));
    }
    FileLock l;
    l.fd_ = fd;
    return l;
  }
  FileLock(FileLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  FileLock() = default;
  int fd_ = -1;
};

std::string StripEtag(std::string e) {
  if (e.rfind("W/", 0) == 0) e.erase(0, 2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

std::string Header(const HttpResult& r, const char* name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? std::string() : it->second;
}

bool Truthy(const std::string& v) {
  const std::string l = Lower(v);
  return l == "1" || l == "on" || l == "yes" || l == "true";
}

}  // namespace

HubOptions HubOptions::FromEnvironment() {
  HubOptions o;
  if (std::string e = Env("HF_ENDPOINT"); !e.empty()) {
    while (!e.empty() && e.back() == '/') e.pop_back();
    o.endpoint = e;
  }
  const std::string home = Env("HOME");
  const std::string xdg = Env("XDG_CACHE_HOME");
  const std::string hf_home = !Env("HF_HOME").empty()
                                  ? Env("HF_HOME")
                                  : (xdg.empty() ? home + "/.cache" : xdg) + "/huggingface";
  o.cache_dir = !Env("HF_HUB_CACHE").empty() ? Env("HF_HUB_CACHE") : hf_home + "/hub";
  o.offline = Truthy(Env("HF_HUB_OFFLINE"));
  o.token = Env("HF_TOKEN");
  if (o.token.empty()) {
    const std::string token_path =
        !Env("HF_TOKEN_PATH").empty() ? Env("HF_TOKEN_PATH") : hf_home + "/token";
    std::ifstream f(token_path);
    if (f) std::getline(f, o.token);
    while (!o.token.empty() && std::isspace(static_cast<unsigned char>(o.token.back())))
      o.token.pop_back();
  }
  return o;
}

Status ValidateRepoId(const std::string& repo_id) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(StrCat("model id '", repo_id, "' ", why, " (expected org/name)"));
  };
  if (repo_id.empty() || repo_id.size() > 96) return bad("is empty or too long");
  if (std::count(repo_id.begin(), repo_id.end(), '/') > 1) return bad("has more than one '/'");
  if (repo_id.find("--") != std::string::npos || repo_id.find("..") != std::string::npos)
    return bad("contains '--' or '..'");
  for (char c : repo_id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '/')
      return bad(StrCat("contains '", c, "'"));
  if (repo_id.front() == '/' || repo_id.back() == '/' || repo_id.front() == '-' ||
      repo_id.front() == '.')
    return bad("starts or ends badly");
  return Status::Ok();
}

std::string RepoCacheFolder(const std::string& repo_id, RepoType type) {
  std::string s = (type == RepoType::kDataset ? "datasets--" : "models--") + repo_id;
  for (size_t p = s.find('/'); p != std::string::npos; p = s.find('/', p)) s.replace(p, 1, "--");
  return s;
}

HubClient::HubClient(HubOptions options) : options_(std::move(options)) {}

void HubClient::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

StatusOr<RepoInfo> HubClient::GetRepoInfo(const std::string& repo_id, const std::string& revision,
                                          RepoType type) const {
  ST_RETURN_IF_ERROR(ValidateRepoId(repo_id));
  if (options_.offline)
    return Unimplemented(StrCat(repo_id, ": HF_HUB_OFFLINE is set; the hub cannot be asked"));
  const std::string url =
      StrCat(options_.endpoint, type == RepoType::kDataset ? "/api/datasets/" : "/api/models/",
             repo_id, "/revision/", UrlEncode(revision, false));
  HttpResult r;
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    r = Http("GET", url, options_, /*follow=*/true);
    if (!Retryable(r) || !r.transport_ok()) break;
  }
  if (!r.transport_ok() || r.status != 200)
    return HttpError(r, repo_id, StrCat(repo_id, "@", revision), options_, type);
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("sha") || !j["sha"].is_string())
    return DataLoss(StrCat(repo_id, ": the hub's answer has no commit sha"));
  RepoInfo info;
  info.sha = j["sha"].get<std::string>();
  for (const auto& s : j.value("siblings", nlohmann::json::array()))
    if (s.contains("rfilename") && s["rfilename"].is_string())
      info.files.push_back(s["rfilename"].get<std::string>());
  return info;
}

StatusOr<std::string> HubClient::CachedSnapshot(const std::string& repo_id,
                                                const std::string& revision, RepoType type) const {
  const fs::path repo = fs::path(options_.cache_dir) / RepoCacheFolder(repo_id, type);
  std::string commit = revision;
  if (!IsHex(revision, 40)) {
    std::ifstream f(repo / "refs" / revision);
    if (!f || !std::getline(f, commit))
      return NotFound(StrCat(repo_id, "@", revision, ": not in the cache ", options_.cache_dir));
  }
  const fs::path snap = repo / "snapshots" / commit;
  std::error_code ec;
  if (!fs::is_directory(snap, ec))
    return NotFound(StrCat(repo_id, "@", revision, ": not in the cache ", options_.cache_dir));
  return snap.string();
}

StatusOr<std::string> HubClient::CachedFile(const std::string& repo_id, const std::string& filename,
                                            const std::string& revision, RepoType type) const {
  ST_ASSIGN_OR_RETURN(std::string snap, CachedSnapshot(repo_id, revision, type));
  const fs::path p = fs::path(snap) / filename;
  std::error_code ec;
  if (!fs::exists(p, ec))  // follows the symlink: a dangling link is not a cached file
    return NotFound(StrCat(repo_id, "@", revision, ": ", filename, " is not in the cache ",
                           options_.cache_dir));
  return p.string();
}

StatusOr<std::string> HubClient::DownloadFile(const std::string& repo_id,
                                              const std::string& filename,
                                              const std::string& revision, RepoType type) const {
  ST_RETURN_IF_ERROR(ValidateRepoId(repo_id));
  if (options_.offline) {
    auto cached = CachedFile(repo_id, filename, revision, type);
    if (!cached.ok())
      return NotFound(StrCat(cached.status().message(),
                             "; HF_HUB_OFFLINE=1 forbids downloading it (unset it, or download it "
                             "on a machine with network access into the same cache)"));
    return cached;
  }
  return DownloadFileAt(repo_id, filename, revision, "", type);
}

StatusOr<std::string> HubClient::DownloadFileAt(const std::string& repo_id,
                                                const std::string& filename,
                                                const std::string& revision,
                                                const std::string& commit_hint,
                                                RepoType type) const {
  const std::string what = StrCat(repo_id, "@", revision, ": ", filename);
  if (filename.empty() || filename.front() == '/' || filename.find("..") != std::string::npos)
    return InvalidArgument(StrCat(what, ": bad file name"));
  const std::string ref = commit_hint.empty() ? revision : commit_hint;
  std::string url =
      StrCat(options_.endpoint, type == RepoType::kDataset ? "/datasets/" : "/", repo_id,
             "/resolve/", UrlEncode(ref, false), "/", UrlEncode(filename, true));
  // Metadata (redirects not followed: the LFS headers are on the hub's own answer).
  HttpResult head;
  for (int hop = 0, attempt = 0; attempt < options_.max_attempts; ++attempt) {
    head = Http("HEAD", url, options_, /*follow=*/false);
    if (head.transport_ok() && head.status >= 300 && head.status < 400 &&
        Header(head, "location").rfind("/", 0) == 0 && hop++ < 5) {
      url = options_.endpoint + Header(head, "location");  // renamed repository: same host
      --attempt;
      continue;
    }
    if (!Retryable(head)) break;
  }
  if (!head.transport_ok()) {
    // The hub cannot be reached: a cached copy is as good as huggingface_hub would use.
    auto cached = CachedFile(repo_id, filename, revision, type);
    if (cached.ok()) {
      Log(StrCat(what, ": hub unreachable (", head.curl_error, "), using the cached copy"));
      return cached;
    }
    return HttpError(head, repo_id, what, options_, type);
  }
  if (head.status >= 400) return HttpError(head, repo_id, what, options_, type);
  std::string etag = StripEtag(Header(head, "x-linked-etag"));
  if (etag.empty()) etag = StripEtag(Header(head, "etag"));
  const std::string commit = Header(head, "x-repo-commit");
  if (etag.empty() || commit.empty())
    return DataLoss(StrCat(what, ": the hub's answer has no ETag or X-Repo-Commit header"));
  if (etag.find('/') != std::string::npos || etag.find("..") != std::string::npos ||
      !IsHex(commit, 40))
    return DataLoss(StrCat(what, ": the hub's answer has a malformed ETag or commit"));
  int64_t size = -1;
  std::string size_text = Header(head, "x-linked-size");
  if (size_text.empty()) size_text = Header(head, "content-length");
  if (!size_text.empty()) size = std::strtoll(size_text.c_str(), nullptr, 10);
  const std::string location =
      head.status >= 300 && head.status < 400 && !Header(head, "location").empty()
          ? Header(head, "location")
          : url;

  const fs::path repo_dir = fs::path(options_.cache_dir) / RepoCacheFolder(repo_id, type);
  const fs::path blob = repo_dir / "blobs" / etag;
  const fs::path snap_file = repo_dir / "snapshots" / commit / filename;
  std::error_code ec;
  fs::create_directories(blob.parent_path(), ec);
  if (ec) return IoError(StrCat(blob.parent_path().string(), ": ", ec.message()));
  if (!IsHex(revision, 40) && revision != commit)
    ST_RETURN_IF_ERROR(WriteAtomically(repo_dir / "refs" / revision, commit));

  if (!fs::exists(blob, ec)) {
    // Locks live outside the repository folder, as huggingface_hub keeps them (.locks/<repo>/).
    const fs::path lock_path =
        fs::path(options_.cache_dir) / ".locks" / RepoCacheFolder(repo_id, type) / (etag + ".lock");
    fs::create_directories(lock_path.parent_path(), ec);
    ST_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(lock_path));
    fs::path part = blob;
    part += ".incomplete";
    const bool sha256 = IsHex(etag, 64), sha1 = IsHex(etag, 40);
    Status last = Status::Ok();
    for (int attempt = 0; attempt < options_.max_attempts && !fs::exists(blob, ec); ++attempt) {
      const int64_t have = fs::exists(part, ec) ? static_cast<int64_t>(fs::file_size(part, ec)) : 0;
      if (size >= 0 && have > size) fs::remove(part, ec);
      const int64_t from = size >= 0 && have > size ? 0 : have;
      if (size < 0 || from < size) {
        Log(from > 0
                ? StrCat("resuming ", what, " at ", HumanBytes(from), " of ", HumanBytes(size))
                : StrCat("downloading ", what, size >= 0 ? " (" + HumanBytes(size) + ")" : ""));
        std::FILE* f = std::fopen(part.c_str(), "ab");
        if (!f) return IoError(StrCat(part.string(), ": ", std::strerror(errno)));
        HttpResult r = Http("GET", location, options_, /*follow=*/true, f, from, &filename, size);
        const bool write_ok = std::fclose(f) == 0;
        if (!write_ok) return IoError(StrCat(part.string(), ": write failed"));
        if (r.transport_ok() && r.status == 416 && size >= 0 && from == size) {
          // Already complete.
        } else if (!r.transport_ok() || (r.status != 200 && r.status != 206)) {
          last = HttpError(r, repo_id, what, options_, type);
          if (r.transport_ok() && !Retryable(r)) return last;
          Log(StrCat(what, ": attempt ", attempt + 1, " failed (", last.message(), "), retrying"));
          continue;
        }
      }
      const int64_t got = static_cast<int64_t>(fs::file_size(part, ec));
      if (size >= 0 && got != size) {
        last = DataLoss(StrCat(what, ": got ", got, " bytes, expected ", size));
        continue;
      }
      if (sha256 || sha1) {
        ST_ASSIGN_OR_RETURN(std::string digest, FileDigest(part.string(), sha1));
        if (digest != etag) {
          fs::remove(part, ec);
          last =
              DataLoss(StrCat(what, ": checksum mismatch (", sha256 ? "sha256 " : "git sha1 ",
                              digest, ", the hub says ", etag, "); the partial file was deleted"));
          Log(last.message());
          continue;
        }
      } else {
        Log(StrCat(what, ": the ETag is not a sha256 or sha1, size checked only"));
      }
      fs::rename(part, blob, ec);
      if (ec) return IoError(StrCat(blob.string(), ": ", ec.message()));
    }
    if (!fs::exists(blob, ec)) return last.ok() ? IoError(StrCat(what, ": download failed")) : last;
  } else {
    Log(StrCat(what, ": already in the cache"));
  }
  // snapshots/<commit>/<file> -> ../../blobs/<etag> (one more ../ per directory in the file name).
  fs::create_directories(snap_file.parent_path(), ec);
  if (!fs::exists(snap_file, ec)) {
    fs::remove(snap_file, ec);  // a dangling link
    std::string rel = "../../";
    for (char c : filename)
      if (c == '/') rel += "../";
    rel += "blobs/" + etag;
    fs::create_symlink(rel, snap_file, ec);
    if (ec) {  // file systems without symlinks: copy
      fs::copy_file(blob, snap_file, fs::copy_options::overwrite_existing, ec);
      if (ec) return IoError(StrCat(snap_file.string(), ": ", ec.message()));
    }
  }
  return snap_file.string();
}

StatusOr<std::string> HubClient::DownloadModel(const std::string& repo_id,
                                               const std::string& revision) const {
  ST_RETURN_IF_ERROR(ValidateRepoId(repo_id));
  static const char* kWanted[] = {
      "config.json",           "generation_config.json", "tokenizer.json",
      "tokenizer_config.json", "tokenizer.model",        "special_tokens_map.json",
      "chat_template.jinja",   "model.safetensors",      "model.safetensors.index.json"};
  auto shards_of = [&](const std::string& index_path) -> StatusOr<std::vector<std::string>> {
    std::ifstream f(index_path);
    nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return DataLoss(StrCat(index_path, ": no weight_map"));
    std::set<std::string> s;
    for (const auto& [name, file] : j["weight_map"].items())
      if (file.is_string()) s.insert(file.get<std::string>());
    return std::vector<std::string>(s.begin(), s.end());
  };

  std::vector<std::string> files;
  std::string snapshot;
  if (!options_.offline) {
    auto info = GetRepoInfo(repo_id, revision);
    if (!info.ok() && info.status().code() == StatusCode::kIo) {
      auto cached = CachedSnapshot(repo_id, revision);
      if (!cached.ok()) return info.status();
      Log(StrCat(info.status().message(), "; trying the cached snapshot"));
    } else if (!info.ok()) {
      return info.status();
    } else {
      const std::set<std::string> present(info->files.begin(), info->files.end());
      if (!present.count("config.json"))
        return NotFound(
            StrCat(repo_id, "@", revision, ": no config.json (not a transformers model?)"));
      for (const char* w : kWanted)
        if (present.count(w)) files.push_back(w);
      const fs::path repo_dir = fs::path(options_.cache_dir) / RepoCacheFolder(repo_id);
      if (!IsHex(revision, 40) && revision != info->sha)
        ST_RETURN_IF_ERROR(WriteAtomically(repo_dir / "refs" / revision, info->sha));
      std::string index_path;
      for (const std::string& f : files) {
        ST_ASSIGN_OR_RETURN(std::string p, DownloadFileAt(repo_id, f, revision, info->sha));
        if (f == "model.safetensors.index.json") index_path = p;
        snapshot = fs::path(p).parent_path().string();
      }
      if (!index_path.empty()) {
        ST_ASSIGN_OR_RETURN(std::vector<std::string> shards, shards_of(index_path));
        for (const std::string& s : shards) {
          if (!present.count(s))
            return DataLoss(
                StrCat(repo_id, ": the index names ", s, ", absent from the repository"));
          ST_RETURN_IF_ERROR(DownloadFileAt(repo_id, s, revision, info->sha).status());
        }
      } else if (!present.count("model.safetensors")) {
        return NotFound(StrCat(repo_id, "@", revision,
                               ": no model.safetensors or model.safetensors.index.json"));
      }
      return snapshot;
    }
  }
  // Offline, or the hub is unreachable: the cached snapshot must be complete.
  auto snap = CachedSnapshot(repo_id, revision);
  if (!snap.ok())
    return NotFound(StrCat(snap.status().message(),
                           options_.offline ? "; HF_HUB_OFFLINE=1 forbids downloading it" : ""));
  std::vector<std::string> missing;
  std::error_code ec;
  auto have = [&](const std::string& f) { return fs::exists(fs::path(*snap) / f, ec); };
  if (!have("config.json")) missing.push_back("config.json");
  if (have("model.safetensors.index.json")) {
    ST_ASSIGN_OR_RETURN(std::vector<std::string> shards,
                        shards_of((fs::path(*snap) / "model.safetensors.index.json").string()));
    for (const std::string& s : shards)
      if (!have(s)) missing.push_back(s);
  } else if (!have("model.safetensors")) {
    missing.push_back("model.safetensors");
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    return NotFound(StrCat(repo_id, "@", revision, ": the cached snapshot ", *snap, " lacks ", list,
                           options_.offline ? "; HF_HUB_OFFLINE=1 forbids downloading them" : ""));
  }
  Log(StrCat(repo_id, "@", revision, ": using the cached snapshot ", *snap));
  return *snap;
}

}  // namespace st

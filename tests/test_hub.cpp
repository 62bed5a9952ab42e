// Hub client tests against a local imitation of the hub's endpoints (cpp-httplib on a thread; never
// the internet): model download into huggingface_hub's cache layout, sharded safetensors, resume
// after a dropped connection, integrity check, gated repositories, offline mode, cache reuse, and
// that the token never reaches logs, errors, files or the storage host.
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "data/dataset.h"
#include "data/hub_dataset.h"
#include "io/hub.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;

std::string Hex(const unsigned char* md, unsigned int len) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < len; ++i) s += std::string{k[md[i] >> 4], k[md[i] & 15]};
  return s;
}
std::string Digest(const std::string& data, bool git_sha1) {
  std::string in =
      git_sha1 ? "blob " + std::to_string(data.size()) + std::string(1, '\0') + data : data;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(in.data(), in.size(), md, &len, git_sha1 ? EVP_sha1() : EVP_sha256(), nullptr);
  return Hex(md, len);
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(g() & 0xFF);
  return s;
}

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The imitation hub. Repos: acme/tiny (sharded), acme/single, acme/gated (needs kGoodToken),
// acme/corrupt (an LFS file whose bytes do not match its sha256).
constexpr const char* kGoodToken = "hf_SECRET_good_token_123";

class FakeHub {
 public:
  struct File {
    std::string content;
    bool lfs = false;
    bool corrupt = false;
  };
  struct Repo {
    std::string sha;
    std::map<std::string, File> files;
    bool gated = false;
  };

  FakeHub() {
    Repo tiny;
    tiny.sha = std::string(40, 'a');
    tiny.files["config.json"] = {R"({"model_type": "gemma4_text"})", false};
    tiny.files["tokenizer.json"] = {R"({"model": {"type": "BPE"}})", false};
    tiny.files["README.md"] = {"# not downloaded", false};
    tiny.files["model.safetensors.index.json"] = {
        R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}})",
        false};
    tiny.files["model-00001-of-00002.safetensors"] = {RandomBytes(300000, 1), true};
    tiny.files["model-00002-of-00002.safetensors"] = {RandomBytes(200000, 2), true};
    repos_["acme/tiny"] = tiny;
    Repo single;
    single.sha = std::string(40, 'b');
    single.files["config.json"] = {"{}", false};
    single.files["model.safetensors"] = {RandomBytes(1000, 3), true};
    repos_["acme/single"] = single;
    Repo gated = single;
    gated.sha = std::string(40, 'c');
    gated.gated = true;
    repos_["acme/gated"] = gated;
    Repo corrupt = single;
    corrupt.sha = std::string(40, 'd');
    corrupt.files["model.safetensors"].corrupt = true;
    repos_["acme/corrupt"] = corrupt;

    // Data set repositories: the fixture directories of tests/fixtures/datasets/hub (Parquet
    // files served as LFS files, the rest as plain git files).
    const fs::path fixtures = fs::path(ST_FIXTURE_DIR) / "datasets" / "hub";
    auto from_dir = [&](const std::string& dir, char sha) {
      Repo r;
      r.sha = std::string(40, sha);
      for (const auto& e : fs::recursive_directory_iterator(fixtures / dir))
        if (e.is_regular_file())
          r.files[fs::relative(e.path(), fixtures / dir).generic_string()] = {
              Slurp(e.path()), e.path().extension() == ".parquet"};
      return r;
    };
    datasets_["acme/instruct"] = from_dir("acme--instruct", 'e');
    datasets_["acme/dolly"] = from_dir("acme--dolly", 'f');
    datasets_["databricks/databricks-dolly-15k"] = from_dir("acme--dolly", '4');
    Repo gated_data = from_dir("acme--dolly", '1');
    gated_data.gated = true;
    datasets_["acme/gated-data"] = gated_data;
    // A script data set: no data files of its own, only the hub's Parquet conversion.
    Repo scripted;
    scripted.sha = std::string(40, '2');
    scripted.files["README.md"] = {"# a script data set", false};
    scripted.files["scripted.py"] = {"import datasets", false};
    datasets_["acme/scripted"] = scripted;
    Repo converted;
    converted.sha = std::string(40, '3');
    converted.files["default/train/0000.parquet"] = {
        Slurp(fixtures / "acme--splits" / "data" / "train-00000-of-00001.parquet"), true};
    converted.files["default/validation/0000.parquet"] = {
        Slurp(fixtures / "acme--splits" / "data" / "validation-00000-of-00001.parquet"), true};
    converted_["acme/scripted"] = converted;
    // Data files of its own, but a README config whose pattern matches none of them: an error to
    // report, not a reason to read the Parquet conversion (which exists here too).
    Repo misconfigured;
    misconfigured.sha = std::string(40, '5');
    misconfigured.files["README.md"] = {
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: \"missing/*.jsonl\"\n---\n# moved files\n",
        false};
    misconfigured.files["data/train.jsonl"] = {"{\"instruction\": \"a\", \"response\": \"b\"}\n",
                                               false};
    datasets_["acme/misconfigured"] = misconfigured;
    converted_["acme/misconfigured"] = converted;

    srv_.Get(R"(/api/models/([^/]+/[^/]+)/revision/([^/]+))",
             [this](const httplib::Request& q, httplib::Response& r) { Info(q, r); });
    srv_.Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))",
             [this](const httplib::Request& q, httplib::Response& r) { Resolve(q, r); });
    srv_.Get(R"(/api/datasets/([^/]+/[^/]+)/revision/(refs(?:/|%2F)convert(?:/|%2F)parquet|[^/]+))",
             [this](const httplib::Request& q, httplib::Response& r) { Info(q, r, true); });
    srv_.Get(R"(/datasets/([^/]+/[^/]+)/resolve/(refs(?:/|%2F)convert(?:/|%2F)parquet|[^/]+)/(.+))",
             [this](const httplib::Request& q, httplib::Response& r) { Resolve(q, r, true); });
    srv_.Get(R"(/cdn/([0-9a-f]+))",
             [this](const httplib::Request& q, httplib::Response& r) { Cdn(q, r); });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeHub() {
    srv_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const Repo& repo(const std::string& id) { return repos_.at(id); }
  const Repo& dataset(const std::string& id) { return datasets_.at(id); }
  void DropFirstCdnGetOf(const std::string& sha256) { drop_.insert(sha256); }

  std::mutex mu;
  std::vector<std::string> ranges;    // Range headers seen by the storage host
  std::vector<std::string> cdn_auth;  // Authorization headers seen by the storage host
  std::vector<std::string> all_auth;  // every Authorization header the hub saw
  int cdn_gets = 0;

 private:
  bool Allowed(const httplib::Request& q, const Repo& repo, httplib::Response& r) {
    std::lock_guard<std::mutex> l(mu);
    all_auth.push_back(q.get_header_value("Authorization"));
    if (!repo.gated || q.get_header_value("Authorization") == std::string("Bearer ") + kGoodToken)
      return true;
    r.status = q.has_header("Authorization") ? 403 : 401;
    r.set_header("X-Error-Code", "GatedRepo");
    r.set_content("{\"error\": \"gated\"}", "application/json");
    return false;
  }
  // The repository a request names: a model, a data set, or a data set's Parquet conversion.
  const Repo* Find(const httplib::Request& q, bool dataset) {
    const std::string id = q.matches[1];
    const std::string rev = q.matches[2];
    if (dataset && converted_.count(id) &&
        (rev.rfind("refs", 0) == 0 || rev == converted_.at(id).sha))
      return &converted_.at(id);  // the branch, or its commit
    auto& m = dataset ? datasets_ : repos_;
    auto it = m.find(id);
    return it == m.end() ? nullptr : &it->second;
  }
  void Info(const httplib::Request& q, httplib::Response& r, bool dataset = false) {
    const Repo* found = Find(q, dataset);
    if (!found) {
      r.status = 404;
      r.set_header("X-Error-Code", "RepoNotFound");
      return;
    }
    if (!Allowed(q, *found, r)) return;
    std::string s = "{\"sha\": \"" + found->sha + "\", \"siblings\": [";
    bool first = true;
    for (const auto& [name, f] : found->files) {
      s += std::string(first ? "" : ", ") + "{\"rfilename\": \"" + name + "\"}";
      first = false;
    }
    r.set_content(s + "]}", "application/json");
  }
  void Resolve(const httplib::Request& q, httplib::Response& r, bool dataset = false) {
    const Repo* found = Find(q, dataset);
    if (!found) {
      r.status = 404;
      r.set_header("X-Error-Code", "RepoNotFound");
      return;
    }
    const Repo& repo = *found;
    if (!Allowed(q, repo, r)) return;
    if (q.matches[2] != "main" && q.matches[2] != repo.sha &&
        std::string(q.matches[2]).rfind("refs", 0) != 0) {
      r.status = 404;
      r.set_header("X-Error-Code", "RevisionNotFound");
      return;
    }
    auto f = repo.files.find(q.matches[3]);
    if (f == repo.files.end()) {
      r.status = 404;
      r.set_header("X-Error-Code", "EntryNotFound");
      return;
    }
    r.set_header("X-Repo-Commit", repo.sha);
    if (f->second.lfs) {
      const std::string sha = Digest(f->second.content, false);
      r.status = 302;
      r.set_header("X-Linked-Etag", "\"" + sha + "\"");
      r.set_header("X-Linked-Size", std::to_string(f->second.content.size()));
      r.set_header("ETag", "\"" + Digest("pointer", true) + "\"");
      // A different host name for the storage, as the real hub's CDN: the token must not follow.
      r.set_header("Location", "http://localhost:" + std::to_string(port_) + "/cdn/" + sha);
      std::lock_guard<std::mutex> l(mu);
      cdn_content_[sha] =
          f->second.corrupt ? RandomBytes(f->second.content.size(), 99) : f->second.content;
      return;
    }
    r.set_header("ETag", "\"" + Digest(f->second.content, true) + "\"");
    r.set_content(f->second.content, "application/octet-stream");
  }
  void Cdn(const httplib::Request& q, httplib::Response& r) {
    std::string content;
    bool drop = false;
    {
      std::lock_guard<std::mutex> l(mu);
      ++cdn_gets;
      cdn_auth.push_back(q.get_header_value("Authorization"));
      if (q.has_header("Range")) ranges.push_back(q.get_header_value("Range"));
      auto it = cdn_content_.find(q.matches[1]);
      if (it == cdn_content_.end()) {
        r.status = 404;
        return;
      }
      content = it->second;
      drop = drop_.erase(q.matches[1]) > 0 && !q.has_header("Range");
    }
    if (drop) {  // send 40% of the body, then drop the connection
      auto data = std::make_shared<std::string>(content);
      r.set_content_provider(data->size(), "application/octet-stream",
                             [data](size_t offset, size_t, httplib::DataSink& sink) {
                               if (offset > 0) return false;
                               sink.write(data->data(), data->size() * 2 / 5);
                               return false;
                             });
      return;
    }
    r.set_content(content, "application/octet-stream");  // httplib answers Range with 206
  }

  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::map<std::string, Repo> repos_, datasets_, converted_;
  std::map<std::string, std::string> cdn_content_;
  std::set<std::string> drop_;
};

class HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ =
        fs::temp_directory_path() /
        ("st_hub_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(cache_);
  }
  void TearDown() override { fs::remove_all(cache_); }
  HubOptions Options(const std::string& token = "") {
    HubOptions o;
    o.endpoint = hub_.endpoint();
    o.cache_dir = cache_.string();
    o.token = token;
    o.timeout_s = 5;
    o.log = [this](const std::string& l) { logs_.push_back(l); };
    return o;
  }
  std::string AllLogs() const {
    std::string s;
    for (const auto& l : logs_) s += l + "\n";
    return s;
  }
  FakeHub hub_;
  fs::path cache_;
  std::vector<std::string> logs_;
};

TEST(Hub, RepoIdsAndCacheFolders) {
  EXPECT_TRUE(ValidateRepoId("google/gemma-4-E2B-it").ok());
  EXPECT_TRUE(ValidateRepoId("gpt2").ok());
  for (const char* bad : {"", "a/b/c", "a--b/c", "../x", "a/..b", "a b/c", "/a", "a/"})
    EXPECT_FALSE(ValidateRepoId(bad).ok()) << bad;
  EXPECT_EQ(RepoCacheFolder("google/gemma-4-E2B-it"), "models--google--gemma-4-E2B-it");
}

TEST_F(HubTest, DownloadsShardedModelInHuggingfaceHubLayout) {
  hub_.DropFirstCdnGetOf(
      Digest(hub_.repo("acme/tiny").files.at("model-00001-of-00002.safetensors").content, false));
  HubClient client(Options());
  auto snap = client.DownloadModel("acme/tiny");
  ASSERT_TRUE(snap.ok()) << snap.status().message();
  const fs::path repo = cache_ / "models--acme--tiny";
  const std::string sha = hub_.repo("acme/tiny").sha;
  EXPECT_EQ(fs::path(*snap), repo / "snapshots" / sha);
  EXPECT_EQ(Slurp(repo / "refs" / "main"), sha);
  for (const auto& [name, f] : hub_.repo("acme/tiny").files) {
    const fs::path p = repo / "snapshots" / sha / name;
    if (name == "README.md") {
      EXPECT_FALSE(fs::exists(p));  // not a file the run needs
      continue;
    }
    ASSERT_TRUE(fs::is_symlink(p)) << p;
    const std::string etag = f.lfs ? Digest(f.content, false) : Digest(f.content, true);
    EXPECT_EQ(fs::read_symlink(p), fs::path("../../blobs/" + etag));
    EXPECT_EQ(Slurp(p), f.content) << name;
  }
  // The dropped shard was resumed, not restarted.
  {
    std::lock_guard<std::mutex> l(hub_.mu);
    ASSERT_EQ(hub_.ranges.size(), 1u);
    EXPECT_EQ(hub_.ranges[0], "bytes=120000-");
  }
  EXPECT_NE(AllLogs().find("resuming"), std::string::npos) << AllLogs();
  for (const auto& e : fs::recursive_directory_iterator(repo / "blobs"))
    EXPECT_EQ(e.path().extension(), "") << "left over: " << e.path();
  // A second run downloads nothing.
  const int gets = hub_.cdn_gets;
  auto again = client.DownloadModel("acme/tiny");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(hub_.cdn_gets, gets);
  EXPECT_NE(AllLogs().find("already in the cache"), std::string::npos);
}

TEST_F(HubTest, OfflineUsesTheCacheOnly) {
  {
    HubClient online(Options());
    ASSERT_TRUE(online.DownloadModel("acme/single").ok());
  }
  HubOptions o = Options();
  o.offline = true;
  o.endpoint = "http://127.0.0.1:1";  // nothing may be asked
  HubClient offline(o);
  auto snap = offline.DownloadModel("acme/single");
  ASSERT_TRUE(snap.ok()) << snap.status().message();
  EXPECT_TRUE(fs::exists(fs::path(*snap) / "model.safetensors"));
  auto f = offline.DownloadFile("acme/single", "config.json");
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto missing = offline.DownloadFile("acme/single", "tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("HF_HUB_OFFLINE"), std::string::npos);
  auto none = offline.DownloadModel("acme/tiny");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("HF_HUB_OFFLINE"), std::string::npos);
}

TEST_F(HubTest, ReusesACacheWrittenByPythonTools) {
  // The layout huggingface_hub writes: blobs/<etag>, snapshots/<commit>/<file> ->
  // ../../blobs/<etag>, refs/main. The hub is unreachable: the cached snapshot is used.
  const std::string sha(40, 'e');
  const fs::path repo = cache_ / "models--org--py";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / sha);
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << sha;
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::string etag = Digest(name, true);
    std::ofstream(repo / "blobs" / etag) << name;
    fs::create_symlink("../../blobs/" + etag, repo / "snapshots" / sha / name);
  }
  HubOptions o = Options();
  o.endpoint = "http://127.0.0.1:1";
  o.max_attempts = 1;
  HubClient client(o);
  auto snap = client.DownloadModel("org/py");
  ASSERT_TRUE(snap.ok()) << snap.status().message();
  EXPECT_EQ(fs::path(*snap), repo / "snapshots" / sha);
  auto file = client.DownloadFile("org/py", "config.json");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(Slurp(*file), "config.json");
  auto other = client.DownloadModel("org/absent");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("cannot reach"), std::string::npos)
      << other.status().message();
}

TEST_F(HubTest, GatedModelsAskForTheLicenceAndToken) {
  HubClient anonymous(Options());
  auto r = anonymous.DownloadModel("acme/gated");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("accept its licence"), std::string::npos);
  EXPECT_NE(r.status().message().find("HF_TOKEN is not set"), std::string::npos);
  const std::string wrong = "hf_SECRET_wrong_token_456";
  HubClient bad(Options(wrong));
  r = bad.DownloadModel("acme/gated");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("refused the token"), std::string::npos);
  EXPECT_EQ(r.status().message().find(wrong), std::string::npos);
  HubClient good(Options(kGoodToken));
  auto ok = good.DownloadModel("acme/gated");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  // The token went to the hub as a bearer header, never to the storage host, a log or a file.
  std::lock_guard<std::mutex> l(hub_.mu);
  EXPECT_NE(
      std::find(hub_.all_auth.begin(), hub_.all_auth.end(), std::string("Bearer ") + kGoodToken),
      hub_.all_auth.end());
  for (const std::string& a : hub_.cdn_auth) EXPECT_EQ(a, "");
  EXPECT_EQ(AllLogs().find("SECRET"), std::string::npos) << AllLogs();
  for (const auto& e : fs::recursive_directory_iterator(cache_)) {
    EXPECT_EQ(e.path().string().find("SECRET"), std::string::npos);
    if (e.is_regular_file()) {
      EXPECT_EQ(Slurp(e.path()).find("SECRET"), std::string::npos) << e.path();
    }
  }
}

TEST_F(HubTest, ChecksumMismatchIsAnErrorAndLeavesNothing) {
  HubOptions o = Options();
  o.max_attempts = 2;
  HubClient client(o);
  auto r = client.DownloadModel("acme/corrupt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos);
  for (const auto& e :
       fs::recursive_directory_iterator(cache_ / "models--acme--corrupt" / "blobs")) {
    EXPECT_NE(e.path().filename().string(),
              Digest(hub_.repo("acme/corrupt").files.at("model.safetensors").content, false));
    EXPECT_NE(e.path().extension(), ".incomplete");
  }
}

TEST_F(HubTest, NotFoundMessages) {
  HubClient client(Options());
  auto r = client.DownloadModel("acme/nope");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  auto f = client.DownloadFile("acme/tiny", "nope.bin");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("no such file"), std::string::npos) << f.status().message();
  auto rev = client.DownloadFile("acme/tiny", "config.json", "v9");
  ASSERT_FALSE(rev.ok());
  EXPECT_NE(rev.status().message().find("revision not found"), std::string::npos);
  auto one = client.DownloadFile("acme/tiny", "config.json", hub_.repo("acme/tiny").sha);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_FALSE(fs::exists(cache_ / "models--acme--tiny" / "refs" / hub_.repo("acme/tiny").sha));
}

}  // namespace
}  // namespace st

namespace st {
namespace {

// Rows of a data set as InstructionDataset reads them: "instruction|context|response".
std::vector<std::string> Rows(const DatasetSource& src) {
  DatasetOptions o;
  o.path = src.path;
  o.split = src.split;
  o.config = src.config;
  auto ds = InstructionDataset::Open(o);
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  std::vector<std::string> out;
  if (!ds.ok()) return out;
  DatasetReport rep;
  Status s = ds->ForEach(
      [&](const InstructionRecord& r) {
        out.push_back(r.instruction + "|" + r.context + "|" + r.response);
        return Status::Ok();
      },
      &rep);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::vector<std::string> Golden(const std::string& file) {
  std::ifstream f(fs::path(ST_FIXTURE_DIR) / "datasets" / "hub_golden" / file);
  std::vector<std::string> out;
  std::string line;
  auto text = [](const nlohmann::json& v) {
    return v.is_null() ? std::string() : v.get<std::string>();
  };
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    out.push_back(text(j["instruction"]) + "|" + text(j["context"]) + "|" + text(j["response"]));
  }
  return out;
}

// `--dataset acme/instruct --dataset-split train[100:200]`: README configs resolved from the
// repository's file list, only that split's shards downloaded (one resumed after a dropped
// connection), in huggingface_hub's datasets-- cache layout, and the rows datasets.load_dataset
// gives for the same split.
TEST_F(HubTest, DataSetSplitAsDatasetsLoadsIt) {
  const auto& repo = hub_.dataset("acme/instruct");
  hub_.DropFirstCdnGetOf(Digest(repo.files.at("data/train-00001-of-00002.parquet").content, false));
  auto src = ResolveDatasetSource("acme/instruct", "", "", "train[100:200]", Options());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const fs::path snap = cache_ / "datasets--acme--instruct" / "snapshots" / repo.sha;
  EXPECT_EQ(fs::path(src->path), snap);
  EXPECT_EQ(Slurp(cache_ / "datasets--acme--instruct" / "refs" / "main"), repo.sha);
  EXPECT_TRUE(fs::exists(snap / "README.md"));
  EXPECT_TRUE(fs::exists(snap / "data" / "train-00000-of-00002.parquet"));
  EXPECT_TRUE(fs::exists(snap / "data" / "train-00001-of-00002.parquet"));
  EXPECT_FALSE(fs::exists(snap / "data" / "test-00000-of-00001.parquet"));  // another split
  EXPECT_FALSE(fs::exists(snap / "jsonl"));                                 // other configs
  EXPECT_FALSE(fs::exists(snap / "csv"));
  {
    std::lock_guard<std::mutex> l(hub_.mu);
    ASSERT_EQ(hub_.ranges.size(), 1u);  // the dropped shard resumed
  }
  EXPECT_EQ(Rows(*src), Golden("acme--instruct__default__train_from_100_to_200.jsonl"));

  // Another config of the same repository, and the Dolly layout (one JSONL at the root).
  auto jsonl = ResolveDatasetSource("acme/instruct", "jsonl", "main", "train", Options());
  ASSERT_TRUE(jsonl.ok()) << jsonl.status().ToString();
  EXPECT_EQ(Rows(*jsonl), Golden("acme--instruct__jsonl__train.jsonl"));
  auto dolly = ResolveDatasetSource("acme/dolly", "", "", "train[10:20]", Options());
  ASSERT_TRUE(dolly.ok()) << dolly.status().ToString();
  EXPECT_EQ(Rows(*dolly), Golden("acme--dolly__default__train_from_10_to_20.jsonl"));

  // Offline: the cached split is read, a split never downloaded is refused with the reason.
  HubOptions off = Options();
  off.offline = true;
  const int gets = hub_.cdn_gets;
  auto cached = ResolveDatasetSource("acme/instruct", "", "", "train[:10%]", off);
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  EXPECT_EQ(Rows(*cached), Golden("acme--instruct__default__train_from_start_to_10pct.jsonl"));
  EXPECT_EQ(hub_.cdn_gets, gets);
  auto missing = ResolveDatasetSource("acme/instruct", "", "", "test", off);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("HF_HUB_OFFLINE=1"), std::string::npos)
      << missing.status().ToString();
}

TEST_F(HubTest, DataSetErrors) {
  auto unknown = ResolveDatasetSource("acme/nope", "", "", "train", Options());
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("check the data set id"), std::string::npos)
      << unknown.status().ToString();
  auto config = ResolveDatasetSource("acme/instruct", "xml", "", "train", Options());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("no config 'xml' (the README defines: default, jsonl, "
                                           "csv)"),
            std::string::npos)
      << config.status().ToString();
  auto split = ResolveDatasetSource("acme/instruct", "", "", "validation", Options());
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("has no split 'validation' (splits: train, test)"),
            std::string::npos)
      << split.status().ToString();
  auto gated = ResolveDatasetSource("acme/gated-data", "", "", "train", Options());
  ASSERT_FALSE(gated.ok());
  EXPECT_NE(gated.status().message().find("data set is gated"), std::string::npos)
      << gated.status().ToString();
  EXPECT_NE(gated.status().message().find("HF_TOKEN is not set"), std::string::npos);
  auto token = ResolveDatasetSource("acme/gated-data", "", "", "train", Options(kGoodToken));
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(Rows(*token).size(), 60u);
  EXPECT_EQ(AllLogs().find(kGoodToken), std::string::npos);
  // A local path is not a hub id, even when it does not exist.
  auto local = ResolveDatasetSource("data/missing.jsonl", "", "", "train", Options());
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->path, "data/missing.jsonl");
}

// A data set without data files of its own is read from the hub's Parquet conversion.
TEST_F(HubTest, ScriptDataSetReadsTheParquetConversion) {
  auto src = ResolveDatasetSource("acme/scripted", "", "", "validation[:5]", Options());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(src->split, "train[:5]");
  EXPECT_NE(src->path.find("datasets--acme--scripted/snapshots/" + std::string(40, '3') +
                           "/default/validation"),
            std::string::npos)
      << src->path;
  std::vector<std::string> want = Golden("acme--splits__default__validation.jsonl");
  want.resize(5);
  EXPECT_EQ(Rows(*src), want);
  EXPECT_NE(AllLogs().find("Parquet conversion"), std::string::npos) << AllLogs();
}

// A repository with data files whose config matches none of them is reported as such; the hub's
// Parquet conversion is only for repositories without data files.
TEST_F(HubTest, AConfigMatchingNoDataFileIsAnError) {
  auto src = ResolveDatasetSource("acme/misconfigured", "", "", "train", Options());
  ASSERT_FALSE(src.ok()) << src->path;
  EXPECT_NE(src.status().message().find("config 'default' split 'train': no data files"),
            std::string::npos)
      << src.status().ToString();
  EXPECT_EQ(AllLogs().find("Parquet conversion"), std::string::npos) << AllLogs();
}

// The seed's job: `slicetrain finetune --dataset databricks/databricks-dolly-15k` against the
// imitation hub (HF_ENDPOINT), two local workers reading the snapshot the launcher downloaded.
TEST_F(HubTest, FinetuneWithTheSeedsHubDataSet) {
  const std::string dir = test::TempDir("hubfinetune");
  ASSERT_FALSE(dir.empty());
  const test::Ran r = test::RunCommand(
      "HF_ENDPOINT=" + hub_.endpoint() + " HF_HUB_CACHE=" + cache_.string() +
      " HF_TOKEN= " ST_BINARY
      " finetune --dataset databricks/databricks-dolly-15k"
      " --dataset-split 'train[:24]' --num-epochs 1 --batch-size-per-device 4 --max-seq-len 32"
      " --topology 2 --no-dashboard --storage-path " +
      dir + " --run-name hub 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("databricks/databricks-dolly-15k@main: config default, split train: 1 file"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Epoch 1/1 | loss="), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("datasets--databricks--databricks-dolly-15k/snapshots/" + std::string(40, '4') +
                 "/databricks-dolly-15k.jsonl records [0, 24): 24 used"),
      std::string::npos)
      << r.out;
  fs::remove_all(dir);
  // Offline, the same command reads the cache.
  const test::Ran off = test::RunCommand(
      "HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9 HF_HUB_CACHE=" + cache_.string() +
      " " ST_BINARY
      " finetune --dataset databricks/databricks-dolly-15k --dataset-split "
      "'train[:8]' --num-epochs 1 --max-seq-len 32 --topology 1 --no-dashboard --storage-path " +
      dir + " --run-name off 2>&1");
  EXPECT_EQ(off.code, 0) << off.out;
  fs::remove_all(dir);
  // `slicetrain download --dataset` fetches a split for later offline runs.
  const test::Ran dl =
      test::RunCommand("HF_ENDPOINT=" + hub_.endpoint() + " HF_HUB_CACHE=" + cache_.string() +
                       " " ST_BINARY " download --dataset acme/instruct --dataset-split test");
  EXPECT_EQ(dl.code, 0) << dl.out;
  EXPECT_NE(dl.out.find("datasets--acme--instruct/snapshots/" + hub_.dataset("acme/instruct").sha),
            std::string::npos)
      << dl.out;
  EXPECT_TRUE(fs::exists(cache_ / "datasets--acme--instruct" / "snapshots" /
                         hub_.dataset("acme/instruct").sha / "data" /
                         "test-00000-of-00001.parquet"));
  // An unknown data set: one line, exit code 1, no worker started.
  const test::Ran bad = test::RunCommand(
      "HF_ENDPOINT=" + hub_.endpoint() + " HF_HUB_CACHE=" + cache_.string() +
      " " ST_BINARY " finetune --dataset acme/none --topology 1 --no-dashboard --storage-path " +
      dir + " 2>&1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("slicetrain finetune: error: --dataset acme/none"), std::string::npos)
      << bad.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace st

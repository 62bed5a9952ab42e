// Split-to-file resolution of `datasets` (data_files.py: get_data_patterns, resolve_pattern,
// infer_module_for_data_files), re-implemented on a file list.
#include "data/data_files.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "data/formats/rows.h"

namespace st {
namespace {

namespace fs = std::filesystem;

std::string Basename(const std::string& p) {
  const size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string GlobToRegex(const std::string& g) {
  std::string r = "^";
  for (size_t i = 0; i < g.size(); ++i) {
    const char c = g[i];
    if (c == '*' && i + 1 < g.size() && g[i + 1] == '*') {
      const bool at_start = i == 0 || g[i - 1] == '/';
      if (at_start && i + 2 < g.size() && g[i + 2] == '/') {
        r += "(?:.*/)?";  // **/ : any number of directories, also none
        i += 2;
      } else {
        r += ".*";
        ++i;
      }
    } else if (c == '*') {
      r += "[^/]*";
    } else if (c == '?') {
      r += "[^/]";
    } else if (c == '[') {
      const size_t close = g.find(']', i + 2);
      if (close == std::string::npos) {
        r += "\\[";
        continue;
      }
      std::string cls = g.substr(i + 1, close - i - 1);
      if (!cls.empty() && cls[0] == '!') cls[0] = '^';
      std::string esc;
      for (char k : cls) {
        if (k == '\\' || k == ']') esc += '\\';
        esc += k;
      }
      r += "[" + esc + "]";
      i = close;
    } else if (std::string_view("\\^$.|+(){}").find(c) != std::string_view::npos) {
      r += '\\';
      r += c;
    } else {
      r += c;
    }
  }
  return r + "$";
}

bool Hidden(const std::string& path) {
  size_t start = 0;
  for (;;) {
    const size_t end = path.find('/', start);
    const std::string part = path.substr(start, end == std::string::npos ? end : end - start);
    if (!part.empty() && (part[0] == '.' || (end != std::string::npos && part.rfind("__", 0) == 0)))
      return true;
    if (end == std::string::npos) return false;
    start = end + 1;
  }
}

const std::set<std::string>& IgnoredNames() {
  static const std::set<std::string> k = {"README.md",         "config.json",
                                          "dataset_info.json", "dataset_infos.json",
                                          "dummy_data.zip",    "dataset_dict.json"};
  return k;
}

// A glob as a regex; a pattern std::regex refuses ([z-a]) matches nothing.
std::optional<std::regex> GlobRegex(const std::string& pattern) {
  try {
    return std::regex(GlobToRegex(pattern));
  } catch (const std::regex_error&) {
    return std::nullopt;
  }
}

// The files matching one pattern, in path order (files is sorted).
std::vector<std::string> Resolve(const std::vector<std::string>& files, std::string pattern) {
  while (pattern.rfind("./", 0) == 0) pattern.erase(0, 2);
  std::vector<std::string> out;
  const std::optional<std::regex> compiled = GlobRegex(pattern);
  if (!compiled) return out;
  const std::regex& re = *compiled;
  const std::string pattern_base = Basename(pattern);
  for (const std::string& f : files) {
    if (Hidden(f)) continue;
    const std::string b = Basename(f);
    if (IgnoredNames().count(b) && b != pattern_base) continue;
    if (!std::regex_match(f, re)) continue;
    out.push_back(f);
  }
  return out;
}

using SplitPatterns = std::vector<std::pair<std::string, std::vector<std::string>>>;

// The default patterns of datasets (data_files.py), in its order.
std::vector<SplitPatterns> DefaultPatterns() {
  const std::string sep = "-._ 0-9";
  const std::vector<std::pair<std::string, std::vector<std::string>>> keywords = {
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}}};
  auto expand = [&](const std::vector<std::string>& bases) {
    SplitPatterns sp;
    for (const auto& [split, kws] : keywords) {
      std::vector<std::string> pats;
      for (const std::string& kw : kws)
        for (std::string b : bases) {
          for (size_t p; (p = b.find("{keyword}")) != std::string::npos;) b.replace(p, 9, kw);
          for (size_t p; (p = b.find("{sep}")) != std::string::npos;) b.replace(p, 5, sep);
          pats.push_back(b);
        }
      sp.emplace_back(split, pats);
    }
    return sp;
  };
  return {expand({"{keyword}/**", "{keyword}[{sep}]*/**", "**/*[{sep}]{keyword}/**",
                  "**/*[{sep}]{keyword}[{sep}]*/**"}),
          expand({"**/{keyword}[{sep}]*", "**/*[{sep}]{keyword}[{sep}]*"}),
          SplitPatterns{{"train", {"**"}}}};
}

std::vector<std::string> DataFilesOnly(std::vector<std::string> v) {
  v.erase(
      std::remove_if(v.begin(), v.end(), [](const std::string& f) { return !IsDataFileName(f); }),
      v.end());
  return v;
}

}  // namespace

bool HoldsDataFiles(const std::vector<std::string>& files) {
  return !DataFilesOnly(Resolve(files, "**")).empty();
}

namespace {

StatusOr<SplitPatterns> InferPatterns(const std::vector<std::string>& files) {
  // Shards named data/{split}-00000-of-00003*.*
  const std::string sharded = "data/*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*";
  const std::vector<std::string> shards = DataFilesOnly(Resolve(files, sharded));
  if (!shards.empty()) {
    static const std::regex split_re(R"(^(.+?)-[0-9]{5}-of-[0-9]{5}.*$)");
    std::set<std::string> names;
    for (const std::string& s : shards) {
      std::smatch m;
      const std::string b = Basename(s);
      if (std::regex_match(b, m, split_re)) names.insert(m[1]);
    }
    SplitPatterns sp;
    for (const char* d : {"train", "validation", "test"})
      if (names.erase(d)) sp.push_back({d, {}});
    for (const std::string& n : names) sp.push_back({n, {}});
    for (auto& [split, pats] : sp)
      pats.push_back("data/" + split +
                     "-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*");
    return sp;
  }
  for (const SplitPatterns& group : DefaultPatterns()) {
    SplitPatterns found;
    for (const auto& [split, pats] : group)
      for (const std::string& p : pats)
        if (!DataFilesOnly(Resolve(files, p)).empty()) {
          found.push_back({split, pats});
          break;
        }
    if (!found.empty()) return found;
  }
  return NotFound("no data files (.jsonl, .json, .csv, .tsv, .parquet)");
}

std::vector<std::string> AsStrings(const YAML::Node& n) {
  std::vector<std::string> v;
  if (n.IsScalar()) v.push_back(n.as<std::string>());
  if (n.IsSequence())
    for (const auto& e : n)
      if (e.IsScalar()) v.push_back(e.as<std::string>());
  return v;
}

// One config of the README's front matter.
struct Config {
  std::string name;
  SplitPatterns patterns;  // relative to data_dir; empty: the default patterns under data_dir
  std::string data_dir;    // "" = the repository's root
};

// The configs of the README's front matter, in its order.
StatusOr<std::vector<Config>> ReadmeConfigs(const std::string& readme,
                                            std::string* default_config) {
  std::vector<Config> out;
  if (readme.rfind("---", 0) != 0) return out;
  const size_t end = readme.find("\n---", 3);
  if (end == std::string::npos) return out;
  YAML::Node root;
  try {
    root = YAML::Load(readme.substr(3, end - 3));
  } catch (const std::exception& e) {
    return InvalidArgument(StrCat("README.md: the YAML front matter does not parse: ", e.what()));
  }
  if (!root.IsMap() || !root["configs"]) return out;
  const YAML::Node configs = root["configs"];
  if (!configs.IsSequence())
    return InvalidArgument("README.md: `configs` must be a list of {config_name, data_files}");
  try {
    for (const auto& c : configs) {
      if (!c.IsMap() || !c["config_name"])
        return InvalidArgument("README.md: a `configs` entry without config_name");
      const std::string name = c["config_name"].as<std::string>();
      SplitPatterns sp;
      const YAML::Node df = c["data_files"];
      if (!df) {
        // No data_files: the default patterns, under data_dir when there is one.
      } else if (df.IsScalar()) {
        sp.push_back({"train", AsStrings(df)});
      } else if (df.IsMap()) {
        for (const auto& kv : df) sp.push_back({kv.first.as<std::string>(), AsStrings(kv.second)});
      } else if (df.IsSequence()) {
        std::vector<std::string> plain;
        for (const auto& e : df) {
          if (e.IsScalar()) {
            plain.push_back(e.as<std::string>());
          } else if (e.IsMap() && e["split"] && e["path"]) {
            sp.push_back({e["split"].as<std::string>(), AsStrings(e["path"])});
          } else {
            return InvalidArgument(
                StrCat("README.md: config ", name, ": data_files entries need `split` and `path`"));
          }
        }
        if (!plain.empty()) sp.push_back({"train", plain});
      }
      if (c["default"] && c["default"].as<bool>(false)) *default_config = name;
      std::string data_dir = c["data_dir"] ? c["data_dir"].as<std::string>() : "";
      while (!data_dir.empty() && data_dir.back() == '/') data_dir.pop_back();
      while (data_dir.rfind("./", 0) == 0) data_dir.erase(0, 2);
      if (data_dir == ".") data_dir.clear();
      out.push_back({name, sp, data_dir});
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(StrCat("README.md: bad `configs` entry: ", e.what()));
  }
  return out;
}

}  // namespace

bool GlobMatch(const std::string& pattern, const std::string& path) {
  const std::optional<std::regex> re = GlobRegex(pattern);
  return re && std::regex_match(path, *re);
}

StatusOr<SplitFiles> ResolveSplitFiles(const std::vector<std::string>& files_in,
                                       const std::string& readme, const std::string& config,
                                       const std::string& split) {
  std::vector<std::string> files = files_in;
  std::sort(files.begin(), files.end());
  std::string dflt;
  ST_ASSIGN_OR_RETURN(auto configs, ReadmeConfigs(readme, &dflt));
  SplitFiles out;
  SplitPatterns patterns;
  if (configs.empty()) {
    if (!config.empty() && config != "default")
      return NotFound(StrCat("no config '", config,
                             "': the data set defines no configs in its README (use the default)"));
    out.config = "default";
    ST_ASSIGN_OR_RETURN(patterns, InferPatterns(files));
  } else {
    std::string want = config;
    if (want.empty()) {
      if (!dflt.empty())
        want = dflt;
      else if (configs.size() == 1)
        want = configs[0].name;
      else
        for (const auto& c : configs)
          if (c.name == "default") want = "default";
    }
    std::string names;
    for (const Config& c : configs) names += (names.empty() ? "" : ", ") + c.name;
    if (want.empty())
      return InvalidArgument(
          StrCat("the data set has several configs and no default; pick one "
                 "with --dataset-config (",
                 names, ")"));
    auto it = std::find_if(configs.begin(), configs.end(),
                           [&](const Config& c) { return c.name == want; });
    if (it == configs.end())
      return NotFound(StrCat("no config '", want, "' (the README defines: ", names, ")"));
    out.config = want;
    patterns = it->patterns;
    if (!it->data_dir.empty()) {
      // data_dir: data_files (or the default patterns) are relative to it.
      const std::string prefix = it->data_dir + "/";
      if (patterns.empty()) {
        std::vector<std::string> under;
        for (const std::string& f : files)
          if (f.rfind(prefix, 0) == 0) under.push_back(f.substr(prefix.size()));
        StatusOr<SplitPatterns> inferred = InferPatterns(under);
        if (!inferred.ok())
          return NotFound(StrCat("config '", want, "': ", inferred.status().message(),
                                 " under data_dir ", it->data_dir));
        patterns = *inferred;
      }
      for (auto& [split_name, pats] : patterns)
        for (std::string& p : pats) p = prefix + p;
    } else if (patterns.empty()) {
      ST_ASSIGN_OR_RETURN(patterns, InferPatterns(files));
    }
  }
  const SplitPatterns::value_type* mine = nullptr;
  for (const auto& sp : patterns) {
    out.splits.push_back(sp.first);
    if (sp.first == split) mine = &sp;
  }
  std::string split_names;
  for (const std::string& s : out.splits) split_names += (split_names.empty() ? "" : ", ") + s;
  if (!mine)
    return NotFound(
        StrCat("config '", out.config, "' has no split '", split, "' (splits: ", split_names, ")"));
  std::vector<std::string> matched;
  for (const std::string& p : mine->second) {
    std::vector<std::string> m = Resolve(files, p);
    if (m.empty() && p.find_first_of("*?[") == std::string::npos)
      return NotFound(StrCat("config '", out.config, "' split '", split, "': no file ", p));
    matched.insert(matched.end(), m.begin(), m.end());
  }
  // The most common data file type decides which files are read (datasets' module inference).
  std::map<std::string, int> count;
  std::vector<std::string> order;
  auto kind = [](const std::string& f) -> std::string {
    if (!IsDataFileName(f)) return "";
    std::string e = f.substr(f.rfind('.'));
    for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return e == ".jsonl" || e == ".json" ? "json" : e == ".parquet" ? "parquet" : "csv";
  };
  for (const std::string& f : matched) {
    const std::string k = kind(f);
    if (k.empty()) continue;
    if (!count[k]++) order.push_back(k);
  }
  if (order.empty())
    return NotFound(StrCat("config '", out.config, "' split '", split,
                           "': no data files (.jsonl, .json, .csv, .tsv, .parquet) among ",
                           matched.size(), " matching files"));
  std::string best = order[0];
  for (const std::string& k : order)
    if (count[k] > count[best]) best = k;
  for (const std::string& f : matched)
    if (kind(f) == best) out.files.push_back(f);
  return out;
}

StatusOr<std::vector<std::string>> ListRepoFiles(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir,
                                      fs::directory_options::follow_directory_symlink |
                                          fs::directory_options::skip_permission_denied,
                                      ec);
  if (ec) return IoError(StrCat(dir, ": ", ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return IoError(StrCat(dir, ": ", ec.message()));
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) out.push_back(it->path().lexically_relative(dir).generic_string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace st

#include "io/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sd::io {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

bool is_commit_hash(const std::string& revision) {
  return revision.size() == 40 && std::all_of(revision.begin(), revision.end(),
                                              [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string trimmed(std::string text) {
  text.erase(
      std::remove_if(text.begin(), text.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
      text.end());
  return text;
}

std::string fetch_hint(const std::string& repo_id, const std::string& revision) {
  return fmt::format(
      "sdtrain never downloads: on a machine with network run `huggingface-cli download {}{}` and copy its cache "
      "folder here, or set HF_HUB_CACHE to a cache that has it",
      repo_id, revision.empty() ? "" : " --revision " + revision);
}

}  // namespace

fs::path hub_cache_dir() {
  if (const std::string cache = env("HF_HUB_CACHE"); !cache.empty()) return cache;
  if (const std::string home = env("HF_HOME"); !home.empty()) return fs::path(home) / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

bool is_hub_repo_id(const std::string& name) {
  static const std::regex repo_id(R"(^([\w.\-]+/)?[\w.\-]{1,96}$)");
  return std::regex_match(name, repo_id) && name.find("--") == std::string::npos &&
         name.find("..") == std::string::npos && name.front() != '.' && name.back() != '.';
}

fs::path find_cached_snapshot(const std::string& repo_id, const std::string& revision) {
  const fs::path repo = hub_cache_dir() / ("models--" + std::regex_replace(repo_id, std::regex("/"), "--"));
  SD_CHECK(fs::is_directory(repo), "{}: not a local folder or file, and not in the Hugging Face cache (no {}); {}",
           repo_id, repo.string(), fetch_hint(repo_id, revision));
  const std::string wanted = revision.empty() ? "main" : revision;
  SD_CHECK(wanted.find("..") == std::string::npos && wanted.front() != '/',
           "--revision '{}': expected a branch, tag or commit hash", wanted);
  std::string commit = wanted;
  if (!is_commit_hash(wanted)) {
    const fs::path ref = repo / "refs" / wanted;
    SD_CHECK(fs::is_regular_file(ref), "{}: revision '{}' is not in the Hugging Face cache (no {}); {}", repo_id,
             wanted, ref.string(), fetch_hint(repo_id, revision));
    commit = trimmed(read_text_file(ref));
    SD_CHECK(is_commit_hash(commit), "{}: {} does not hold a commit hash", repo_id, ref.string());
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  SD_CHECK(fs::is_directory(snapshot), "{}: revision '{}' (commit {}) has no snapshot in the cache (no {}); {}",
           repo_id, wanted, commit, snapshot.string(), fetch_hint(repo_id, revision));
  return snapshot;
}

}  // namespace sd::io

// A Hugging Face Hub cache for tests, laid out as huggingface_hub lays it out: models--<org>--<name>/ with
// refs/<branch> holding a commit hash and snapshots/<commit>/ of relative symlinks into blobs/.
#pragma once
#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "io/atomic_file.h"

namespace sd::test {

// Adds every file of the folder `pipeline` to `cache` as `repo_id` at `commit`, which refs/`branch` names.
inline void add_to_hub_cache(const std::filesystem::path& cache, const std::string& repo_id,
                             const std::filesystem::path& pipeline, const std::string& commit,
                             const std::string& branch) {
  namespace fs = std::filesystem;
  std::string folder = "models--" + repo_id;
  folder.replace(folder.find('/'), 1, "--");
  const fs::path repo = cache / folder, snapshot = repo / "snapshots" / commit;
  int blob = 0;
  for (const auto& entry : fs::recursive_directory_iterator(pipeline)) {
    if (!entry.is_regular_file()) continue;
    const fs::path relative = fs::relative(entry.path(), pipeline);
    const fs::path blob_path = repo / "blobs" / fmt::format("{}{:038d}", commit.substr(0, 2), blob++);
    fs::create_directories(blob_path.parent_path());
    fs::copy_file(entry.path(), blob_path);
    fs::create_directories((snapshot / relative).parent_path());
    fs::create_symlink(fs::relative(blob_path, (snapshot / relative).parent_path()), snapshot / relative);
  }
  io::write_text_file(repo / "refs" / branch, commit);
}

}  // namespace sd::test

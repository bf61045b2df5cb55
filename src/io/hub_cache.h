// Hugging Face Hub names resolved offline, from the cache huggingface_hub (and so diffusers) fills when it downloads:
// <cache>/models--<org>--<name>/refs/<branch or tag> holds a commit hash, snapshots/<hash>/ the repository's files
// (symlinks into blobs/). The cache is HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. Nothing is
// ever downloaded: a name that is not cached is an error saying how to fetch it elsewhere.
#pragma once
#include <filesystem>
#include <string>

namespace sd::io {

std::filesystem::path hub_cache_dir();

// A Hub repository id as huggingface_hub accepts it: "name" or "org/name", of letters, digits, '-', '_' and '.'.
bool is_hub_repo_id(const std::string& name);

// The snapshot folder of `repo_id` at `revision` (a branch or tag under refs/, or a commit hash; "" means "main").
// Throws one sd::Error line saying where it looked and how to fetch the model.
std::filesystem::path find_cached_snapshot(const std::string& repo_id, const std::string& revision);

}  // namespace sd::io

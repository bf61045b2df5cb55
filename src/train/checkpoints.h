// checkpoint-N folders in the output directory, as diffusers' scripts name them: finding the latest, honouring
// --checkpoints_total_limit, and writing a folder atomically (built under a temporary name, then renamed).
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

namespace sd::train {

// checkpoint-N folders under `output_dir`, sorted by N.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& output_dir);

// Resolves --resume_from_checkpoint: "latest" -> the highest checkpoint-N (nullopt when there is none, as the
// reference starts a new run then); a name or path -> that folder, which must exist.
std::optional<std::filesystem::path> resolve_checkpoint(const std::filesystem::path& output_dir,
                                                        const std::string& flag);

// The step number of a checkpoint-N folder.
int64_t checkpoint_step(const std::filesystem::path& checkpoint);

// Before writing a new checkpoint, removes the oldest so that at most `limit - 1` remain.
void enforce_total_limit(const std::filesystem::path& output_dir, std::optional<int> limit);

// Creates `dir` by calling fill(tmp_dir) on a temporary sibling folder and renaming it into place, replacing an
// older folder of the same name. A crash mid-way leaves only the temporary folder.
void write_directory_atomically(const std::filesystem::path& dir,
                                const std::function<void(const std::filesystem::path&)>& fill);

}  // namespace sd::train

// checkpoint-N folders in the output directory, as diffusers' scripts name them. A checkpoint is written as
// checkpoint-N.partial by every rank, then manifest.json (written last) marks it whole and the folder is renamed into
// place; a folder without a manifest is never resumed from. Old checkpoints are removed only after a new one is
// whole, so a failed write never leaves the run without a checkpoint.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sd::train {

inline constexpr const char* kCheckpointFormat = "sdtrain-checkpoint-1";
inline constexpr const char* kManifestName = "manifest.json";

// Whole checkpoint-N folders under `output_dir` (those with a manifest), sorted by N.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& output_dir);

// Resolves --resume_from_checkpoint: "latest" -> the highest whole checkpoint-N (nullopt when there is none, as the
// reference starts a new run then; incomplete ones are skipped with a warning); a name or path -> that folder, which
// must exist and be whole.
std::optional<std::filesystem::path> resolve_checkpoint(const std::filesystem::path& output_dir,
                                                        const std::string& flag);

// The step number of a checkpoint-N folder.
int64_t checkpoint_step(const std::filesystem::path& checkpoint);

// The manifest of a whole checkpoint; throws sd::Error naming the folder when it is missing or malformed.
nlohmann::json read_manifest(const std::filesystem::path& checkpoint);

// checkpoint-N -> checkpoint-N.partial, where ranks write before it is published.
std::filesystem::path partial_checkpoint_path(const std::filesystem::path& checkpoint);
// Removes checkpoint-N.partial folders an interrupted run left behind.
void discard_partial_checkpoints(const std::filesystem::path& output_dir);
// Renames a finished `partial` folder to `checkpoint` (replacing an older folder of that name, through
// checkpoint-N.old: io::replace_directory).
void publish_checkpoint(const std::filesystem::path& partial, const std::filesystem::path& checkpoint);
// "checkpoint-N".
bool is_checkpoint_name(const std::string& name);
// Keeps the newest `limit` whole checkpoints (all when no limit).
void remove_old_checkpoints(const std::filesystem::path& output_dir, std::optional<int> limit);

}  // namespace sd::train

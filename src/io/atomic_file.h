// Write-then-rename, so a crash or Ctrl-C never leaves a half-written file or folder under its final name.
#pragma once
#include <filesystem>
#include <functional>
#include <string>

namespace sd::io {

// Calls write(tmp_path) and renames tmp_path to path once write returns; removes tmp_path if it throws.
void write_atomically(const std::filesystem::path& path,
                      const std::function<void(const std::filesystem::path& tmp_path)>& write);

// Creates folder `dir` by calling fill(tmp_dir) on a temporary sibling folder and renaming it into place, replacing
// an older folder of the same name. A crash mid-way leaves only the temporary folder.
void write_directory_atomically(const std::filesystem::path& dir,
                                const std::function<void(const std::filesystem::path& tmp_dir)>& fill);

// Writes text to path atomically.
void write_text_file(const std::filesystem::path& path, const std::string& text);

// Reads a whole file; throws sd::Error naming the path if it cannot.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace sd::io

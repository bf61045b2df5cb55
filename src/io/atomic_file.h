// Write-then-rename, so a crash or Ctrl-C never leaves a half-written file or folder under its final name; the
// recovery of what a kill in the middle leaves behind; and write errors that name the file and the OS's reason.
#pragma once
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

namespace sd::io {

// A file being written through POSIX calls, so that a failure reports errno: every error is an sd::Error naming
// `name` (the final path, when `path` is a temporary one) and the reason, e.g. "out/x.safetensors: cannot write: No
// space left on device".
class FileWriter {
 public:
  explicit FileWriter(const std::filesystem::path& path, const std::filesystem::path& name = {}, bool append = false);
  ~FileWriter();  // closes without checking (the error, if any, is already on its way)
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(const void* data, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Flushes to the file system and closes; network and full file systems may report failures only here.
  void close();

 private:
  [[noreturn]] void fail_with_errno(const char* what) const;
  int fd_ = -1;
  std::filesystem::path name_;
};

// Copies the folder `from` (files and subfolders) into the new or empty folder `to`. Errors name the file the way
// `shown_as` (the folder `to` will become) would hold it and the OS's reason, e.g. "out/vae/x.safetensors: cannot
// write: No space left on device" (std::filesystem::copy reports a full disk as an I/O error of the source).
void copy_folder(const std::filesystem::path& from, const std::filesystem::path& to,
                 const std::filesystem::path& shown_as);

// Calls write(tmp_path) and renames tmp_path to path once write returns; removes tmp_path if it throws.
void write_atomically(const std::filesystem::path& path,
                      const std::function<void(const std::filesystem::path& tmp_path)>& write);

// The same with the temporary file opened: errors name `path`.
void write_file_atomically(const std::filesystem::path& path, const std::function<void(FileWriter& out)>& write);

// Creates folder `dir` by calling fill(tmp_dir) on a temporary sibling folder and renaming it into place, replacing
// an older folder of the same name (replace_directory). A crash mid-way leaves only the temporary folder, or
// dir.old, which recover_interrupted_replace puts right; it runs first.
void write_directory_atomically(const std::filesystem::path& dir,
                                const std::function<void(const std::filesystem::path& tmp_dir)>& fill);

// Moves the finished folder `ready` to `dir`, replacing whatever folder is there: dir -> dir.old, ready -> dir,
// dir.old removed. Each step is one rename (or the removal of a folder no longer needed), so a kill between any
// two leaves a whole version under dir or under dir.old, never only a half one.
void replace_directory(const std::filesystem::path& ready, const std::filesystem::path& dir);

// Puts right what an interrupted replace_directory / write_directory_atomically left for `dir`: a dir.old is the
// last whole version, restored when dir is missing and removed when dir exists (the newer whole version); dir.tmpPID
// folders of processes that no longer run are removed.
void recover_interrupted_replace(const std::filesystem::path& dir);

// For the start of a command that writes into `folder` again: recover_interrupted_replace for every X.old in
// `folder` (not below) whose X is a folder the command replaces (`replaced(X)`: a user's own "notes.old" is left
// alone), and removal of the temporary files and folders (X.tmpPID, .partial-PID) of processes that no longer run.
void recover_interrupted_writes(const std::filesystem::path& folder,
                                const std::function<bool(const std::string& name)>& replaced);

// Test hook: called after each step k = 1, 2, 3 of replace_directory (renamed away, renamed into place, old
// removed), so that a test can end the process there as a kill would. Null in normal runs.
extern void (*replace_directory_step_hook)(int step);

// Checks that `dir` is a folder or can be created, and that a file can be written there, without creating anything
// (a command that fails later leaves no empty folder), so that an unusable output location stops a command before
// any work, with the flag and the OS's reason, e.g.
// "--output_dir out/x: cannot create the folder: Not a directory (out is a file)".
void check_output_dir(const std::string& flag, const std::filesystem::path& dir);

// The same for a file a command will write: its folder as above, and the path itself not a folder.
void check_output_file(const std::string& flag, const std::filesystem::path& file);

// An exclusive lock on an output folder (flock on <dir>/.sdtrain.lock, holding the owner's pid), kept until
// destroyed or until the process ends, however it ends: two runs writing one folder would interleave their
// checkpoints and logs. Throws sd::Error naming `flag`, the folder and the holder's pid when another process has it.
class OutputFolderLock {
 public:
  OutputFolderLock(const std::string& flag, const std::filesystem::path& dir);
  ~OutputFolderLock();
  OutputFolderLock(const OutputFolderLock&) = delete;
  OutputFolderLock& operator=(const OutputFolderLock&) = delete;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// One line for a std::filesystem error: "<path>: <what failed>: <OS reason>".
std::string describe(const std::filesystem::filesystem_error& e);

// Writes text to path atomically.
void write_text_file(const std::filesystem::path& path, const std::string& text);

// Reads a whole file; throws sd::Error naming the path if it cannot.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace sd::io

#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "core/error.h"

namespace sd::io {

namespace fs = std::filesystem;

void (*replace_directory_step_hook)(int step) = nullptr;

namespace {

// The temporary name of `path` for this process: leftovers of a dead process are recognised by their pid.
fs::path temporary_name(const fs::path& path) {
  fs::path tmp = path;
  tmp += fmt::format(".tmp{}", getpid());
  return tmp;
}

fs::path old_name(const fs::path& dir) {
  fs::path old = dir;
  old += ".old";
  return old;
}

void step_done(int step) {
  if (replace_directory_step_hook) replace_directory_step_hook(step);
}

// A leftover of this process (from a previous run that had the same pid, common in containers: nothing of this
// command is written yet when the recovery runs) or of a process that no longer runs.
bool is_orphan(long pid) {
  if (pid == getpid()) return true;
  return pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

const std::regex kTemporaryName("(.+)\\.tmp([0-9]{1,9})");
const std::regex kPartialPipelineName("\\.partial-([0-9]{1,9})");

// The pid a temporary name carries (X.tmpPID, .partial-PID), if it is one.
std::optional<long> temporary_pid(const std::string& name) {
  std::smatch m;
  if (std::regex_match(name, m, kTemporaryName)) return std::stol(m[2].str());
  if (std::regex_match(name, m, kPartialPipelineName)) return std::stol(m[1].str());
  return std::nullopt;
}

}  // namespace

FileWriter::FileWriter(const fs::path& path, const fs::path& name, bool append) : name_(name.empty() ? path : name) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) fail_with_errno("cannot open for writing");
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::fail_with_errno(const char* what) const {
  fail("{}: {}: {}", name_.string(), what, std::strerror(errno));
}

void FileWriter::write(const void* data, size_t size) {
  SD_CHECK(fd_ >= 0, "{}: written after it was closed", name_.string());
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_with_errno("cannot write");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void FileWriter::close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) fail_with_errno("cannot write");
}

void copy_folder(const fs::path& from, const fs::path& to, const fs::path& shown_as) {
  fs::create_directory(to);
  std::vector<char> buffer(size_t{1} << 20);
  // Symlinks are followed, folders too: a Hugging Face cache's snapshot is symlinks into its blob store, and a copy
  // must hold the files themselves.
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(from, fs::directory_options::follow_directory_symlink)) {
    const fs::path relative = entry.path().lexically_relative(from);
    if (entry.is_directory()) {
      fs::create_directory(to / relative);
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    SD_CHECK(in.is_open(), "{}: cannot open for reading", entry.path().string());
    FileWriter out(to / relative, shown_as / relative);
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      out.write(buffer.data(), static_cast<size_t>(in.gcount()));
    }
    SD_CHECK(in.eof(), "{}: cannot read", entry.path().string());
    out.close();
  }
}

void write_atomically(const fs::path& path, const std::function<void(const fs::path&)>& write) {
  const fs::path tmp = temporary_name(path);
  try {
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    write(tmp);
    fs::rename(tmp, path);
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail("{}: cannot write: {}", path.string(), e.code().message());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

void write_file_atomically(const fs::path& path, const std::function<void(FileWriter&)>& write) {
  write_atomically(path, [&](const fs::path& tmp) {
    FileWriter out(tmp, path);
    write(out);
    out.close();
  });
}

namespace {

// What an interrupted replace left under dir.old: the last whole version when dir is missing (restored), else a
// version already replaced (removed).
void settle_old_version(const fs::path& dir) {
  const fs::path old = old_name(dir);
  if (!fs::is_directory(old)) return;
  if (fs::exists(dir))
    fs::remove_all(old);
  else
    fs::rename(old, dir);
}

}  // namespace

void replace_directory(const fs::path& ready, const fs::path& dir) {
  const fs::path old = old_name(dir);
  settle_old_version(dir);  // the sequence below needs dir.old free
  if (fs::exists(dir)) fs::rename(dir, old);
  step_done(1);
  fs::rename(ready, dir);
  step_done(2);
  fs::remove_all(old);
  step_done(3);
}

void recover_interrupted_replace(const fs::path& dir) {
  settle_old_version(dir);
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (!fs::is_directory(parent)) return;
  const std::string prefix = dir.filename().string() + ".tmp";
  for (const auto& entry : fs::directory_iterator(parent)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    auto pid = temporary_pid(name);
    if (pid && is_orphan(*pid)) fs::remove_all(entry.path());
  }
}

void recover_interrupted_writes(const fs::path& folder, const std::function<bool(const std::string&)>& replaced) {
  if (!fs::is_directory(folder)) return;
  std::vector<fs::path> dirs, orphans;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const fs::path& path = entry.path();
    if (entry.is_directory() && path.extension() == ".old" && replaced(path.stem().string()))
      dirs.push_back(folder / path.stem());
    if (auto pid = temporary_pid(path.filename().string()); pid && is_orphan(*pid)) orphans.push_back(path);
  }
  for (const auto& dir : dirs) recover_interrupted_replace(dir);
  for (const auto& path : orphans) fs::remove_all(path);
}

void write_directory_atomically(const fs::path& dir, const std::function<void(const fs::path&)>& fill) {
  recover_interrupted_replace(dir);
  const fs::path tmp = temporary_name(dir);
  try {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    fill(tmp);
    replace_directory(tmp, dir);
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    fail("{}: cannot write the folder: {}", dir.string(), describe(e));
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

void check_output_dir(const std::string& flag, const fs::path& dir) {
  if (dir.empty()) fail("{}: expected a folder, got an empty path", flag);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) fail("{} {}: is a file, not a folder", flag, dir.string());
  // Nothing is created: a command that fails later leaves no empty folder. The probe goes where the folder is, or
  // into its deepest existing ancestor, which is where it would be created.
  const bool exists = fs::is_directory(dir, ec);
  fs::path where = dir;
  while (!exists && !where.empty() && !fs::exists(where, ec) && where != where.parent_path())
    where = where.parent_path();
  if (where.empty()) where = ".";
  const std::string cannot = exists ? "cannot write there" : "cannot create the folder";
  if (!fs::is_directory(where, ec))
    fail("{} {}: {}: {} ({} is a file)", flag, dir.string(), cannot, std::strerror(ENOTDIR), where.string());
  // A block, not just a name: a full file system still has room for an empty file.
  const fs::path probe = temporary_name(where / ".sdtrain-write-test");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{} {}: {}: {}", flag, dir.string(), cannot, std::strerror(errno));
  const std::string block(4096, '\0');
  const ssize_t written = ::write(fd, block.data(), block.size());
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (written != static_cast<ssize_t>(block.size()))
    fail("{} {}: cannot write there: {}", flag, dir.string(), std::strerror(written < 0 ? write_errno : ENOSPC));
}

void check_output_file(const std::string& flag, const fs::path& file) {
  if (file.empty()) fail("{}: expected a file name, got an empty path", flag);
  std::error_code ec;
  if (fs::is_directory(file, ec)) fail("{} {}: is a folder, not a file", flag, file.string());
  const fs::path folder = file.parent_path();
  check_output_dir(flag, folder.empty() ? fs::path(".") : folder);
}

std::string describe(const fs::filesystem_error& e) {
  // what() is "filesystem error: <operation>: <reason> [path1] [path2]".
  std::string operation = e.what();
  const std::string prefix = "filesystem error: ";
  if (operation.rfind(prefix, 0) == 0) operation.erase(0, prefix.size());
  const std::string reason = e.code().message();
  const auto at = operation.find(": " + reason);
  if (at != std::string::npos) operation.resize(at);
  const std::string path = e.path1().empty() ? std::string() : e.path1().string() + ": ";
  return fmt::format("{}{}: {}", path, operation, reason);
}

void write_text_file(const fs::path& path, const std::string& text) {
  write_file_atomically(path, [&](FileWriter& out) { out.write(text); });
}

OutputFolderLock::OutputFolderLock(const std::string& flag, const fs::path& dir) : path_(dir / ".sdtrain.lock") {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("{} {}: cannot create {}: {}", flag, dir.string(), path_.filename().string(), std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    // A file system without locks (some network mounts): run unguarded rather than refuse to run.
    if (error != EWOULDBLOCK) return;
    const std::string holder = read_text_file(path_);
    fail("{} {}: another sdtrain process (pid {}) is writing there; wait for it, or give another folder", flag,
         dir.string(), holder.empty() ? "unknown" : holder);
  }
  // The pid only makes another run's message more helpful: the lock holds without it.
  const std::string pid = std::to_string(::getpid());
  [[maybe_unused]] const bool recorded =
      ::ftruncate(fd_, 0) == 0 && ::write(fd_, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size());
}

OutputFolderLock::~OutputFolderLock() {
  if (fd_ < 0) return;
  // Removed while still held, so no other run can have locked this file in between; a killed run leaves it behind,
  // unlocked, and the next run takes it over.
  ::unlink(path_.c_str());
  ::close(fd_);
}

std::string read_text_file(const fs::path& path) {
  std::error_code ignored;
  SD_CHECK(!fs::is_directory(path, ignored), "{}: is a folder, expected a file", path.string());
  std::ifstream in(path, std::ios::binary);
  SD_CHECK(in.good(), "{}: cannot open file (missing or unreadable)", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace sd::io

#include "io/atomic_file.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace sd::io {

namespace fs = std::filesystem;

void write_atomically(const fs::path& path, const std::function<void(const fs::path&)>& write) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  fs::path tmp = path;
  tmp += fmt::format(".tmp{}", getpid());
  try {
    write(tmp);
    fs::rename(tmp, path);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

void write_directory_atomically(const fs::path& dir, const std::function<void(const fs::path&)>& fill) {
  fs::path tmp = dir;
  tmp += fmt::format(".tmp{}", getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    fill(tmp);
    fs::path old = dir;
    old += ".old";
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    fs::remove_all(old);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

void write_text_file(const fs::path& path, const std::string& text) {
  write_atomically(path, [&](const fs::path& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    out.close();
    SD_CHECK(out.good(), "{}: could not write file", tmp.string());
  });
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  SD_CHECK(in.good(), "{}: cannot open file (missing or unreadable)", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace sd::io

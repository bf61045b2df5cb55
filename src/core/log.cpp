#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace sd::log {

namespace {

Level level_from_environment() {
  const char* v = std::getenv("SDTRAIN_LOG");
  if (!v) return Level::kInfo;
  const std::string s = v;
  if (s == "debug") return Level::kDebug;
  if (s == "warning" || s == "warn") return Level::kWarning;
  if (s == "error") return Level::kError;
  return Level::kInfo;
}

std::atomic<int> g_rank{0};
std::atomic<int> g_world{1};
std::atomic<Level> g_level{level_from_environment()};
std::mutex g_mutex;  // one line at a time, also from loader and communication threads

}  // namespace

void set_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

void set_level(Level level) { g_level = level; }

bool is_main_rank() { return g_rank == 0; }

void write(Level level, bool every_rank, const std::string& message) {
  if (level < g_level.load()) return;
  if (!every_rank && g_rank != 0) return;
  std::string prefix = every_rank ? rank_prefix() : "sdtrain: ";
  if (level == Level::kWarning) prefix += "warning: ";
  if (level == Level::kError) prefix += "error: ";
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s%s\n", prefix.c_str(), message.c_str());
  std::fflush(stderr);
}

std::string rank_prefix() {
  return g_world > 1 ? fmt::format("sdtrain[rank {}]: ", g_rank.load()) : std::string("sdtrain: ");
}

}  // namespace sd::log

// Logging for every subcommand: one line per message on stderr, "sdtrain: " first, and in a distributed run the
// rank ("sdtrain[rank 1]: ") on messages every rank prints. Most messages concern the whole run and are printed by
// the main rank alone, so N ranks do not print N copies. SDTRAIN_LOG=debug|info|warning|error sets the level.
#pragma once
#include <fmt/format.h>

#include <string>

namespace sd::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Called once the rank is known; before that every process counts as the main rank of a world of one.
void set_rank(int rank, int world_size);
void set_level(Level level);
bool is_main_rank();

// Prints `message` at `level` if enabled: on the main rank only, or on every rank (with its rank in the prefix).
void write(Level level, bool every_rank, const std::string& message);

// How a line this rank alone prints begins (its own messages, its failure): "sdtrain[rank N]: " once this process
// is one rank of several, so that the lines of many ranks in one terminal or log tell who said what; else
// "sdtrain: ".
std::string rank_prefix();

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::kDebug, false, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::kInfo, false, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::kWarning, false, fmt::format(format, std::forward<Args>(args)...));
}
// Every rank: for what differs between ranks (a rank's own data, files, failures).
template <typename... Args>
void info_every_rank(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::kInfo, true, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void warn_every_rank(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::kWarning, true, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace sd::log

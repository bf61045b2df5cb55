// sd::Error: the one exception type for anything a user can cause (bad file, flag, shape, peer).
// main() catches it, prints its message as one line and exits non-zero.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace sd {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws sd::Error with a fmt-formatted message: fail("{}: expected {}", path, what).
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace sd

// SD_CHECK(cond, "message {}", arg): a user-facing check that throws sd::Error when cond is false.
#define SD_CHECK(cond, ...)    \
  do {                         \
    if (!(cond)) {             \
      ::sd::fail(__VA_ARGS__); \
    }                          \
  } while (0)

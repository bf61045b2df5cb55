#include "cli/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <optional>

namespace sd::cli {

std::string flag_names(const std::string& snake_name) {
  std::string kebab = snake_name;
  std::replace(kebab.begin() + 2, kebab.end(), '_', '-');
  return kebab == snake_name ? snake_name : snake_name + "," + kebab;
}

namespace {

// The flag's text as a whole number, if it is one (CLI11 converts the same text into the flag's type afterwards).
std::optional<int64_t> whole_number(const std::string& text) {
  int64_t value = 0;
  if (!CLI::detail::lexical_cast(text, value)) return std::nullopt;
  return value;
}

}  // namespace

CLI::Validator in_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const auto value = whole_number(text);
        if (!value) return text + " is not a whole number";
        if (*value < lo || *value > hi) return fmt::format("{} is outside {}..{}", text, lo, hi);
        return {};
      },
      fmt::format("{}..{}", lo, hi));
}

CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        const auto value = whole_number(text);
        if (!value) return text + " is not a whole number";
        if (*value < lo) return fmt::format("{} is less than {}", text, lo);
        return {};
      },
      fmt::format(">={}", lo));
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !(value > 0) || !std::isfinite(value))
          return text + " is not a positive number";
        return {};
      },
      ">0");
}

CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !(value >= 0) || !std::isfinite(value))
          return text + " is not a number >= 0";
        return {};
      },
      ">=0");
}

CLI::Validator not_a_flag() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool looks_like_a_flag = text.size() > 2 && text.compare(0, 2, "--") == 0 && std::isalpha(text[2]);
        return looks_like_a_flag ? "got the flag " + text + " instead of a value" : std::string();
      },
      "");
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value)) return text + " is not a finite number";
        return {};
      },
      "finite");
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        if (digits) std::strtoull(text.c_str(), nullptr, 10);
        if (!digits || errno == ERANGE)
          return "\"" + text + "\" is not a seed (a whole number from 0 to 18446744073709551615)";
        return {};
      },
      "0..2^64-1");
}

CLI::Option* accepted_python_flag(CLI::App* app, const std::string& name, bool takes_value, const std::string& note) {
  auto announce = [name, note](const auto&) {
    std::fprintf(stderr, "sdtrain: note: %s: %s\n", name.c_str(), note.c_str());
  };
  if (takes_value)
    return app->add_option_function<std::string>(flag_names(name), announce, "(accepted for compatibility) " + note)
        ->group("Python-only (accepted, not used)");
  return app->add_flag_function(flag_names(name), announce, "(accepted for compatibility) " + note)
      ->group("Python-only (accepted, not used)");
}

CLI::Option* dist_transport_flag(CLI::App* app, std::string& value) {
  return flag(app, "--dist_transport", value,
              "auto: ranks that all run on one machine send gradients and weights through shared memory, "
              "else over TCP; tcp: always over TCP")
      ->check(CLI::IsMember({"auto", "tcp"}));
}

}  // namespace sd::cli

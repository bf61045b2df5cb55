// Flag helpers shared by the subcommands: every flag is registered under the diffusers script's snake_case name
// and a kebab-case alias, with its default shown in --help.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace sd::cli {

// "--train_batch_size" -> "--train_batch_size,--train-batch-size"
std::string flag_names(const std::string& snake_name);

// A text value that is another flag ("--validation_prompts --output_dir out"): the value was forgotten, and CLI11
// would take the next flag as it. Refused as "--validation_prompts: got the flag --output_dir instead of a value".
CLI::Validator not_a_flag();

template <typename T>
constexpr bool is_text = std::is_same_v<T, std::string> || std::is_same_v<T, std::vector<std::string>> ||
                         std::is_same_v<T, std::optional<std::string>>;

template <typename T>
CLI::Option* flag(CLI::App* app, const std::string& name, T& value, const std::string& help) {
  CLI::Option* option = app->add_option(flag_names(name), value, help)->capture_default_str();
  if constexpr (is_text<T>) option->check(not_a_flag());
  return option;
}

// A repeatable flag: each occurrence takes exactly one value (`--x a --x b`), so it never swallows positionals.
template <typename T>
CLI::Option* repeated_flag(CLI::App* app, const std::string& name, std::vector<T>& values, const std::string& help) {
  CLI::Option* option = app->add_option(flag_names(name), values, help)
                            ->allow_extra_args(false)
                            ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  if constexpr (std::is_same_v<T, std::string>) option->check(not_a_flag());
  return option;
}

inline CLI::Option* switch_flag(CLI::App* app, const std::string& name, bool& value, const std::string& help) {
  return app->add_flag(flag_names(name), value, help);
}

// Number checks whose failures read like every other error, with readable bounds: "--threads: 5000 is outside
// 1..1024" (CLI11's own PositiveNumber prints its upper bound as a 300-digit number). The upper bounds of flags
// that size an allocation or a loop (images, threads, vectors, repeats, sizes) keep a typo from asking for terabytes
// or a run of years; they are refused before anything is allocated.
CLI::Validator in_range(int64_t lo, int64_t hi);
// A whole number >= lo with no upper bound other than the type's: "--max_train_steps: 0 is less than 1".
CLI::Validator at_least(int64_t lo);
// A number (not necessarily whole) > 0.
CLI::Validator positive_number();
// A finite number (not necessarily whole) >= 0.
CLI::Validator non_negative_number();
// Any number but NaN or an infinity.
CLI::Validator finite_number();
// A seed: a whole number from 0 to 2^64 - 1. CLI11 alone would wrap -1 around to 2^64 - 1 and saturate larger values.
CLI::Validator seed_value();

// --dist_transport, shared by every command that starts ranks (dist::CommOptions::transport).
CLI::Option* dist_transport_flag(CLI::App* app, std::string& value);

// A flag kept only so command lines written for the Python scripts still parse; using it prints `note` once.
CLI::Option* accepted_python_flag(CLI::App* app, const std::string& name, bool takes_value, const std::string& note);

}  // namespace sd::cli

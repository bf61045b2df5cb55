#include "cli/commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dist/signals.h"

namespace sd::cli {

void add_init(CLI::App& app, std::function<int()>& chosen);
void add_inspect(CLI::App& app, std::function<int()>& chosen);
void add_tokenize(CLI::App& app, std::function<int()>& chosen);
void add_generate(CLI::App& app, std::function<int()>& chosen);
void add_convert(CLI::App& app, std::function<int()>& chosen);
void add_textual_inversion(CLI::App& app, std::function<int()>& chosen);
void add_train(CLI::App& app, std::function<int()>& chosen);
void add_dreambooth(CLI::App& app, std::function<int()>& chosen);
void add_preprocess(CLI::App& app, std::function<int()>& chosen);
void add_launch(CLI::App& app, std::function<int()>& chosen);
void add_dist_check(CLI::App& app, std::function<int()>& chosen);
void add_benchmark(CLI::App& app, std::function<int()>& chosen);
void add_report(CLI::App& app, std::function<int()>& chosen);

namespace {

// Levenshtein distance: how many one-character edits turn `a` into `b`.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substituted = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substituted});
    }
  }
  return row[b.size()];
}

// The long flags `command` takes, with their dashes (and the app's own, such as --help-all, which every subcommand
// passes up).
std::vector<std::string> long_flags(const CLI::App& app, const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::App* owner : {&command, &app})
    for (const CLI::Option* option : owner->get_options())
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  return names;
}

// CLI11 reports an unknown flag only after any missing required one, and as "The following arguments were not
// expected: <its value> <the flag>". A mistyped or foreign flag is named first here, with the flag it most likely
// meant. Everything after a bare "--" belongs to another command line (launch's).
std::optional<std::string> unknown_flag_error(const CLI::App& app, const CLI::App& command, int argc, char** argv) {
  const std::vector<std::string> known = long_flags(app, command);
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string error = fmt::format("{} has no flag {}", command.get_name(), name);
    const auto nearest = std::min_element(known.begin(), known.end(), [&](const auto& a, const auto& b) {
      return edit_distance(name, a) < edit_distance(name, b);
    });
    if (nearest != known.end() && edit_distance(name, *nearest) <= std::max<size_t>(2, name.size() / 4))
      error += fmt::format("; did you mean {}?", *nearest);
    return error + fmt::format(" (see sdtrain {} --help)", command.get_name());
  }
  return std::nullopt;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"sdtrain: train and run Stable Diffusion (diffusers layout), natively"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show every subcommand's flags");
  // As Python's argparse: a flag given twice takes its last value (scripts often append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // A bad flag is one line, like every other error (CLI11 adds a second "Run with --help" line by default).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("sdtrain: error: ") + e.what() + " (see --help)\n";
  });
  std::function<int()> chosen;
  // Each add_* registers one subcommand and sets `chosen` when it is parsed.
  add_init(app, chosen);
  add_inspect(app, chosen);
  add_tokenize(app, chosen);
  add_generate(app, chosen);
  add_convert(app, chosen);
  add_textual_inversion(app, chosen);
  add_train(app, chosen);
  add_dreambooth(app, chosen);
  add_preprocess(app, chosen);
  add_launch(app, chosen);
  add_dist_check(app, chosen);
  add_benchmark(app, chosen);
  add_report(app, chosen);
  // CLI11 would say "A subcommand is required" for a typo, or print the general help for `trian --help`.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::fputs(
          fmt::format("sdtrain: error: unknown command '{}' (expected one of: {})\n", argv[1], fmt::join(names, ", "))
              .c_str(),
          stderr);
      return 1;
    }
    if (const auto error = unknown_flag_error(app, *app.get_subcommand(argv[1]), argc, argv)) {
      std::fputs(("sdtrain: error: " + *error + "\n").c_str(), stderr);
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Before the subcommand starts any thread (LibTorch's pools start with the first parallel op).
  if (!app.got_subcommand("launch")) dist::route_stop_signals_to_a_watcher_thread();
  return chosen ? chosen() : 0;
}

}  // namespace sd::cli

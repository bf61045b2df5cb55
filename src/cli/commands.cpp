#include "cli/commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
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
void add_preprocess(CLI::App& app, std::function<int()>& chosen);
void add_launch(CLI::App& app, std::function<int()>& chosen);
void add_dist_check(CLI::App& app, std::function<int()>& chosen);
void add_benchmark(CLI::App& app, std::function<int()>& chosen);
void add_report(CLI::App& app, std::function<int()>& chosen);

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

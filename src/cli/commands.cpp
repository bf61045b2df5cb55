#include "cli/commands.h"

#include <functional>

namespace sd::cli {

// ---- distributed subcommands (src/cli/launch.cpp, src/cli/dist_check.cpp) ----
void add_launch(CLI::App& app, std::function<int()>& chosen);
void add_dist_check(CLI::App& app, std::function<int()>& chosen);
// ---- end distributed subcommands ----

int run(int argc, char** argv) {
  CLI::App app{"sdtrain: train and run Stable Diffusion (diffusers layout), natively"};
  app.require_subcommand(1);
  std::function<int()> chosen;
  // Each add_* registers one subcommand and sets `chosen` when it is parsed.
  // ---- distributed subcommands ----
  add_launch(app, chosen);
  add_dist_check(app, chosen);
  // ---- end distributed subcommands ----
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return chosen ? chosen() : 0;
}

}  // namespace sd::cli

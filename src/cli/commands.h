// The subcommands. Each lives in its own file and registers its flags on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

namespace sd::cli {

// Parses argv, runs the chosen subcommand, returns the exit code.
int run(int argc, char** argv);

}  // namespace sd::cli

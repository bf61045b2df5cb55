// sdtrain: dispatches to one subcommand; every user-caused failure ends here as one line and exit code 1.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  try {
    return sd::cli::run(argc, argv);
  } catch (const sd::Error& e) {
    std::fprintf(stderr, "sdtrain: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdtrain: internal error: %s\n", e.what());
  }
  return 1;
}

// sdtrain: dispatches to one subcommand; every user-caused failure ends here as one line and exit code 1.
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "cli/huge_pages.h"
#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"

namespace {

// The first line only: c10::Error's what() carries a frame list, which is no use to a user.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

int main(int argc, char** argv) {
#ifdef SDTRAIN_TCMALLOC
  sd::cli::use_transparent_huge_pages();
  sd::cli::keep_freed_memory();
#endif
  // In a run of several ranks each rank names itself on its error line ("sdtrain[rank 1]: error: ...").
  const auto report = [](const char* kind, const std::string& message) {
    std::fprintf(stderr, "%s%s: %s\n", sd::log::rank_prefix().c_str(), kind, message.c_str());
  };
  try {
    return sd::cli::run(argc, argv);
  } catch (const sd::Error& e) {
    report("error", e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    // A file system refusing (full, read-only, not a directory) is the machine's state, not a bug.
    report("error", sd::io::describe(e));
  } catch (const c10::Error& e) {
    report("internal error", first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    report("internal error", first_line(e.what()));
  }
  return 1;
}

// `sdtrain report OUTPUT_DIR [--logging_dir logs]`: writes OUTPUT_DIR/report.html, one self-contained page with a
// training run's curves, validation images, flags and checkpoints, and prints its path.
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "report/html_report.h"

namespace sd::cli {

namespace {

struct ReportOptions {
  std::string output_dir;
  std::string logging_dir = "logs";
};

int run_report(const ReportOptions& o) {
  std::printf("%s\n", report::write_report(o.output_dir, o.logging_dir).c_str());
  return 0;
}

}  // namespace

void add_report(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("report",
                                 "Write OUTPUT_DIR/report.html: a training run's curves, validation "
                                 "images, flags and checkpoints, in one self-contained page");
  auto o = std::make_shared<ReportOptions>();
  cmd->add_option("output_dir", o->output_dir, "The training run's --output_dir")->required();
  flag(cmd, "--logging_dir", o->logging_dir, "The run's --logging_dir (relative to OUTPUT_DIR)");
  cmd->callback([o, &chosen] { chosen = [o] { return run_report(*o); }; });
}

}  // namespace sd::cli

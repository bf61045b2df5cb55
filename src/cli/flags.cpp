#include "cli/flags.h"

#include <algorithm>
#include <cstdio>

namespace sd::cli {

std::string flag_names(const std::string& snake_name) {
  std::string kebab = snake_name;
  std::replace(kebab.begin() + 2, kebab.end(), '_', '-');
  return kebab == snake_name ? snake_name : snake_name + "," + kebab;
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

}  // namespace sd::cli

// `sdtrain tokenize --model DIR [--add-token TOKEN]... PROMPT...`: the padded input ids of each prompt, one JSON
// array per line, exactly what the pipeline feeds its text encoder.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "text/clip_tokenizer.h"

namespace sd::cli {

namespace {

struct TokenizeOptions {
  std::string model;
  std::vector<std::string> added_tokens;
  std::vector<std::string> prompts;
};

int run_tokenize(const TokenizeOptions& o) {
  // A pipeline folder has its tokenizer in tokenizer/; a tokenizer folder is accepted as is.
  std::filesystem::path dir = o.model;
  if (!std::filesystem::exists(dir / "vocab.json") && std::filesystem::exists(dir / "tokenizer")) dir /= "tokenizer";
  text::ClipTokenizer tokenizer = text::ClipTokenizer::load(dir);
  for (const auto& token : o.added_tokens) tokenizer.add_token(token);
  for (const auto& prompt : o.prompts) std::printf("%s\n", nlohmann::json(tokenizer.encode(prompt)).dump().c_str());
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("tokenize", "Print the padded input ids of prompts as JSON, one array per line");
  auto o = std::make_shared<TokenizeOptions>();
  flag(cmd, "--model", o->model, "Pipeline folder (or its tokenizer/ folder)")->required();
  repeated_flag(cmd, "--add-token", o->added_tokens,
                "Add a token before tokenizing, as textual inversion does (repeatable)");
  cmd->add_option("prompts", o->prompts, "Prompts to tokenize")->required();
  cmd->callback([o, &chosen] { chosen = [o] { return run_tokenize(*o); }; });
}

}  // namespace sd::cli

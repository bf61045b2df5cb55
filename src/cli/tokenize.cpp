// `sdtrain tokenize --model MODEL [--add-token TOKEN]... PROMPT...`: the padded input ids of each prompt, one JSON
// array per line, exactly what the pipeline feeds its text encoder.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "pipeline/model_source.h"
#include "text/clip_tokenizer.h"

namespace sd::cli {

namespace {

struct TokenizeOptions {
  pipeline::ModelRequest model;
  std::vector<std::string> added_tokens;
  std::vector<std::string> prompts;
};

// A tokenizer folder as it is; of anything else a model flag accepts, its tokenizer (no weights are read).
text::ClipTokenizer load_tokenizer(const pipeline::ModelRequest& model) {
  if (std::filesystem::exists(std::filesystem::path(model.name_or_path) / "vocab.json"))
    return text::ClipTokenizer::load(model.name_or_path);
  constexpr at::ScalarType kNotLoaded = at::ScalarType::Undefined;
  return pipeline::load_pipeline(pipeline::resolve_model(model), {kNotLoaded, kNotLoaded, kNotLoaded}).tokenizer;
}

int run_tokenize(const TokenizeOptions& o) {
  text::ClipTokenizer tokenizer = load_tokenizer(o.model);
  for (const auto& token : o.added_tokens) tokenizer.add_token(token);
  for (const auto& prompt : o.prompts) std::printf("%s\n", nlohmann::json(tokenizer.encode(prompt)).dump().c_str());
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Print the padded input ids of prompts as JSON, one array per line (--model may also be a tokenizer folder)");
  auto o = std::make_shared<TokenizeOptions>();
  add_model_flags(cmd, "--model", o->model)->required();
  repeated_flag(cmd, "--add-token", o->added_tokens,
                "Add a token before tokenizing, as textual inversion does (repeatable)");
  cmd->add_option("prompts", o->prompts, "Prompts to tokenize")->required();
  cmd->callback([o, &chosen] { chosen = [o] { return run_tokenize(*o); }; });
}

}  // namespace sd::cli

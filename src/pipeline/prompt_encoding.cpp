#include "pipeline/prompt_encoding.h"

#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "pipeline/textual_inversion_embeddings.h"

namespace sd::pipeline {

namespace {

// The negative prompt of each prompt: "" without any, the one given for all, or one each.
std::vector<std::string> negative_prompt_per_prompt(const GenerationOptions& o) {
  if (o.negative_prompts.size() == o.prompts.size()) return o.negative_prompts;
  return std::vector<std::string>(o.prompts.size(), o.negative_prompts.empty() ? "" : o.negative_prompts.front());
}

}  // namespace

at::Tensor encode_text(StableDiffusion& pipe, const std::vector<std::string>& prompts, std::optional<int> clip_skip) {
  SD_CHECK(!pipe.text_encoder.is_empty(), "the pipeline's text encoder was released: give the prompts' embeddings");
  at::NoGradGuard no_grad;
  const auto length = static_cast<int64_t>(pipe.tokenizer.model_max_length());
  std::vector<int64_t> ids;
  for (const std::string& prompt : prompts) {
    std::vector<int64_t> row = pipe.tokenizer.encode(maybe_convert_prompt(prompt, pipe.tokenizer));
    SD_CHECK(static_cast<int64_t>(row.size()) == length, "tokenizer returned {} ids, expected {}", row.size(), length);
    ids.insert(ids.end(), row.begin(), row.end());
  }
  const at::Tensor input_ids = at::tensor(ids, at::kLong).view({static_cast<int64_t>(prompts.size()), length});
  models::ClipTextOutput out = pipe.text_encoder->forward(input_ids);
  if (!clip_skip) return out.last_hidden_state;  // [P, L, D]
  const auto layers = static_cast<int>(out.hidden_states.size()) - 1;
  SD_CHECK(*clip_skip >= 0 && *clip_skip <= layers, "clip_skip {} is out of range: the text encoder has {} layers",
           *clip_skip, layers);
  return pipe.text_encoder->apply_final_layer_norm(out.hidden_states[layers - *clip_skip]);
}

at::Tensor encode_prompt(StableDiffusion& pipe, const GenerationOptions& o, bool guidance) {
  const at::Tensor prompts = o.prompt_embeds.defined() ? o.prompt_embeds : encode_text(pipe, o.prompts, o.clip_skip);
  const at::Tensor cond = prompts.repeat_interleave(o.num_images_per_prompt, 0);
  if (!guidance) return cond.to(at::kFloat);
  const at::Tensor negatives =
      o.negative_prompt_embeds.defined() ? o.negative_prompt_embeds : encode_text(pipe, negative_prompt_per_prompt(o));
  return at::cat({negatives.repeat_interleave(o.num_images_per_prompt, 0), cond}).to(at::kFloat);
}

}  // namespace sd::pipeline

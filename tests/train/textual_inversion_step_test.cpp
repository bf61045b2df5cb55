// Replays the reference textual-inversion steps (fixtures golden C6): fed the recorded pixels, posterior noise,
// noise and timesteps, each step's loss, the placeholder row's gradient and its value after AdamW must match.
#include "train/tasks/textual_inversion_step.h"

#include <torch/optim/adamw.h>

#include "io/safetensors.h"
#include "pipeline/stable_diffusion.h"
#include "schedulers/ddpm.h"
#include "test_util.h"

namespace sd::train {
namespace {

using sd::test::close_rel_max;

TEST(TextualInversionStep, ReplaysTheReferenceSteps) {
  auto g = io::load_safetensors(sd::test::golden("tiny-sd1/textual_inversion.safetensors"));
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(sd::test::fixtures() / "tiny-sd1");
  const int64_t placeholder = pipe.tokenizer.add_token("<dicoo>");
  ASSERT_EQ(placeholder, g.at("placeholder_token_id").item<int64_t>());
  const int64_t initializer = pipe.tokenizer.encode_tokens("toy").at(0);
  ASSERT_EQ(initializer, g.at("initializer_token_id").item<int64_t>());

  at::Tensor learned = pipe.text_encoder->token_embedding()->weight[initializer].detach().clone().unsqueeze(0);
  ASSERT_TRUE(at::equal(learned[0], g.at("init.initializer_row")));
  learned.set_requires_grad(true);
  schedulers::DDPMScheduler ddpm(pipe.scheduler_config);
  TextualInversionStep step(pipe.text_encoder, pipe.vae, pipe.unet, ddpm.alphas_cumprod(), "epsilon", placeholder, 1);
  torch::optim::AdamW adamw({learned},
                            torch::optim::AdamWOptions(5e-4).betas({0.9, 0.999}).eps(1e-8).weight_decay(1e-2));

  at::Tensor before = learned.detach().clone();
  for (int k = 0; k < 4; ++k) {
    auto at_step = [&](const std::string& key) { return g.at("step" + std::to_string(k) + "." + key); };
    // The prompts tokenize to the recorded ids.
    at::Tensor ids = at_step("input_ids");
    auto posterior = step.encode(at_step("pixel_values"));
    EXPECT_TRUE(close_rel_max(posterior.mean, at_step("latent_dist_mean"), 1e-4)) << k;
    EXPECT_TRUE(close_rel_max(posterior.std, at_step("latent_dist_std"), 1e-4)) << k;
    auto out = step.forward(posterior.mean, posterior.std, ids,
                            {at_step("vae_sample_eps"), at_step("noise"), at_step("timesteps")}, learned);
    EXPECT_TRUE(close_rel_max(out.latents, at_step("latents"), 1e-4)) << k;
    EXPECT_TRUE(close_rel_max(out.noisy_latents, at_step("noisy_latents"), 1e-4)) << k;
    EXPECT_TRUE(close_rel_max(out.encoder_hidden_states, at_step("encoder_hidden_states"), 1e-4)) << k;
    EXPECT_TRUE(close_rel_max(out.model_pred, at_step("model_pred"), 1e-4)) << k;
    EXPECT_TRUE(close_rel_max(out.target, at_step("target"), 1e-4)) << k;
    EXPECT_TRUE(close_rel_max(out.loss.reshape({1}), at_step("loss"), 1e-4)) << k;
    adamw.zero_grad();
    out.loss.backward();
    EXPECT_TRUE(close_rel_max(learned.grad()[0], at_step("placeholder_grad"), 1e-3)) << k;
    adamw.step();
    EXPECT_TRUE(close_rel_max(learned.detach()[0], at_step("placeholder_row_after"), 1e-5)) << k;
    EXPECT_TRUE(close_rel_max(learned.detach()[0] - before[0], at_step("placeholder_row_after") - before[0], 1e-3))
        << k;
    before = at_step("placeholder_row_after").unsqueeze(0);
  }
}

TEST(TextualInversionStep, OnlyPlaceholderPositionsTakeLearnedRows) {
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(sd::test::fixtures() / "tiny-sd1");
  const int64_t first = pipe.tokenizer.add_token("<a>");
  pipe.tokenizer.add_token("<a>_1");
  schedulers::DDPMScheduler ddpm(pipe.scheduler_config);
  TextualInversionStep step(pipe.text_encoder, pipe.vae, pipe.unet, ddpm.alphas_cumprod(), "epsilon", first, 2);
  at::Tensor learned = at::randn({2, 32});
  at::Tensor ids = at::tensor(std::vector<int64_t>{49406, 320, first + 1, first, 49407}).unsqueeze(0);
  at::Tensor emb = step.token_embeddings(ids, learned);
  EXPECT_TRUE(at::equal(emb[0][2], learned[1]));
  EXPECT_TRUE(at::equal(emb[0][3], learned[0]));
  EXPECT_TRUE(at::equal(emb[0][1], pipe.text_encoder->token_embedding()->weight[320]));
}

}  // namespace
}  // namespace sd::train

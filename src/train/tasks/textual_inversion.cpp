#include "train/tasks/textual_inversion.h"

#include <torch/serialize.h>

#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/listing_fingerprint.h"
#include "data/random_streams.h"
#include "data/textual_inversion_dataset.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "models/weights.h"
#include "pipeline/embedding_file.h"
#include "pipeline/model_source.h"
#include "pipeline/txt2img.h"
#include "schedulers/ddpm.h"
#include "schedulers/factory.h"
#include "train/tasks/textual_inversion_step.h"

namespace sd::train {

namespace fs = std::filesystem;

TextualInversionOptions::TextualInversionOptions() {
  training.max_train_steps = 5000;
  training.output_dir = "text-inversion-model";
}

namespace {

// The tokens the learned vectors occupy, added to the tokenizer; returns the first id (they are consecutive).
int64_t add_placeholder_tokens(text::ClipTokenizer& tokenizer, const TextualInversionOptions& o) {
  int64_t first = -1;
  for (const auto& token : pipeline::embedding_tokens(o.placeholder_token, o.num_vectors)) {
    SD_CHECK(!tokenizer.token_to_id(token).has_value(),
             "--placeholder_token: the tokenizer already contains the token '{}'; pass a different placeholder_token",
             token);
    const int64_t id = tokenizer.add_token(token);
    if (first < 0) first = id;
  }
  return first;
}

int64_t initializer_id(const text::ClipTokenizer& tokenizer, const std::string& token) {
  const std::vector<int64_t> ids = tokenizer.encode_tokens(token);
  SD_CHECK(ids.size() == 1, "--initializer_token '{}' must be a single token, but it is {} tokens", token, ids.size());
  return ids[0];
}

class TextualInversionTask : public Task {
 public:
  TextualInversionTask(const TextualInversionOptions& o, RunContext& context);

  std::string name() const override { return "textual-inversion"; }
  std::vector<NamedParameter> trainable_parameters() override { return {{o_.placeholder_token, learned_}}; }
  int64_t dataset_size() const override { return dataset_->size(); }
  std::string data_fingerprint() const override { return data::listing_fingerprint(dataset_->image_paths()); }
  at::Tensor micro_batch_loss(int64_t step, int64_t micro) override;

  nlohmann::json identity() const override {
    return {{"placeholder_token", o_.placeholder_token}, {"num_vectors", o_.num_vectors}};
  }
  // A checkpoint's learned_embeds.safetensors is the script's own file format.
  WholeTensorFiles checkpoint_files() const override {
    WholeTensorFiles files;
    files.master_file = "learned_embeds.safetensors";
    return files;
  }

  void periodic_outputs(int64_t step) override {
    if (step % o_.save_steps == 0) save_embeddings(learned_.detach(), embeddings_path(fmt::format("-steps-{}", step)));
  }
  bool wants_validation(int64_t step, bool last_step) const override {
    return !o_.validation_prompt.empty() && step % o_.validation_steps == 0;
  }
  at::Tensor validation_images(int64_t step) override;
  fs::path export_final(const io::TensorMap& weights, const io::TensorMap& ema) override;

 private:
  void encode_every_image();
  const models::DiagonalGaussian& posterior(int64_t image, bool flip) const {
    return posteriors_[static_cast<size_t>(2 * image + (flip ? 1 : 0))];
  }
  // learned_embeds<suffix>.safetensors, or .bin (a torch.save file) under --no_safe_serialization.
  fs::path embeddings_path(const std::string& suffix) const;
  void save_embeddings(const at::Tensor& rows, const fs::path& path) const;
  void write_rows_into_text_encoder(const at::Tensor& rows);
  void save_full_pipeline();

  TextualInversionOptions o_;
  RunContext& context_;
  fs::path output_dir_;
  pipeline::ModelSource model_;
  std::unique_ptr<pipeline::StableDiffusion> pipe_;
  int64_t first_placeholder_ = 0;
  std::unique_ptr<data::TextualInversionDataset> dataset_;
  std::unique_ptr<data::BatchPlanner> planner_;
  std::unique_ptr<TextualInversionStep> step_;
  at::Tensor learned_;                                // [num_vectors, D] float32
  std::vector<models::DiagonalGaussian> posteriors_;  // by 2 x image + flip
};

TextualInversionTask::TextualInversionTask(const TextualInversionOptions& o, RunContext& context)
    : o_(o), context_(context), output_dir_(o.training.output_dir) {
  // The text encoder, whose rows are trained, stays float32; the frozen UNet and VAE take the policy's dtype.
  const at::ScalarType frozen = context_.precision.frozen;
  context_.precision.compute = at::kFloat;
  model_ = pipeline::resolve_model(o.model);
  pipe_ = std::make_unique<pipeline::StableDiffusion>(
      pipeline::load_pipeline(model_, {at::kFloat, frozen, frozen}, o.tokenizer_name));
  const int64_t factor = pipe_->vae_scale_factor();
  SD_CHECK(o.resolution % factor == 0, "--resolution {} must be divisible by {} (the VAE's downscale factor)",
           o.resolution, factor);

  first_placeholder_ = add_placeholder_tokens(pipe_->tokenizer, o);
  const int64_t init_id = initializer_id(pipe_->tokenizer, o.initializer_token);
  pipe_->text_encoder->resize_token_embeddings(static_cast<int64_t>(pipe_->tokenizer.size()));
  for (int64_t i = 0; i < o.num_vectors; ++i)
    pipe_->text_encoder->copy_token_embedding_row(init_id, first_placeholder_ + i);
  learned_ = pipe_->text_encoder->token_embedding()
                 ->weight.detach()
                 .narrow(0, first_placeholder_, o.num_vectors)
                 .to(at::kFloat)
                 .clone()
                 .requires_grad_(true);

  data::TextualInversionDatasetOptions data_options;
  data_options.data_dir = o.train_data_dir;
  data_options.learnable_property = o.learnable_property;
  data_options.placeholder_string =
      fmt::format("{}", fmt::join(pipeline::embedding_tokens(o.placeholder_token, o.num_vectors), " "));
  data_options.resolution = o.resolution;
  data_options.center_crop = o.center_crop;
  data_options.repeats = o.repeats;
  dataset_ = std::make_unique<data::TextualInversionDataset>(data_options);
  log::info("{} images x {} repeats", dataset_->num_images(), o.repeats);
  planner_ =
      std::make_unique<data::BatchPlanner>(dataset_->size(), context_.layout, context_.comm->rank(), context_.seed);

  schedulers::DDPMScheduler ddpm(pipe_->scheduler_config);
  // Under bf16 the step's text encoder runs its matmuls in bf16 (as the reference's autocast does); the pipeline's
  // float32 one stays for validation and for the saved pipeline.
  models::ClipTextModel step_text_encoder =
      frozen == at::kFloat ? pipe_->text_encoder : pipe_->text_encoder->with_linears_in(frozen);
  step_ = std::make_unique<TextualInversionStep>(step_text_encoder, pipe_->vae, pipe_->unet, ddpm.alphas_cumprod(),
                                                 pipe_->scheduler_config.prediction_type, first_placeholder_,
                                                 o.num_vectors);
  pipe_->unet->set_memory_options(o.unet_memory);
  encode_every_image();
}

// The VAE is frozen and deterministic, and an image reaches it in only two ways (flipped or not): each is encoded
// once, before the first step, and its posterior reused by every step (diffusers encodes on every step, with the
// same numbers). Up front rather than on first use, so that step times show what training costs from then on.
void TextualInversionTask::encode_every_image() {
  const int64_t images = dataset_->num_images();
  ProgressBar bar("encoding images", 2 * images);
  for (int64_t image = 0; image < images; ++image)
    for (const bool flip : {false, true}) {
      posteriors_.push_back(step_->encode(dataset_->pixel_values(image, flip).unsqueeze(0)));
      bar.update(static_cast<int64_t>(posteriors_.size()));
    }
  bar.finish();
}

at::Tensor TextualInversionTask::micro_batch_loss(int64_t step, int64_t micro) {
  using data::Stream;
  const data::BatchRequest batch = planner_->plan(step, micro);
  std::vector<at::Tensor> means, stds, ids, eps, noise, timesteps;
  const int64_t num_train_timesteps = pipe_->scheduler_config.num_train_timesteps;
  for (size_t j = 0; j < batch.indices.size(); ++j) {
    const auto position = static_cast<uint64_t>(batch.first_position + static_cast<int64_t>(j));
    auto gen = [&](Stream s) {
      return data::stream_generator(context_.seed, s, static_cast<uint64_t>(batch.step), position);
    };
    const bool flip = at::rand({1}, gen(Stream::kAugment)).item<float>() < 0.5f;
    const int64_t templ =
        at::randint(static_cast<int64_t>(dataset_->templates().size()), {1}, gen(Stream::kPrompt)).item<int64_t>();
    const auto& p = posterior(batch.indices[j] % dataset_->num_images(), flip);
    means.push_back(p.mean);
    stds.push_back(p.std);
    ids.push_back(at::tensor(pipe_->tokenizer.encode(dataset_->prompt(templ))).unsqueeze(0));
    eps.push_back(at::randn(p.mean.sizes(), gen(Stream::kPosterior)));
    noise.push_back(at::randn(p.mean.sizes(), gen(Stream::kNoise)));
    timesteps.push_back(at::randint(num_train_timesteps, {1}, gen(Stream::kTimestep)));
  }
  return step_
      ->forward(at::cat(means), at::cat(stds), at::cat(ids), {at::cat(eps), at::cat(noise), at::cat(timesteps)},
                learned_)
      .loss;
}

fs::path TextualInversionTask::embeddings_path(const std::string& suffix) const {
  return output_dir_ / ("learned_embeds" + suffix + (o_.no_safe_serialization ? ".bin" : ".safetensors"));
}

void TextualInversionTask::save_embeddings(const at::Tensor& rows, const fs::path& path) const {
  if (path.extension() != ".bin") {
    io::save_safetensors(path, {{o_.placeholder_token, rows.clone()}}, {{"format", "pt"}});
    return;
  }
  // What the reference's torch.save writes: a dict {token: tensor} that torch.load reads.
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert(o_.placeholder_token, rows.clone());
  const std::vector<char> bytes = torch::pickle_save(dict);
  io::write_file_atomically(path, [&](io::FileWriter& out) { out.write(bytes.data(), bytes.size()); });
}

void TextualInversionTask::write_rows_into_text_encoder(const at::Tensor& rows) {
  torch::NoGradGuard no_grad;
  pipe_->text_encoder->token_embedding()->weight.narrow(0, first_placeholder_, o_.num_vectors).copy_(rows);
}

at::Tensor TextualInversionTask::validation_images(int64_t step) {
  // As the reference's log_validation: DPM-Solver++ from the pipeline's scheduler config, 25 steps, the run's seed.
  write_rows_into_text_encoder(learned_.detach());
  auto scheduler = schedulers::make_scheduler(pipe_->scheduler_config, "DPMSolverMultistepScheduler");
  pipeline::Txt2ImgOptions options;
  options.prompts = {o_.validation_prompt};
  options.num_inference_steps = 25;
  options.num_images_per_prompt = o_.num_validation_images;
  options.seed = context_.seed;
  options.height = options.width = o_.resolution;
  return pipeline::txt2img_with_progress(*pipe_, *scheduler, options, fmt::format("validation at step {}", step))
      .images_uint8;
}

void TextualInversionTask::save_full_pipeline() {
  // The UNet, VAE and scheduler are unchanged: they come from the source in full precision (a pipeline folder's
  // files copied as they are), and only the tokenizer and the text encoder, which gained the learned token rows, are
  // written anew.
  pipeline::copy_components(model_, output_dir_, {"unet", "vae", "scheduler"});
  io::write_directory_atomically(output_dir_ / "tokenizer", [&](const fs::path& tmp) { pipe_->tokenizer.save(tmp); });
  io::write_directory_atomically(output_dir_ / "text_encoder",
                                 [&](const fs::path& tmp) { models::save_text_encoder(pipe_->text_encoder, tmp); });
  pipeline::write_model_index(output_dir_, pipe_->model_index["scheduler"][1].get<std::string>());
}

fs::path TextualInversionTask::export_final(const io::TensorMap& weights, const io::TensorMap& ema) {
  // The small, valuable result first: a failure writing the pipeline cannot lose it.
  const at::Tensor& rows = weights.at(o_.placeholder_token);
  save_embeddings(rows, embeddings_path(""));
  if (o_.save_as_full_pipeline) {
    write_rows_into_text_encoder(rows);
    save_full_pipeline();
  }
  return embeddings_path("");
}

}  // namespace

int run_textual_inversion(const TextualInversionOptions& options) { return train_task<TextualInversionTask>(options); }

}  // namespace sd::train

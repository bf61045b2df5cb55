#include "train/preprocess.h"

#include <ATen/core/grad_mode.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "data/image_transforms.h"
#include "data/listing_fingerprint.h"
#include "data/prefetcher.h"
#include "data/random_streams.h"
#include "dist/rendezvous.h"
#include "dist/threads.h"
#include "io/atomic_file.h"
#include "models/vae/vae_config.h"

namespace sd::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void validate(const PreprocessOptions& o) {
  SD_CHECK(!o.output_dir.empty(), "--output_dir is required: the folder the latent shards go to");
  io::check_output_dir("--output_dir", o.output_dir);
  SD_CHECK(o.inputs.train_data_dir.empty() != o.inputs.train_shards.empty(),
           "give exactly one of --train_data_dir and --train_shards");
  SD_CHECK(!o.resolution.empty(), "--resolution: give at least one");
  for (int r : o.resolution) SD_CHECK(r > 0 && r % 8 == 0, "--resolution {} must be a positive multiple of 8", r);
  SD_CHECK(o.latents == "moments" || o.latents == "sample", "--latents: expected moments or sample, got '{}'",
           o.latents);
  SD_CHECK(o.samples_per_shard >= 1, "--samples_per_shard must be at least 1, got {}", o.samples_per_shard);
  SD_CHECK(o.batch_size >= 1, "--batch_size must be at least 1, got {}", o.batch_size);
}

// A digest of the samples' names (image paths below --train_data_dir, or shard names and keys), so that a rerun over
// other images of the same count does not keep shards of the first ones.
std::string sample_names_fingerprint(const PreprocessOptions& o, const data::ImageCaptionDataset& dataset) {
  const std::string folder = o.inputs.train_data_dir.empty() ? "" : fs::path(o.inputs.train_data_dir).string();
  std::vector<std::string> names;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    std::string name = dataset.describe(i);
    if (!folder.empty() && name.rfind(folder, 0) == 0) name.erase(0, folder.size());
    names.push_back(std::move(name));
  }
  return data::text_fingerprint(names);
}

// What decides the contents of the shards: a shard kept from an earlier run must have been made with the same.
json content_settings(const PreprocessOptions& o, const data::ImageCaptionDataset& dataset,
                      const LatentEncoder& encoder) {
  json settings = {{"samples", dataset.size()},
                   {"sample names", sample_names_fingerprint(o, dataset)},
                   {"model weights", encoder.weights_fingerprint()},
                   {"resolutions", o.resolution},
                   {"latents", o.latents},
                   {"text_pooled", o.text_pooled},
                   {"samples_per_shard", o.samples_per_shard},
                   {"image_column", o.inputs.image_column},
                   {"caption_column", o.inputs.caption_column},
                   {"enable_bucket", o.inputs.enable_bucket}};
  if (o.inputs.enable_bucket)
    settings.update({{"min_bucket_reso", o.inputs.min_bucket_reso},
                     {"max_bucket_reso", o.inputs.max_bucket_reso},
                     {"bucket_reso_steps", o.inputs.bucket_reso_steps}});
  if (o.latents == "sample") settings["seed"] = o.seed;
  // Recorded only when not the default, so that shards made before the flag existed still match.
  if (o.inputs.transform.interpolation != io::ResizeFilter::kBilinear)
    settings["image_interpolation_mode"] = io::resize_filter_name(o.inputs.transform.interpolation);
  return settings;
}

at::Tensor token_ids(const text::ClipTokenizer& tokenizer, const std::vector<std::string>& captions) {
  std::vector<at::Tensor> rows;
  for (const std::string& caption : captions) rows.push_back(at::tensor(tokenizer.encode(caption), at::kLong));
  return at::stack(rows);
}

}  // namespace

// A sample decoded (or replaced, as in training) and resized for every resolution, on a loader thread.
struct LatentEncoder::Prepared {
  std::vector<at::Tensor> pixels;  // per resolution: [3, H, W]
  std::vector<std::string> captions;
};

LatentEncoder::LatentEncoder(const PreprocessOptions& options)
    : LatentEncoder(options, pipeline::load_pipeline(pipeline::resolve_model(options.model),
                                                     {at::kFloat, at::kFloat, /*unet=*/at::ScalarType::Undefined})) {}

LatentEncoder::LatentEncoder(const PreprocessOptions& options, pipeline::StableDiffusion encoders)
    : options_(options),
      tokenizer_(std::move(encoders.tokenizer)),
      text_encoder_(encoders.text_encoder),
      vae_(encoders.vae) {
  text_encoder_->eval();
  vae_->eval();
  const int64_t factor = vae_->config().scale_factor();
  for (int r : options.resolution) {
    SD_CHECK(r % factor == 0, "--resolution {} must be divisible by {} (the VAE's factor)", r, factor);
    data::TrainingDataOptions bucketing = options.inputs;
    bucketing.transform.resolution = r;
    if (options.inputs.enable_bucket) buckets_.push_back(data::bucket_resolutions(bucketing));
  }
}

data::LatentsIndex LatentEncoder::describe() const {
  data::LatentsIndex index;
  index.moments = options_.latents == "moments";
  index.resolutions = options_.resolution;
  index.scaling_factor = vae_->config().scaling_factor;
  index.latent_channels = vae_->config().latent_channels;
  index.text_dim = text_encoder_->config().hidden_size;
  index.pooled = options_.text_pooled;
  return index;
}

std::string LatentEncoder::weights_fingerprint() const {
  std::vector<std::string> items;
  for (const torch::nn::Module* model :
       {static_cast<const torch::nn::Module*>(vae_.get()), static_cast<const torch::nn::Module*>(text_encoder_.get())})
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      const at::Tensor& tensor = item.value();
      const at::Tensor flat = tensor.detach().reshape({-1}).to(at::kFloat).contiguous();
      const int64_t n = std::min<int64_t>(flat.numel(), 64);
      const at::Tensor ends = at::cat({flat.narrow(0, 0, n), flat.narrow(0, flat.numel() - n, n)});
      items.push_back(fmt::format("{} {}", name, fmt::join(tensor.sizes(), "x")));
      items.emplace_back(static_cast<const char*>(ends.data_ptr()), ends.numel() * sizeof(float));
    }
  return data::text_fingerprint(items);
}

LatentEncoder::Prepared LatentEncoder::prepare(const data::ImageCaptionDataset& dataset, int64_t index) const {
  data::DecodedSample sample = dataset.decode(index);
  Prepared prepared{{}, std::move(sample.captions)};
  // Center crops without flips draw nothing from the generator the transforms take.
  at::Generator no_draws = data::stream_generator(0, data::Stream::kAugment, 0);
  for (size_t r = 0; r < options_.resolution.size(); ++r) {
    data::ImageTransformOptions transform = options_.inputs.transform;
    transform.resolution = options_.resolution[r];
    transform.center_crop = true;
    transform.random_flip = false;
    const data::Resolution size{sample.image.width, sample.image.height};
    prepared.pixels.push_back(
        buckets_.empty()
            ? data::train_transform(sample.image, transform, no_draws)
            : data::bucket_transform(sample.image, data::assign_bucket(buckets_[r], size).bucket, transform, no_draws));
  }
  return prepared;
}

void LatentEncoder::encode_images(const std::vector<int64_t>& samples, const std::vector<at::Tensor>& pixels, size_t r,
                                  io::TensorMap& out) {
  at::NoGradGuard no_grad;
  const models::DiagonalGaussian posterior = vae_->encode(at::stack(pixels));
  const int resolution = options_.resolution[r];
  for (size_t j = 0; j < samples.size(); ++j) {
    const int64_t n = samples[j];
    const at::Tensor mean = posterior.mean[static_cast<int64_t>(j)].clone();
    const at::Tensor std = posterior.std[static_cast<int64_t>(j)].clone();
    if (options_.latents == "moments") {
      out[data::latent_tensor_name(n, "latent_mean", resolution)] = mean;
      out[data::latent_tensor_name(n, "latent_std", resolution)] = std;
      continue;
    }
    at::Generator gen = data::stream_generator(options_.seed, data::Stream::kStoredPosterior, static_cast<uint64_t>(n),
                                               static_cast<uint64_t>(resolution));
    out[data::latent_tensor_name(n, "latent", resolution)] =
        (mean + std * at::randn(mean.sizes(), gen)) * vae_->config().scaling_factor;
  }
}

void LatentEncoder::encode_captions(const std::vector<std::vector<std::string>>& captions, int64_t first,
                                    io::TensorMap& out) {
  at::NoGradGuard no_grad;
  std::vector<std::string> all;
  for (const auto& sample : captions) all.insert(all.end(), sample.begin(), sample.end());
  const models::ClipTextOutput text = text_encoder_->forward(token_ids(tokenizer_, all));
  int64_t row = 0;
  for (size_t j = 0; j < captions.size(); ++j) {
    const auto count = static_cast<int64_t>(captions[j].size());
    const int64_t n = first + static_cast<int64_t>(j);
    out[data::latent_tensor_name(n, "text_hidden")] = text.last_hidden_state.narrow(0, row, count).clone();
    if (options_.text_pooled)
      out[data::latent_tensor_name(n, "text_pooled")] = text.pooler_output.narrow(0, row, count).clone();
    row += count;
  }
}

io::TensorMap LatentEncoder::encode(const data::ImageCaptionDataset& dataset, int64_t first, int64_t end) {
  // Loader threads decode and resize a few batches ahead of the encoders.
  data::Prefetcher<Prepared> loader(data::loader_threads(options_.inputs));
  int64_t requested = first;
  auto request_next = [&] {
    if (requested == end) return;
    loader.request([this, &dataset, index = requested] { return prepare(dataset, index); });
    ++requested;
  };
  for (int k = 0; k < 2 * options_.batch_size; ++k) request_next();

  io::TensorMap out;
  // Images are batched per resolution and size (buckets differ in size); captions in order.
  struct ImageBatch {
    std::vector<int64_t> samples;
    std::vector<at::Tensor> pixels;
  };
  std::map<std::tuple<size_t, int64_t, int64_t>, ImageBatch> pending;
  std::vector<std::vector<std::string>> captions;
  const auto batch = static_cast<size_t>(options_.batch_size);
  double ignored = 0;
  for (int64_t n = first; n < end; ++n) {
    Prepared prepared = loader.next(ignored);
    request_next();
    for (size_t r = 0; r < prepared.pixels.size(); ++r) {
      const at::Tensor& pixels = prepared.pixels[r];
      ImageBatch& images = pending[{r, pixels.size(1), pixels.size(2)}];
      images.samples.push_back(n);
      images.pixels.push_back(pixels);
      if (images.samples.size() == batch) {
        encode_images(images.samples, images.pixels, r, out);
        images = {};
      }
    }
    captions.push_back(std::move(prepared.captions));
    if (captions.size() == batch || n + 1 == end) {
      encode_captions(captions, n + 1 - static_cast<int64_t>(captions.size()), out);
      captions.clear();
    }
  }
  for (auto& [key, images] : pending)
    if (!images.samples.empty()) encode_images(images.samples, images.pixels, std::get<0>(key), out);
  return out;
}

io::TensorMap LatentEncoder::encode_empty_caption() {
  at::NoGradGuard no_grad;
  const models::ClipTextOutput text = text_encoder_->forward(token_ids(tokenizer_, {""}));
  io::TensorMap out{{"text_hidden", text.last_hidden_state}};
  if (options_.text_pooled) out["text_pooled"] = text.pooler_output;
  return out;
}

namespace {

// Shard k of the index: samples [k * per_shard, ...).
std::vector<data::LatentsIndex::Shard> plan_shards(int64_t samples, int64_t per_shard) {
  std::vector<data::LatentsIndex::Shard> shards;
  for (int64_t first = 0, k = 0; first < samples; first += per_shard, ++k)
    shards.push_back({data::latent_shard_file(k), first, std::min(per_shard, samples - first)});
  return shards;
}

// Whether `path` holds a finished shard; one made with other settings is an error.
bool shard_done(const fs::path& path, const std::string& settings) {
  if (!fs::exists(path)) return false;
  const io::SafeTensorsFile file(path);
  const auto it = file.metadata().find("settings");
  SD_CHECK(it != file.metadata().end() && it->second == settings,
           "{}: made with other settings ({}) than this run's ({}); preprocess into another --output_dir, or remove "
           "the folder",
           path.string(), it == file.metadata().end() ? "none recorded" : it->second, settings);
  return true;
}

// Removes what killed runs left of this rank's shards: temporaries never renamed into place. Other ranks' shards
// are left alone (they may be writing theirs right now).
void remove_temporaries(const fs::path& dir, const std::vector<data::LatentsIndex::Shard>& shards, int rank,
                        int world) {
  for (size_t k = static_cast<size_t>(rank); k < shards.size(); k += static_cast<size_t>(world)) {
    const std::string prefix = shards[k].file + ".tmp";
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) fs::remove(entry.path());
  }
}

}  // namespace

int run_preprocess(const PreprocessOptions& o) {
  validate(o);
  const dist::DistEnv env = dist::detect_dist_env();
  log::set_rank(env.rank, env.world_size);
  set_compute_threads(dist::threads_for_rank(o.threads, env));
  const std::unique_ptr<data::ImageCaptionDataset> dataset =
      data::open_image_captions(o.inputs, data::loader_threads(o.inputs));
  LatentEncoder encoder(o);
  const fs::path dir = o.output_dir;
  fs::create_directories(dir);

  data::LatentsIndex index = encoder.describe();
  index.shards = plan_shards(dataset->size(), o.samples_per_shard);
  const json settings = content_settings(o, *dataset, encoder);
  index.preprocessing = {{"model", o.model.name_or_path},
                         {"inputs", o.inputs.train_data_dir.empty() ? o.inputs.train_shards : o.inputs.train_data_dir},
                         {"settings", settings}};
  remove_temporaries(dir, index.shards, env.rank, env.world_size);
  log::info("{} samples ({} layout) -> {} shard(s) of up to {} in {}, {} rank(s)", dataset->size(), dataset->layout(),
            index.shards.size(), o.samples_per_shard, dir.string(), env.world_size);

  int64_t kept = 0, encoded = 0;
  for (size_t k = static_cast<size_t>(env.rank); k < index.shards.size(); k += static_cast<size_t>(env.world_size)) {
    const data::LatentsIndex::Shard& shard = index.shards[k];
    if (shard_done(dir / shard.file, settings.dump())) {
      ++kept;
      continue;
    }
    const auto started = std::chrono::steady_clock::now();
    const io::TensorMap tensors = encoder.encode(*dataset, shard.first_sample, shard.first_sample + shard.samples);
    json sources = json::array();
    for (int64_t i = shard.first_sample; i < shard.first_sample + shard.samples; ++i)
      sources.push_back(dataset->describe(i));
    io::save_safetensors(dir / shard.file, tensors,
                         {{"format", data::kLatentsFormat},
                          {"first_sample", std::to_string(shard.first_sample)},
                          {"samples", std::to_string(shard.samples)},
                          {"settings", settings.dump()},
                          {"sources", sources.dump()}});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    log::info_every_rank("{}: {} samples in {:.1f} s ({:.2f} images/s)", shard.file, shard.samples, seconds,
                         static_cast<double>(shard.samples) / seconds);
    ++encoded;
  }
  log::info_every_rank("{} shard(s) encoded, {} kept from an earlier run", encoded, kept);

  for (const data::LatentsIndex::Shard& shard : index.shards)
    if (!fs::exists(dir / shard.file)) return 0;  // another rank is still encoding; the last one writes the index
  if (!fs::exists(dir / data::kEmptyCaptionFile))
    io::save_safetensors(dir / data::kEmptyCaptionFile, encoder.encode_empty_caption());
  io::write_text_file(dir / data::kLatentsIndexFile, index.to_json().dump(2) + "\n");
  log::info_every_rank("every shard is present: wrote {}", (dir / data::kLatentsIndexFile).string());
  std::printf("%s\n", dir.c_str());
  return 0;
}

}  // namespace sd::train

#include "data/training_batches.h"

#include <utility>

#include "core/error.h"
#include "data/random_streams.h"
#include "perf/op_profiler.h"

namespace sd::data {

namespace {

at::Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows) {
  at::Tensor out = at::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.at(0).size())}, at::kLong);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i].begin(), rows[i].end(), out[static_cast<int64_t>(i)].data_ptr<int64_t>());
  return out;
}

}  // namespace

at::Tensor sample_posterior(const at::Tensor& mean, const at::Tensor& std, double scaling_factor, uint64_t seed,
                            const BatchRequest& request) {
  std::vector<at::Tensor> eps;
  for (int64_t j = 0; j < mean.size(0); ++j)
    eps.push_back(at::randn(mean.sizes().slice(1),
                            SampleStreams{seed, request.step, request.first_position + j}(Stream::kPosterior)));
  return (mean.to(at::kFloat) + std.to(at::kFloat) * at::stack(eps)) * scaling_factor;
}

// ---------------------------------------------------------------------------------------------------------------

LookaheadLoader::LookaheadLoader(const BatchPlanner& planner, Load load, int threads, int micro_batches_ahead)
    : planner_(planner), load_(std::move(load)), ahead_(std::max(1, micro_batches_ahead)), prefetcher_(threads) {}

void LookaheadLoader::request(const BatchRequest& request) {
  requested_.push_back(request);
  prefetcher_.request([this, request] { return load_(request); });
}

TrainingBatch LookaheadLoader::get(const BatchRequest& request) {
  // The trainer asks in plan order; after a resume (or on the first call) the queue starts at the request.
  while (!requested_.empty() &&
         (requested_.front().step != request.step || requested_.front().micro != request.micro)) {
    double ignored = 0;
    requested_.pop_front();
    prefetcher_.next(ignored);
  }
  if (requested_.empty()) this->request(request);
  while (requested_.size() < static_cast<size_t>(ahead_)) this->request(planner_.after(requested_.back()));
  requested_.pop_front();
  SD_PERF_SCOPE("sdtrain::data_wait");
  return prefetcher_.next(waited_s_);
}

double LookaheadLoader::take_wait_seconds() { return std::exchange(waited_s_, 0.0); }

// ---------------------------------------------------------------------------------------------------------------

ImageCaptionSource::ImageCaptionSource(std::unique_ptr<ImageCaptionDataset> dataset,
                                       const text::ClipTokenizer& tokenizer, ImageCaptionSourceOptions options,
                                       const uint64_t& seed, const BatchPlanner& planner)
    : dataset_(std::move(dataset)),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      seed_(seed),
      loader_(
          planner, [this](const BatchRequest& r) { return load(r); }, options_.loader.threads,
          options_.loader.micro_batches_ahead) {}

TrainingBatch ImageCaptionSource::load(const BatchRequest& request) const {
  std::vector<at::Tensor> pixels;
  std::vector<std::vector<int64_t>> ids;
  std::vector<double> weights;
  for (size_t j = 0; j < request.indices.size(); ++j) {
    const SampleStreams streams{seed_, request.step, request.first_position + static_cast<int64_t>(j)};
    const DecodedSample sample = dataset_->decode(request.indices[j]);
    weights.push_back(sample.loss_weight);
    at::Generator augment = streams(Stream::kAugment);
    pixels.push_back(request.bucket < 0 ? train_transform(sample.image, options_.transform, augment)
                                        : bucket_transform(sample.image, options_.buckets.at(request.bucket),
                                                           options_.transform, augment));
    const std::optional<int64_t> pick =
        choose_caption(static_cast<int64_t>(sample.captions.size()), options_.captions, streams);
    at::Generator shuffle = streams(Stream::kCaptionShuffle);
    ids.push_back(tokenizer_.encode(pick ? shuffle_tags(sample.captions[*pick], options_.captions, shuffle) : ""));
  }
  TrainingBatch batch;
  batch.pixel_values = at::stack(pixels);
  batch.input_ids = ids_tensor(ids);
  if (std::any_of(weights.begin(), weights.end(), [](double w) { return w != 1.0; }))
    batch.loss_weights = at::tensor(weights, at::kDouble).to(at::kFloat);
  return batch;
}

// ---------------------------------------------------------------------------------------------------------------

LatentSource::LatentSource(std::unique_ptr<LatentDataset> dataset, CaptionOptions captions, LoaderOptions loader,
                           const uint64_t& seed, const BatchPlanner& planner)
    : dataset_(std::move(dataset)),
      captions_(captions),
      seed_(seed),
      loader_(
          planner, [this](const BatchRequest& r) { return load(r); }, loader.threads, loader.micro_batches_ahead) {}

TrainingBatch LatentSource::load(const BatchRequest& request) const {
  std::vector<at::Tensor> means, stds, latents, text;
  for (size_t j = 0; j < request.indices.size(); ++j) {
    const SampleStreams streams{seed_, request.step, request.first_position + static_cast<int64_t>(j)};
    const LatentSample sample = dataset_->read(request.indices[j]);
    if (sample.latent.defined()) {
      latents.push_back(sample.latent);
    } else {
      means.push_back(sample.mean);
      stds.push_back(sample.std);
    }
    const std::optional<int64_t> pick = choose_caption(sample.text_hidden.size(0), captions_, streams);
    text.push_back(pick ? sample.text_hidden[*pick] : dataset_->empty_caption());
  }
  TrainingBatch batch;
  if (latents.empty()) {
    batch.latent_mean = at::stack(means);
    batch.latent_std = at::stack(stds);
  } else {
    batch.latents = at::stack(latents);
  }
  batch.encoder_hidden_states = at::stack(text);
  return batch;
}

// ---------------------------------------------------------------------------------------------------------------

SyntheticSource::SyntheticSource(SyntheticOptions options, const text::ClipTokenizer* tokenizer, const uint64_t& seed)
    : options_(std::move(options)), tokenizer_(tokenizer), seed_(seed) {
  SD_CHECK(options_.kind == "images" || options_.kind == "latents",
           "--synthetic_data: expected images or latents, got '{}'", options_.kind);
  SD_CHECK(options_.samples >= 1, "--synthetic_samples must be at least 1, got {}", options_.samples);
  SD_CHECK(options_.kind == "latents" || tokenizer_, "synthetic images need a tokenizer for their captions");
}

TrainingBatch SyntheticSource::get(const BatchRequest& request) {
  // Captions of 5-20 words from a small vocabulary: what matters for throughput is their token count.
  static const std::vector<std::string> words = {"a",     "photo", "of",     "the",    "red",  "cat",   "on",
                                                 "table", "in",    "garden", "with",   "blue", "sky",   "old",
                                                 "house", "by",    "river",  "bright", "dog",  "street"};
  const int64_t latent = options_.resolution / options_.vae_scale_factor;
  std::vector<at::Tensor> first, second;
  std::vector<std::vector<int64_t>> ids;
  for (int64_t index : request.indices) {
    at::Generator gen = stream_generator(seed_, Stream::kSynthetic, static_cast<uint64_t>(index));
    if (options_.kind == "latents") {
      first.push_back(at::randn({options_.latent_channels, latent, latent}, gen));
      second.push_back(at::randn({77, options_.embedding_dim}, gen));
      continue;
    }
    first.push_back(at::rand({3, options_.resolution, options_.resolution}, gen) * 2 - 1);
    const int64_t n = at::randint(5, 21, {1}, gen).item<int64_t>();
    const at::Tensor picks = at::randint(static_cast<int64_t>(words.size()), {n}, gen);
    std::string caption;
    for (int64_t k = 0; k < n; ++k) caption += (k ? " " : "") + words[picks[k].item<int64_t>()];
    ids.push_back(tokenizer_->encode(caption));
  }
  TrainingBatch batch;
  if (options_.kind == "latents") {
    batch.latents = at::stack(first);
    batch.encoder_hidden_states = at::stack(second);
  } else {
    batch.pixel_values = at::stack(first);
    batch.input_ids = ids_tensor(ids);
  }
  return batch;
}

// ---------------------------------------------------------------------------------------------------------------

ReplaySource::ReplaySource(const std::filesystem::path& file, BatchLayout layout, int rank)
    : file_(file), layout_(layout), rank_(rank) {
  try {
    tensors_ = io::load_safetensors(file);
  } catch (const Error& e) {
    fail("--replay_inputs: {}", e.what());
  }
  while (tensors_.count(fmt::format("step{}.latents", steps_))) ++steps_;
  SD_CHECK(steps_ > 0,
           "--replay_inputs {}: no step0.latents (expected stepK.latents, stepK.noise, stepK.timesteps and "
           "stepK.encoder_hidden_states per step)",
           file.string());
  for (int64_t k = 0; k < steps_; ++k) {
    for (const char* name : {"latents", "noise", "timesteps", "encoder_hidden_states"}) {
      const std::string key = fmt::format("step{}.{}", k, name);
      SD_CHECK(tensors_.count(key), "--replay_inputs {}: missing {}", file.string(), key);
      SD_CHECK(tensors_.at(key).size(0) == layout_.global(),
               "--replay_inputs {}: {} holds a batch of {}, but this run's global batch is {} ({} rank(s) x {} "
               "accumulation x batch {})",
               file.string(), key, tensors_.at(key).size(0), layout_.global(), layout_.world, layout_.accumulation,
               layout_.batch);
    }
  }
}

TrainingBatch ReplaySource::get(const BatchRequest& request) {
  SD_CHECK(request.step < steps_, "--replay_inputs {} holds {} step(s); step {} was asked for", file_.string(), steps_,
           request.step);
  const int64_t start = (rank_ * layout_.accumulation + request.micro) * layout_.batch;
  auto slice = [&](const char* name) {
    return tensors_.at(fmt::format("step{}.{}", request.step, name)).narrow(0, start, layout_.batch);
  };
  TrainingBatch batch;
  batch.latents = slice("latents").to(at::kFloat);
  batch.encoder_hidden_states = slice("encoder_hidden_states");
  batch.noise = slice("noise").to(at::kFloat);
  batch.timesteps = slice("timesteps").to(at::kLong);
  return batch;
}

}  // namespace sd::data

#include "data/training_data.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "data/image_folder_dataset.h"
#include "data/shard_pattern.h"
#include "data/webdataset.h"

namespace sd::data {

DataKind data_kind(const TrainingDataOptions& o) {
  if (!o.dreambooth.instance_data_dir.empty()) return DataKind::kDreamBooth;  // `sdtrain dreambooth` takes no other
  const int given = !o.train_data_dir.empty() + !o.train_shards.empty() + !o.train_latents.empty() +
                    !o.synthetic_data.empty() + !o.replay_inputs.empty();
  SD_CHECK(given == 1,
           "give exactly one of --train_data_dir, --synthetic_data, --replay_inputs, --train_shards and "
           "--train_latents ({} given)",
           given);
  if (!o.train_data_dir.empty()) return DataKind::kImageFolder;
  if (!o.train_shards.empty()) return DataKind::kShards;
  if (!o.train_latents.empty()) return DataKind::kLatents;
  if (!o.replay_inputs.empty()) return DataKind::kReplay;
  SD_CHECK(o.synthetic_data == "images" || o.synthetic_data == "latents",
           "--synthetic_data: expected images or latents, got '{}'", o.synthetic_data);
  return o.synthetic_data == "images" ? DataKind::kSyntheticImages : DataKind::kSyntheticLatents;
}

bool needs_encoders(DataKind kind) {
  return kind == DataKind::kImageFolder || kind == DataKind::kShards || kind == DataKind::kSyntheticImages ||
         kind == DataKind::kDreamBooth;
}

int loader_threads(const TrainingDataOptions& o) { return std::max(1, o.dataloader_num_workers); }

std::unique_ptr<ImageCaptionDataset> open_image_captions(const TrainingDataOptions& o, int threads) {
  if (!o.train_data_dir.empty())
    return std::make_unique<ImageFolderDataset>(ImageFolderOptions{o.train_data_dir, o.image_column, o.caption_column,
                                                                   o.output_dir, o.reg_data_dir, o.prior_loss_weight});
  return std::make_unique<WebDatasetShards>(resolve_shards(o.train_shards), o.caption_column, threads);
}

std::vector<Resolution> bucket_resolutions(const TrainingDataOptions& o) {
  const int r = o.transform.resolution;
  return make_bucket_resolutions({{r, r}, o.min_bucket_reso, o.max_bucket_reso, o.bucket_reso_steps});
}

namespace {

int32_t index_of(const std::vector<Resolution>& buckets, Resolution bucket) {
  return static_cast<int32_t>(std::find(buckets.begin(), buckets.end(), bucket) - buckets.begin());
}

// One line on how the samples spread over the buckets, so a user sees what bucketing did to their data.
void log_buckets(const std::vector<Resolution>& buckets, const std::vector<int32_t>& bucket_of, int64_t scale) {
  std::map<int32_t, int64_t> count;
  for (int32_t b : bucket_of) ++count[b];
  std::string spread;
  for (const auto& [b, n] : count)
    spread +=
        fmt::format("{}{}x{}: {}", spread.empty() ? "" : ", ", buckets[b].width * scale, buckets[b].height * scale, n);
  log::info("aspect-ratio buckets (width x height: samples): {}", spread);
}

// Flags that only some sources can honour, named when given to another.
void check_flags_fit(const TrainingDataOptions& o, DataKind kind) {
  const bool captions = kind == DataKind::kImageFolder || kind == DataKind::kShards || kind == DataKind::kLatents;
  SD_CHECK(captions || (o.captions.dropout_probability == 0 && !o.captions.shuffle && !o.enable_bucket),
           "--caption_dropout_probability, --shuffle_caption and --enable_bucket need real data (--train_data_dir, "
           "--train_shards or --train_latents)");
  SD_CHECK(kind == DataKind::kImageFolder || o.reg_data_dir.empty(),
           "--reg_data_dir needs --train_data_dir: its images are balanced against that folder's, as kohya does");
  SD_CHECK(kind != DataKind::kLatents || !o.captions.shuffle,
           "--shuffle_caption needs captions as text; --train_latents holds them encoded");
  SD_CHECK(kind != DataKind::kLatents || !o.transform.random_flip,
           "--random_flip needs pixels; --train_latents holds the latents of unflipped center crops");
  validate(o.captions);
}

LoaderOptions loader_options(const TrainingDataOptions& o, const BatchLayout& layout) {
  // Two optimizer steps ahead: the loaders work through one step while the trainer computes the other.
  return {loader_threads(o), static_cast<int>(2 * layout.accumulation + 2)};
}

ImageCaptionSourceOptions image_source_options(const TrainingDataOptions& o, const BatchLayout& layout) {
  ImageCaptionSourceOptions source;
  source.transform = o.transform;
  source.captions = o.captions;
  source.loader = loader_options(o, layout);
  return source;
}

TrainingData open_images(const TrainingDataOptions& o, const text::ClipTokenizer& tokenizer, const uint64_t& seed,
                         const BatchLayout& layout, int rank) {
  std::unique_ptr<ImageCaptionDataset> dataset = open_image_captions(o, loader_threads(o));
  if (o.max_train_samples) dataset->select(random_subset(dataset->size(), *o.max_train_samples, seed));
  log::info("{} training images ({} layout) in {}{}", dataset->size(), dataset->layout(),
            o.train_data_dir.empty() ? o.train_shards : o.train_data_dir,
            o.reg_data_dir.empty() ? "" : " and " + o.reg_data_dir);
  ImageCaptionSourceOptions source = image_source_options(o, layout);
  std::vector<int32_t> bucket_of;
  if (o.enable_bucket) {
    source.buckets = bucket_resolutions(o);
    const Resolution square{o.transform.resolution, o.transform.resolution};
    for (Resolution size : image_sizes(*dataset, square, loader_threads(o)))
      bucket_of.push_back(index_of(source.buckets, assign_bucket(source.buckets, size).bucket));
    log_buckets(source.buckets, bucket_of, 1);
  }
  TrainingData data;
  data.listing_fingerprint = dataset->fingerprint();
  data.sample_counts = dataset->sample_counts();
  data.planner = std::make_unique<BatchPlanner>(dataset->size(), layout, rank, seed, std::move(bucket_of));
  data.source = std::make_unique<ImageCaptionSource>(std::move(dataset), tokenizer, source, seed, *data.planner);
  return data;
}

// DreamBooth: with prior preservation, pairs of an instance and a class image (data/dreambooth_images.h).
TrainingData open_dreambooth(const TrainingDataOptions& o, const text::ClipTokenizer& tokenizer, const uint64_t& seed,
                             const BatchLayout& layout, int rank) {
  DreamBoothImages images = dreambooth_images(o.dreambooth, o.prior_loss_weight);
  auto dataset = std::make_unique<ImageFolderDataset>(std::move(images.samples), "dreambooth");
  TrainingData data;
  data.listing_fingerprint = dataset->fingerprint();
  data.sample_counts = {images.pairs.instances, images.pairs.classes};
  if (images.pairs.classes == 0)
    data.planner = std::make_unique<BatchPlanner>(images.pairs.instances, layout, rank, seed);
  else
    data.planner = std::make_unique<BatchPlanner>(images.pairs, layout, rank, seed);
  data.source = std::make_unique<ImageCaptionSource>(std::move(dataset), tokenizer, image_source_options(o, layout),
                                                     seed, *data.planner);
  return data;
}

void check_latents_fit(const LatentDataset& dataset, const TrainingDataOptions& o, const ModelShapes& model) {
  const LatentsIndex& index = dataset.index();
  SD_CHECK(index.latent_channels == model.latent_channels,
           "--train_latents {}: latents of {} channels; the UNet takes {} (unet/config.json in_channels)",
           o.train_latents, index.latent_channels, model.latent_channels);
  SD_CHECK(index.text_dim == model.text_dim,
           "--train_latents {}: text embeddings of width {}; the UNet's cross-attention takes {}", o.train_latents,
           index.text_dim, model.text_dim);
  SD_CHECK(!index.moments || std::abs(index.scaling_factor - model.vae_scaling_factor) < 1e-9,
           "--train_latents {}: made with a VAE of scaling factor {}; this pipeline's VAE has {}", o.train_latents,
           index.scaling_factor, model.vae_scaling_factor);
  SD_CHECK(o.captions.dropout_probability == 0 || dataset.has_empty_caption(),
           "--train_latents {}: --caption_dropout_probability needs {} (the text encoder's output for \"\", "
           "text_hidden [1, 77, {}]), which it lacks",
           o.train_latents, kEmptyCaptionFile, index.text_dim);
  if (o.enable_bucket) return;
  const int side = static_cast<int>(o.transform.resolution / model.vae_scale_factor);
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const Resolution size = dataset.latent_size(i);
    SD_CHECK(size == (Resolution{side, side}),
             "--train_latents {}: sample {} has latents of {}x{}, not the {}x{} of --resolution {}; train with "
             "--enable_bucket on latents of several sizes",
             o.train_latents, i, size.width, size.height, side, side, o.transform.resolution);
  }
}

TrainingData open_latents(const TrainingDataOptions& o, const ModelShapes& model, const uint64_t& seed,
                          const BatchLayout& layout, int rank) {
  auto dataset = std::make_unique<LatentDataset>(o.train_latents, o.transform.resolution);
  check_latents_fit(*dataset, o, model);
  if (o.max_train_samples) dataset->select(random_subset(dataset->size(), *o.max_train_samples, seed));
  log::info("{} precomputed samples in {} ({})", dataset->size(), o.train_latents,
            dataset->index().moments ? "posterior moments" : "posterior samples");
  std::vector<int32_t> bucket_of;
  if (o.enable_bucket) {
    // The buckets are the latent sizes the shards hold, in sorted order.
    std::vector<Resolution> sizes;
    for (int64_t i = 0; i < dataset->size(); ++i) sizes.push_back(dataset->latent_size(i));
    std::vector<Resolution> buckets = sizes;
    std::sort(buckets.begin(), buckets.end());
    buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
    for (Resolution size : sizes) bucket_of.push_back(index_of(buckets, size));
    log_buckets(buckets, bucket_of, model.vae_scale_factor);
  }
  TrainingData data;
  data.listing_fingerprint = dataset->fingerprint();
  data.sample_counts = {dataset->size(), 0};
  data.planner = std::make_unique<BatchPlanner>(dataset->size(), layout, rank, seed, std::move(bucket_of));
  data.source =
      std::make_unique<LatentSource>(std::move(dataset), o.captions, loader_options(o, layout), seed, *data.planner);
  return data;
}

TrainingData open_synthetic(const TrainingDataOptions& o, const text::ClipTokenizer& tokenizer,
                            const ModelShapes& model, const uint64_t& seed, const BatchLayout& layout, int rank) {
  SyntheticOptions synthetic;
  synthetic.kind = o.synthetic_data;
  synthetic.samples = o.synthetic_samples;
  synthetic.resolution = o.transform.resolution;
  synthetic.latent_channels = model.latent_channels;
  synthetic.vae_scale_factor = model.vae_scale_factor;
  synthetic.embedding_dim = model.text_dim;
  TrainingData data;
  data.sample_counts = {o.synthetic_samples, 0};
  data.planner = std::make_unique<BatchPlanner>(o.synthetic_samples, layout, rank, seed);
  data.source = std::make_unique<SyntheticSource>(synthetic, o.synthetic_data == "images" ? &tokenizer : nullptr, seed);
  return data;
}

TrainingData open_replay(const TrainingDataOptions& o, const uint64_t& seed, const BatchLayout& layout, int rank) {
  auto replay = std::make_unique<ReplaySource>(o.replay_inputs, layout, rank);
  TrainingData data;
  data.replay_steps = replay->steps();
  data.planner = std::make_unique<BatchPlanner>(0, layout, rank, seed);
  data.source = std::move(replay);
  return data;
}

}  // namespace

TrainingData open_training_data(const TrainingDataOptions& o, const text::ClipTokenizer& tokenizer,
                                const ModelShapes& model, const uint64_t& seed, const BatchLayout& layout, int rank) {
  const DataKind kind = data_kind(o);
  check_flags_fit(o, kind);
  switch (kind) {
    case DataKind::kImageFolder:
    case DataKind::kShards: return open_images(o, tokenizer, seed, layout, rank);
    case DataKind::kLatents: return open_latents(o, model, seed, layout, rank);
    case DataKind::kReplay: return open_replay(o, seed, layout, rank);
    case DataKind::kDreamBooth: return open_dreambooth(o, tokenizer, seed, layout, rank);
    default: return open_synthetic(o, tokenizer, model, seed, layout, rank);
  }
}

}  // namespace sd::data

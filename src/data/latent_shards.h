// Precomputed latents (what `sdtrain preprocess` writes and `sdtrain train --train_latents` reads): VAE posteriors
// and CLIP text embeddings in safetensors shards plus an index, so training runs the UNet alone. docs/data.md
// specifies the format for other tools; in short, a directory holds
//   latents-00000.safetensors ...  shard k holds samples [first_sample, first_sample + samples) of index.json, per
//                                  sample n and stored resolution R the float tensors
//                                    n.latent_mean.R, n.latent_std.R  [C, h, w] the VAE posterior (unscaled), or
//                                    n.latent.R                       [C, h, w] one posterior sample x scaling factor
//                                    n.text_hidden                    [K, 77, D] CLIP's last hidden state per caption
//                                    n.text_pooled                    [K, D] (optional) its pooled output
//   empty_caption.safetensors      text_hidden [1, 77, D] (and text_pooled) of "", for caption dropout (optional
//                                  without it)
//   index.json                     written last: its presence marks the directory complete
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/buckets.h"
#include "data/sampler.h"

namespace sd::data {

constexpr char kLatentsFormat[] = "sdtrain-latents";
constexpr int kLatentsVersion = 1;
constexpr char kLatentsIndexFile[] = "index.json";
constexpr char kEmptyCaptionFile[] = "empty_caption.safetensors";
// The most samples one shard may claim (its safetensors header, at most 100 MB, names every one).
constexpr int64_t kMaxShardSamples = 10'000'000;

// "latents-00012.safetensors"
std::string latent_shard_file(int64_t shard);
// "12.text_hidden"; with a resolution "12.latent_mean.256"
std::string latent_tensor_name(int64_t sample, const std::string& field);
std::string latent_tensor_name(int64_t sample, const std::string& field, int resolution);

// What index.json says about the whole directory.
struct LatentsIndex {
  bool moments = true;  // latent_mean/latent_std per sample, else one stored sample (latent)
  std::vector<int> resolutions;
  double scaling_factor = 0.18215;  // the VAE's, applied to samples drawn from stored moments
  int64_t latent_channels = 4;
  int64_t text_dim = 768;
  bool pooled = false;
  struct Shard {
    std::string file;
    int64_t first_sample = 0;
    int64_t samples = 0;
  };
  std::vector<Shard> shards;
  nlohmann::json preprocessing;  // the settings and inputs that made it, for provenance

  int64_t samples() const;
  nlohmann::json to_json() const;
  // Throws sd::Error naming `source` for a missing or malformed key, another format or a newer version.
  static LatentsIndex from_json(const nlohmann::json& j, const std::string& source);
};

// One sample as stored, converted to float32.
struct LatentSample {
  at::Tensor mean, std;    // [C, h, w], with moments; or
  at::Tensor latent;       // [C, h, w], already times the scaling factor
  at::Tensor text_hidden;  // [K, 77, D], one row per caption
};

class LatentDataset {
 public:
  // Reads <dir>/index.json, the header of every shard and the empty caption's embedding if there is one, and checks
  // that every sample holds the tensors of `resolution` with C channels and K x 77 x D text embeddings as the index
  // says. Throws sd::Error (one line naming --train_latents, the file and the tensor) otherwise: no index, a
  // resolution not stored, a missing shard or tensor, a shape that disagrees.
  LatentDataset(const std::filesystem::path& dir, int resolution);

  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const LatentsIndex& index() const { return index_; }
  // The latent size (width, height) of sample `index`, from the shard headers.
  Resolution latent_size(int64_t index) const { return sizes_.at(static_cast<size_t>(samples_.at(index))); }
  // Reads sample `index` (one pread per tensor, safe on any thread).
  LatentSample read(int64_t index) const;
  // Whether the directory holds empty_caption.safetensors, which caption dropout needs.
  bool has_empty_caption() const { return empty_caption_.defined(); }
  // [77, D]: the embedding of the empty caption (undefined without the file).
  const at::Tensor& empty_caption() const { return empty_caption_; }
  // Keeps the samples at `indices`, in that order.
  void select(const std::vector<int64_t>& indices) { keep_indices(samples_, indices); }
  // A digest of the shards' names and sizes and of the samples kept (data/listing_fingerprint.h): ranks compare it
  // at start-up, since each node may hold its own copy.
  std::string fingerprint() const;

 private:
  const LatentsIndex::Shard& shard_of(int64_t sample) const;
  void check_shard(const LatentsIndex::Shard& shard);

  std::filesystem::path dir_;
  int resolution_;
  LatentsIndex index_;
  std::vector<int64_t> samples_;   // the stored sample numbers, in dataset order
  std::vector<Resolution> sizes_;  // by stored sample number
  at::Tensor empty_caption_;
};

}  // namespace sd::data

#include "data/latent_shards.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "data/listing_fingerprint.h"
#include "io/atomic_file.h"
#include "io/json_config.h"
#include "io/safetensors.h"

namespace sd::data {

namespace fs = std::filesystem;
using nlohmann::json;

std::string latent_shard_file(int64_t shard) { return fmt::format("latents-{:05d}.safetensors", shard); }

std::string latent_tensor_name(int64_t sample, const std::string& field) { return fmt::format("{}.{}", sample, field); }

std::string latent_tensor_name(int64_t sample, const std::string& field, int resolution) {
  return fmt::format("{}.{}.{}", sample, field, resolution);
}

int64_t LatentsIndex::samples() const {
  int64_t total = 0;
  for (const Shard& s : shards) total += s.samples;
  return total;
}

json LatentsIndex::to_json() const {
  json shard_list = json::array();
  for (const Shard& s : shards)
    shard_list.push_back({{"file", s.file}, {"first_sample", s.first_sample}, {"samples", s.samples}});
  return {{"format", kLatentsFormat},
          {"version", kLatentsVersion},
          {"latents", moments ? "moments" : "sample"},
          {"resolutions", resolutions},
          {"scaling_factor", scaling_factor},
          {"latent_channels", latent_channels},
          {"text_dim", text_dim},
          {"pooled", pooled},
          {"samples", samples()},
          {"shards", shard_list},
          {"empty_caption", kEmptyCaptionFile},
          {"preprocessing", preprocessing}};
}

LatentsIndex LatentsIndex::from_json(const json& j, const std::string& source) {
  LatentsIndex index;
  try {
    SD_CHECK(j.at("format") == kLatentsFormat, "{}: format is {}, expected \"{}\"", source, j.at("format").dump(),
             kLatentsFormat);
    SD_CHECK(j.at("version").get<int>() <= kLatentsVersion,
             "{}: version {} is newer than this sdtrain reads ({}); update sdtrain", source, j.at("version").dump(),
             kLatentsVersion);
    const std::string latents = j.at("latents").get<std::string>();
    SD_CHECK(latents == "moments" || latents == "sample", "{}: latents is \"{}\", expected \"moments\" or \"sample\"",
             source, latents);
    index.moments = latents == "moments";
    index.resolutions = j.at("resolutions").get<std::vector<int>>();
    index.scaling_factor = j.at("scaling_factor").get<double>();
    index.latent_channels = j.at("latent_channels").get<int64_t>();
    index.text_dim = j.at("text_dim").get<int64_t>();
    index.pooled = j.value("pooled", false);
    for (const json& s : j.at("shards"))
      index.shards.push_back(
          {s.at("file").get<std::string>(), s.at("first_sample").get<int64_t>(), s.at("samples").get<int64_t>()});
    index.preprocessing = j.value("preprocessing", json::object());
  } catch (const json::exception& e) {
    fail("{}: malformed latents index ({})", source, e.what());
  }
  int64_t next = 0;
  for (const Shard& s : index.shards) {
    SD_CHECK(s.first_sample == next && s.samples > 0,
             "{}: shard {} starts at sample {} with {} samples; expected consecutive, non-empty ranges from sample 0",
             source, s.file, s.first_sample, s.samples);
    // A shard's header lists every sample's tensors, and safetensors headers are at most 100 MB.
    SD_CHECK(s.samples <= kMaxShardSamples, "{}: shard {} claims {} samples, more than {}", source, s.file, s.samples,
             kMaxShardSamples);
    next += s.samples;
  }
  SD_CHECK(next > 0, "{}: lists no samples", source);
  return index;
}

namespace {

// A stored tensor's shape, checked against `expected` (-1: any size).
std::vector<int64_t> checked_shape(const io::SafeTensorsFile& file, const std::string& name,
                                   const std::vector<int64_t>& expected) {
  SD_CHECK(file.contains(name), "--train_latents: {}: no tensor '{}'", file.path().string(), name);
  const std::vector<int64_t>& shape = file.entry(name).shape;
  bool fits = shape.size() == expected.size();
  for (size_t d = 0; fits && d < shape.size(); ++d) fits = expected[d] == -1 || expected[d] == shape[d];
  SD_CHECK(fits, "--train_latents: {}: {} has shape [{}]; expected [{}] (-1: any) as index.json says",
           file.path().string(), name, fmt::join(shape, ", "), fmt::join(expected, ", "));
  return shape;
}

at::Tensor read_float(const io::SafeTensorsFile& file, const std::string& name) {
  return file.read(name).to(at::kFloat);
}

}  // namespace

LatentDataset::LatentDataset(const fs::path& dir, int resolution) : dir_(dir), resolution_(resolution) {
  SD_CHECK(fs::is_directory(dir), "--train_latents {}: not a directory", dir.string());
  const fs::path index_path = dir / kLatentsIndexFile;
  SD_CHECK(fs::exists(index_path),
           "--train_latents {}: no {} (not written by `sdtrain preprocess`, or its preprocessing has not finished: "
           "run it again to complete it)",
           dir.string(), kLatentsIndexFile);
  index_ = LatentsIndex::from_json(io::JsonConfig::load(index_path).raw(), index_path.string());
  const auto& stored = index_.resolutions;
  SD_CHECK(std::find(stored.begin(), stored.end(), resolution) != stored.end(),
           "--train_latents {}: holds latents at resolution(s) {}, not at --resolution {}", dir.string(),
           fmt::join(stored, ", "), resolution);
  // Grown shard by shard as each is checked, so an index that claims more samples than its shards hold is refused
  // before memory is spent on the claim.
  for (const LatentsIndex::Shard& shard : index_.shards) check_shard(shard);
  samples_.resize(sizes_.size());
  for (size_t i = 0; i < samples_.size(); ++i) samples_[i] = static_cast<int64_t>(i);
  if (!fs::exists(dir / kEmptyCaptionFile)) return;
  const io::SafeTensorsFile empty(dir / kEmptyCaptionFile);
  checked_shape(empty, "text_hidden", {1, -1, index_.text_dim});
  empty_caption_ = read_float(empty, "text_hidden")[0];
}

void LatentDataset::check_shard(const LatentsIndex::Shard& shard) {
  const fs::path path = dir_ / shard.file;
  SD_CHECK(fs::exists(path), "--train_latents {}: {} is listed in {} but missing", dir_.string(), shard.file,
           kLatentsIndexFile);
  const io::SafeTensorsFile file(path);
  const std::string field = index_.moments ? "latent_mean" : "latent";
  for (int64_t n = shard.first_sample; n < shard.first_sample + shard.samples; ++n) {
    const std::vector<int64_t> shape =
        checked_shape(file, latent_tensor_name(n, field, resolution_), {index_.latent_channels, -1, -1});
    if (index_.moments) checked_shape(file, latent_tensor_name(n, "latent_std", resolution_), shape);
    checked_shape(file, latent_tensor_name(n, "text_hidden"), {-1, -1, index_.text_dim});
    sizes_.push_back(
        {static_cast<int>(shape[2]), static_cast<int>(shape[1])});  // n == sizes_.size(): shards are consecutive
  }
}

std::string LatentDataset::fingerprint() const {
  std::vector<fs::path> files;
  for (const LatentsIndex::Shard& shard : index_.shards) files.push_back(dir_ / shard.file);
  std::vector<std::string> kept;
  for (int64_t sample : samples_) kept.push_back(std::to_string(sample));
  return text_fingerprint({listing_fingerprint(files), text_fingerprint(kept)});
}

const LatentsIndex::Shard& LatentDataset::shard_of(int64_t sample) const {
  const auto after = std::upper_bound(index_.shards.begin(), index_.shards.end(), sample,
                                      [](int64_t n, const LatentsIndex::Shard& s) { return n < s.first_sample; });
  return *(after - 1);
}

LatentSample LatentDataset::read(int64_t index) const {
  const int64_t n = samples_.at(static_cast<size_t>(index));
  const io::SafeTensorsFile file(dir_ / shard_of(n).file);
  LatentSample sample;
  if (index_.moments) {
    sample.mean = read_float(file, latent_tensor_name(n, "latent_mean", resolution_));
    sample.std = read_float(file, latent_tensor_name(n, "latent_std", resolution_));
  } else {
    sample.latent = read_float(file, latent_tensor_name(n, "latent", resolution_));
  }
  sample.text_hidden = read_float(file, latent_tensor_name(n, "text_hidden"));
  return sample;
}

}  // namespace sd::data

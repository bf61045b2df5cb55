// WebDataset shards as a map-style dataset. A shard is a tar archive whose consecutive members sharing a key form
// one sample ("00/000123.jpg", "00/000123.txt", "00/000123.json" as img2dataset writes them). Each shard is
// indexed once, from its tar headers alone (the data is seeked over): where every sample's image and caption
// members lie. The sampler then permutes the samples of all shards together, and each rank reads only its own
// samples, with one pread per member at its offset, on the loader threads.
//
// Python's webdataset streams shards instead, through a bounded shuffle buffer, with shards split across ranks and
// workers. The order it yields then depends on the number of ranks and workers and on the buffer's history, so N
// ranks cannot train what 1 rank with N-fold accumulation trains, and a resumed run can only skip ahead
// approximately. Indexing keeps both exact: a sample's identity is (shard, offset), a pure function of the seed
// and the step picks it, and a checkpoint's step alone says where to continue.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/image_caption_dataset.h"

namespace sd::data {

// WebDataset's split of a member name into key and extension: the key is the path up to the first dot of the
// base name, the extension all after that dot ("a.b/c.seg.png" -> {"a.b/c", "seg.png"}). nullopt when the base
// name has no dot (such members belong to no sample).
std::optional<std::pair<std::string, std::string>> split_sample_key(const std::string& member_name);

// Where a sample's members are in its shard. Kept small (32 bytes), since every rank holds one per sample of the
// whole dataset: 10 million samples take 320 MB.
struct ShardSample {
  uint64_t image_offset = 0;
  uint64_t caption_offset = 0;
  uint32_t image_size = 0;
  uint32_t caption_size = 0;
  uint32_t shard = 0;            // index into the dataset's shard list
  bool caption_is_json = false;  // the caption is a key of the sample's .json ("txt" preferred when both exist)
};

// What indexing one shard found: its usable samples in order, and its problems.
struct ShardIndex {
  std::vector<ShardSample> samples;
  int64_t incomplete = 0;             // samples without an image or a caption, dropped
  std::string incomplete_example;     // the key of one of them, for the warning
  std::vector<std::string> warnings;  // tar damage, stray and duplicate members, each naming the shard
};

// Indexes the shard at `path` (number `shard` of the list). A sample's image is its first member with extension
// jpg, jpeg, png, webp or bmp; its caption its txt member, else its json member. Throws sd::Error naming the shard
// if it is not a tar archive.
ShardIndex index_shard(const std::filesystem::path& path, uint32_t shard);

class WebDatasetShards : public ImageCaptionDataset {
 public:
  // Indexes every shard, `threads` at a time, and prints their warnings and the count of samples dropped for
  // lacking an image or a caption. A caption read from a json member is the value of `caption_key`, else of
  // "caption" (img2dataset's key). Throws sd::Error naming a shard that is not a tar archive, or when no shard holds
  // a usable sample.
  WebDatasetShards(std::vector<std::filesystem::path> shards, std::string caption_key, int threads);

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  EncodedSample read(int64_t index) const override;
  std::string image_head(int64_t index, uint64_t bytes) const override;
  std::string describe(int64_t index) const override;
  std::string layout() const override { return "webdataset"; }
  void select(const std::vector<int64_t>& indices) override { keep_indices(samples_, indices); }
  // The shards' names and sizes, and the samples kept.
  std::string fingerprint() const override;

  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }

 private:
  // `size` bytes at `offset` of sample `index`'s shard, its `what` ("image", "caption"): an error names the sample.
  std::string read_member(int64_t index, const char* what, uint64_t offset, uint64_t size) const;
  // The caption text of sample `index` from its caption member's bytes.
  std::vector<std::string> captions_of(int64_t index, const std::string& bytes) const;

  std::vector<std::filesystem::path> shards_;
  std::string caption_key_;
  std::vector<ShardSample> samples_;
};

}  // namespace sd::data

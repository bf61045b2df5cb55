// WebDataset shards: tar archives whose consecutive members that share a key form one sample, e.g.
// "00/000123.jpg", "00/000123.txt" and "00/000123.json" as img2dataset writes them.
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/tar_reader.h"

namespace sd::data {

struct WebDatasetSample {
  std::string key;                           // "00/000123"
  std::map<std::string, std::string> files;  // extension, lower-cased ("jpg", "txt", "seg.png") -> contents
  std::filesystem::path shard;               // where it came from, for messages
};

// WebDataset's split of a member name into key and extension: the key is the path up to the first dot of the
// base name, the extension all after that dot ("a.b/c.seg.png" -> {"a.b/c", "seg.png"}). nullopt when the base
// name has no dot (such members belong to no sample).
std::optional<std::pair<std::string, std::string>> split_sample_key(const std::string& member_name);

// The sample's image: the first of "jpg", "jpeg", "png", "webp" it has, as {extension, bytes}; nullopt if none.
std::optional<std::pair<std::string, const std::string*>> find_image(const WebDatasetSample& sample);

class WebDatasetReader {
 public:
  // Throws sd::Error naming the shard if it is not a tar archive.
  explicit WebDatasetReader(const std::filesystem::path& shard);

  // The next sample; nullopt at the end of the shard (or of its readable part).
  std::optional<WebDatasetSample> next();

  // One line per problem, naming the shard and the member or sample: the tar reader's (corruption, truncation)
  // and members without an extension or repeated within a sample, which are dropped.
  std::vector<std::string> warnings() const;

 private:
  io::TarReader tar_;
  std::optional<WebDatasetSample> pending_;  // the sample being gathered
  std::vector<std::string> warnings_;
};

}  // namespace sd::data

#include "data/dreambooth_images.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace sd::data {

namespace fs = std::filesystem;

std::vector<fs::path> images_in(const fs::path& dir) {
  std::vector<fs::path> images;
  if (!fs::is_directory(dir)) return images;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && is_image_path(entry.path())) images.push_back(entry.path());
  std::sort(images.begin(), images.end());
  return images;
}

namespace {

std::vector<CaptionedImage> captioned(const std::vector<fs::path>& images, const std::string& prompt, double weight) {
  std::vector<CaptionedImage> samples;
  for (const fs::path& image : images) samples.push_back({image, {prompt}, weight});
  return samples;
}

}  // namespace

void check_dreambooth_options(const DreamBoothDataOptions& o) {
  SD_CHECK(fs::is_directory(o.instance_data_dir), "--instance_data_dir {}: not a directory", o.instance_data_dir);
  SD_CHECK(!images_in(o.instance_data_dir).empty(),
           "--instance_data_dir {}: no images (.jpg, .jpeg, .png, .bmp or .webp files)", o.instance_data_dir);
  SD_CHECK(!o.instance_prompt.empty(), "--instance_prompt is empty: it names the subject, e.g. \"a photo of sks dog\"");
  if (!o.with_prior_preservation) return;
  SD_CHECK(!o.class_prompt.empty(),
           "--with_prior_preservation needs --class_prompt (the class, e.g. \"a photo of a dog\")");
  std::error_code ignored;
  SD_CHECK(!fs::equivalent(o.class_data_dir, o.instance_data_dir, ignored),
           "--class_data_dir {} is --instance_data_dir: class images would train as the subject; keep them apart",
           o.class_data_dir);
}

DreamBoothImages dreambooth_images(const DreamBoothDataOptions& o, double prior_loss_weight) {
  check_dreambooth_options(o);
  const std::vector<fs::path> instances = images_in(o.instance_data_dir);
  DreamBoothImages data;
  data.pairs.instances = static_cast<int64_t>(instances.size());
  if (!o.with_prior_preservation) {
    data.samples = captioned(instances, o.instance_prompt, 1.0);
    return data;
  }
  std::vector<fs::path> classes = images_in(o.class_data_dir);
  SD_CHECK(!classes.empty(), "--class_data_dir {}: no images (with --with_prior_preservation it needs class images)",
           o.class_data_dir);
  if (static_cast<int64_t>(classes.size()) > o.num_class_images) classes.resize(o.num_class_images);
  data.pairs.classes = static_cast<int64_t>(classes.size());
  data.samples = captioned(instances, o.instance_prompt, 2.0);
  for (CaptionedImage& sample : captioned(classes, o.class_prompt, 2.0 * prior_loss_weight))
    data.samples.push_back(std::move(sample));
  log::info("DreamBooth: {} instance image(s) in {}, {} class image(s) in {}: {} pairs per epoch", data.pairs.instances,
            o.instance_data_dir, data.pairs.classes, o.class_data_dir, data.pairs.count());
  return data;
}

}  // namespace sd::data

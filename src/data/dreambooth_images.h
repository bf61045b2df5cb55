// DreamBooth's data as diffusers' examples/dreambooth/train_dreambooth.py reads it: the images of one subject in
// --instance_data_dir, all captioned --instance_prompt, and with prior preservation images of its class in
// --class_data_dir, captioned --class_prompt (the first --num_class_images of them), trained in pairs
// (data/sampler.h PriorPairs). Folders hold images directly: sdtrain lists their image files in name order (the
// script lists every entry in the filesystem's order and fails on anything that is not an image).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/image_folder_dataset.h"
#include "data/sampler.h"

namespace sd::data {

// The flags; field names are the flags'.
struct DreamBoothDataOptions {
  std::string instance_data_dir;
  std::string instance_prompt;
  std::string class_data_dir;
  std::string class_prompt;
  bool with_prior_preservation = false;
  int64_t num_class_images = 100;          // class images trained on (and generated up to when fewer)
  int64_t sample_batch_size = 4;           // class images generated per pipeline call
  std::string prior_generation_precision;  // of that pipeline: "no" or "fp32", "fp16" or "bf16"; "": the run's
};

// The image files directly in `dir`, in name order; none when it does not exist.
std::vector<std::filesystem::path> images_in(const std::filesystem::path& dir);

struct DreamBoothImages {
  std::vector<CaptionedImage> samples;  // instance images, then (with prior preservation) class images
  PriorPairs pairs;                     // classes 0 without prior preservation
};

// Throws sd::Error naming the flag for a missing or empty --instance_data_dir, a missing prompt, or a class folder
// that is the instance folder: what can be told before any class image is generated.
void check_dreambooth_options(const DreamBoothDataOptions& options);

// Lists the images. With prior preservation every batch's loss is the script's mse(instances) + w * mse(classes),
// w = `prior_loss_weight`: as the mean over its 2B samples, instance samples weigh 2 and class samples 2w. Throws
// sd::Error as check_dreambooth_options does, and for no class images.
DreamBoothImages dreambooth_images(const DreamBoothDataOptions& options, double prior_loss_weight);

}  // namespace sd::data

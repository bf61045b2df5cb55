// The data flags `sdtrain train`, `preprocess` and `dreambooth` share, defined once: where the images and captions are,
// and kohya's aspect-ratio buckets.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "data/training_data.h"

namespace sd::cli {

// --train_data_dir, --train_shards, --image_column, --caption_column, --image_interpolation_mode,
// --dataloader_num_workers
void add_image_caption_flags(CLI::App* cmd, data::TrainingDataOptions& o, const std::string& group);

// --image_interpolation_mode
void add_interpolation_flag(CLI::App* cmd, data::ImageTransformOptions& o, const std::string& group);

// --enable_bucket, --min_bucket_reso, --max_bucket_reso, --bucket_reso_steps
void add_bucket_flags(CLI::App* cmd, data::TrainingDataOptions& o, const std::string& group);

}  // namespace sd::cli

#include "cli/data_flags.h"

#include "cli/flags.h"
#include "io/image.h"

namespace sd::cli {

void add_image_caption_flags(CLI::App* cmd, data::TrainingDataOptions& o, const std::string& group) {
  flag(cmd, "--train_data_dir", o.train_data_dir,
       "Images with a metadata.jsonl (Hugging Face imagefolder) or with .txt captions beside them (kohya)")
      ->group(group);
  flag(cmd, "--train_shards", o.train_shards,
       "WebDataset tar shards, read in place: 'data/{00000..00099}.tar' (brace ranges and lists) or globs; a "
       "sample's image is its jpg/png/webp member, its caption its txt member (else a key of its json)")
      ->group(group);
  flag(cmd, "--image_column", o.image_column, "metadata.jsonl column of the image ('image' means file_name)")
      ->group(group);
  flag(cmd, "--caption_column", o.caption_column,
       "metadata.jsonl column of the caption (a string or a list); with --train_shards the .json key tried before "
       "'caption'")
      ->group(group);
  add_interpolation_flag(cmd, o.transform, group);
  flag(cmd, "--dataloader_num_workers", o.dataloader_num_workers,
       "Loader threads indexing shards and decoding images ahead of use (0 or 1: one thread)")
      ->check(in_range(0, 256))
      ->group(group);
}

void add_interpolation_flag(CLI::App* cmd, data::ImageTransformOptions& o, const std::string& group) {
  cmd->add_option_function<std::string>(
         flag_names("--image_interpolation_mode"),
         [&o](const std::string& name) { o.interpolation = *io::resize_filter_named(name); },
         "How images are resized, as PIL does: bilinear (diffusers 0.24's scripts), bicubic, lanczos (the default "
         "of later scripts), box, hamming, or nearest (also named nearest_exact, which is nearest on PIL images)")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            if (io::resize_filter_named(name)) return {};
            return "'" + name + "' is not one of bilinear, bicubic, lanczos, box, hamming, nearest, nearest_exact";
          },
          "bilinear|bicubic|lanczos|box|hamming|nearest|nearest_exact"))
      ->default_str("bilinear")
      ->group(group);
}

void add_bucket_flags(CLI::App* cmd, data::TrainingDataOptions& o, const std::string& group) {
  switch_flag(cmd, "--enable_bucket", o.enable_bucket,
              "Aspect-ratio buckets (kohya's): each image trains at the bucket of about --resolution squared pixels "
              "nearest its aspect ratio; each micro-batch holds one bucket")
      ->group(group);
  flag(cmd, "--min_bucket_reso", o.min_bucket_reso, "Smallest bucket side")->check(in_range(8, 16384))->group(group);
  flag(cmd, "--max_bucket_reso", o.max_bucket_reso, "Largest bucket side")->check(in_range(8, 16384))->group(group);
  flag(cmd, "--bucket_reso_steps", o.bucket_reso_steps, "Bucket sides are multiples of this (itself a multiple of 8)")
      ->check(in_range(1, 16384))
      ->group(group);
}

}  // namespace sd::cli

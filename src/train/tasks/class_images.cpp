#include "train/tasks/class_images.h"

#include <c10/util/hash.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/jpeg.h"
#include "pipeline/txt2img.h"
#include "schedulers/factory.h"

namespace sd::train {

namespace fs = std::filesystem;

namespace {

// The script's name: its index among the folder's images, and the SHA-1 of the pixels (PIL's image.tobytes()).
std::string class_image_name(int64_t index, const io::RgbImage& image) {
  const std::string pixels(image.pixels.begin(), image.pixels.end());
  return fmt::format("{}-{}.jpg", index, c10::sha1(pixels).str());
}

}  // namespace

void generate_missing_class_images(pipeline::StableDiffusion& pipe, const data::DreamBoothDataOptions& o, uint64_t seed,
                                   dist::Communicator& comm) {
  data::check_dreambooth_options(o);  // before an hour of generation, not after
  const fs::path dir = o.class_data_dir;
  std::error_code error;
  fs::create_directories(dir, error);
  SD_CHECK(!error, "--class_data_dir {}: cannot create the folder: {}", dir.string(), error.message());
  const auto have = static_cast<int64_t>(data::images_in(dir).size());
  const int64_t missing = o.num_class_images - have;
  if (missing <= 0) return;
  if (comm.rank() == 0)
    log::info("--class_data_dir {} holds {} of --num_class_images {}: generating {} from \"{}\"", dir.string(), have,
              o.num_class_images, missing, o.class_prompt);
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config);
  const int64_t batch = o.sample_batch_size, world = comm.world_size();
  for (int64_t first = comm.rank() * batch; first < missing; first += world * batch) {
    pipeline::Txt2ImgOptions options;
    options.prompts = {o.class_prompt};
    options.num_images_per_prompt = std::min(batch, missing - first);
    options.seed = seed + static_cast<uint64_t>(have + first);
    const at::Tensor images =
        pipeline::txt2img_with_progress(
            pipe, *scheduler, options,
            fmt::format("class images {}-{} of {}", first + 1, first + options.num_images_per_prompt, missing))
            .images_uint8;
    for (int64_t k = 0; k < images.size(0); ++k) {
      const io::RgbImage image = pipeline::to_rgb_image(images[k]);
      io::write_text_file(dir / class_image_name(have + first + k, image), io::encode_jpeg(image, 75));
    }
  }
  comm.barrier();
}

}  // namespace sd::train

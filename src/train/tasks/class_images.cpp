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
#include "train/precision.h"

namespace sd::train {

namespace fs = std::filesystem;

namespace {

// The script's name: its index among the folder's images, and the SHA-1 of the pixels (PIL's image.tobytes()).
std::string class_image_name(int64_t index, const io::RgbImage& image) {
  const std::string pixels(image.pixels.begin(), image.pixels.end());
  return fmt::format("{}-{}.jpg", index, c10::sha1(pixels).str());
}

// The script's torch_dtype is the flag's, else float16 on a GPU and float32 on a CPU; here the run's precision, so a
// bf16 run generates at bf16's speed. float16 is taken as bf16, and bf16 as float32 on CPUs where bf16 runs slower,
// as --mixed_precision takes them.
at::ScalarType generation_dtype(const std::string& precision, at::ScalarType run_dtype) {
  if (precision.empty()) return run_dtype;
  const bool half = precision == "bf16" || precision == "fp16";
  SD_CHECK(half || precision == "fp32" || precision == "no",
           "--prior_generation_precision must be no, fp32, fp16 or bf16, got {}", precision);
  return PrecisionPolicy::from_flag(half ? "bf16" : "no").frozen;
}

}  // namespace

void generate_missing_class_images(const pipeline::ModelSource& model, const data::DreamBoothDataOptions& o,
                                   at::ScalarType run_dtype, uint64_t seed, dist::Communicator& comm) {
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
  // As `sdtrain generate` loads them, so image i is what it draws from seed + i: the text encoder stays float32.
  pipeline::ComponentDtypes dtypes;
  dtypes.unet = dtypes.vae = generation_dtype(o.prior_generation_precision, run_dtype);
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(model, dtypes);
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

// The config loaders on arbitrary JSON: the same text as a UNet, VAE, CLIP text-encoder and scheduler config (each
// parsed and validated), and a valid scheduler config builds its scheduler and a timestep schedule.
#include "fuzz_util.h"
#include "io/json_config.h"
#include "models/clip/clip_config.h"
#include "models/unet/unet_config.h"
#include "models/vae/vae_config.h"
#include "schedulers/factory.h"
#include "schedulers/scheduler_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json root;
  sd::fuzz::run_one([&] { root = sd::io::parse_python_json(text, "config.json"); });
  if (!root.is_object()) return 0;
  const sd::io::JsonConfig cfg(root, "config.json");
  sd::fuzz::run_one([&] { sd::models::UNetConfig::from_json(cfg).validate(); });
  sd::fuzz::run_one([&] { sd::models::VaeConfig::from_json(cfg); });
  sd::fuzz::run_one([&] { sd::models::ClipTextConfig::from_json(cfg); });
  sd::fuzz::run_one([&] {
    const auto scheduler = sd::schedulers::make_scheduler(sd::schedulers::SchedulerConfig::from_json(cfg));
    scheduler->set_timesteps(static_cast<int>(1 + size % 50));
  });
  return 0;
}

// End-to-end reliability through the binary: what a killed run leaves is put right by the next run into the same
// folder, output locations that cannot be written are named with their flag and the OS's reason, damaged
// checkpoints are named on resume, the skipped-step allowance counts over resumes, and sizes a flag or config file
// asks for are held to readable bounds before anything is loaded.
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

fs::path tiny_sd1() { return sd::test::fixtures() / "tiny-sd1"; }

std::string quote(const std::string& s) { return "'" + s + "'"; }

// A short UNet training run on synthetic latents, checkpointing every step, resuming from the latest.
std::vector<std::string> synthetic_run(const fs::path& out, int steps, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--synthetic_data=latents",
                                   "--synthetic_samples=4",
                                   "--resolution=32",
                                   "--train_batch_size=1",
                                   "--checkpointing_steps=1",
                                   "--seed=3",
                                   "--resume_from_checkpoint=latest",
                                   "--max_train_steps=" + std::to_string(steps),
                                   "--output_dir=" + out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return sd::test::tiny_training_command("train", args);
}

// The last line of a run's output (training prints progress before an error).
std::string last_line(const std::string& output) {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ReliabilityE2E, LeftoversOfAKilledRunArePutRightByTheNextRun) {
  sd::test::TempDir dir;
  const fs::path out = dir.path() / "out";
  auto first = sd::test::run_process(synthetic_run(out, 2), 300s);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Killed while checkpoint-2 was published again (moved aside, the new one not yet in place) and after the final
  // UNet was moved in but before its old version was removed; temporaries of processes that died.
  fs::rename(out / "checkpoint-2", out / "checkpoint-2.old");
  fs::copy(out / "unet", out / "unet.old", fs::copy_options::recursive);
  fs::create_directories(out / fmt::format("unet.tmp{}", sd::test::dead_pid()));
  fs::create_directories(out / fmt::format(".partial-{}", sd::test::dead_pid()) / "vae");
  std::ofstream(out / fmt::format("model_index.json.tmp{}", sd::test::dead_pid())) << "{";
  std::ofstream(out / "logs" / fmt::format("run.json.tmp{}", sd::test::dead_pid())) << "{";
  fs::create_directories(out / "notes.old");  // the user's own: left alone

  auto second = sd::test::run_process(synthetic_run(out, 3), 300s);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // The newest checkpoint was not lost to the interrupted rename.
  EXPECT_NE(second.output.find("resuming from " + (out / "checkpoint-2").string() + " (step 2)"), std::string::npos)
      << second.output;
  const std::vector<std::string> expected = {"checkpoint-1",     "checkpoint-2", "checkpoint-3", "logs",
                                             "model_index.json", "notes.old",    "scheduler",    "text_encoder",
                                             "tokenizer",        "unet",         "vae"};
  EXPECT_EQ(names_in(out), expected);
  for (const auto& name : names_in(out / "logs")) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

// Two runs into one folder would interleave checkpoints and logs: the second is refused while the first runs, and a
// finished run leaves no lock behind.
TEST(ReliabilityE2E, ASecondRunIntoTheSameOutputFolderIsRefused) {
  sd::test::TempDir dir;
  const fs::path out = dir.path() / "out";
  sd::test::Process first(synthetic_run(out, 100000));
  ASSERT_TRUE(first.wait_for_output("step", 120s)) << first.output();
  const auto second = sd::test::run_process(synthetic_run(out, 2), 120s);
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_EQ(last_line(second.output), "sdtrain: error: --output_dir " + out.string() +
                                          ": another sdtrain process (pid " + std::to_string(first.pid()) +
                                          ") is writing there; wait for it, or give "
                                          "another folder")
      << second.output;
  first.signal(SIGTERM);
  ASSERT_TRUE(first.wait(120s));
  EXPECT_FALSE(fs::exists(out / ".sdtrain.lock"));
  const auto third = sd::test::run_process(synthetic_run(out, 2), 120s);
  EXPECT_EQ(third.exit_code, 0) << third.output;
}

TEST(ReliabilityE2E, OutputLocationsThatCannotBeWrittenAreNamedWithTheFlag) {
  sd::test::TempDir dir;
  const fs::path file = dir.path() / "file";
  std::ofstream(file) << "x";
  const std::string blocked = (file / "out").string();
  const std::string because = ": cannot create the folder: Not a directory (" + file.string() + " is a file)";
  const std::string bin = sd::test::sdtrain_binary();
  EXPECT_TRUE(sd::test::is_one_line_error(sd::test::run_command(bin + " init --preset tiny --out " + quote(blocked)),
                                          "--out " + blocked + because));
  EXPECT_TRUE(sd::test::is_one_line_error(
      sd::test::run_command(bin + " generate --model " + quote(tiny_sd1().string()) +
                            " --prompt x --num_inference_steps 1 --output_dir " + quote(blocked)),
      "--output_dir " + blocked + because));
  EXPECT_TRUE(sd::test::is_one_line_error(
      sd::test::run_command(bin + " convert " + quote(tiny_sd1().string()) + " " + quote(blocked)),
      "OUTPUT " + blocked + because));
  auto train = sd::test::run_process(synthetic_run(file / "out", 1), 120s);
  EXPECT_NE(train.exit_code, 0);
  EXPECT_EQ(last_line(train.output), "sdtrain: error: --output_dir " + blocked + because) << train.output;
}

TEST(ReliabilityE2E, AFullOrReadOnlyDiskIsNamedAndLeavesNoHalfCheckpoint) {
  sd::test::TempDir dir;
  sd::test::Tmpfs disk(dir.path() / "disk", "size=2m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error() << ")";
  // The first checkpoint (the UNet's weights and AdamW moments, ~26 MB) does not fit.
  const fs::path out = dir.path() / "disk" / "out";
  auto full = sd::test::run_process(synthetic_run(out, 2), 120s);
  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_NE(last_line(full.output).find(": cannot write: No space left on device"), std::string::npos) << full.output;
  // (The progress bar may share the line: it ends in a carriage return, not a newline.)
  EXPECT_NE(last_line(full.output).find("sdtrain: error: " + out.string() + "/checkpoint-1.partial/"),
            std::string::npos)
      << full.output;
  EXPECT_FALSE(fs::exists(out / "checkpoint-1"));

  ASSERT_TRUE(disk.remount_read_only());
  const fs::path ro = dir.path() / "disk" / "new";
  auto read_only = sd::test::run_process(synthetic_run(ro, 1), 120s);
  EXPECT_EQ(read_only.exit_code, 1) << read_only.output;
  EXPECT_EQ(last_line(read_only.output),
            "sdtrain: error: --output_dir " + ro.string() + ": cannot create the folder: Read-only file system")
      << read_only.output;
}

// Resuming must check that the checkpoint's parts belong together, not go on from a damaged state.
TEST(ReliabilityE2E, DamagedCheckpointsAreNamedOnResume) {
  sd::test::TempDir dir;
  const fs::path out = dir.path() / "out";
  auto first = sd::test::run_process(synthetic_run(out, 2), 300s);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const fs::path manifest = out / "checkpoint-2" / "manifest.json";
  const std::string original = io::read_text_file(manifest);
  auto resume_after = [&](const std::function<void(json&)>& damage) {
    json m = json::parse(original);
    damage(m);
    io::write_text_file(manifest, m.dump());
    return sd::test::run_process(synthetic_run(out, 3), 300s);
  };
  auto steps = resume_after([](json& m) { m["trained"]["optimizer_steps"] = 1; });
  EXPECT_EQ(steps.exit_code, 1) << steps.output;
  EXPECT_EQ(last_line(steps.output),
            "sdtrain: error: " + (out / "checkpoint-2").string() +
                ": the optimizer state has taken 1 steps, but training_state.json says step 2 with 0 skipped: the "
                "checkpoint is damaged")
      << steps.output;
  auto types = resume_after([](json& m) { m["task"] = 7; });
  EXPECT_EQ(types.exit_code, 1) << types.output;
  EXPECT_EQ(last_line(types.output).rfind("sdtrain: error: " + manifest.string() + ": malformed checkpoint (", 0), 0u)
      << types.output;
}

// --skip_nonfinite_steps N allows N skipped updates in the whole run, resumes included (the count used to restart
// at 0 on every resume).
TEST(ReliabilityE2E, SkippedStepAllowanceCountsAcrossResumes) {
  sd::test::TempDir dir;
  const fs::path out = dir.path() / "out";
  // A learning rate that throws the weights to ~1e34 in one step (still finite, so the checkpoints resume): every
  // later loss overflows.
  const std::vector<std::string> diverging = {"--learning_rate=1e34", "--lr_warmup_steps=0",
                                              "--skip_nonfinite_steps=2"};
  auto first = sd::test::run_process(synthetic_run(out, 3, diverging), 300s);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("the update is skipped (2 of 2 allowed)"), std::string::npos) << first.output;
  auto resumed = sd::test::run_process(synthetic_run(out, 4, diverging), 300s);
  EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
  EXPECT_NE(last_line(resumed.output).find("step 4: the loss is "), std::string::npos) << resumed.output;
  EXPECT_NE(last_line(resumed.output).find("training stopped"), std::string::npos) << resumed.output;
}

TEST(ReliabilityE2E, FlagsOutOfRangeShowReadableBounds) {
  const std::string bin = sd::test::sdtrain_binary();
  const std::string model = " --pretrained_model_name_or_path " + quote(tiny_sd1().string());
  auto expect = [&](const std::string& args, const std::string& fragment) {
    EXPECT_TRUE(sd::test::is_one_line_error(sd::test::run_command(bin + " " + args), fragment)) << args;
  };
  expect("train" + model + " --synthetic_data latents --threads 5000", "--threads: 5000 is outside 1..1024");
  expect("train" + model + " --synthetic_data latents --train_batch_size 0",
         "--train_batch_size: 0 is outside 1..65536");
  expect("train" + model + " --synthetic_data latents --max_train_steps 0", "--max_train_steps: 0 is less than 1");
  expect("train" + model + " --synthetic_data latents --resolution 1000000",
         "--resolution: 1000000 is outside 8..16384");
  expect("train" + model + " --synthetic_data latents --lora_rank 100000", "--lora_rank: 100000 is outside 1..4096");
  expect(
      "textual-inversion" + model + " --train_data_dir x --placeholder_token '<x>' --initializer_token toy --repeats 0",
      "--repeats: 0 is outside 1..1000000");
  expect("textual-inversion" + model +
             " --train_data_dir x --placeholder_token '<x>' --initializer_token toy --num_vectors 100000",
         "--num_vectors: 100000 is outside 1..256");
  expect("generate --model " + quote(tiny_sd1().string()) + " --prompt x --num_images_per_prompt 100000",
         "--num_images_per_prompt: 100000 is outside 1..256");
  expect("generate --model " + quote(tiny_sd1().string()) + " --prompt x --height 99999999999",
         "--height: 99999999999 is outside 8..16384");
}

// A copy of tiny-sd1 whose `file` has `key` set to `value`.
fs::path model_with(const fs::path& dir, const std::string& file, const std::string& key, const json& value) {
  const fs::path model = dir / "model";
  fs::remove_all(model);
  fs::copy(tiny_sd1(), model, fs::copy_options::recursive);
  json config = json::parse(io::read_text_file(model / file));
  config[key] = value;
  io::write_text_file(model / file, config.dump());
  return model;
}

// `sdtrain generate` with `model`, one step, into dir/images.
sd::test::CommandResult generate_with(const fs::path& model, const fs::path& dir) {
  return sd::test::run_command(sd::test::sdtrain_binary() + " generate --model " + quote(model.string()) +
                               " --prompt x --num_inference_steps 1 --output_dir " + quote((dir / "images").string()));
}

TEST(ReliabilityE2E, HugeConfigValuesAreRefusedBeforeLoading) {
  sd::test::TempDir dir;
  auto expect = [&](const std::string& file, const std::string& key, const json& value, const std::string& fragment) {
    const fs::path model = model_with(dir.path(), file, key, value);
    EXPECT_TRUE(sd::test::is_one_line_error(generate_with(model, dir.path()), (model / file).string() + fragment))
        << file << " " << key;
  };
  expect("unet/config.json", "block_out_channels", {32, 1000000},
         ": key 'block_out_channels' = 1000000 is more than 4096, the most sdtrain accepts");
  expect("unet/config.json", "layers_per_block", 100000, ": key 'layers_per_block' = 100000 is more than 8");
  expect("vae/config.json", "latent_channels", 1 << 30, ": key 'latent_channels' = 1073741824 is more than 256");
  expect("text_encoder/config.json", "max_position_embeddings", 1000000000,
         ": key 'max_position_embeddings' = 1000000000 is more than 4096");
  expect("scheduler/scheduler_config.json", "num_train_timesteps", 2000000000,
         ": key 'num_train_timesteps' = 2000000000 is more than 100000");
  expect("tokenizer/tokenizer_config.json", "model_max_length", 500000,
         ": key 'model_max_length' = 500000 is more than 4096");
}

TEST(ReliabilityE2E, TokenizerThatDoesNotFitTheTextEncoderIsRefused) {
  sd::test::TempDir dir;
  const fs::path model = model_with(dir.path(), "tokenizer/vocab.json", "zzz</w>", 60000);
  EXPECT_TRUE(sd::test::is_one_line_error(
      generate_with(model, dir.path()),
      "the tokenizer has token ids up to 60000 but the text encoder embeds 49408 (its vocab_size)"));
  const fs::path longer = model_with(dir.path(), "tokenizer/tokenizer_config.json", "model_max_length", 100);
  EXPECT_TRUE(sd::test::is_one_line_error(
      generate_with(longer, dir.path()),
      "the tokenizer pads prompts to 100 tokens (model_max_length) but the text encoder has 77 positions"));
}

}  // namespace
}  // namespace sd

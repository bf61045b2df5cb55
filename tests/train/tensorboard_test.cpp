// TensorBoard event files read back by a reader that shares nothing with the writer: the TFRecord framing and its
// CRC-32C are checked here bit by bit, and the Event protobufs are decoded with protoc's classes for TensorBoard's
// own messages (tensorboard_event.proto).
#include "train/tensorboard.h"

#include <stb_image.h>

#include <chrono>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "process_util.h"
#include "tensorboard_event.pb.h"
#include "test_util.h"
#include "train/metrics_sink.h"

namespace sd::train {
namespace {

namespace fs = std::filesystem;

// CRC-32C one bit at a time (the writer uses a table), checked below against RFC 3720's test vectors.
uint32_t bitwise_crc32c(const std::string& data) {
  uint32_t crc = 0xFFFFFFFF;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78 : crc >> 1;
  }
  return ~crc;
}

// TFRecord's masking, as TensorBoard's reader (tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py) undoes it.
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8; }

uint64_t read_little_endian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = value << 8 | static_cast<uint8_t>(bytes.at(at + i));
  return value;
}

// Splits a TFRecord file into its records, checking both CRCs of each.
std::vector<std::string> read_records(const fs::path& path) {
  const std::string file = io::read_text_file(path);
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) {
      ADD_FAILURE() << path << ": truncated record header at byte " << at;
      break;
    }
    const std::string length_bytes = file.substr(at, 8);
    const uint64_t length = read_little_endian(file, at, 8);
    EXPECT_EQ(read_little_endian(file, at + 8, 4), masked(bitwise_crc32c(length_bytes))) << "length CRC at " << at;
    if (file.size() - at - 12 < length + 4) {
      ADD_FAILURE() << path << ": truncated record data at byte " << at;
      break;
    }
    records.push_back(file.substr(at + 12, length));
    EXPECT_EQ(read_little_endian(file, at + 12 + length, 4), masked(bitwise_crc32c(records.back())))
        << "data CRC at " << at;
    at += 12 + length + 4;
  }
  return records;
}

std::vector<tensorboard::Event> read_events(const fs::path& path) {
  std::vector<tensorboard::Event> events;
  for (const std::string& record : read_records(path)) {
    events.emplace_back();
    EXPECT_TRUE(events.back().ParseFromString(record)) << "record " << events.size() - 1 << " of " << path;
  }
  return events;
}

// The Summary.Values of every event after the file_version one, with their steps.
struct LoggedValue {
  int64_t step;
  tensorboard::Summary::Value value;
};
std::vector<LoggedValue> read_values(const fs::path& path) {
  std::vector<LoggedValue> values;
  for (const auto& event : read_events(path)) {
    for (const auto& value : event.summary().value()) values.push_back({event.step(), value});
  }
  return values;
}

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

TEST(TensorBoard, ReferenceCrcMatchesRfc3720) {
  // RFC 3720 (iSCSI), appendix B.4; the CRC bytes listed there are little-endian.
  std::string increasing, decreasing;
  for (int i = 0; i < 32; ++i) {
    increasing += static_cast<char>(i);
    decreasing += static_cast<char>(31 - i);
  }
  EXPECT_EQ(bitwise_crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(bitwise_crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  EXPECT_EQ(bitwise_crc32c(increasing), 0x46DD794Eu);
  EXPECT_EQ(bitwise_crc32c(decreasing), 0x113FDB5Cu);
  const uint8_t read_command_pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0,    0, 0,    0, 0, 0,    0, 0, 0, 0,
                                        0x14, 0,    0, 0, 0, 0, 0x04, 0, 0,    0, 0, 0x14, 0, 0, 0, 0x18,
                                        0x28, 0,    0, 0, 0, 0, 0,    0, 0x02, 0, 0, 0,    0, 0, 0, 0};
  EXPECT_EQ(bitwise_crc32c(std::string(reinterpret_cast<const char*>(read_command_pdu), 48)), 0xD9963A56u);
}

TEST(TensorBoard, FileIsNamedForTensorBoardAndStartsWithItsVersion) {
  sd::test::TempDir dir;
  const double before = unix_now();
  TensorBoardWriter writer(dir.path() / "logs");
  EXPECT_EQ(writer.path().parent_path(), dir.path() / "logs");
  EXPECT_TRUE(std::regex_match(writer.path().filename().string(), std::regex(R"(events\.out\.tfevents\.\d{10}\..+)")))
      << writer.path();
  const auto events = read_events(writer.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GE(events[0].wall_time(), before);
  EXPECT_LE(events[0].wall_time(), unix_now());
}

TEST(TensorBoard, ScalarsRoundTripAndAreOnDiskAfterFlush) {
  sd::test::TempDir dir;
  TensorBoardWriter writer(dir.path());
  writer.add_scalar("train/loss", 3, 0.25);
  writer.add_scalar("train/lr", 3, 2e-3);
  writer.add_scalar("train/loss", 300000000000, -1.5);  // a step beyond 32 bits
  writer.flush();
  // Read while the writer is still open: flush() is what a crash relies on.
  const auto values = read_values(writer.path());
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0].step, 3);
  EXPECT_EQ(values[0].value.tag(), "train/loss");
  EXPECT_EQ(values[0].value.simple_value(), 0.25f);
  EXPECT_EQ(values[1].value.tag(), "train/lr");
  EXPECT_EQ(values[1].value.simple_value(), 2e-3f);
  EXPECT_EQ(values[2].step, 300000000000);
  EXPECT_EQ(values[2].value.simple_value(), -1.5f);
}

TEST(TensorBoard, ImagesRoundTripAsRgbPng) {
  sd::test::TempDir dir;
  io::RgbImage image{7, 5, std::vector<uint8_t>(7 * 5 * 3)};  // not square: width and height cannot swap unseen
  for (size_t k = 0; k < image.pixels.size(); ++k) image.pixels[k] = static_cast<uint8_t>(k * 37 % 256);
  TensorBoardWriter writer(dir.path());
  writer.add_image("validation/0", 40, image);
  writer.flush();
  const auto values = read_values(writer.path());
  ASSERT_EQ(values.size(), 1u);
  EXPECT_EQ(values[0].step, 40);
  EXPECT_EQ(values[0].value.tag(), "validation/0");
  const auto& stored = values[0].value.image();
  EXPECT_EQ(stored.width(), 7);
  EXPECT_EQ(stored.height(), 5);
  EXPECT_EQ(stored.colorspace(), 3);  // RGB
  const std::string& png = stored.encoded_image_string();
  ASSERT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
  int width = 0, height = 0, channels = 0;
  uint8_t* decoded = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(png.data()), static_cast<int>(png.size()),
                                           &width, &height, &channels, 0);
  ASSERT_NE(decoded, nullptr);
  EXPECT_EQ(width, 7);
  EXPECT_EQ(height, 5);
  EXPECT_EQ(channels, 3);
  EXPECT_EQ(std::vector<uint8_t>(decoded, decoded + image.pixels.size()), image.pixels);
  stbi_image_free(decoded);
}

TEST(TensorBoard, MetricsRecordBecomesTaggedScalarsAtItsStep) {
  sd::test::TempDir dir;
  TensorBoardWriter writer(dir.path());
  write_metrics_record(writer, {{"step", 12},
                                {"epoch", 1},
                                {"loss", 0.5},
                                {"lr", 0.004},
                                {"grad_norm", 1.25},
                                {"step_time_s", 0.25},
                                {"images_per_s", 8.0},
                                {"data_wait_s", 0.125},
                                {"note", "not a number"}});
  std::map<std::string, float> scalars;
  for (const auto& [step, value] : read_values(writer.path())) {
    EXPECT_EQ(step, 12);
    scalars[value.tag()] = value.simple_value();
  }
  const std::map<std::string, float> expected = {{"train/epoch", 1.0f},        {"train/loss", 0.5f},
                                                 {"train/lr", 0.004f},         {"train/grad_norm", 1.25f},
                                                 {"speed/step_time_s", 0.25f}, {"speed/images_per_s", 8.0f},
                                                 {"speed/data_wait_s", 0.125f}};
  EXPECT_EQ(scalars, expected);
}

fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find("tfevents") != std::string::npos) found.push_back(entry.path());
  EXPECT_EQ(found.size(), 1u) << "event files in " << dir;
  return found.empty() ? fs::path() : found[0];
}

TEST(MetricsSink, TensorBoardAddsEventFilesBesideMetricsJsonl) {
  for (const char* report_to : {"tensorboard", "all"}) {
    sd::test::TempDir dir;
    {
      MetricsSink sink(dir.path() / "logs", report_to, 0);
      sink.log_step({{"step", 1}, {"loss", 0.75}});
      sink.log_validation_images(1, {io::RgbImage{2, 2, std::vector<uint8_t>(12, 200)}});
    }
    EXPECT_EQ(io::read_text_file(dir.path() / "logs" / "metrics.jsonl"), R"({"loss":0.75,"step":1})"
                                                                         "\n");
    std::set<std::string> tags;
    for (const auto& logged : read_values(only_event_file(dir.path() / "logs"))) tags.insert(logged.value.tag());
    EXPECT_EQ(tags, (std::set<std::string>{"train/loss", "validation/0"})) << report_to;
  }
}

TEST(MetricsSink, JsonlWritesOnlyMetricsJsonl) {
  sd::test::TempDir dir;
  MetricsSink(dir.path(), "jsonl", 0).log_step({{"step", 1}, {"loss", 0.5}});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  EXPECT_TRUE(fs::exists(dir.path() / "metrics.jsonl"));
}

TEST(MetricsSink, UnknownReportToNamesTheFlag) {
  try {
    reports_to_tensorboard("wandb");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--report_to wandb: expected tensorboard, jsonl or all (sdtrain writes files only; wandb and comet need "
              "their Python clients)");
  }
}

// The file a real run writes: a tiny UNet training with validation after each of its 2 epochs. Every number of
// metrics.jsonl is in the event file at its step (as float32), and the images are the validation PNGs' pixels.
TEST(TensorBoard, TrainingRunEventsMatchMetricsAndValidationImages) {
  using namespace std::chrono_literals;
  sd::test::TempDir dir;
  sd::test::write_captioned_images(dir.path() / "data", 2);
  const fs::path out = dir.path() / "out";
  auto run = sd::test::run_process(
      {sd::test::sdtrain_binary(), "train",
       "--pretrained_model_name_or_path=" + (sd::test::fixtures() / "tiny-sd1").string(),
       "--train_data_dir=" + (dir.path() / "data").string(), "--resolution=32", "--train_batch_size=1",
       "--num_train_epochs=2", "--validation_epochs=1", "--validation_prompts", "a pattern", "--seed=4", "--threads=1",
       "--output_dir=" + out.string()},
      300s);
  ASSERT_EQ(run.exit_code, 0) << run.output;

  std::map<std::pair<int64_t, std::string>, float> logged;
  std::map<std::pair<int64_t, std::string>, tensorboard::Summary::Image> images;
  for (const auto& [step, value] : read_values(only_event_file(out / "logs"))) {
    if (value.has_image())
      images[{step, value.tag()}] = value.image();
    else
      logged[{step, value.tag()}] = value.simple_value();
  }
  std::istringstream lines(io::read_text_file(out / "logs" / "metrics.jsonl"));
  std::string line;
  int64_t steps = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    const int64_t step = record.at("step");
    for (const auto& [key, value] : record.items()) {
      if (key == "step" || !value.is_number()) continue;
      const bool speed = key == "step_time_s" || key == "images_per_s" || key == "data_wait_s";
      const auto found = logged.find({step, (speed ? "speed/" : "train/") + key});
      ASSERT_NE(found, logged.end()) << key << " at step " << step;
      EXPECT_EQ(found->second, static_cast<float>(value.get<double>())) << key << " at step " << step;
    }
    ++steps;
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(logged.size(), static_cast<size_t>(steps) * 7);  // loss lr grad_norm epoch step_time images/s data_wait

  ASSERT_EQ(images.size(), 2u);  // after epoch 1 (step 2) and epoch 2 (step 4)
  for (const auto& [where, image] : images) {
    const io::RgbImage png = io::load_image_rgb(out / "validation" / fmt::format("step-{}-0.png", where.first));
    const std::string& encoded = image.encoded_image_string();
    int width = 0, height = 0, channels = 0;
    uint8_t* decoded = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(encoded.data()),
                                             static_cast<int>(encoded.size()), &width, &height, &channels, 3);
    ASSERT_NE(decoded, nullptr);
    EXPECT_EQ(where.second, "validation/0");
    EXPECT_EQ(width, png.width);
    EXPECT_EQ(height, png.height);
    EXPECT_EQ(std::vector<uint8_t>(decoded, decoded + png.pixels.size()), png.pixels) << "step " << where.first;
    stbi_image_free(decoded);
  }
}

}  // namespace
}  // namespace sd::train

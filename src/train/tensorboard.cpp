#include "train/tensorboard.h"

#include <stb_image_write.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <set>
#include <string_view>

#include "core/error.h"

namespace sd::train {

namespace fs = std::filesystem;

namespace {

// Field numbers of the messages written, from TensorBoard's tensorboard/compat/proto/event.proto (Event) and
// summary.proto (Summary, Summary.Value, Summary.Image).
namespace event_field {
constexpr int kWallTime = 1;     // double, seconds since the epoch
constexpr int kStep = 2;         // int64
constexpr int kFileVersion = 3;  // string
constexpr int kSummary = 5;      // Summary
}  // namespace event_field
namespace summary_field {
constexpr int kValue = 1;  // repeated Summary.Value
}
namespace value_field {
constexpr int kTag = 1;          // string
constexpr int kSimpleValue = 2;  // float
constexpr int kImage = 4;        // Summary.Image
}  // namespace value_field
namespace image_field {
constexpr int kHeight = 1;              // int32
constexpr int kWidth = 2;               // int32
constexpr int kColorspace = 3;          // int32: 3 is RGB
constexpr int kEncodedImageString = 4;  // bytes: the PNG file
}  // namespace image_field
constexpr int kColorspaceRgb = 3;

// Appends `value` as `width` little-endian bytes, the byte order of TFRecord's integers and protobuf's fixed fields.
void append_little_endian(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

// A protobuf message in wire format, built field by field. Only the wire types Event and Summary need: varint
// (int32, int64), 64-bit (double), 32-bit (float) and length-delimited (string, bytes, nested message).
class ProtoMessage {
 public:
  ProtoMessage& varint(int field, int64_t value) {
    key(field, kVarint);
    append_varint(static_cast<uint64_t>(value));  // a negative int64 takes ten bytes, as protobuf encodes it
    return *this;
  }
  ProtoMessage& float64(int field, double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    key(field, kFixed64);
    append_little_endian(bytes_, bits, 8);
    return *this;
  }
  ProtoMessage& float32(int field, float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    key(field, kFixed32);
    append_little_endian(bytes_, bits, 4);
    return *this;
  }
  ProtoMessage& bytes(int field, std::string_view value) {
    key(field, kLengthDelimited);
    append_varint(value.size());
    bytes_.append(value);
    return *this;
  }
  ProtoMessage& message(int field, const ProtoMessage& nested) { return bytes(field, nested.bytes_); }
  const std::string& encoded() const { return bytes_; }

 private:
  enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
  void key(int field, WireType type) { append_varint(static_cast<uint64_t>(field) << 3 | type); }
  // Seven bits per byte, least significant first; the high bit says another byte follows.
  void append_varint(uint64_t value) {
    for (; value >= 0x80; value >>= 7) bytes_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    bytes_.push_back(static_cast<char>(value));
  }
  std::string bytes_;
};

// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78), the checksum TFRecord uses.
uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
      t[i] = crc;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// TFRecord stores each CRC rotated and offset ("masked"): a CRC computed over data that holds CRCs is weak.
uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event at `step` whose Summary holds the one Summary.Value given.
std::string summary_event(int64_t step, const ProtoMessage& value) {
  return ProtoMessage()
      .float64(event_field::kWallTime, unix_seconds_now())
      .varint(event_field::kStep, step)
      .message(event_field::kSummary, ProtoMessage().message(summary_field::kValue, value))
      .encoded();
}

// The name PyTorch's SummaryWriter gives its files (without its in-process counter); TensorBoard reads any file
// whose name contains "tfevents". The pid keeps apart two processes started in the same second.
fs::path new_event_file_path(const fs::path& dir) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return dir / fmt::format("events.out.tfevents.{:010d}.{}.{}", static_cast<int64_t>(std::time(nullptr)), host,
                           static_cast<int64_t>(getpid()));
}

// TensorBoard shows one section per tag prefix: the optimisation curves in one, the speed curves in another.
std::string metric_tag(const std::string& key) {
  static const std::set<std::string> speed_keys = {"step_time_s", "images_per_s", "data_wait_s"};
  return (speed_keys.count(key) ? "speed/" : "train/") + key;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) : path_(new_event_file_path(dir)) {
  fs::create_directories(dir);
  out_ = std::make_unique<io::FileWriter>(path_);
  // The first record names the format; TensorBoard checks it before reading the rest.
  write_record(ProtoMessage()
                   .float64(event_field::kWallTime, unix_seconds_now())
                   .bytes(event_field::kFileVersion, "brain.Event:2")
                   .encoded());
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  write_record(summary_event(
      step,
      ProtoMessage().bytes(value_field::kTag, tag).float32(value_field::kSimpleValue, static_cast<float>(value))));
}

void TensorBoardWriter::add_image(const std::string& tag, int64_t step, const io::RgbImage& image) {
  const ProtoMessage png = ProtoMessage()
                               .varint(image_field::kHeight, image.height)
                               .varint(image_field::kWidth, image.width)
                               .varint(image_field::kColorspace, kColorspaceRgb)
                               .bytes(image_field::kEncodedImageString, io::encode_png(image));
  write_record(summary_event(step, ProtoMessage().bytes(value_field::kTag, tag).message(value_field::kImage, png)));
}

// Records go to the file as they are written (FileWriter does not buffer).
void TensorBoardWriter::flush() {}

void TensorBoardWriter::write_record(const std::string& event) {
  // TFRecord framing: uint64 length, masked CRC of those 8 bytes, the data, masked CRC of the data.
  std::string length;
  append_little_endian(length, event.size(), 8);
  std::string record = length;
  append_little_endian(record, masked_crc32c(length), 4);
  record += event;
  append_little_endian(record, masked_crc32c(event), 4);
  out_->write(record);
}

void write_metrics_record(TensorBoardWriter& writer, const nlohmann::json& record) {
  const int64_t step = record.at("step").get<int64_t>();
  for (const auto& item : record.items()) {
    if (item.key() != "step" && item.value().is_number())
      writer.add_scalar(metric_tag(item.key()), step, item.value().get<double>());
  }
  writer.flush();
}

}  // namespace sd::train

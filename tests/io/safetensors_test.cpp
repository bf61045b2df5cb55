#include "io/safetensors.h"

#include <fstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "test_util.h"

namespace sd::io {
namespace {

using sd::test::TempDir;

// Writes a file made of a raw header string and `data_bytes` zero bytes of data.
void write_raw(const std::filesystem::path& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

std::string error_of(const std::filesystem::path& path) {
  try {
    load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafeTensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  TensorMap tensors;
  for (auto dtype : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16})
    tensors[std::string("t_") + c10::toString(dtype)] = at::randn({2, 3}).to(dtype);
  for (auto dtype : {at::kLong, at::kInt, at::kShort, at::kChar, at::kByte})
    tensors[std::string("t_") + c10::toString(dtype)] = at::randint(0, 100, {5}).to(dtype);
  tensors["t_bool"] = at::tensor({1, 0, 1}).to(at::kBool);
  tensors["scalar"] = at::tensor(3.5f).reshape({});
  tensors["empty"] = at::zeros({0, 4});
  auto path = dir.path() / "x.safetensors";
  save_safetensors(path, tensors, {{"format", "pt"}, {"note", "héllo"}});

  SafeTensorsFile file(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "héllo");
  auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(loaded.count(name)) << name;
    EXPECT_EQ(loaded[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(loaded[name].sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(loaded[name], t)) << name;
  }
}

TEST(SafeTensors, WritesTheReferenceLayoutByteForByte) {
  // The golden learned_embeds file was written by the reference writer; ours must produce the same bytes.
  auto golden = sd::test::golden("tiny-sd1/learned_embeds.safetensors");
  TempDir dir;
  auto path = dir.path() / "out.safetensors";
  save_safetensors(path, load_safetensors(golden), SafeTensorsFile(golden).metadata());
  EXPECT_EQ(read_text_file(path), read_text_file(golden));
}

TEST(SafeTensors, ReadsGoldenFiles) {
  auto tensors = load_safetensors(sd::test::golden("tiny-sd1/unet.safetensors"));
  EXPECT_EQ(tensors.at("input.sample").sizes(), (std::vector<int64_t>{2, 4, 16, 16}));
  EXPECT_EQ(tensors.at("input.timestep").scalar_type(), at::kLong);
  EXPECT_EQ(tensors.at("input.timestep")[0].item<int64_t>(), 981);
}

TEST(SafeTensors, MissingFile) {
  EXPECT_NE(error_of("/nonexistent/x.safetensors").find("/nonexistent/x.safetensors: cannot open"), std::string::npos);
}

TEST(SafeTensors, TooShortForHeaderLength) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  std::ofstream(path) << "abc";
  EXPECT_NE(error_of(path).find("too short for the 8-byte header length"), std::string::npos);
}

TEST(SafeTensors, HeaderLengthBound) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  std::ofstream out(path, std::ios::binary);
  uint64_t len = 1ull << 40;
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.close();
  EXPECT_NE(error_of(path).find("header length 1099511627776 exceeds"), std::string::npos);
}

TEST(SafeTensors, TruncatedHeader) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  std::ofstream out(path, std::ios::binary);
  uint64_t len = 100;
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << "{}";
  out.close();
  EXPECT_NE(error_of(path).find("truncated safetensors file: header needs 108 bytes"), std::string::npos);
}

TEST(SafeTensors, TruncatedData) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10);
  EXPECT_NE(error_of(path).find("truncated safetensors file: header describes 16 data bytes, file holds 10"),
            std::string::npos);
}

TEST(SafeTensors, TruncatedRealFile) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  std::string bytes = read_text_file(sd::test::golden("tiny-sd1/vae.safetensors"));
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(error_of(path).find("truncated safetensors file"), std::string::npos);
}

TEST(SafeTensors, InvalidJson) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype")", 0);
  EXPECT_NE(error_of(path).find("not valid UTF-8 JSON"), std::string::npos);
}

TEST(SafeTensors, InvalidUtf8) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0);
  EXPECT_NE(error_of(path).find("not valid UTF-8 JSON"), std::string::npos);
}

TEST(SafeTensors, UnknownDtype) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(error_of(path).find("tensor 'a': unsupported safetensors dtype 'F8'"), std::string::npos);
}

TEST(SafeTensors, ShapeDoesNotMatchByteLength) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
  EXPECT_NE(error_of(path).find("tensor 'a' is F32 [2,3] (24 bytes) but data_offsets span 20 bytes"),
            std::string::npos);
}

// 2^62 + 1 float32 elements are 2^64 + 4 bytes: the byte count must not wrap around to the 4 bytes stored.
TEST(SafeTensors, ShapeWhoseByteSizeOverflows) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(error_of(path).find("tensor 'a' shape overflows"), std::string::npos) << error_of(path);
  write_raw(path, R"({"a":{"dtype":"F32","shape":[4294967296,4294967297],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(error_of(path).find("tensor 'a' shape overflows"), std::string::npos) << error_of(path);
}

TEST(SafeTensors, OverlappingTensors) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(
      path,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  EXPECT_NE(error_of(path).find("tensor 'b' starts at byte 4 but the previous tensor ends at 8"), std::string::npos);
}

TEST(SafeTensors, TensorListedTwice) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  // Nested keys may repeat across tensors ("dtype"); only a tensor name twice is an error.
  write_raw(
      path,
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      8);
  EXPECT_EQ(error_of(path), path.string() + ": corrupt safetensors header: tensor 'a' is listed twice");
}

TEST(SafeTensors, GapBetweenTensors) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(
      path,
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
      12);
  EXPECT_NE(error_of(path).find("contiguous and non-overlapping"), std::string::npos);
}

TEST(SafeTensors, TrailingBytes) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 5);
  EXPECT_NE(error_of(path).find("4 trailing bytes"), std::string::npos);
}

TEST(SafeTensors, BadMetadata) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"__metadata__":{"format":3}})", 0);
  EXPECT_NE(error_of(path).find("__metadata__['format'] must be a string"), std::string::npos);
}

TEST(SafeTensors, NegativeOffset) {
  TempDir dir;
  auto path = dir.path() / "a.safetensors";
  write_raw(path, R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1);
  EXPECT_NE(error_of(path).find("data_offsets[0] must be a non-negative integer"), std::string::npos);
}

// A tensor of exactly kMappedBytes, the smallest that read() maps instead of copying.
at::Tensor smallest_mapped() { return at::arange(int64_t{SafeTensorsFile::kMappedBytes / 4}, at::kFloat); }

bool maps_file(const std::filesystem::path& path) {
  return read_text_file("/proc/self/maps").find(path.string()) != std::string::npos;
}

TEST(SafeTensors, LargeTensorsMapTheFileWhileTheyLive) {
  TempDir dir;
  const auto path = dir.path() / "a.safetensors";
  save_safetensors(path, {{"large", smallest_mapped()}, {"small", at::arange(10, at::kFloat)}});
  at::Tensor large = SafeTensorsFile(path).read("large");  // the file object is gone after this line
  EXPECT_TRUE(maps_file(path));
  EXPECT_TRUE(at::equal(large, smallest_mapped()));
  large = at::Tensor();
  EXPECT_FALSE(maps_file(path));
  const at::Tensor small = SafeTensorsFile(path).read("small");
  EXPECT_FALSE(maps_file(path));
  EXPECT_TRUE(at::equal(small, at::arange(10, at::kFloat)));
}

TEST(SafeTensors, MappedTensorsAreEachTheirOwnAndNeverWriteToTheFile) {
  TempDir dir;
  const auto path = dir.path() / "a.safetensors";
  save_safetensors(path, {{"large", smallest_mapped()}});
  const SafeTensorsFile file(path);
  const at::Tensor written = file.read("large"), kept = file.read("large");
  written.fill_(-1);
  EXPECT_TRUE(at::equal(kept, smallest_mapped()));
  EXPECT_TRUE(at::equal(SafeTensorsFile(path).read("large"), smallest_mapped()));
  // Replaced by rename, as every sdtrain writer does: tensors already read keep the old values.
  save_safetensors(path, {{"large", smallest_mapped() + 1}});
  EXPECT_TRUE(at::equal(kept, smallest_mapped()));
  EXPECT_TRUE(at::equal(SafeTensorsFile(path).read("large"), smallest_mapped() + 1));
}

TEST(SafeTensors, LargeTensorOffItsAlignmentIsCopiedToAnAlignedOne) {
  // One byte of U8 first puts the float32 tensor at an odd offset, where a view of the mapping would be misaligned.
  TempDir dir;
  const auto path = dir.path() / "a.safetensors";
  const at::Tensor values = smallest_mapped();
  const auto bytes = static_cast<uint64_t>(values.numel() * 4);
  std::string header = fmt::format(R"({{"a":{{"dtype":"U8","shape":[1],"data_offsets":[0,1]}},)"
                                   R"("b":{{"dtype":"F32","shape":[{}],"data_offsets":[1,{}]}}}})",
                                   values.numel(), 1 + bytes);
  header.append((8 - header.size() % 8) % 8, ' ');
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << '\x07';
    out.write(static_cast<const char*>(values.data_ptr()), static_cast<std::streamsize>(bytes));
  }
  const at::Tensor read = SafeTensorsFile(path).read("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(read.data_ptr()) % alignof(float), 0u);
  EXPECT_TRUE(at::equal(read, values));
  EXPECT_EQ(SafeTensorsFile(path).read("a").item<uint8_t>(), 7);
}

TEST(SafeTensors, NoPartialFileOnFailedWrite) {
  TempDir dir;
  auto path = dir.path() / "out.safetensors";
  TensorMap bad = {{"a", at::zeros({2}, at::kComplexFloat)}};
  EXPECT_THROW(save_safetensors(path, bad), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace sd::io

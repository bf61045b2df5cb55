// The torch.save reader: PyTorch's own files (the tiny-sd1 .bin fixtures) read bit for bit, LibTorch's writer's
// views and dtypes honoured, ZIP64 archives read, and hand-forged archives (code-running pickles, unknown globals,
// broken zips and ZIP64 records, views outside their storage) refused with one line naming the file and the offending
// part, before any tensor is read.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/tensor_file.h"
#include "io/torch_file.h"
#include "io/torch_zip_util.h"
#include "test_util.h"

namespace sd::io {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;
using sd::test::fixtures;
using sd::test::TempDir;

std::string error_of(const fs::path& path) {
  try {
    TorchFile file(path);
    for (const auto& name : file.names()) file.read(name);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

void expect_same_tensors(const TensorFile& actual, const TensorFile& expected) {
  std::vector<std::string> a = actual.names(), e = expected.names();
  std::sort(a.begin(), a.end());
  std::sort(e.begin(), e.end());
  ASSERT_EQ(a, e);
  for (const auto& name : e) {
    const at::Tensor x = actual.read(name), y = expected.read(name);
    EXPECT_EQ(x.scalar_type(), y.scalar_type()) << name;
    EXPECT_TRUE(x.sizes() == y.sizes() && at::equal(x, y)) << name;
  }
}

TEST(TorchFile, ReadsPyTorchsOwnBinFilesBitForBit) {
  const fs::path bin = fixtures() / "formats" / "tiny-sd1-bin", safetensors = fixtures() / "tiny-sd1";
  expect_same_tensors(TorchFile(bin / "unet" / "diffusion_pytorch_model.bin"),
                      SafeTensorsFile(safetensors / "unet" / "diffusion_pytorch_model.safetensors"));
  expect_same_tensors(TorchFile(bin / "vae" / "diffusion_pytorch_model.bin"),
                      SafeTensorsFile(safetensors / "vae" / "diffusion_pytorch_model.safetensors"));
  expect_same_tensors(*open_tensor_file(bin / "text_encoder" / "pytorch_model.bin"),
                      SafeTensorsFile(safetensors / "text_encoder" / "model.safetensors"));
}

TEST(TorchFile, HonoursStorageViewsAndDtypes) {
  // LibTorch's own pickler writes each tensor as (storage, offset, size, stride) over the whole shared storage.
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("base", base);
  dict.insert("transposed_slice", base.narrow(0, 1, 2).narrow(1, 2, 3).t());  // offset 8, strides (1, 6)
  dict.insert("row", base[3]);                                                // offset 18
  dict.insert("half", at::linspace(-2, 2, 7).to(at::kHalf));
  dict.insert("bfloat16", at::linspace(-3, 3, 5).to(at::kBFloat16));
  dict.insert("int64", at::arange(-5, 5, at::kLong).reshape({2, 5}));
  dict.insert("empty", at::empty({0, 3}));
  TempDir dir;
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream(dir.path() / "views.pt", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  TorchFile file(dir.path() / "views.pt");
  for (const auto& entry : dict) {
    const at::Tensor read = file.read(entry.key());
    EXPECT_EQ(read.scalar_type(), entry.value().scalar_type()) << entry.key();
    EXPECT_EQ(file.info(entry.key()).shape, entry.value().sizes().vec()) << entry.key();
    EXPECT_TRUE(at::equal(read, entry.value())) << entry.key();
    EXPECT_TRUE(read.is_contiguous()) << entry.key();
  }
}

TEST(TorchFile, LightningCheckpointYieldsItsStateDictAndScalarsAsMetadata) {
  c10::impl::GenericDict state(c10::StringType::get(), c10::TensorType::get());
  state.insert("model.w", at::ones({2}));
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("state_dict", state);
  root.insert("global_step", int64_t{875000});
  root.insert("epoch", int64_t{3});
  TempDir dir;
  const std::vector<char> bytes = torch::pickle_save(root);
  std::ofstream(dir.path() / "model.ckpt", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TorchFile file(dir.path() / "model.ckpt");
  EXPECT_EQ(file.names(), std::vector<std::string>{"model.w"});
  EXPECT_EQ(file.metadata().at("global_step"), "875000");
  EXPECT_TRUE(at::equal(file.read("model.w"), at::ones({2})));
}

TEST(TorchFile, LightningCallbackObjectsStayInertBesideTheWeights) {
  // {"callbacks": {ModelCheckpoint: numpy.core.multiarray.scalar(numpy.dtype('f8'), b'..')}, "state_dict": {w: t}}
  const std::string callbacks = sd::test::pickle_unicode("callbacks") +
                                "}cpytorch_lightning.callbacks.model_checkpoint\nModelCheckpoint\n"
                                "cnumpy.core.multiarray\nscalar\ncnumpy\ndtype\n" +
                                sd::test::pickle_unicode("f8") + "\x85R}bC\x08"s + std::string(6, '\0') + "\xf0?\x86Rs";
  const std::string tensor = sd::test::one_tensor_pickle("w", 2, 0, {2}, {1});
  // one_tensor_pickle is PROTO, a dict, STOP: its dict becomes the "state_dict" entry.
  const std::string state_dict = tensor.substr(2, tensor.size() - 3);
  const std::string pickle = "\x80\x02}("s + callbacks + sd::test::pickle_unicode("state_dict") + state_dict + "u.";
  TempDir dir;
  sd::test::write_bytes(dir.path() / "lightning.ckpt", sd::test::torch_archive(pickle, std::string(8, '\0')));
  TorchFile file(dir.path() / "lightning.ckpt");
  EXPECT_EQ(file.names(), std::vector<std::string>{"w"});
}

TEST(TorchFile, RefusesPicklesThatWouldRunCode) {
  TempDir dir;
  const auto archive = [&](const std::string& name, const std::string& pickle) {
    const fs::path path = dir.path() / name;
    sd::test::write_bytes(path, sd::test::torch_archive(pickle, std::string(16, '\0')));
    return path;
  };
  std::string err = error_of(archive("system.bin",
                                     "\x80\x02"
                                     "cos\nsystem\n" +
                                         sd::test::pickle_unicode("touch x") + "\x85R."));
  EXPECT_NE(err.find("refusing to load"), std::string::npos) << err;
  EXPECT_NE(err.find("'os.system'"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists("x"));

  err = error_of(archive("posix.bin", "\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c\x02id\x85R."));
  EXPECT_NE(err.find("'posix.system'"), std::string::npos) << err;

  err = error_of(archive("unknown.bin", "\x80\x02}(" + sd::test::pickle_unicode("w") + "c__main__\nPayload\n)Ru."));
  EXPECT_NE(err.find("'__main__.Payload'"), std::string::npos) << err;

  err = error_of(archive("builtins.bin",
                         "\x80\x02"
                         "cbuiltins\neval\n" +
                             sd::test::pickle_unicode("1+1") + "\x85R."));
  EXPECT_NE(err.find("'builtins.eval'"), std::string::npos) << err;

  err = error_of(archive("newobj.bin",
                         "\x80\x02"
                         "ccollections\nOrderedDict\n)\x81."));
  EXPECT_NE(err.find("NEWOBJ"), std::string::npos) << err;

  err = error_of(archive("inst.bin", "(S'x'\n."));
  EXPECT_NE(err.find("STRING"), std::string::npos) << err;

  err = error_of(archive("storage_call.bin",
                         "\x80\x02"
                         "ctorch\nFloatStorage\n)R."));
  EXPECT_NE(err.find("calls torch.FloatStorage"), std::string::npos) << err;
}

TEST(TorchFile, RefusesViewsOutsideTheirStorageAndMislabelledStorages) {
  TempDir dir;
  const auto write = [&](const std::string& name, const std::string& pickle, size_t storage_bytes) {
    const fs::path path = dir.path() / name;
    sd::test::write_bytes(path, sd::test::torch_archive(pickle, std::string(storage_bytes, '\0')));
    return path;
  };
  // The good one first, so the failures below are the forged parts.
  EXPECT_EQ(error_of(write("good.bin", sd::test::one_tensor_pickle("w", 4, 1, {3}, {1}), 16)), "");

  std::string err = error_of(write("past_end.bin", sd::test::one_tensor_pickle("w", 4, 2, {3}, {1}), 16));
  EXPECT_NE(err.find("reaches outside storage '0' of 4 elements"), std::string::npos) << err;
  err = error_of(write("stride.bin", sd::test::one_tensor_pickle("w", 4, 0, {2, 2}, {3, 1}), 16));
  EXPECT_NE(err.find("reaches outside"), std::string::npos) << err;
  err = error_of(write("overflow.bin", sd::test::one_tensor_pickle("w", 4, 0, {2, 2}, {0x7fffffff, 0x7fffffff}), 16));
  EXPECT_NE(err.find("reaches outside"), std::string::npos) << err;
  err = error_of(write("negative.bin", sd::test::one_tensor_pickle("w", 4, -1, {2}, {1}), 16));
  EXPECT_NE(err.find("reaches outside"), std::string::npos) << err;
  err = error_of(write("numel.bin", sd::test::one_tensor_pickle("w", 8, 0, {2}, {1}), 16));
  EXPECT_NE(err.find("storage '0' should hold 8 Float elements but its entry has 16 bytes"), std::string::npos) << err;
  err = error_of(write("rank.bin", sd::test::one_tensor_pickle("w", 4, 0, {2, 2}, {1}), 16));
  EXPECT_NE(err.find("2 sizes but 1 strides"), std::string::npos) << err;

  // Stride 0 repeats one stored element: a view may be larger than its storage, but not without bound, and its
  // byte count must not overflow.
  EXPECT_EQ(error_of(write("broadcast.bin", sd::test::one_tensor_pickle("w", 4, 0, {1000, 4}, {0, 1}), 16)), "");
  err = error_of(write("repeat.bin", sd::test::one_tensor_pickle("w", 4, 0, {1 << 20, 1 << 10}, {0, 0}), 16));
  EXPECT_NE(err.find("repeats its storage '0' of 4 elements into more than 1 GiB"), std::string::npos) << err;
  err = error_of(write("repeat_overflow.bin",
                       sd::test::one_tensor_pickle("w", 4, 0, {0x7fffffff, 0x7fffffff, 0x7fffffff}, {0, 0, 0}), 16));
  EXPECT_NE(err.find("repeats its storage"), std::string::npos) << err;

  const fs::path no_storage = dir.path() / "no_storage.bin";
  sd::test::write_bytes(no_storage,
                        sd::test::zip_of({{"archive/data.pkl", sd::test::one_tensor_pickle("w", 4, 0, {4}, {1})}}));
  err = error_of(no_storage);
  EXPECT_NE(err.find("no archive/data/0"), std::string::npos) << err;
}

TEST(TorchFile, RefusesTruncatedAndCorruptArchives) {
  TempDir dir;
  const fs::path source = fixtures() / "formats" / "tiny-sd1-bin" / "vae" / "diffusion_pytorch_model.bin";
  std::ifstream in(source, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const fs::path truncated = dir.path() / "truncated.bin";
  sd::test::write_bytes(truncated, bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(error_of(truncated).find("not a zip archive"), std::string::npos);

  const fs::path tail_cut = dir.path() / "tail_cut.bin";
  sd::test::write_bytes(tail_cut, bytes.substr(0, bytes.size() - 30));
  EXPECT_NE(error_of(tail_cut), "");

  // One flipped byte inside a tensor's storage: the entry's CRC-32 no longer matches.
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  const fs::path corrupt = dir.path() / "corrupt.bin";
  sd::test::write_bytes(corrupt, flipped);
  EXPECT_NE(error_of(corrupt).find("CRC-32 mismatch"), std::string::npos) << error_of(corrupt);

  // The central directory said to start past the end of the file.
  std::string forged = sd::test::torch_archive(sd::test::one_tensor_pickle("w", 4, 0, {4}, {1}), std::string(16, '\0'));
  forged[forged.size() - 6] = '\x7f';
  const fs::path bad_directory = dir.path() / "bad_directory.bin";
  sd::test::write_bytes(bad_directory, forged);
  EXPECT_NE(error_of(bad_directory).find("central directory"), std::string::npos) << error_of(bad_directory);

  const fs::path truncated_pickle = dir.path() / "truncated_pickle.bin";
  const std::string pickle = sd::test::one_tensor_pickle("w", 4, 0, {4}, {1});
  sd::test::write_bytes(truncated_pickle, sd::test::torch_archive(pickle.substr(0, 40), std::string(16, '\0')));
  EXPECT_NE(error_of(truncated_pickle).find("truncated"), std::string::npos) << error_of(truncated_pickle);
}

TEST(TorchFile, DictsThatContainThemselvesAreWalkedOnce) {
  // {"a0": d, "a1": d, ...} where d is the dict itself (through the memo): walked naively 8 levels deep, 1000 entries
  // would mean 1000^8 visits. Walked once, the reader finds the tensor beside them and stops.
  TempDir dir;
  std::string pickle = sd::test::one_tensor_pickle("w", 4, 0, {4}, {1});
  const std::string opening = "\x80\x02}";
  pickle.insert(opening.size(), "q\x00"s);  // BINPUT 0: the dict is memo entry 0
  std::string self_entries = "(";
  for (int i = 0; i < 1000; ++i) self_entries += sd::test::pickle_unicode("a" + std::to_string(i)) + "h\x00"s;
  pickle.insert(pickle.size() - 1, self_entries + "u");  // a second SETITEMS before STOP
  sd::test::write_bytes(dir.path() / "self.bin", sd::test::torch_archive(pickle, std::string(16, '\0')));
  EXPECT_EQ(error_of(dir.path() / "self.bin"), "");
  EXPECT_EQ(TorchFile(dir.path() / "self.bin").names(), std::vector<std::string>{"w"});
}

TEST(TorchFile, ReadsZip64ArchivesAndRefusesForgedZip64Records) {
  // What torch.save writes past 4 GiB, forged small: every size and offset in ZIP64 records.
  TempDir dir;
  const at::Tensor expected = at::arange(4, at::kFloat);
  const std::string storage(static_cast<const char*>(expected.data_ptr()), 16);
  const std::string pickle = sd::test::one_tensor_pickle("w", 4, 0, {4}, {1});
  const std::string zip64 = sd::test::torch_archive(pickle, storage, /*zip64=*/true);
  sd::test::write_bytes(dir.path() / "zip64.bin", zip64);
  EXPECT_EQ(error_of(dir.path() / "zip64.bin"), "");
  EXPECT_TRUE(at::equal(TorchFile(dir.path() / "zip64.bin").read("w"), expected));

  // The locator (the 20 bytes before the 22-byte end record) sends the reader past the end of the file.
  std::string far = zip64;
  far[far.size() - 22 - 20 + 15] = '\x7f';  // the high byte of the ZIP64 end record's offset
  sd::test::write_bytes(dir.path() / "far.bin", far);
  EXPECT_NE(error_of(dir.path() / "far.bin").find("ZIP64 end record at byte"), std::string::npos)
      << error_of(dir.path() / "far.bin");

  // An end record that defers to ZIP64 (0xFFFF entries) in an archive that has no ZIP64 records.
  std::string no_locator = sd::test::torch_archive(pickle, storage);
  no_locator[no_locator.size() - 12] = no_locator[no_locator.size() - 11] = '\xff';
  sd::test::write_bytes(dir.path() / "no_locator.bin", no_locator);
  EXPECT_NE(error_of(dir.path() / "no_locator.bin").find("ZIP64 locator missing"), std::string::npos)
      << error_of(dir.path() / "no_locator.bin");
}

TEST(TorchFile, LegacyFormatAndNonZipFilesGetOneLine) {
  TempDir dir;
  sd::test::write_bytes(dir.path() / "legacy.pt", "\x80\x02\x8a\x0alegacy");
  try {
    open_tensor_file(dir.path() / "legacy.pt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("legacy pre-1.6 format"), std::string::npos) << e.what();
  }
}

TEST(TorchFile, SafetensorsWhoseHeaderLengthStartsWithThePickleByteIsNotLegacy) {
  // This fixture's header is 0x1e80 bytes long: its first byte is 0x80, the byte a legacy pickle starts with.
  const fs::path file = sd::test::fixtures() / "tiny-sd2" / "text_encoder" / "model.safetensors";
  char first = 0;
  std::ifstream(file, std::ios::binary).get(first);
  ASSERT_EQ(first, '\x80');
  EXPECT_FALSE(open_tensor_file(file)->names().empty());
}

}  // namespace
}  // namespace sd::io

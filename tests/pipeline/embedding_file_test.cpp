#include "pipeline/embedding_file.h"

#include <torch/serialize.h>

#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/torch_zip_util.h"
#include "pipeline/a1111_embedding.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::filesystem::path& path) {
  try {
    load_embedding_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EmbeddingFile, ReadsTheReferenceLearnedEmbeds) {
  auto path = sd::test::golden("tiny-sd1/learned_embeds.safetensors");
  EmbeddingFile e = load_embedding_file(path);
  EXPECT_EQ(e.token, "<dicoo>");
  EXPECT_TRUE(at::equal(e.vectors, io::load_safetensors(path).at("<dicoo>")));
}

TEST(EmbeddingFile, ReadsA1111Safetensors) {
  sd::test::TempDir dir;
  auto vectors = at::randn({3, 8});
  io::save_safetensors(dir.path() / "my-style.safetensors", {{"emb_params", vectors.to(at::kHalf)}});
  EmbeddingFile e = load_embedding_file(dir.path() / "my-style.safetensors");
  EXPECT_EQ(e.token, "my-style");
  EXPECT_EQ(e.vectors.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(e.vectors, vectors.to(at::kHalf).to(at::kFloat)));
}

TEST(EmbeddingFile, ReadsTorchSavedDicts) {
  sd::test::TempDir dir;
  auto vectors = at::randn({2, 8});
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("<cat-toy>", vectors);
  auto bytes = torch::pickle_save(dict);
  std::ofstream(dir.path() / "learned_embeds.bin", std::ios::binary).write(bytes.data(), bytes.size());
  EmbeddingFile e = load_embedding_file(dir.path() / "learned_embeds.bin");
  EXPECT_EQ(e.token, "<cat-toy>");
  EXPECT_TRUE(at::equal(e.vectors, vectors));
}

TEST(EmbeddingFile, ReadsA1111TorchSaveFiles) {
  // {"string_to_token": {"*": 265}, "string_to_param": {"*": vectors}, "name": ..., "step": ...}, as A1111 saves.
  sd::test::TempDir dir;
  auto vectors = at::randn({2, 8});
  auto bytes = sd::test::a1111_embedding_bytes(vectors, "my-style");
  std::ofstream(dir.path() / "embedding.pt", std::ios::binary).write(bytes.data(), bytes.size());
  EmbeddingFile e = load_embedding_file(dir.path() / "embedding.pt");
  EXPECT_EQ(e.token, "my-style");
  EXPECT_TRUE(at::equal(e.vectors, vectors));
}

TEST(EmbeddingFile, PicklesAreReadWithoutRunningThem) {
  sd::test::TempDir dir;
  const fs::path marker = dir.path() / "pwned";
  const std::string pickle =
      "\x80\x02"
      "cos\nsystem\n" +
      sd::test::pickle_unicode("touch " + marker.string()) + "\x85R.";
  sd::test::write_bytes(dir.path() / "evil.pt", sd::test::torch_archive(pickle, ""));
  const std::string err = error_of(dir.path() / "evil.pt");
  EXPECT_NE(err.find("refusing to load: the pickle asks for the Python object 'os.system'"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(marker));
}

TEST(EmbeddingFile, MultiVectorTokenNames) {
  EXPECT_EQ(embedding_tokens("<t>", 3), (std::vector<std::string>{"<t>", "<t>_1", "<t>_2"}));
}

TEST(EmbeddingFile, Errors) {
  sd::test::TempDir dir;
  EXPECT_NE(error_of(dir.path() / "none.safetensors").find("embedding file not found"), std::string::npos);
  io::save_safetensors(dir.path() / "two.safetensors", {{"a", at::zeros({1, 4})}, {"b", at::zeros({1, 4})}});
  EXPECT_NE(error_of(dir.path() / "two.safetensors").find("found 2 tensors"), std::string::npos);
  io::save_safetensors(dir.path() / "cube.safetensors", {{"<x>", at::zeros({1, 2, 4})}});
  EXPECT_NE(error_of(dir.path() / "cube.safetensors").find("expected an embedding of shape [num_vectors, dim]"),
            std::string::npos);
  EXPECT_NE(error_of(dir.path() / "cube.safetensors").find("got [1, 2, 4]"), std::string::npos);
  io::save_safetensors(dir.path() / "none.safetensors", {{"<x>", at::zeros({0, 4})}});
  EXPECT_NE(error_of(dir.path() / "none.safetensors").find("got [0, 4]"), std::string::npos);
  io::save_safetensors(dir.path() / "ints.safetensors", {{"<x>", at::zeros({1, 4}, at::kLong)}});
  EXPECT_NE(error_of(dir.path() / "ints.safetensors").find("the embedding is Long, expected a floating-point tensor"),
            std::string::npos);
  std::ofstream(dir.path() / "junk.pt") << "PK garbage";
  EXPECT_NE(error_of(dir.path() / "junk.pt").find("cannot read as safetensors or torch.save file"), std::string::npos);
}

}  // namespace
}  // namespace sd::pipeline

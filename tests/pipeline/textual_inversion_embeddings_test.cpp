// Applying textual-inversion embeddings as diffusers' load_textual_inversion does: ids, rows, multi-vector
// tokens, the prompt expansion, and the refusals (wrong width, token already known) that must leave the
// pipeline unchanged.
#include "pipeline/textual_inversion_embeddings.h"

#include "io/safetensors.h"
#include "models/model_test_util.h"
#include "pipeline/stable_diffusion.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

using sd::test::error_message;

StableDiffusion load_tiny() { return load_pipeline(sd::test::fixtures() / "tiny-sd1"); }

TEST(TextualInversionEmbeddings, ReferenceFileRoundTrips) {
  StableDiffusion pipe = load_tiny();
  const auto path = sd::test::golden("tiny-sd1/learned_embeds.safetensors");
  const at::Tensor expected = io::load_safetensors(path).at("<dicoo>");  // [1, 32]
  const EmbeddingFile file = load_embedding_file(path);
  const size_t before = pipe.tokenizer.size();
  EXPECT_EQ(load_textual_inversion(pipe.tokenizer, pipe.text_encoder, file, path.string()),
            std::vector<std::string>{"<dicoo>"});
  EXPECT_EQ(pipe.tokenizer.size(), before + 1);
  // The ids the tokenizer gives (the textual-inversion golden's placeholder id is 49408) and the row the text
  // encoder will look up.
  const std::vector<int64_t> ids = pipe.tokenizer.encode("a <dicoo> toy");
  EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + 5), (std::vector<int64_t>{49406, 320, 49408, 5988, 49407}));
  const at::Tensor& weight = pipe.text_encoder->token_embedding()->weight;
  EXPECT_EQ(weight.size(0), 49409);
  EXPECT_TRUE(at::equal(weight[49408], expected[0]));
  // The other rows are untouched.
  StableDiffusion fresh = load_tiny();
  EXPECT_TRUE(at::equal(weight.narrow(0, 0, 49408), fresh.text_encoder->token_embedding()->weight));
}

TEST(TextualInversionEmbeddings, MultiVectorBecomesTokenToken1Token2) {
  StableDiffusion pipe = load_tiny();
  sd::test::TempDir dir;
  const at::Tensor vectors = at::randn({3, 32});
  io::save_safetensors(dir.path() / "multi.safetensors", {{"<multi>", vectors}});
  const EmbeddingFile file = load_embedding_file(dir.path() / "multi.safetensors");
  EXPECT_EQ(load_textual_inversion(pipe.tokenizer, pipe.text_encoder, file, "multi.safetensors"),
            (std::vector<std::string>{"<multi>", "<multi>_1", "<multi>_2"}));
  EXPECT_EQ(maybe_convert_prompt("a <multi> on a <multi>", pipe.tokenizer),
            "a <multi> <multi>_1 <multi>_2 on a <multi> <multi>_1 <multi>_2");
  EXPECT_EQ(maybe_convert_prompt("a plain prompt", pipe.tokenizer), "a plain prompt");
  const std::vector<int64_t> ids = pipe.tokenizer.encode(maybe_convert_prompt("<multi>", pipe.tokenizer));
  EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + 5),
            (std::vector<int64_t>{49406, 49408, 49409, 49410, 49407}));
  const at::Tensor& weight = pipe.text_encoder->token_embedding()->weight;
  EXPECT_EQ(weight.size(0), 49411);
  EXPECT_TRUE(at::equal(weight.narrow(0, 49408, 3), vectors));
}

TEST(TextualInversionEmbeddings, A1111FileUsesTheFileName) {
  StableDiffusion pipe = load_tiny();
  sd::test::TempDir dir;
  const at::Tensor vectors = at::randn({2, 32});
  io::save_safetensors(dir.path() / "my-style.safetensors", {{"emb_params", vectors}});
  const EmbeddingFile file = load_embedding_file(dir.path() / "my-style.safetensors");
  load_textual_inversion(pipe.tokenizer, pipe.text_encoder, file, "my-style.safetensors");
  EXPECT_EQ(pipe.tokenizer.token_to_id("my-style"), 49408);
  EXPECT_EQ(pipe.tokenizer.token_to_id("my-style_1"), 49409);
  EXPECT_TRUE(at::equal(pipe.text_encoder->token_embedding()->weight.narrow(0, 49408, 2), vectors));
}

TEST(TextualInversionEmbeddings, RefusalsNameTheFileAndChangeNothing) {
  StableDiffusion pipe = load_tiny();
  const size_t vocab = pipe.tokenizer.size();
  auto attempt = [&](const std::string& token, const at::Tensor& vectors) {
    return error_message([&] {
      load_textual_inversion(pipe.tokenizer, pipe.text_encoder, {token, vectors}, "emb.safetensors");
    });
  };
  std::string msg = attempt("<wide>", at::zeros({1, 64}));
  EXPECT_NE(msg.find("emb.safetensors: embedding '<wide>' has width 64 but the text encoder's hidden_size is 32"),
            std::string::npos)
      << msg;
  msg = attempt("a", at::zeros({1, 32}));  // a byte-level vocabulary entry
  EXPECT_NE(msg.find("emb.safetensors: token 'a' is already in the tokenizer's vocabulary"), std::string::npos) << msg;
  msg = attempt("<|endoftext|>", at::zeros({2, 32}));
  EXPECT_NE(msg.find("token '<|endoftext|>' is already"), std::string::npos) << msg;
  EXPECT_EQ(pipe.tokenizer.size(), vocab);
  EXPECT_EQ(pipe.text_encoder->token_embedding()->weight.size(0), 49408);

  // Loading the same token twice is refused the second time; a companion "<x>_1" already present is refused too.
  EXPECT_EQ(attempt("<x>", at::ones({1, 32})), "");
  msg = attempt("<x>", at::ones({1, 32}));
  EXPECT_NE(msg.find("token '<x>' is already in the tokenizer's vocabulary"), std::string::npos) << msg;
  EXPECT_EQ(attempt("<y>_1", at::ones({1, 32})), "");
  msg = attempt("<y>", at::ones({1, 32}));
  EXPECT_NE(msg.find("token '<y>_1' is already"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sd::pipeline

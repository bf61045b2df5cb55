// Writes the fuzzers' seed corpora, small inputs derived from the test fixtures: a few tensors of tiny-sd1's VAE as
// safetensors and as torch.save files, the embedding formats, a WebDataset shard, the fixture images (and one as
// WebP), the tiny pipelines' configs and a cut-down copy of their tokenizer. Usage: make_seeds FIXTURES OUT
#include <torch/serialize.h>
#include <webp/encode.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/image.h"
#include "io/safetensors.h"
#include "io/tar_builder.h"
#include "pipeline/a1111_embedding.h"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string pickled(const c10::IValue& value) {
  const std::vector<char> bytes = torch::pickle_save(value);
  return {bytes.begin(), bytes.end()};
}

// The `count` smallest tensors of a fixture's weights.
sd::io::TensorMap smallest(const fs::path& file, size_t count) {
  sd::io::TensorMap all = sd::io::load_safetensors(file);
  std::vector<std::pair<int64_t, std::string>> by_size;
  for (const auto& [name, t] : all) by_size.emplace_back(t.numel(), name);
  std::sort(by_size.begin(), by_size.end());
  sd::io::TensorMap out;
  for (size_t i = 0; i < count && i < by_size.size(); ++i) out[by_size[i].second] = all[by_size[i].second];
  return out;
}

void tensor_seeds(const fs::path& fixtures, const fs::path& out) {
  const sd::io::TensorMap few = smallest(fixtures / "tiny-sd1/vae/diffusion_pytorch_model.safetensors", 3);
  sd::io::save_safetensors(out / "safetensors/vae-few.safetensors", few, {{"format", "pt"}});
  sd::io::save_safetensors(out / "safetensors/half.safetensors", {{"w", few.begin()->second.to(at::kHalf)}});
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : few) dict.insert(name, t);
  write(out / "torch_file/vae-few.bin", pickled(dict));
  // A view into a larger storage, as torch.save writes slices.
  c10::Dict<std::string, at::Tensor> views;
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  views.insert("slice", base.narrow(1, 2, 3));
  views.insert("t", base.t());
  write(out / "torch_file/views.bin", pickled(views));

  const at::Tensor vectors = at::randn({2, 32});
  sd::io::save_safetensors(out / "embedding/learned_embeds.safetensors", {{"<cat-toy>", vectors}});
  sd::io::save_safetensors(out / "embedding/a1111.safetensors", {{"emb_params", vectors.to(at::kHalf)}});
  c10::Dict<std::string, at::Tensor> learned;
  learned.insert("<cat-toy>", vectors);
  write(out / "embedding/learned_embeds.bin", pickled(learned));
  const std::vector<char> a1111 = sd::test::a1111_embedding_bytes(vectors, "my-style");
  write(out / "embedding/a1111.pt", std::string(a1111.begin(), a1111.end()));
}

void shard_seeds(const fs::path& fixtures, const fs::path& out) {
  const std::string png = read(fixtures / "golden/images/toy_alpha_100x100.png");
  fs::create_directories(out / "tar");
  sd::test::TarBuilder()
      .file("000001.png", png)
      .file("000001.txt", "a toy")
      .file("000001.json", R"({"caption": "a toy", "width": 100})")
      .file(std::string(120, 'd') + "/000002.txt", "a long name")
      .end()
      .write(out / "tar/shard.tar");
}

void image_seeds(const fs::path& fixtures, const fs::path& out) {
  for (const char* name : {"landscape_160x120.jpg", "portrait_90x140.png", "toy_alpha_100x100.png"})
    write(out / "image" / name, read(fixtures / "golden/images" / name));
  const sd::io::RgbImage image =
      sd::io::resize(sd::io::decode_image_rgb(read(fixtures / "golden/images/portrait_90x140.png"), "seed"), 24, 16,
                     sd::io::ResizeFilter::kBilinear);
  uint8_t* webp = nullptr;
  const size_t size = WebPEncodeRGB(image.pixels.data(), image.width, image.height, image.width * 3, 75, &webp);
  write(out / "image/small.webp", std::string(reinterpret_cast<const char*>(webp), size));
  WebPFree(webp);
}

void config_seeds(const fs::path& fixtures, const fs::path& out) {
  for (const char* model : {"tiny-sd1", "tiny-sd2"})
    for (const char* file :
         {"unet/config.json", "vae/config.json", "text_encoder/config.json", "scheduler/scheduler_config.json"}) {
      std::string name = std::string(model) + "-" + file;
      std::replace(name.begin(), name.end(), '/', '-');
      write(out / "config" / name, read(fixtures / model / file));
    }
}

// The first 600 tokens by id (CLIP's byte alphabet and its "</w>" forms, then the first merged tokens), the merges
// that build them, the tokenizer configs and a prompt.
void tokenizer_seeds(const fs::path& fixtures, const fs::path& out) {
  for (const char* model : {"tiny-sd1", "tiny-sd2"}) {
    const fs::path dir = fixtures / model / "tokenizer";
    const nlohmann::json vocab = nlohmann::json::parse(read(dir / "vocab.json"));
    nlohmann::json small = nlohmann::json::object();
    for (const auto& [token, id] : vocab.items())
      if (id.get<int64_t>() < 600 || token.rfind("<|", 0) == 0) small[token] = id;
    std::istringstream merges(read(dir / "merges.txt"));
    std::string line, some_merges;
    for (int i = 0; i < 100 && std::getline(merges, line); ++i) some_merges += line + "\n";
    const std::string sep = "\n--8<--\n";
    write(out / "tokenizer" / model, small.dump() + sep + some_merges + sep + read(dir / "tokenizer_config.json") +
                                         sep + read(dir / "special_tokens_map.json") + sep +
                                         "a photo of <cat-toy>, the THE  théâtre 東京 <|endoftext|> !!");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_seeds FIXTURES OUT\n";
    return 2;
  }
  const fs::path fixtures = argv[1], out = argv[2];
  tensor_seeds(fixtures, out);
  shard_seeds(fixtures, out);
  image_seeds(fixtures, out);
  config_seeds(fixtures, out);
  tokenizer_seeds(fixtures, out);
  return 0;
}

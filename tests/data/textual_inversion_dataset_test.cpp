#include "data/textual_inversion_dataset.h"

#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;

TextualInversionDatasetOptions options_for(const fs::path& dir) {
  TextualInversionDatasetOptions o;
  o.data_dir = dir;
  o.placeholder_string = "<dicoo>";
  o.resolution = 64;
  o.center_crop = true;
  o.repeats = 3;
  return o;
}

std::string error_of(const TextualInversionDatasetOptions& o) {
  try {
    TextualInversionDataset dataset(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TextualInversionDataset, PixelValuesMatchTheReferencePreprocessing) {
  sd::test::TempDir dir;
  // Named so that sorting puts the toy first, as the golden's index 1 and 2 are toy and portrait.
  fs::copy_file(sd::test::golden("images/toy_alpha_100x100.png"), dir.path() / "a_toy.png");
  fs::copy_file(sd::test::golden("images/portrait_90x140.png"), dir.path() / "b_portrait.PNG");
  std::ofstream(dir.path() / "notes.txt") << "not an image";
  TextualInversionDataset dataset(options_for(dir.path()));
  EXPECT_EQ(dataset.num_images(), 2);
  EXPECT_EQ(dataset.size(), 6);
  auto golden = io::load_safetensors(sd::test::golden("image_preprocessing.safetensors"));
  EXPECT_TRUE(at::equal(dataset.pixel_values(0, false), golden.at("1.pixel_values")));
  EXPECT_TRUE(at::equal(dataset.pixel_values(4, false), golden.at("1.pixel_values")));  // repeats wrap around
  EXPECT_TRUE(at::equal(dataset.pixel_values(5, false), golden.at("2.pixel_values")));
  EXPECT_TRUE(at::equal(dataset.pixel_values(1, true), golden.at("2.pixel_values").flip({2})));
}

TEST(TextualInversionDataset, PromptsFromTemplates) {
  sd::test::TempDir dir;
  fs::copy_file(sd::test::golden("images/toy_alpha_100x100.png"), dir.path() / "toy.png");
  auto o = options_for(dir.path());
  EXPECT_EQ(TextualInversionDataset(o).prompt(12), "a photo of the <dicoo>");
  EXPECT_EQ(TextualInversionDataset(o).templates().size(), 27u);
  o.learnable_property = "style";
  o.placeholder_string = "<s> <s>_1";
  EXPECT_EQ(TextualInversionDataset(o).prompt(0), "a painting in the style of <s> <s>_1");
  EXPECT_EQ(TextualInversionDataset(o).templates().size(), 19u);
}

TEST(TextualInversionDataset, ListsEveryImageKindTheDecoderReads) {
  sd::test::TempDir dir;
  // Contents decide the decoder, names decide what is listed: the same extensions as the image-caption folders.
  for (const char* name : {"a.jpg", "b.JPEG", "c.png", "d.bmp", "e.WebP"})
    fs::copy_file(sd::test::golden("images/toy_alpha_100x100.png"), dir.path() / name);
  std::ofstream(dir.path() / "f.gif") << "GIF89a";
  EXPECT_EQ(TextualInversionDataset(options_for(dir.path())).num_images(), 5);
}

TEST(TextualInversionDataset, MissingFolder) {
  EXPECT_NE(error_of(options_for("/nonexistent/dicoo")).find("--train_data_dir /nonexistent/dicoo: not a directory"),
            std::string::npos);
}

TEST(TextualInversionDataset, FolderWithoutImages) {
  sd::test::TempDir dir;
  std::ofstream(dir.path() / "readme.md") << "hi";
  EXPECT_NE(error_of(options_for(dir.path())).find("no images"), std::string::npos);
}

TEST(TextualInversionDataset, CorruptImageNamesTheFile) {
  sd::test::TempDir dir;
  std::ofstream(dir.path() / "broken.jpg") << "garbage";
  EXPECT_NE(error_of(options_for(dir.path())).find("broken.jpg: cannot decode image"), std::string::npos);
}

TEST(TextualInversionDataset, UnknownLearnableProperty) {
  sd::test::TempDir dir;
  auto o = options_for(dir.path());
  o.learnable_property = "person";
  EXPECT_NE(error_of(o).find("--learnable_property: expected 'object' or 'style', got 'person'"), std::string::npos);
}

}  // namespace
}  // namespace sd::data

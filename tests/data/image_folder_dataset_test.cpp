// Image folders as `sdtrain train --train_data_dir` lists them.
#include "data/image_folder_dataset.h"

#include <fstream>

#include "io/image.h"
#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;

void write_captioned_png(const fs::path& image, const std::string& caption) {
  fs::create_directories(image.parent_path());
  io::save_png(image, io::RgbImage{4, 4, std::vector<uint8_t>(4 * 4 * 3, 100)});
  std::ofstream(fs::path(image).replace_extension(".txt")) << caption;
}

// A run's --output_dir inside its kohya folder: the validation images written there are outputs, not training data,
// so a resumed run lists the same samples as the first.
TEST(ImageFolderDataset, TheRunsOwnOutputFolderIsNotListed) {
  sd::test::TempDir dir;
  const fs::path data = dir.path() / "data", out = data / "out";
  write_captioned_png(data / "a.png", "a cat");
  write_captioned_png(data / "sub" / "b.png", "a dog");
  io::save_png(out / "validation" / "step-5-0.png", io::RgbImage{4, 4, std::vector<uint8_t>(4 * 4 * 3, 0)});

  EXPECT_EQ(ImageFolderDataset({data, "image", "text", out}).size(), 2);
  EXPECT_EQ(ImageFolderDataset({data, "image", "text", data / "sub" / ".." / "out"}).size(), 2);
  EXPECT_EQ(ImageFolderDataset({data, "image", "text", {}}).size(), 3);
}

}  // namespace
}  // namespace sd::data

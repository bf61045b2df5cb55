// Image folders as `sdtrain train --train_data_dir` lists them.
#include "data/image_folder_dataset.h"

#include <fstream>

#include "io/image.h"
#include "models/model_test_util.h"
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

  EXPECT_EQ(ImageFolderDataset({data, "image", "text", out, {}}).size(), 2);
  EXPECT_EQ(ImageFolderDataset({data, "image", "text", data / "sub" / ".." / "out", {}}).size(), 2);
  EXPECT_EQ(ImageFolderDataset({data, "image", "text", {}, {}}).size(), 3);
}

// Ranks compare the fingerprint: the same copy at another mount point agrees; another caption or image does not.
TEST(ImageFolderDataset, FingerprintIsTheImagesNamesAndSizesAndTheCaptions) {
  sd::test::TempDir dir;
  for (const fs::path& copy : {dir.path() / "node0", dir.path() / "node1"}) {
    write_captioned_png(copy / "a.png", "a cat");
    write_captioned_png(copy / "b.png", "a dog");
  }
  auto fingerprint = [&](const fs::path& data) {
    return ImageFolderDataset({data, "image", "text", {}, {}}).fingerprint();
  };
  const std::string node0 = fingerprint(dir.path() / "node0");
  EXPECT_EQ(fingerprint(dir.path() / "node1"), node0);
  std::ofstream(dir.path() / "node1" / "b.txt") << "a wolf";
  EXPECT_NE(fingerprint(dir.path() / "node1"), node0);
  write_captioned_png(dir.path() / "node1" / "b.png", "a dog");
  EXPECT_EQ(fingerprint(dir.path() / "node1"), node0);
  sd::test::write_pattern_png(dir.path() / "node1" / "b.png", 40, 36, 9);
  EXPECT_NE(fingerprint(dir.path() / "node1"), node0);
}

std::vector<std::string> captions_by_image(const ImageFolderDataset& dataset) {
  std::vector<std::string> out;
  for (int64_t k = 0; k < dataset.size(); ++k)
    out.push_back(fs::path(dataset.describe(k)).filename().string() + ": " + dataset.read(k).captions.at(0));
  return out;
}

// kohya's DreamBooth folders: "N_tokens" repeats each image N times; tokens caption the images without a caption
// file; a folder of 0 repeats is skipped; other folders train once, as before.
TEST(ImageFolderDataset, KohyaRepeatFoldersRepeatAndCaptionTheirImages) {
  sd::test::TempDir dir;
  const fs::path data = dir.path() / "data";
  write_captioned_png(data / "3_sks dog" / "a.png", "a photo of sks dog");
  io::save_png(data / "3_sks dog" / "b.png", io::RgbImage{4, 4, std::vector<uint8_t>(4 * 4 * 3, 7)});
  write_captioned_png(data / "0_reg" / "c.png", "skipped");
  write_captioned_png(data / "misc" / "d.png", "once");
  write_captioned_png(data / "2_x" / "deep" / "e.png", "twice");
  write_captioned_png(data / "5_not_a_folder.png", "an image at the top, once");
  // Spelled with a trailing slash, as shell completion writes it.
  const ImageFolderDataset dataset({data.string() + "/", "image", "text", {}, {}});
  EXPECT_EQ(dataset.layout(), "kohya");
  EXPECT_EQ(captions_by_image(dataset),
            (std::vector<std::string>{"e.png: twice", "e.png: twice", "a.png: a photo of sks dog",
                                      "a.png: a photo of sks dog", "a.png: a photo of sks dog", "b.png: sks dog",
                                      "b.png: sks dog", "b.png: sks dog",
                                      "5_not_a_folder.png: an image at the top, once", "d.png: once"}));
}

// Each sample's file, caption and loss weight, in order.
std::vector<std::string> weighted_samples(const ImageFolderDataset& dataset) {
  std::vector<std::string> out;
  for (int64_t k = 0; k < dataset.size(); ++k) {
    const EncodedSample sample = dataset.read(k);
    out.push_back(fmt::format("{}: {} x{}", fs::path(dataset.describe(k)).filename().string(), sample.captions.at(0),
                              sample.loss_weight));
  }
  return out;
}

// kohya's regularization images (--reg_data_dir, DreamBooth's prior preservation): after the training images, with
// --prior_loss_weight, balanced to as many samples as the training images. Fewer: each gets one more repeat in turn
// until they match. More: those in order until they match (the last may overshoot with its repeats), the rest unused.
TEST(ImageFolderDataset, RegularizationImagesAreBalancedAgainstTheTrainingImagesAsKohyaDoes) {
  sd::test::TempDir dir;
  const fs::path train = dir.path() / "train", few = dir.path() / "few", many = dir.path() / "many";
  write_captioned_png(train / "3_sks dog" / "a.png", "sks dog");
  write_captioned_png(train / "3_sks dog" / "b.png", "sks dog");  // 6 training samples
  io::save_png(few / "1_dog" / "r1.png", io::RgbImage{4, 4, std::vector<uint8_t>(4 * 4 * 3, 7)});
  io::save_png(few / "1_dog" / "r2.png", io::RgbImage{4, 4, std::vector<uint8_t>(4 * 4 * 3, 7)});
  write_captioned_png(few / "2_cat" / "r3.png", "a cat");  // 1 + 1 + 2 = 4 regularization samples
  const ImageFolderDataset balanced({train, "image", "text", {}, few, 0.5});
  EXPECT_EQ(
      weighted_samples(balanced),
      (std::vector<std::string>{"a.png: sks dog x1", "a.png: sks dog x1", "a.png: sks dog x1", "b.png: sks dog x1",
                                "b.png: sks dog x1", "b.png: sks dog x1", "r1.png: dog x0.5", "r1.png: dog x0.5",
                                "r2.png: dog x0.5", "r2.png: dog x0.5", "r3.png: a cat x0.5", "r3.png: a cat x0.5"}));
  // kohya's num_train_images and num_reg_images: images times repeats, the latter before balancing.
  EXPECT_EQ(balanced.sample_counts().training, 6);
  EXPECT_EQ(balanced.sample_counts().regularization, 4);

  for (const char* name : {"r1.png", "r2.png", "r3.png", "r4.png"})
    io::save_png(many / "5_dog" / name, io::RgbImage{4, 4, std::vector<uint8_t>(4 * 4 * 3, 7)});
  const ImageFolderDataset truncated({train, "image", "text", {}, many, 2.0});
  // 5 repeats of r1 make 5 < 6; r2's make 10; r3 and r4 are not used.
  std::vector<std::string> expected(5, "r1.png: dog x2");
  expected.insert(expected.end(), 5, "r2.png: dog x2");
  const std::vector<std::string> samples = weighted_samples(truncated);
  EXPECT_EQ(std::vector<std::string>(samples.begin() + 6, samples.end()), expected);
  EXPECT_EQ(truncated.sample_counts().training, 6);
  EXPECT_EQ(truncated.sample_counts().regularization, 20);

  EXPECT_EQ(sd::test::error_message([&] {
              ImageFolderDataset({train, "image", "text", {}, dir.path() / "none"});
            }),
            "--reg_data_dir " + (dir.path() / "none").string() + ": not a directory");
  EXPECT_EQ(sd::test::error_message([&] {
              ImageFolderDataset({train, "image", "text", {}, train / "3_sks dog"});
            }),
            "--reg_data_dir " + (train / "3_sks dog").string() + " and --train_data_dir " + train.string() +
                " overlap: the regularization images would also train as training images; keep the two folders "
                "apart");
  fs::create_directories(dir.path() / "empty" / "1_dog");
  EXPECT_EQ(sd::test::error_message([&] {
              ImageFolderDataset({train, "image", "text", {}, dir.path() / "empty"});
            }),
            "--reg_data_dir " + (dir.path() / "empty").string() + ": no images");
}

// Hugging Face imagefolder's other metadata format: a header row, then file_name and caption per row.
TEST(ImageFolderDataset, MetadataCsvNamesImagesAndCaptions) {
  sd::test::TempDir dir;
  const fs::path data = dir.path() / "data";
  write_captioned_png(data / "a.png", "ignored");
  write_captioned_png(data / "sub" / "b.png", "ignored");
  std::ofstream(data / "metadata.csv") << "file_name,text,score\na.png,\"a cat, sitting\",1\nsub/b.png,a dog,2\n";
  EXPECT_EQ(captions_by_image(ImageFolderDataset({data, "image", "text", {}, {}})),
            (std::vector<std::string>{"a.png: a cat, sitting", "b.png: a dog"}));
  EXPECT_EQ(captions_by_image(ImageFolderDataset({data, "image", "score", {}, {}})),
            (std::vector<std::string>{"a.png: 1", "b.png: 2"}));

  std::ofstream(data / "metadata.csv") << "file_name,text\na.png,x,y\n";
  EXPECT_EQ(sd::test::error_of([&] {
              ImageFolderDataset({data, "image", "text", {}, {}});
            }),
            (data / "metadata.csv").string() + " line 2: 3 values, but the header names 2 columns");
  std::ofstream(data / "metadata.jsonl") << "{\"file_name\": \"a.png\", \"text\": \"x\"}\n";
  EXPECT_EQ(sd::test::error_of([&] {
              ImageFolderDataset({data, "image", "text", {}, {}});
            }),
            data.string() + ": holds both metadata.jsonl and metadata.csv; keep one");
}

}  // namespace
}  // namespace sd::data

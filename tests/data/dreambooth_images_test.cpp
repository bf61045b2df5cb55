// DreamBooth's data (data/dreambooth_images.h): what the folders list, the pairs the planner makes of instance and
// class images, and the loss weights that give the script's mse(instances) + w * mse(classes).
#include "data/dreambooth_images.h"

#include <set>

#include "data/training_data.h"
#include "io/atomic_file.h"
#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;
using sd::test::error_of;

struct Folders {
  sd::test::TempDir dir;
  DreamBoothDataOptions options;
  Folders(int instances, int classes) {
    for (int i = 0; i < instances; ++i)
      sd::test::write_pattern_png(dir.path() / "sks" / fmt::format("i{}.png", i), 40, 36, 3 + i);
    for (int i = 0; i < classes; ++i)
      sd::test::write_pattern_png(dir.path() / "dog" / fmt::format("c{}.png", i), 40, 36, 9 + i);
    options.instance_data_dir = (dir.path() / "sks").string();
    options.instance_prompt = "a photo of sks dog";
    options.class_data_dir = (dir.path() / "dog").string();
    options.class_prompt = "a photo of dog";
  }
};

TEST(DreamBoothImages, InstanceImagesInNameOrderWithTheInstancePrompt) {
  Folders f(3, 0);
  io::write_text_file(fs::path(f.options.instance_data_dir) / "notes.txt", "not an image");
  fs::create_directories(fs::path(f.options.instance_data_dir) / "sub.png");
  const DreamBoothImages images = dreambooth_images(f.options, 0.5);
  ASSERT_EQ(images.samples.size(), 3U);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(images.samples[i].image.filename(), fmt::format("i{}.png", i));
    EXPECT_EQ(images.samples[i].captions, std::vector<std::string>{"a photo of sks dog"});
    EXPECT_EQ(images.samples[i].loss_weight, 1.0);  // no prior preservation: the plain mse
  }
  EXPECT_EQ(images.pairs.instances, 3);
  EXPECT_EQ(images.pairs.classes, 0);
}

TEST(DreamBoothImages, PriorPreservationTakesTheFirstClassImagesWithWeightsForTheScriptsLoss) {
  Folders f(2, 5);
  f.options.with_prior_preservation = true;
  f.options.num_class_images = 3;
  const DreamBoothImages images = dreambooth_images(f.options, 0.25);
  ASSERT_EQ(images.samples.size(), 5U);
  EXPECT_EQ(images.pairs.instances, 2);
  EXPECT_EQ(images.pairs.classes, 3);
  EXPECT_EQ(images.pairs.count(), 3);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(images.samples[i].loss_weight, 2.0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(images.samples[2 + i].image.filename(), fmt::format("c{}.png", i));
    EXPECT_EQ(images.samples[2 + i].captions, std::vector<std::string>{"a photo of dog"});
    EXPECT_EQ(images.samples[2 + i].loss_weight, 0.5);
  }
}

TEST(DreamBoothImages, BadFoldersAndPromptsAreOneErrorEach) {
  Folders f(1, 0);
  DreamBoothDataOptions o = f.options;
  o.instance_data_dir = (f.dir.path() / "nope").string();
  EXPECT_EQ(error_of([&] { dreambooth_images(o, 1); }),
            "--instance_data_dir " + o.instance_data_dir + ": not a directory");
  o = f.options;
  o.instance_data_dir = f.dir.path().string();  // holds folders only
  EXPECT_EQ(error_of([&] { dreambooth_images(o, 1); }),
            "--instance_data_dir " + o.instance_data_dir + ": no images (.jpg, .jpeg, .png, .bmp or .webp files)");
  o = f.options;
  o.instance_prompt.clear();
  EXPECT_EQ(error_of([&] { dreambooth_images(o, 1); }),
            "--instance_prompt is empty: it names the subject, e.g. \"a photo of sks dog\"");
  o = f.options;
  o.with_prior_preservation = true;
  o.class_prompt.clear();
  EXPECT_EQ(error_of([&] { dreambooth_images(o, 1); }),
            "--with_prior_preservation needs --class_prompt (the class, e.g. \"a photo of a dog\")");
  o.class_prompt = "a dog";
  o.class_data_dir = o.instance_data_dir;
  EXPECT_EQ(error_of([&] { dreambooth_images(o, 1); }),
            "--class_data_dir " + o.class_data_dir +
                " is --instance_data_dir: class images would train as the subject; keep them apart");
  o.class_data_dir = f.options.class_data_dir;
  EXPECT_EQ(
      error_of([&] { dreambooth_images(o, 1); }),
      "--class_data_dir " + o.class_data_dir + ": no images (with --with_prior_preservation it needs class images)");
}

TEST(DreamBoothPairs, EachMicroBatchHoldsItsPairsInstancesThenTheirClassImages) {
  // 2 instance and 3 class images make 3 pairs; the pairs are ordered as a dataset of 3 samples would be.
  const PriorPairs pairs{2, 3};
  const BatchLayout layout{2, 2, 2};
  const uint64_t seed = 11;
  for (int rank = 0; rank < 2; ++rank) {
    const BatchPlanner paired(pairs, layout, rank, seed), plain(3, layout, rank, seed);
    EXPECT_EQ(paired.samples_per_epoch(), 3);
    EXPECT_EQ(paired.images_per_sample(), 2);  // throughput counts both images of a pair
    EXPECT_EQ(plain.images_per_sample(), 1);
    for (int64_t step = 0; step < 3; ++step)
      for (int64_t micro = 0; micro < 2; ++micro) {
        const BatchRequest p = paired.plan(step, micro), q = plain.plan(step, micro);
        ASSERT_EQ(p.indices.size(), 4U);
        for (size_t j = 0; j < 2; ++j) {
          EXPECT_EQ(p.indices[j], q.indices[j] % 2);
          EXPECT_EQ(p.indices[2 + j], 2 + q.indices[j] % 3);
        }
        EXPECT_EQ(p.first_position, 2 * q.first_position);
      }
  }
  // Every sample of a step has a position of its own: 2 ranks x 2 micro-batches x 4 samples.
  std::set<int64_t> positions;
  for (int rank = 0; rank < 2; ++rank)
    for (int64_t micro = 0; micro < 2; ++micro) {
      const BatchRequest r = BatchPlanner(pairs, layout, rank, seed).plan(0, micro);
      for (int64_t j = 0; j < 4; ++j) positions.insert(r.first_position + j);
    }
  EXPECT_EQ(positions.size(), 16U);
}

TEST(DreamBoothPairs, MicroBatchesCarryThePromptsAndLossWeightsOfTheirPairs) {
  Folders f(2, 3);
  TrainingDataOptions o;
  o.dreambooth = f.options;
  o.dreambooth.with_prior_preservation = true;
  o.prior_loss_weight = 0.3;
  o.transform = {32, /*center_crop=*/true, /*random_flip=*/false};
  const text::ClipTokenizer tok = text::ClipTokenizer::load(sd::test::fixtures() / "tiny-sd1" / "tokenizer");
  const uint64_t seed = 5;
  TrainingData data = open_training_data(o, tok, {}, seed, BatchLayout{2, 1, 1}, 0);
  EXPECT_EQ(data.planner->samples_per_epoch(), 3);
  const TrainingBatch batch = data.source->get(data.planner->plan(0, 0));
  EXPECT_EQ(batch.pixel_values.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
  const at::Tensor instance = at::tensor(tok.encode("a photo of sks dog")),
                   dog = at::tensor(tok.encode("a photo of dog"));
  EXPECT_TRUE(at::equal(batch.input_ids[0], instance));
  EXPECT_TRUE(at::equal(batch.input_ids[1], instance));
  EXPECT_TRUE(at::equal(batch.input_ids[2], dog));
  EXPECT_TRUE(at::equal(batch.input_ids[3], dog));
  ASSERT_TRUE(batch.loss_weights.defined());
  EXPECT_TRUE(at::equal(batch.loss_weights, at::tensor({2.0f, 2.0f, 0.6f, 0.6f})));
  // Ranks compare a digest of every listed file, so nodes holding other class images are told apart.
  const fs::path classes = f.options.class_data_dir;
  EXPECT_EQ(open_training_data(o, tok, {}, seed, BatchLayout{2, 1, 1}, 0).listing_fingerprint,
            data.listing_fingerprint);
  sd::test::write_pattern_png(classes / "c2.png", 48, 36, 9);  // another image under the same name
  EXPECT_NE(open_training_data(o, tok, {}, seed, BatchLayout{2, 1, 1}, 0).listing_fingerprint,
            data.listing_fingerprint);
}

}  // namespace
}  // namespace sd::data

// What the data flags do to the micro-batches `sdtrain train` gets: caption dropout and kohya's tag shuffling reach
// the token ids, with aspect-ratio buckets every micro-batch holds images of its bucket's size, and regularization
// images carry their loss weight.
#include "data/training_data.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "test_util.h"

namespace sd::data {
namespace {

namespace fs = std::filesystem;

text::ClipTokenizer tokenizer() { return text::ClipTokenizer::load(sd::test::fixtures() / "tiny-sd1" / "tokenizer"); }

std::vector<int64_t> row(const at::Tensor& ids, int64_t j) {
  const at::Tensor r = ids[j].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

TEST(TrainingData, CaptionDropoutAndTagShuffleReachTheTokenIds) {
  sd::test::TempDir dir;
  const std::vector<std::string> rest = {"red", "green", "blue", "yellow"};
  for (int i = 0; i < 8; ++i) {
    sd::test::write_pattern_png(dir.path() / fmt::format("img{}.png", i), 40, 36, 3 + i);
    std::ofstream(dir.path() / fmt::format("img{}.txt", i)) << "number" << i << ",red, green ,blue,yellow";
  }
  TrainingDataOptions o;
  o.train_data_dir = dir.path().string();
  o.transform = {32, /*center_crop=*/true, /*random_flip=*/false};
  o.captions = {/*dropout_probability=*/0.5, /*shuffle=*/true, /*keep_tokens=*/1};
  const text::ClipTokenizer tok = tokenizer();
  // Every caption a use can train on: "" or the kept first tag followed by a permutation of the rest.
  std::map<std::vector<int64_t>, std::string> known = {{tok.encode(""), ""}};
  for (int i = 0; i < 8; ++i) {
    std::vector<std::string> tags = rest;
    std::sort(tags.begin(), tags.end());  // next_permutation walks from the first order to the last
    do {
      std::string caption = fmt::format("number{}", i);
      for (const std::string& tag : tags) caption += ", " + tag;
      known[tok.encode(caption)] = caption;
    } while (std::next_permutation(tags.begin(), tags.end()));
  }

  const uint64_t seed = 3;
  const BatchLayout layout{4, 1, 1};
  TrainingData data = open_training_data(o, tok, {}, seed, layout, 0);
  int dropped = 0, uses = 0;
  std::set<std::string> orders;
  for (int64_t step = 0; step < 20; ++step) {
    const BatchRequest request = data.planner->plan(step, 0);
    const TrainingBatch batch = data.source->get(request);
    for (size_t j = 0; j < request.indices.size(); ++j, ++uses) {
      const auto caption = known.find(row(batch.input_ids, static_cast<int64_t>(j)));
      ASSERT_NE(caption, known.end()) << "step " << step << ": neither empty nor the caption with its tags shuffled: '"
                                      << tok.decode(row(batch.input_ids, static_cast<int64_t>(j))) << "'";
      if (caption->second.empty()) {
        ++dropped;
        continue;
      }
      // The kept tag is the sample's own (kohya folders list images in sorted order: img0 ... img7).
      EXPECT_EQ(caption->second.rfind(fmt::format("number{},", request.indices[j]), 0), 0u) << caption->second;
      orders.insert(caption->second.substr(caption->second.find(',')));
    }
  }
  EXPECT_GT(dropped, uses / 4);  // 80 uses at p = 0.5: 40 expected, 25..55 is more than 3 sigma either way
  EXPECT_LT(dropped, 3 * uses / 4);
  EXPECT_GT(orders.size(), 6u);  // of the 24 orders of the four shuffled tags

  // The same seed gives the same captions: the draws are the sample's, not the loader thread's.
  TrainingData again = open_training_data(o, tok, {}, seed, layout, 0);
  for (int64_t step = 0; step < 4; ++step)
    EXPECT_TRUE(at::equal(again.source->get(again.planner->plan(step, 0)).input_ids,
                          data.source->get(data.planner->plan(step, 0)).input_ids))
        << step;
}

TEST(TrainingData, WithBucketsEachMicroBatchHasItsBucketsSize) {
  sd::test::TempDir dir;
  // Landscapes, portraits and squares of several sizes; with --resolution 64 and steps of 16 they fall into 80x48,
  // 48x80 and 64x64.
  const std::vector<std::pair<int, int>> sizes = {{100, 60}, {60, 100}, {70, 70}, {105, 63}, {63, 105}, {80, 80},
                                                  {96, 58},  {58, 96},  {64, 64}, {90, 54},  {54, 90},  {72, 72}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    sd::test::write_pattern_png(dir.path() / fmt::format("img{:02d}.png", i), sizes[i].first, sizes[i].second, 5);
    std::ofstream(dir.path() / fmt::format("img{:02d}.txt", i)) << "a pattern";
  }
  TrainingDataOptions o;
  o.train_data_dir = dir.path().string();
  o.transform = {64, /*center_crop=*/false, /*random_flip=*/true};
  o.enable_bucket = true;
  o.min_bucket_reso = 32;
  o.max_bucket_reso = 128;
  o.bucket_reso_steps = 16;
  const std::vector<Resolution> buckets = bucket_resolutions(o);
  const uint64_t seed = 11;
  const text::ClipTokenizer tok = tokenizer();  // the source reads it while it lives
  TrainingData data = open_training_data(o, tok, {}, seed, BatchLayout{2, 1, 1}, 0);
  std::set<std::pair<int, int>> seen;
  for (int64_t step = 0; step < 12; ++step) {  // two epochs of 6 micro-batches
    const BatchRequest request = data.planner->plan(step, 0);
    ASSERT_GE(request.bucket, 0);
    const Resolution bucket = buckets.at(static_cast<size_t>(request.bucket));
    for (int64_t i : request.indices) {
      const Resolution image{sizes[static_cast<size_t>(i)].first, sizes[static_cast<size_t>(i)].second};
      EXPECT_EQ(assign_bucket(buckets, image).bucket, bucket) << "sample " << i << " at step " << step;
    }
    const TrainingBatch batch = data.source->get(request);
    EXPECT_EQ(batch.pixel_values.sizes(), (at::IntArrayRef{2, 3, bucket.height, bucket.width})) << step;
    seen.insert({bucket.width, bucket.height});
  }
  EXPECT_EQ(seen, (std::set<std::pair<int, int>>{{48, 80}, {64, 64}, {80, 48}}));
}

// --reg_data_dir: a micro-batch holding regularization images carries --prior_loss_weight for them and 1 for the
// training images; one holding training images alone carries no weights (the unweighted loss). Other sources refuse
// the flag.
TEST(TrainingData, RegularizationImagesCarryThePriorLossWeight) {
  sd::test::TempDir dir;
  for (int i = 0; i < 2; ++i) {
    sd::test::write_pattern_png(dir.path() / "train" / "2_sks" / fmt::format("t{}.png", i), 40, 36, 3 + i);
    sd::test::write_pattern_png(dir.path() / "reg" / "1_dog" / fmt::format("r{}.png", i), 40, 36, 7 + i);
  }
  TrainingDataOptions o;
  o.train_data_dir = (dir.path() / "train").string();
  o.reg_data_dir = (dir.path() / "reg").string();
  o.prior_loss_weight = 0.3;
  o.transform = {32, /*center_crop=*/true, /*random_flip=*/false};
  const text::ClipTokenizer tok = tokenizer();
  const uint64_t seed = 5;  // read by the source at each request
  TrainingData data = open_training_data(o, tok, {}, seed, BatchLayout{2, 1, 1}, 0);
  int weighted = 0, unweighted = 0;
  for (int64_t step = 0; step < 8; ++step) {  // two epochs of 4 training + 4 regularization samples
    const BatchRequest request = data.planner->plan(step, 0);
    const TrainingBatch batch = data.source->get(request);
    std::vector<float> expected;
    for (int64_t i : request.indices) expected.push_back(i >= 4 ? 0.3f : 1.0f);  // samples 4.. are regularization
    if (std::all_of(expected.begin(), expected.end(), [](float w) { return w == 1.0f; })) {
      EXPECT_FALSE(batch.loss_weights.defined()) << step;
      ++unweighted;
      continue;
    }
    ASSERT_TRUE(batch.loss_weights.defined()) << step;
    EXPECT_TRUE(at::equal(batch.loss_weights, at::tensor(expected))) << step;
    ++weighted;
  }
  EXPECT_GT(weighted, 0);
  EXPECT_GT(unweighted, 0);

  o.train_shards = o.train_data_dir;
  o.train_data_dir.clear();
  EXPECT_THROW(
      {
        try {
          open_training_data(o, tok, {}, seed, BatchLayout{2, 1, 1}, 0);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(),
                       "--reg_data_dir needs --train_data_dir: its images are balanced against that folder's, as kohya "
                       "does");
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace sd::data

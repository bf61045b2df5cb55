#include "train/lr_schedule.h"

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sd::train {
namespace {

double lr_at(const std::string& name, int64_t step, int64_t warmup = 2, int64_t total = 10, double base = 1e-4) {
  LrSchedule s;
  s.name = name;
  s.warmup_steps = warmup;
  s.total_steps = total;
  return base * lr_multiplier(s, step, base);
}

TEST(LrSchedule, LinearWarmupMatchesTheUnetTrainingGolden) {
  // golden C7: get_scheduler('linear', num_warmup_steps=2, num_training_steps=10), lr 1e-4.
  auto golden = io::load_safetensors(sd::test::golden("tiny-sd1/unet_training.safetensors"));
  for (int k = 0; k < 3; ++k)
    EXPECT_DOUBLE_EQ(lr_at("linear", k), golden.at("step" + std::to_string(k) + ".lr").item<double>()) << k;
  EXPECT_DOUBLE_EQ(lr_at("linear", 6), 1e-4 * 4.0 / 8.0);
  EXPECT_DOUBLE_EQ(lr_at("linear", 12), 0.0);
}

TEST(LrSchedule, ConstantMatchesTheTextualInversionGolden) {
  auto golden = io::load_safetensors(sd::test::golden("tiny-sd1/textual_inversion.safetensors"));
  for (int k = 0; k < 4; ++k)
    EXPECT_DOUBLE_EQ(lr_at("constant", k, 0, 4, 5e-4), golden.at("step" + std::to_string(k) + ".lr").item<double>());
}

TEST(LrSchedule, ConstantWithWarmup) {
  EXPECT_DOUBLE_EQ(lr_at("constant_with_warmup", 1, 4), 1e-4 * 0.25);
  EXPECT_DOUBLE_EQ(lr_at("constant_with_warmup", 7, 4), 1e-4);
}

TEST(LrSchedule, CosineHalfWave) {
  EXPECT_DOUBLE_EQ(lr_at("cosine", 2), 1e-4);
  EXPECT_NEAR(lr_at("cosine", 6), 0.5e-4, 1e-15);
  EXPECT_NEAR(lr_at("cosine", 10), 0.0, 1e-15);
}

TEST(LrSchedule, CosineWithRestarts) {
  LrSchedule s{"cosine_with_restarts", 0, 10, 2};
  EXPECT_DOUBLE_EQ(lr_multiplier(s, 0, 1.0), 1.0);
  EXPECT_NEAR(lr_multiplier(s, 5, 1.0), 1.0, 1e-12);  // second cycle restarts at full lr
  EXPECT_NEAR(lr_multiplier(s, 4, 1.0), 0.5 * (1 + std::cos(3.14159265358979323846 * 0.8)), 1e-12);
  EXPECT_EQ(lr_multiplier(s, 10, 1.0), 0.0);
}

TEST(LrSchedule, PolynomialDecaysToLrEnd) {
  EXPECT_NEAR(lr_at("polynomial", 6), (1e-4 - 1e-7) * 0.5 + 1e-7, 1e-18);
  EXPECT_NEAR(lr_at("polynomial", 11), 1e-7, 1e-18);
}

TEST(LrSchedule, UnknownNameIsAnError) {
  LrSchedule s;
  s.name = "exponential";
  try {
    validate(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown schedule 'exponential'"), std::string::npos);
  }
}

}  // namespace
}  // namespace sd::train

// Ranks compare the settings that define a run before training: equal settings pass, and any difference (a flag, a
// setting only one rank has, settings of different sizes) stops every rank with the same line.
#include "train/run_agreement.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "in_process_world.h"

namespace sd {
namespace {

using nlohmann::json;

TEST(RunAgreement, FirstDifferenceNamesTheSettingAndBothValues) {
  const json a = {{"--learning_rate", "1e-4"}, {"resume step", 4}, {"nested", {{"x", 1}}}};
  EXPECT_TRUE(train::first_difference(a, a).key.empty());
  json b = a;
  b["--learning_rate"] = "2e-4";
  const train::SettingDifference d = train::first_difference(a, b);
  EXPECT_EQ(d.key, "--learning_rate");
  EXPECT_EQ(d.a, "\"1e-4\"");
  EXPECT_EQ(d.b, "\"2e-4\"");
  b["--learning_rate"] = "0.0001";  // the same number, written another way
  EXPECT_TRUE(train::first_difference(a, b).key.empty());
  b["--learning_rate"] = "0.0001x";
  EXPECT_EQ(train::first_difference(a, b).key, "--learning_rate");
  json c = a;
  c["nested"]["x"] = 2;
  EXPECT_EQ(train::first_difference(a, c).key, "nested.x");
  json only_in_b = a;
  only_in_b["--use_ema"] = "true";
  const train::SettingDifference e = train::first_difference(a, only_in_b);
  EXPECT_EQ(e.key, "--use_ema");
  EXPECT_EQ(e.a, "(not set)");
}

TEST(RunAgreement, EqualSettingsPassOnThreeRanks) {
  const auto errors = dist::testing::run_world(3, [](int, dist::Communicator& comm) {
    train::check_ranks_agree(comm, {{"--resolution", "32"}, {"dataset size", 12}}, "the run");
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(RunAgreement, OneDisagreeingRankStopsEveryRankWithTheSameLine) {
  // Rank 2's settings are also much longer than the others': the exchange must not depend on equal sizes.
  const auto errors = dist::testing::run_world(3, [](int rank, dist::Communicator& comm) {
    json settings = {{"--resolution", "32"}, {"--learning_rate", "1e-4"}};
    if (rank == 2) {
      settings["--learning_rate"] = "5e-4";
      settings["--validation_prompts"] = std::string(5000, 'x');
    }
    train::check_ranks_agree(comm, settings, "the run");
  });
  const std::string expected =
      "ranks disagree on the run: --learning_rate is \"1e-4\" on rank 0 but \"5e-4\" on rank 2 (every rank must run "
      "the same command)";
  for (const auto& e : errors) EXPECT_EQ(e, expected);
}

}  // namespace
}  // namespace sd

#include "train/checkpoints.h"

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace sd::train {
namespace {

namespace fs = std::filesystem;

// A checkpoint-N folder, whole (with its manifest) or as a crash left it.
void make_checkpoint(const fs::path& output_dir, int step, bool whole = true) {
  const fs::path dir = output_dir / ("checkpoint-" + std::to_string(step));
  fs::create_directories(dir);
  if (whole) std::ofstream(dir / kManifestName) << "{}";
}

TEST(Checkpoints, LatestIsTheHighestWholeStepNotTheLastName) {
  sd::test::TempDir dir;
  for (int n : {10, 2, 100}) make_checkpoint(dir.path(), n);
  make_checkpoint(dir.path(), 200, /*whole=*/false);
  fs::create_directories(dir.path() / "checkpoint-x");
  std::ofstream(dir.path() / "checkpoint-5") << "a file, not a folder";
  EXPECT_EQ(resolve_checkpoint(dir.path(), "latest")->filename(), "checkpoint-100") << "checkpoint-200 is incomplete";
  EXPECT_EQ(list_checkpoints(dir.path()).size(), 3u);
  EXPECT_EQ(resolve_checkpoint(dir.path(), "checkpoint-2")->filename(), "checkpoint-2");
  EXPECT_FALSE(resolve_checkpoint(dir.path(), "").has_value());
}

TEST(Checkpoints, LatestWithNoneStartsFresh) {
  sd::test::TempDir dir;
  EXPECT_FALSE(resolve_checkpoint(dir.path(), "latest").has_value());
}

TEST(Checkpoints, MissingOrIncompleteNamedCheckpointIsAnError) {
  sd::test::TempDir dir;
  EXPECT_THROW(resolve_checkpoint(dir.path(), "checkpoint-7"), Error);
  make_checkpoint(dir.path(), 7, /*whole=*/false);
  try {
    resolve_checkpoint(dir.path(), "checkpoint-7");
    FAIL() << "an incomplete checkpoint must not resume";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Checkpoints, TotalLimitKeepsTheNewestWholeOnes) {
  sd::test::TempDir dir;
  for (int n : {1, 2, 3, 4}) make_checkpoint(dir.path(), n);
  remove_old_checkpoints(dir.path(), 2);
  auto left = list_checkpoints(dir.path());
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "checkpoint-3");
  EXPECT_EQ(left[1].filename(), "checkpoint-4");
  remove_old_checkpoints(dir.path(), std::nullopt);
  EXPECT_EQ(list_checkpoints(dir.path()).size(), 2u);
}

TEST(Checkpoints, PublishingReplacesAndPartialFoldersAreDiscarded) {
  sd::test::TempDir dir;
  make_checkpoint(dir.path(), 3);
  const fs::path partial = partial_checkpoint_path(dir.path() / "checkpoint-3");
  fs::create_directories(partial);
  std::ofstream(partial / "new") << "1";
  publish_checkpoint(partial, dir.path() / "checkpoint-3");
  EXPECT_TRUE(fs::exists(dir.path() / "checkpoint-3" / "new"));
  EXPECT_FALSE(fs::exists(partial));
  fs::create_directories(partial_checkpoint_path(dir.path() / "checkpoint-9"));
  discard_partial_checkpoints(dir.path());
  EXPECT_FALSE(fs::exists(partial_checkpoint_path(dir.path() / "checkpoint-9")));
  EXPECT_TRUE(fs::exists(dir.path() / "checkpoint-3"));
}

}  // namespace
}  // namespace sd::train

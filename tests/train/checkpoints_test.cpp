#include "train/checkpoints.h"

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace sd::train {
namespace {

namespace fs = std::filesystem;

TEST(Checkpoints, LatestIsTheHighestStepNotTheLastName) {
  sd::test::TempDir dir;
  for (int n : {10, 2, 100}) fs::create_directories(dir.path() / ("checkpoint-" + std::to_string(n)));
  fs::create_directories(dir.path() / "checkpoint-x");
  std::ofstream(dir.path() / "checkpoint-5") << "a file, not a folder";
  EXPECT_EQ(resolve_checkpoint(dir.path(), "latest")->filename(), "checkpoint-100");
  EXPECT_EQ(list_checkpoints(dir.path()).size(), 3u);
  EXPECT_EQ(resolve_checkpoint(dir.path(), "checkpoint-2")->filename(), "checkpoint-2");
  EXPECT_FALSE(resolve_checkpoint(dir.path(), "").has_value());
}

TEST(Checkpoints, LatestWithNoneStartsFresh) {
  sd::test::TempDir dir;
  EXPECT_FALSE(resolve_checkpoint(dir.path(), "latest").has_value());
}

TEST(Checkpoints, MissingNamedCheckpointIsAnError) {
  sd::test::TempDir dir;
  EXPECT_THROW(resolve_checkpoint(dir.path(), "checkpoint-7"), Error);
}

TEST(Checkpoints, TotalLimitLeavesRoomForTheNextOne) {
  sd::test::TempDir dir;
  for (int n : {1, 2, 3, 4}) fs::create_directories(dir.path() / ("checkpoint-" + std::to_string(n)));
  enforce_total_limit(dir.path(), 2);
  auto left = list_checkpoints(dir.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].filename(), "checkpoint-4");
  enforce_total_limit(dir.path(), std::nullopt);
  EXPECT_EQ(list_checkpoints(dir.path()).size(), 1u);
}

TEST(Checkpoints, AtomicDirectoryLeavesNothingOnFailure) {
  sd::test::TempDir dir;
  EXPECT_THROW(write_directory_atomically(dir.path() / "checkpoint-3",
                                          [](const fs::path& tmp) {
                                            std::ofstream(tmp / "half") << "x";
                                            throw Error("disk full");
                                          }),
               Error);
  EXPECT_TRUE(fs::is_empty(dir.path()));
  write_directory_atomically(dir.path() / "checkpoint-3", [](const fs::path& tmp) { std::ofstream(tmp / "a") << "1"; });
  write_directory_atomically(dir.path() / "checkpoint-3", [](const fs::path& tmp) { std::ofstream(tmp / "b") << "2"; });
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint-3" / "a"));
  EXPECT_TRUE(fs::exists(dir.path() / "checkpoint-3" / "b"));
}

}  // namespace
}  // namespace sd::train

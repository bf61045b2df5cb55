#include "io/atomic_file.h"

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace sd::io {
namespace {

namespace fs = std::filesystem;

TEST(AtomicFile, DirectoryLeavesNothingOnFailureAndReplacesWhole) {
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

TEST(AtomicFile, TextFileRoundTrip) {
  sd::test::TempDir dir;
  write_text_file(dir.path() / "sub" / "x.txt", "hello\n");
  EXPECT_EQ(read_text_file(dir.path() / "sub" / "x.txt"), "hello\n");
  EXPECT_THROW(read_text_file(dir.path() / "missing.txt"), Error);
}

}  // namespace
}  // namespace sd::io

#include "io/atomic_file.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace sd::io {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A folder "version" holding two files, so a half-written one is visible.
void fill_version(const fs::path& dir, const std::string& version) {
  std::ofstream(dir / "a") << version;
  std::ofstream(dir / "b") << version;
}

bool is_whole_version(const fs::path& dir, const std::string& version) {
  return fs::is_directory(dir) && read(dir / "a") == version && read(dir / "b") == version &&
         std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 2;
}

// Entries of `dir` other than the ones named.
std::vector<std::string> leftovers(const fs::path& dir, const std::set<std::string>& expected) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (!expected.count(e.path().filename().string())) out.push_back(e.path().filename().string());
  return out;
}

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

int g_kill_at_step = -1;
void kill_at_step(int step) {
  if (step == g_kill_at_step) _exit(0);  // as SIGKILL would: no unwinding, no cleanup
}

// A process replacing version "old" by "new" is killed while filling the new folder (step 0) or after each step of
// the replace (1: old moved aside, 2: new moved in, 3: old removed). Whatever it left, the folder (after recovery)
// is one whole version, never a mix or nothing, and the next write into it succeeds and leaves no leftovers.
TEST(AtomicFile, KilledAtAnyStepOfAReplaceLeavesAWholeVersionAndTheNextWriteSucceeds) {
  for (int step = 0; step <= 3; ++step) {
    SCOPED_TRACE("killed at step " + std::to_string(step));
    sd::test::TempDir dir;
    const fs::path target = dir.path() / "unet";
    write_directory_atomically(target, [](const fs::path& tmp) { fill_version(tmp, "old"); });
    const pid_t child = fork();
    if (child == 0) {
      g_kill_at_step = step;
      replace_directory_step_hook = kill_at_step;
      write_directory_atomically(target, [&](const fs::path& tmp) {
        std::ofstream(tmp / "a") << "new";
        if (step == 0) _exit(0);
        std::ofstream(tmp / "b") << "new";
      });
      _exit(1);  // not reached: the hook ended the process
    }
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    // Before any recovery a whole version exists under one of the two names.
    const fs::path old = dir.path() / "unet.old";
    const bool whole_somewhere =
        is_whole_version(target, step >= 2 ? "new" : "old") || (step == 1 && is_whole_version(old, "old"));
    EXPECT_TRUE(whole_somewhere);

    recover_interrupted_replace(target);
    EXPECT_TRUE(is_whole_version(target, step >= 2 ? "new" : "old"));
    EXPECT_EQ(leftovers(dir.path(), {"unet"}), std::vector<std::string>{});

    write_directory_atomically(target, [](const fs::path& tmp) { fill_version(tmp, "next"); });
    EXPECT_TRUE(is_whole_version(target, "next"));
    EXPECT_EQ(leftovers(dir.path(), {"unet"}), std::vector<std::string>{});
  }
}

// The states a kill leaves, laid out on disk: the next write into the folder must succeed (it failed with "rename:
// Directory not empty" when unet.old was left beside unet), and the scan at the start of a run puts right what no
// write will touch again, leaving other people's files alone.
TEST(AtomicFile, LeftoversOfAnInterruptedReplaceAreRecovered) {
  sd::test::TempDir dir;
  const fs::path& d = dir.path();
  for (const char* name : {"unet", "unet.old", "vae.old"}) {
    fs::create_directories(d / name);
    fill_version(d / name, name);
  }
  const std::string orphan = fmt::format("text_encoder.tmp{}", sd::test::dead_pid());
  fs::create_directories(d / orphan);
  std::ofstream(d / fmt::format("model_index.json.tmp{}", sd::test::dead_pid())) << "{";
  fs::create_directories(d / fmt::format(".partial-{}", sd::test::dead_pid()) / "unet");
  fs::create_directories(d / "notes.old");
  std::ofstream(d / "notes.tmp") << "mine";

  write_directory_atomically(d / "unet", [](const fs::path& tmp) { fill_version(tmp, "new"); });
  EXPECT_TRUE(is_whole_version(d / "unet", "new"));
  EXPECT_FALSE(fs::exists(d / "unet.old"));

  recover_interrupted_writes(d, [](const std::string& name) { return name == "unet" || name == "vae"; });
  EXPECT_TRUE(is_whole_version(d / "vae", "vae.old"));  // the last whole version, restored
  EXPECT_EQ(leftovers(d, {"unet", "vae", "notes.old", "notes.tmp"}), std::vector<std::string>{});
}

TEST(AtomicFile, WriteErrorsNameTheFileAndTheReason) {
  // /dev/full answers every write with ENOSPC, as a full disk does.
  FileWriter full("/dev/full", "out/learned_embeds.safetensors");
  const std::string error = sd::test::error_of([&] {
    full.write(std::string(1 << 16, 'x'));
    full.close();
  });
  EXPECT_EQ(error, "out/learned_embeds.safetensors: cannot write: No space left on device");
  EXPECT_EQ(sd::test::error_of([] { FileWriter("/nonexistent-dir/x.json"); }),
            "/nonexistent-dir/x.json: cannot open for writing: No such file or directory");
}

TEST(AtomicFile, OutputFolderProblemsNameTheFlagAndTheReason) {
  sd::test::TempDir dir;
  std::ofstream(dir.path() / "file") << "x";
  const std::string in_the_way = (dir.path() / "file").string();
  EXPECT_EQ(sd::test::error_of([&] { check_output_dir("--output_dir", dir.path() / "file" / "out"); }),
            fmt::format("--output_dir {}/out: cannot create the folder: Not a directory ({} is a file)", in_the_way,
                        in_the_way));
  EXPECT_EQ(sd::test::error_of([&] { check_output_dir("--out", dir.path() / "file"); }),
            fmt::format("--out {}: is a file, not a folder", in_the_way));
  EXPECT_EQ(sd::test::error_of([&] { check_output_dir("--output_dir", dir.path() / "new" / "deep"); }), "");
  // Nothing created (a command failing later leaves no empty folder), and the write probe is gone.
  EXPECT_EQ(leftovers(dir.path(), {"file"}), std::vector<std::string>{});
}

TEST(AtomicFile, OutputFileProblemsNameTheFlagAndTheReason) {
  sd::test::TempDir dir;
  fs::create_directories(dir.path() / "grid.png");
  EXPECT_EQ(sd::test::error_of([&] { check_output_file("--save_raw", dir.path() / "grid.png"); }),
            fmt::format("--save_raw {}: is a folder, not a file", (dir.path() / "grid.png").string()));
  std::ofstream(dir.path() / "file") << "x";
  EXPECT_EQ(sd::test::error_of([&] { check_output_file("OUTPUT", dir.path() / "file" / "m.safetensors"); }),
            fmt::format("OUTPUT {0}: is a file, not a folder", (dir.path() / "file").string()));
  EXPECT_EQ(sd::test::error_of([&] { check_output_file("OUTPUT", ""); }),
            "OUTPUT: expected a file name, got an empty path");
  EXPECT_EQ(sd::test::error_of([&] { check_output_file("OUTPUT", dir.path() / "new" / "m.safetensors"); }), "");
  EXPECT_EQ(leftovers(dir.path(), {"file", "grid.png"}), std::vector<std::string>{});
}

TEST(AtomicFile, CopyFolderCopiesEveryFileAndNamesAFullDiskAsSuch) {
  sd::test::TempDir dir;
  const fs::path from = dir.path() / "from";
  fs::create_directories(from / "sub" / "deeper");
  std::ofstream(from / "a.json") << "{}";
  std::ofstream(from / "sub" / "deeper" / "b.bin") << std::string(3 << 20, 'b');  // more than one 1 MiB chunk
  copy_folder(from, dir.path() / "to", "shown");
  EXPECT_EQ(read_text_file(dir.path() / "to" / "a.json"), "{}");
  EXPECT_EQ(read_text_file(dir.path() / "to" / "sub" / "deeper" / "b.bin"), std::string(3 << 20, 'b'));
  // A symlinked file and a symlinked folder (a Hugging Face cache's snapshot) are copied as what they point to.
  const fs::path elsewhere = dir.path() / "blobs";
  fs::create_directories(elsewhere / "folder");
  std::ofstream(elsewhere / "c.txt") << "c";
  std::ofstream(elsewhere / "folder" / "d.txt") << "d";
  const fs::path linked = dir.path() / "linked";
  fs::create_directories(linked);
  fs::create_symlink(elsewhere / "c.txt", linked / "c.txt");
  fs::create_directory_symlink(elsewhere / "folder", linked / "folder");
  copy_folder(linked, dir.path() / "linked_copy", "shown");
  EXPECT_FALSE(fs::is_symlink(dir.path() / "linked_copy" / "c.txt"));
  EXPECT_FALSE(fs::is_symlink(dir.path() / "linked_copy" / "folder"));
  EXPECT_EQ(read_text_file(dir.path() / "linked_copy" / "c.txt"), "c");
  EXPECT_EQ(read_text_file(dir.path() / "linked_copy" / "folder" / "d.txt"), "d");

  sd::test::Tmpfs small(dir.path() / "small", "size=64k");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << small.error() << ")";
  EXPECT_EQ(sd::test::error_of([&] { copy_folder(from, dir.path() / "small" / "to", "out/vae"); }),
            "out/vae/sub/deeper/b.bin: cannot write: No space left on device");
}

TEST(AtomicFile, FullAndReadOnlyFileSystemsAreNamed) {
  sd::test::TempDir dir;
  sd::test::Tmpfs small(dir.path() / "small", "size=64k");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << small.error() << ")";
  const fs::path full = dir.path() / "small" / "out";
  fs::create_directories(full);
  // Fill it: the probe's block no longer fits.
  {
    std::ofstream fill(dir.path() / "small" / "filler", std::ios::binary);
    fill << std::string(64 * 1024, 'x');
  }
  EXPECT_EQ(sd::test::error_of([&] { check_output_dir("--output_dir", full); }),
            fmt::format("--output_dir {}: cannot write there: No space left on device", full.string()));
  fs::remove(dir.path() / "small" / "filler");
  EXPECT_EQ(
      sd::test::error_of([&] {
        write_file_atomically(dir.path() / "small" / "big.safetensors",
                              [](FileWriter& out) { out.write(std::string(1 << 20, 'x')); });
      }),
      fmt::format("{}: cannot write: No space left on device", (dir.path() / "small" / "big.safetensors").string()));
  EXPECT_FALSE(fs::exists(dir.path() / "small" / "big.safetensors"));
  EXPECT_EQ(leftovers(dir.path() / "small", {"out"}), std::vector<std::string>{});  // no temporary file either

  ASSERT_TRUE(small.remount_read_only());
  EXPECT_EQ(sd::test::error_of([&] { check_output_dir("--output_dir", dir.path() / "small" / "ro"); }),
            fmt::format("--output_dir {}: cannot create the folder: Read-only file system",
                        (dir.path() / "small" / "ro").string()));
  EXPECT_EQ(sd::test::error_of([&] { check_output_dir("--output_dir", full); }),
            fmt::format("--output_dir {}: cannot write there: Read-only file system", full.string()));
}

TEST(AtomicFile, FilesystemErrorsAreDescribedInOneLine) {
  const fs::filesystem_error e("cannot rename", fs::path("out/unet"), fs::path("out/unet.old"),
                               std::make_error_code(std::errc::directory_not_empty));
  EXPECT_EQ(describe(e), "out/unet: cannot rename: Directory not empty");
}

TEST(AtomicFile, TextFileRoundTrip) {
  sd::test::TempDir dir;
  write_text_file(dir.path() / "sub" / "x.txt", "hello\n");
  EXPECT_EQ(read_text_file(dir.path() / "sub" / "x.txt"), "hello\n");
  EXPECT_THROW(read_text_file(dir.path() / "missing.txt"), Error);
}

}  // namespace
}  // namespace sd::io

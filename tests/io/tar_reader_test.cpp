#include "io/tar_reader.h"

#include <fstream>

#include "core/error.h"
#include "io/tar_builder.h"
#include "test_util.h"

namespace sd::io {
namespace {

using sd::test::TarBuilder;
using sd::test::TempDir;

std::vector<TarEntry> read_all(TarReader& reader) {
  std::vector<TarEntry> entries;
  while (std::optional<TarEntry> e = reader.next()) entries.push_back(std::move(*e));
  return entries;
}

std::vector<std::string> names_of(const std::vector<TarEntry>& entries) {
  std::vector<std::string> names;
  for (const TarEntry& e : entries) names.push_back(e.name);
  return names;
}

std::string error_of(const std::filesystem::path& path) {
  try {
    TarReader reader(path);
  } catch (const sd::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TarReader, ListsRegularFilesInOrderAndPassesOverDirectories) {
  TempDir dir;
  TarBuilder()
      .file("shard/", "", '5')
      .file("shard/000.jpg", std::string(700, 'x'))
      .file("shard/000.txt", "a cat")
      .file("shard/link", "", '2')
      .end()
      .write(dir.path() / "a.tar");
  TarReader reader(dir.path() / "a.tar");
  const std::vector<TarEntry> entries = read_all(reader);
  EXPECT_EQ(names_of(entries), (std::vector<std::string>{"shard/000.jpg", "shard/000.txt"}));
  // Each data block follows its header: directory header, jpg header, 700 bytes padded to 1024, txt header.
  EXPECT_EQ(entries[0].data_offset, 1024u);
  EXPECT_EQ(entries[0].size, 700u);
  EXPECT_EQ(entries[1].data_offset, 2560u);
  EXPECT_EQ(read_entry(dir.path() / "a.tar", entries[0]), std::string(700, 'x'));
  EXPECT_EQ(read_entry(dir.path() / "a.tar", entries[1]), "a cat");
  EXPECT_TRUE(reader.warnings().empty());
}

TEST(TarReader, ReadingAnEntryOfAVanishedOrShortenedArchiveIsAnErrorNamingIt) {
  TempDir dir;
  TarBuilder().file("0.jpg", std::string(2000, 'j')).end().write(dir.path() / "v.tar");
  TarReader reader(dir.path() / "v.tar");
  const TarEntry entry = *reader.next();
  std::filesystem::resize_file(dir.path() / "v.tar", 1000);
  try {
    read_entry(dir.path() / "v.tar", entry);
    ADD_FAILURE() << "no error";
  } catch (const sd::Error& e) {
    EXPECT_NE(std::string(e.what()).find("v.tar: member '0.jpg' (2000 bytes at offset 512) can no longer be read"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(dir.path() / "v.tar");
  try {
    read_entry(dir.path() / "v.tar", entry);
    ADD_FAILURE() << "no error";
  } catch (const sd::Error& e) {
    EXPECT_NE(std::string(e.what()).find("v.tar: cannot open the tar archive"), std::string::npos) << e.what();
  }
}

TEST(TarReader, ReadsWhatGnuTarWritesIncludingLongNamesInEveryFormat) {
  TempDir dir;
  const std::string long_dir = std::string(90, 'd') + "/" + std::string(60, 'e');
  std::filesystem::create_directories(dir.path() / "in" / long_dir);
  std::ofstream(dir.path() / "in" / long_dir / "000001.txt") << "long";
  std::ofstream(dir.path() / "in" / "000002.txt") << "short";
  for (const char* format : {"gnu", "ustar", "pax"}) {
    const auto tar = dir.path() / (std::string(format) + ".tar");
    const auto result = sd::test::run_command(fmt::format("tar --format={} -C {} -cf {} {} 000002.txt", format,
                                                          (dir.path() / "in").string(), tar.string(), long_dir));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    TarReader reader(tar);
    EXPECT_EQ(names_of(read_all(reader)), (std::vector<std::string>{long_dir + "/000001.txt", "000002.txt"})) << format;
    EXPECT_TRUE(reader.warnings().empty()) << format;
  }
}

TEST(TarReader, PaxRecordsOverrideTheNextHeader) {
  TempDir dir;
  // A pax record: its own length in decimal, "key=value", newline.
  TarBuilder().file("PaxHeaders/x", "22 path=renamed/0.txt\n", 'x').file("x", "data").end().write(dir.path() / "p.tar");
  TarReader reader(dir.path() / "p.tar");
  const std::vector<TarEntry> entries = read_all(reader);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].name, "renamed/0.txt");
}

TEST(TarReader, NotATarIsOneErrorNamingTheFile) {
  TempDir dir;
  std::ofstream(dir.path() / "small.tar") << "hello";
  EXPECT_NE(error_of(dir.path() / "small.tar").find("small.tar: not a tar archive"), std::string::npos);
  std::ofstream(dir.path() / "text.tar") << std::string(2000, 'z');
  EXPECT_EQ(error_of(dir.path() / "text.tar"),
            (dir.path() / "text.tar").string() + ": not a tar archive (its first 512 bytes are not a tar header)");
  std::ofstream(dir.path() / "z.tar") << std::string("\x1f\x8b\x08") + std::string(600, '\0');
  EXPECT_NE(error_of(dir.path() / "z.tar").find("z.tar: is gzip-compressed"), std::string::npos);
  EXPECT_NE(error_of(dir.path() / "missing.tar").find("missing.tar: cannot open"), std::string::npos);
}

TEST(TarReader, EmptyArchiveHasNoMembers) {
  TempDir dir;
  TarBuilder().end().write(dir.path() / "empty.tar");
  TarReader reader(dir.path() / "empty.tar");
  EXPECT_FALSE(reader.next().has_value());
  EXPECT_TRUE(reader.warnings().empty());
}

TEST(TarReader, TruncatedMemberEndsTheArchiveWithAWarningNamingIt) {
  TempDir dir;
  TarBuilder tar;
  tar.file("000.txt", "first").file("001.jpg", std::string(3000, 'j'));
  std::string bytes = tar.bytes();
  bytes.resize(bytes.size() - 2000);  // cut inside 001.jpg's data
  TarBuilder().raw(bytes).write(dir.path() / "cut.tar");
  TarReader reader(dir.path() / "cut.tar");
  EXPECT_EQ(names_of(read_all(reader)), std::vector<std::string>{"000.txt"});
  ASSERT_EQ(reader.warnings().size(), 1u);
  EXPECT_NE(reader.warnings()[0].find("cut.tar: member '001.jpg' at offset 1024: its 3000 bytes run past the end"),
            std::string::npos)
      << reader.warnings()[0];
  EXPECT_FALSE(reader.next().has_value());  // and stays ended
}

TEST(TarReader, SizeFarBeyondTheFileIsNeverAllocated) {
  TempDir dir;
  // 077777777777 octal = 8 GiB - 1, in an archive of a few blocks.
  TarBuilder()
      .raw(TarBuilder::header("huge.bin", 077777777777ull))
      .raw(std::string(512, 'h'))
      .write(dir.path() / "huge.tar");
  TarReader reader(dir.path() / "huge.tar");
  EXPECT_FALSE(reader.next().has_value());
  ASSERT_EQ(reader.warnings().size(), 1u);
  EXPECT_NE(reader.warnings()[0].find("member 'huge.bin'"), std::string::npos);
}

TEST(TarReader, BadChecksumStopsTheArchiveWithAWarning) {
  TempDir dir;
  std::string corrupt = TarBuilder::header("001.txt", 4);
  corrupt[0] = 'X';  // the name changes, the stored checksum does not
  TarBuilder().file("000.txt", "good").raw(corrupt).raw(std::string(512, 'd')).end().write(dir.path() / "bad.tar");
  TarReader reader(dir.path() / "bad.tar");
  EXPECT_EQ(names_of(read_all(reader)), std::vector<std::string>{"000.txt"});
  ASSERT_EQ(reader.warnings().size(), 1u);
  EXPECT_NE(reader.warnings()[0].find("bad.tar: bad tar header checksum at offset 1024"), std::string::npos);
}

TEST(TarReader, MissingEndBlocksOrAHalfHeaderAreWarnedAbout) {
  TempDir dir;
  TarBuilder().file("000.txt", "a").write(dir.path() / "noend.tar");
  TarReader noend(dir.path() / "noend.tar");
  EXPECT_EQ(read_all(noend).size(), 1u);
  ASSERT_EQ(noend.warnings().size(), 1u);
  EXPECT_NE(noend.warnings()[0].find("ends without tar's end-of-archive blocks"), std::string::npos);

  TarBuilder().file("000.txt", "a").raw(std::string(100, 'x')).write(dir.path() / "half.tar");
  TarReader half(dir.path() / "half.tar");
  EXPECT_EQ(read_all(half).size(), 1u);
  ASSERT_EQ(half.warnings().size(), 1u);
  EXPECT_NE(half.warnings()[0].find("truncated tar header at offset 1024"), std::string::npos);
}

TEST(TarReader, OversizedHeaderRecordsAreSkippedWithAWarning) {
  TempDir dir;
  const std::string huge_name(TarReader::kMaxRecordBytes + 1, 'n');
  TarBuilder().file("././@LongLink", huge_name, 'L').file("small.txt", "s").end().write(dir.path() / "l.tar");
  TarReader reader(dir.path() / "l.tar");
  EXPECT_EQ(names_of(read_all(reader)), std::vector<std::string>{"small.txt"});  // its own name, not the record's
  ASSERT_EQ(reader.warnings().size(), 1u);
  EXPECT_NE(reader.warnings()[0].find("header record '././@LongLink' is 1048577 bytes"), std::string::npos);
}

}  // namespace
}  // namespace sd::io

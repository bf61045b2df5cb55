// End-to-end: the sdtrain binary's init, inspect and tokenize subcommands, and its one-line errors.
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "test_util.h"

namespace sd {
namespace {

using sd::test::run_command;

std::string sdtrain(const std::string& args) { return sd::test::sdtrain_binary() + " " + args; }

TEST(Cli, InitTinyThenInspect) {
  sd::test::TempDir dir;
  auto init = run_command(sdtrain("init --preset tiny --out " + (dir.path() / "m").string() + " --seed 1"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  auto inspect = run_command(sdtrain("inspect " + (dir.path() / "m").string()));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("unet          UNet2DConditionModel         2.164452 M params  float32"),
            std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("Model has 4.737444 M parameters and 2.164452 M trainable"), std::string::npos)
      << inspect.output;
}

TEST(Cli, InitSd2BaseHasMosaicMLsParameterCount) {
  sd::test::TempDir dir;
  auto out = (dir.path() / "sd2").string();
  auto init = run_command(sdtrain("init --preset sd2-base --save_dtype float16 --out " + out));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  auto inspect = run_command(sdtrain("inspect " + out));
  EXPECT_NE(inspect.output.find("Model has 1289.952427 M parameters and 865.910724 M trainable"), std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("text_encoder  CLIPTextModel              340.387840 M params  float16"),
            std::string::npos)
      << inspect.output;
}

TEST(Cli, TokenizeMatchesTheReferenceTokenizer) {
  for (const char* model : {"tiny-sd1", "tiny-sd2"}) {
    const std::string key = std::string(model) == "tiny-sd1" ? "sd1" : "sd2";
    auto r = run_command(sdtrain("tokenize --model " + (sd::test::fixtures() / model).string() +
                                 " --add-token '<dicoo>' 'a photo of a <dicoo>' 'wow! amazing!!'"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(r.output);
    std::string line1, line2;
    std::getline(lines, line1);
    std::getline(lines, line2);
    auto ids = nlohmann::json::parse(line1);
    ASSERT_EQ(ids.size(), 77u);
    EXPECT_EQ(ids[0], 49406);
    EXPECT_EQ(ids[5], 49408);  // the added token, matched whole
    EXPECT_EQ(nlohmann::json::parse(line2)[2], key == "sd1" ? 256 : 0) << "'!' is an added token only in sd2";
  }
}

TEST(Cli, Errors) {
  EXPECT_TRUE(
      sd::test::is_one_line_error(run_command(sdtrain("inspect /nonexistent/model")), "/nonexistent/model: not found"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("tokenize --model /nonexistent/model hi")),
                                          "/nonexistent/model"));
  auto bad = run_command(sdtrain("init --preset sd3 --out /tmp/x"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--preset"), std::string::npos) << bad.output;
  auto unknown = run_command(sdtrain("frobnicate"));
  EXPECT_NE(unknown.exit_code, 0);
}

}  // namespace
}  // namespace sd

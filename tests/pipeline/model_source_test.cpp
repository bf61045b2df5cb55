// Resolving a model name: local folders and single files, and Hugging Face Hub names from a cache laid out as
// huggingface_hub lays it out (refs/<branch>, snapshots/<commit>/ of symlinks into blobs/), found through
// HF_HUB_CACHE / HF_HOME, by branch or commit; a name that is not cached says where it looked and how to fetch it.
#include "pipeline/model_source.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "io/hub_cache.h"
#include "io/hub_cache_util.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

namespace fs = std::filesystem;
using sd::test::fixtures;
using sd::test::ScopedEnv;
using sd::test::TempDir;

const std::string kCommit = "39593d5650112b4cc580433f6b0435385882d819";
const std::string kOtherCommit = "1111111111111111111111111111111111111111";

// A request as the flags give it (aggregate initialisation would leave the later members to -Wextra's warning).
ModelRequest request(std::string name_or_path, std::string revision = "", std::string variant = "",
                     std::string config_from = "") {
  ModelRequest r;
  r.name_or_path = std::move(name_or_path);
  r.revision = std::move(revision);
  r.variant = std::move(variant);
  r.config_from = std::move(config_from);
  return r;
}

std::string error_of(const ModelRequest& request) {
  try {
    resolve_model(request);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    return e.what();
  }
  return "";
}

TEST(ModelSource, LocalFoldersAndFiles) {
  const ModelSource folder = resolve_model(request((fixtures() / "tiny-sd1").string(), "", "fp16"));
  EXPECT_EQ(folder.kind, ModelSource::Kind::kPipelineFolder);
  EXPECT_EQ(folder.variant, "fp16");
  const fs::path file = fixtures() / "formats" / "tiny-sd1-ldm.safetensors";
  const ModelSource single = resolve_model(request(file.string(), "", "", (fixtures() / "tiny-sd1").string()));
  EXPECT_EQ(single.kind, ModelSource::Kind::kSingleFile);
  EXPECT_EQ(single.config_from.string(), (fixtures() / "tiny-sd1").string());
  EXPECT_NE(error_of(request(file.string(), "", "fp16")).find("--variant applies to pipeline folders"),
            std::string::npos);
  EXPECT_NE(error_of(request((fixtures() / "tiny-sd1").string(), "", "", "x")).find("--config_from"),
            std::string::npos);
  EXPECT_NE(error_of(request("/no/such/model")).find("/no/such/model: not found"), std::string::npos);
}

TEST(ModelSource, HubNamesResolveFromTheCache) {
  TempDir cache;
  sd::test::add_to_hub_cache(cache.path(), "sdtrain-test/tiny-sd1", fixtures() / "tiny-sd1", kCommit, "main");
  sd::test::add_to_hub_cache(cache.path(), "sdtrain-test/tiny-sd1", fixtures() / "formats" / "tiny-sd1-bin",
                             kOtherCommit, "bin");
  ScopedEnv env("HF_HUB_CACHE", cache.path().string());
  const fs::path repo = cache.path() / "models--sdtrain-test--tiny-sd1";

  const ModelSource main = resolve_model(request("sdtrain-test/tiny-sd1"));
  EXPECT_EQ(main.kind, ModelSource::Kind::kPipelineFolder);
  EXPECT_EQ(main.path.string(), (repo / "snapshots" / kCommit).string());
  EXPECT_EQ(resolve_model(request("sdtrain-test/tiny-sd1", "bin")).path.string(),
            (repo / "snapshots" / kOtherCommit).string());
  EXPECT_EQ(resolve_model(request("sdtrain-test/tiny-sd1", kOtherCommit)).path.string(),
            (repo / "snapshots" / kOtherCommit).string());

  // The snapshot loads through its symlinks like any folder.
  StableDiffusion from_cache = load_pipeline(resolve_model(request("sdtrain-test/tiny-sd1", "bin")));
  StableDiffusion expected = load_pipeline(fixtures() / "tiny-sd1");
  EXPECT_TRUE(at::equal(from_cache.unet->conv_in->weight, expected.unet->conv_in->weight));

  const std::string missing = error_of(request("sdtrain-test/absent"));
  EXPECT_NE(missing.find((cache.path() / "models--sdtrain-test--absent").string()), std::string::npos) << missing;
  EXPECT_NE(missing.find("huggingface-cli download sdtrain-test/absent"), std::string::npos) << missing;
  const std::string branch = error_of(request("sdtrain-test/tiny-sd1", "v2"));
  EXPECT_NE(branch.find((repo / "refs" / "v2").string()), std::string::npos) << branch;
  EXPECT_NE(branch.find("--revision v2"), std::string::npos) << branch;
  EXPECT_NE(error_of(request("sdtrain-test/tiny-sd1", "2222222222222222222222222222222222222222")).find("no snapshot"),
            std::string::npos);
  EXPECT_NE(error_of(request("sdtrain-test/tiny-sd1", "../../x")).find("--revision"), std::string::npos);
}

TEST(ModelSource, CacheLocationFollowsHuggingfaceHub) {
  ScopedEnv no_cache("HF_HUB_CACHE", "");
  {
    ScopedEnv home("HF_HOME", "/hf-home");
    EXPECT_EQ(io::hub_cache_dir().string(), "/hf-home/hub");
  }
  ScopedEnv no_home("HF_HOME", "");
  ScopedEnv user("HOME", "/home/u");
  EXPECT_EQ(io::hub_cache_dir().string(), "/home/u/.cache/huggingface/hub");
  ScopedEnv cache("HF_HUB_CACHE", "/elsewhere");
  EXPECT_EQ(io::hub_cache_dir().string(), "/elsewhere");
}

TEST(ModelSource, RepoIdsAreValidated) {
  EXPECT_TRUE(io::is_hub_repo_id("runwayml/stable-diffusion-v1-5"));
  EXPECT_TRUE(io::is_hub_repo_id("gpt2"));
  EXPECT_FALSE(io::is_hub_repo_id("a/b/c"));
  EXPECT_FALSE(io::is_hub_repo_id("../x"));
  EXPECT_FALSE(io::is_hub_repo_id("a--b/c"));
  EXPECT_FALSE(io::is_hub_repo_id("/abs/path"));
}

}  // namespace
}  // namespace sd::pipeline

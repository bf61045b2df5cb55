// Resuming the trained state from a checkpoint that was damaged: every way it can be wrong is one line naming the
// file (and tensor) and what is wrong, never a resume that goes on as if nothing happened.
#include "train/trainable_parameters.h"

#include <limits>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sd::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Two small trained tensors after one AdamW step and one EMA update, so every state (weights, both moments, EMA
// shadow) is non-trivial.
class Trained {
 public:
  Trained() : params_(make(), with_ema(), std::make_shared<dist::LocalCommunicator>()) {
    const at::Tensor loss = (params_.parameters()[0].tensor.sum() * 3 + params_.parameters()[1].tensor.pow(2).sum());
    params_.backward(loss, true, true);
    params_.reduce_gradients(1, std::nullopt);
    params_.step(1e-2);
  }
  TrainableParameters& get() { return params_; }

 private:
  static TrainableOptions with_ema() {
    TrainableOptions options;
    options.ema = EmaOptions{};
    return options;
  }
  static std::vector<NamedParameter> make() {
    return {{"w", at::randn({3, 4}).requires_grad_()}, {"b", at::randn({4}).requires_grad_()}};
  }
  TrainableParameters params_;
};

struct Saved {
  sd::test::TempDir dir;
  json manifest;
};

std::unique_ptr<Saved> save_one() {
  auto saved = std::make_unique<Saved>();
  Trained trained;
  saved->manifest = trained.get().save(saved->dir.path(), WholeTensorFiles{});
  return saved;
}

// The error a fresh run gets resuming from `saved` after `damage`.
std::string resume_error(const std::function<void(const fs::path& dir, json& manifest)>& damage) {
  auto saved = save_one();
  damage(saved->dir.path(), saved->manifest);
  Trained fresh;
  return sd::test::error_of([&] { fresh.get().load(saved->dir.path(), saved->manifest); });
}

// Rewrites one tensor of a checkpoint file.
void edit_tensor(const fs::path& file, const std::string& key, const std::function<at::Tensor(at::Tensor)>& edit) {
  io::TensorMap tensors = io::load_safetensors(file);
  tensors[key] = edit(tensors.at(key));
  io::save_safetensors(file, tensors);
}

TEST(TrainableParametersResume, AnUndamagedCheckpointLoads) {
  EXPECT_EQ(resume_error([](const fs::path&, json&) {}), "");
}

// Parameters are matched by name: a run that lists them in another order (another bucket layout) resumes the same
// state, and one that trains other tensors is told which.
TEST(TrainableParametersResume, MatchesParametersByNameNotPosition) {
  auto saved = save_one();
  TrainableOptions options;
  options.ema = EmaOptions{};
  auto run_of = [&](std::vector<NamedParameter> params) {
    return std::make_unique<TrainableParameters>(std::move(params), options,
                                                 std::make_shared<dist::LocalCommunicator>());
  };
  auto reordered = run_of({{"b", at::zeros({4}).requires_grad_()}, {"w", at::zeros({3, 4}).requires_grad_()}});
  reordered->load(saved->dir.path(), saved->manifest);
  const io::TensorMap stored = io::load_safetensors(saved->dir.path() / "model.safetensors");
  const io::TensorMap stored_ema = io::load_safetensors(saved->dir.path() / "ema.safetensors");
  for (const std::string name : {"w", "b"}) {
    EXPECT_TRUE(at::equal(reordered->gather(StateKind::kMaster).at(name), stored.at(name))) << name;
    EXPECT_TRUE(at::equal(reordered->gather(StateKind::kEma).at(name), stored_ema.at(name))) << name;
  }
  auto renamed = run_of({{"w", at::zeros({3, 4}).requires_grad_()}, {"bias", at::zeros({4}).requires_grad_()}});
  EXPECT_NE(sd::test::error_of([&] {
              renamed->load(saved->dir.path(), saved->manifest);
            }).find("the checkpoint does not train bias, which this run trains"),
            std::string::npos);
}

// Routed parameters (a trained text encoder beside the UNet) are kept whole in files of their own under the rest of
// their names, their optimizer state with everyone's, and resume from there.
TEST(TrainableParametersResume, RoutedParametersHaveFilesOfTheirOwnAndResume) {
  TrainableOptions options;
  options.ema = EmaOptions{};
  auto run_of = [&](const at::Tensor& w, const at::Tensor& b) {
    return std::make_unique<TrainableParameters>(
        std::vector<NamedParameter>{{"text.w", w.clone().requires_grad_()}, {"b", b.clone().requires_grad_()}}, options,
        std::make_shared<dist::LocalCommunicator>());
  };
  const at::Tensor w = at::randn({3, 4}), b = at::randn({4});
  auto trained = run_of(w, b);
  const at::Tensor loss = trained->parameters()[0].tensor.pow(3).sum() + trained->parameters()[1].tensor.sum();
  trained->backward(loss, true, true);
  trained->reduce_gradients(1, std::nullopt);
  trained->step(1e-2);
  WholeTensorFiles files;
  files.routes.push_back({"text.", "text/model.safetensors", "text_ema/model.safetensors"});
  sd::test::TempDir dir;
  const json manifest = trained->save(dir.path(), files);

  const io::TensorMap masters = trained->gather(StateKind::kMaster), emas = trained->gather(StateKind::kEma);
  const io::TensorMap text = io::load_safetensors(dir.path() / "text" / "model.safetensors");
  const io::TensorMap text_ema = io::load_safetensors(dir.path() / "text_ema" / "model.safetensors");
  const io::TensorMap rest = io::load_safetensors(dir.path() / "model.safetensors");
  ASSERT_EQ(text.size(), 1U);
  ASSERT_EQ(text_ema.size(), 1U);
  ASSERT_EQ(rest.size(), 1U);
  EXPECT_TRUE(at::equal(text.at("w"), masters.at("text.w")));
  EXPECT_TRUE(at::equal(text_ema.at("w"), emas.at("text.w")));
  EXPECT_TRUE(at::equal(rest.at("b"), masters.at("b")));
  EXPECT_EQ(io::load_safetensors(dir.path() / "optimizer.safetensors").count("text.w.exp_avg"), 1U);

  auto resumed = run_of(at::zeros_like(w), at::zeros_like(b));
  resumed->load(dir.path(), manifest);
  for (StateKind kind : {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq, StateKind::kEma}) {
    const io::TensorMap want = trained->gather(kind), got = resumed->gather(kind);
    for (const auto& [name, t] : want) EXPECT_TRUE(at::equal(got.at(name), t)) << state_kind_name(kind) << name;
  }
}

TEST(TrainableParametersResume, ManifestDamageIsNamed) {
  EXPECT_NE(resume_error([](const fs::path&, json& m) {
              m["optimizer_steps"] = -3;
            }).find("manifest.json: negative optimizer step count -3"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path&, json& m) { m.erase("optimizer_steps"); })
                .find("manifest.json: malformed trained state ([json.exception.out_of_range.403] key "
                      "'optimizer_steps' not found)"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path&, json& m) {
              m["optimizer_steps"] = "many";
            }).find("manifest.json: malformed trained state"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path&, json& m) {
              m["ema_optimization_step"] = 5;
            }).find("manifest.json: EMA step 5 is outside 0..1 (the optimizer steps)"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path&, json& m) {
              m["parameters"][0]["shape"] = {3, -4};
            }).find("manifest.json: trained tensor w has an impossible shape [3, -4]"),
            std::string::npos);
}

TEST(TrainableParametersResume, MissingOrEmptyOptimizerStateIsNamed) {
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              io::save_safetensors(dir / "optimizer.safetensors", {});
            }).find("optimizer.safetensors: missing tensor 'b.exp_avg'"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              io::TensorMap t = io::load_safetensors(dir / "optimizer.safetensors");
              t.erase("w.exp_avg_sq");
              io::save_safetensors(dir / "optimizer.safetensors", t);
            }).find("optimizer.safetensors: missing tensor 'w.exp_avg_sq'"),
            std::string::npos);
}

TEST(TrainableParametersResume, DamagedTensorsAreNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(resume_error([&](const fs::path& dir, json&) {
              edit_tensor(dir / "optimizer.safetensors", "w.exp_avg",
                          [&](at::Tensor t) { return t.index_fill(0, at::tensor({int64_t{1}}), nan); });
            }).find("optimizer.safetensors: tensor 'w.exp_avg' holds 4 NaN or infinite values (exp_avg state)"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              edit_tensor(dir / "optimizer.safetensors", "b.exp_avg_sq", [](at::Tensor t) { return -t - 1; });
            }).find("optimizer.safetensors: tensor 'b.exp_avg_sq' holds negative second moments"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              edit_tensor(dir / "model.safetensors", "w", [](at::Tensor t) { return t.t().contiguous(); });
            }).find("model.safetensors: tensor 'w' has shape [4, 3], its parameter [3, 4]"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              edit_tensor(dir / "model.safetensors", "b", [](at::Tensor t) { return t.to(at::kHalf); });
            }).find("model.safetensors: tensor 'b' is Half, expected float32 master state"),
            std::string::npos);
}

TEST(TrainableParametersResume, DamagedEmaWeightsAreNamed) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_NE(resume_error([&](const fs::path& dir, json&) {
              edit_tensor(dir / "ema.safetensors", "b", [&](at::Tensor t) { return t.fill_(inf); });
            }).find("ema.safetensors: tensor 'b' holds 4 NaN or infinite values (ema state)"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              edit_tensor(dir / "ema.safetensors", "w", [](at::Tensor t) { return t.reshape({12}); });
            }).find("ema.safetensors: tensor 'w' has shape [12], its parameter [3, 4]"),
            std::string::npos);
  EXPECT_NE(resume_error([](const fs::path& dir, json&) {
              io::TensorMap t = io::load_safetensors(dir / "ema.safetensors");
              t.erase("b");
              io::save_safetensors(dir / "ema.safetensors", t);
            }).find("ema.safetensors: missing tensor 'b'"),
            std::string::npos);
}

}  // namespace
}  // namespace sd::train

#include "train/trainable_parameters.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "io/tensor_file.h"
#include "perf/op_profiler.h"
#include "train/gradient_norm.h"

namespace sd::train {

namespace fs = std::filesystem;
using nlohmann::json;

Sharding parse_sharding(const std::string& name) {
  if (name == "no_shard") return Sharding::kNoShard;
  if (name == "shard_grad_op") return Sharding::kShardGradOp;
  fail("--sharding: expected no_shard or shard_grad_op, got '{}'", name);
}

std::string sharding_name(Sharding sharding) {
  return sharding == Sharding::kShardGradOp ? "shard_grad_op" : "no_shard";
}

const char* state_kind_name(StateKind kind) {
  switch (kind) {
    case StateKind::kMaster: return "master";
    case StateKind::kExpAvg: return "exp_avg";
    case StateKind::kExpAvgSq: return "exp_avg_sq";
    case StateKind::kEma: return "ema";
  }
  return "?";
}

namespace {

std::string fill_key(const std::string& pattern, const std::string& name) {
  std::string key = pattern;
  const auto at = key.find("{}");
  if (at != std::string::npos) key.replace(at, 2, name);
  return key;
}

std::string shard_file(int rank, int world) {
  return fmt::format("shards/rank-{:05}-of-{:05}.safetensors", rank, world);
}

// A manifest's whole_files entry for one state: {"file", "key"} for every parameter, and for the weights and EMA
// the routes that send some parameters to files of their own.
json whole_files_entry(const WholeTensorFiles& whole, StateKind kind) {
  switch (kind) {
    case StateKind::kExpAvg: return {{"file", whole.optimizer_file}, {"key", "{}.exp_avg"}};
    case StateKind::kExpAvgSq: return {{"file", whole.optimizer_file}, {"key", "{}.exp_avg_sq"}};
    case StateKind::kMaster:
    case StateKind::kEma: break;
  }
  const bool master = kind == StateKind::kMaster;
  json entry = {{"file", master ? whole.master_file : whole.ema_file},
                {"key", master ? whole.master_key : whole.ema_key}};
  for (const WholeFileRoute& route : whole.routes)
    entry["routes"].push_back({{"prefix", route.prefix}, {"file", master ? route.master_file : route.ema_file}});
  return entry;
}

// The file and key where `entry` (whole_files_entry's form) stores the whole tensor of parameter `name`.
std::pair<std::string, std::string> whole_location(const json& entry, const std::string& name) {
  for (const json& route : entry.value("routes", json::array())) {
    const auto prefix = route.at("prefix").get<std::string>();
    if (name.rfind(prefix, 0) == 0) return {route.at("file").get<std::string>(), name.substr(prefix.size())};
  }
  return {entry.at("file").get<std::string>(), fill_key(entry.at("key").get<std::string>(), name)};
}

}  // namespace

TrainableParameters::TrainableParameters(std::vector<NamedParameter> params, TrainableOptions options,
                                         std::shared_ptr<dist::Communicator> comm)
    : params_(std::move(params)),
      options_(std::move(options)),
      comm_(std::move(comm)),
      rank_(comm_->rank()),
      adam_(options_.adam) {
  SD_CHECK(!params_.empty(), "nothing to train: the task has no trainable parameters");
  std::vector<int64_t> numels;
  for (const auto& p : params_) {
    SD_CHECK(p.tensor.defined() && p.tensor.is_leaf() && p.tensor.requires_grad(),
             "trainable parameter {} must be a leaf tensor that requires grad", p.name);
    numels.push_back(p.tensor.numel());
    numel_ += p.tensor.numel();
  }
  const bool sharded = options_.sharding == Sharding::kShardGradOp;
  layout_ = std::make_unique<dist::BucketLayout>(numels, std::max<int64_t>(1, options_.bucket_cap_bytes / 4),
                                                 comm_->world_size(), sharded);
  const at::ScalarType compute = options_.precision.compute;
  const bool master_is_compute = compute == at::kFloat;
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < layout_->buckets().size(); ++b) {
    const dist::Bucket& bucket = layout_->buckets()[b];
    const int64_t owned_begin = layout_->owned_begin(b, rank_), owned_numel = layout_->owned_numel(b, rank_);
    compute_.push_back(at::zeros({bucket.padded_numel}, at::TensorOptions().dtype(compute)));
    master_.push_back(master_is_compute ? compute_[b].narrow(0, owned_begin, owned_numel)
                                        : at::zeros({owned_numel}, at::kFloat));
    // The float32 starting values go into the master slice before the parameters become (maybe lossy) views.
    if (!master_is_compute)
      for (const dist::OwnedPiece& piece : layout_->owned_pieces(b, rank_))
        master_[b]
            .narrow(0, piece.offset, piece.end - piece.begin)
            .copy_(params_[piece.param].tensor.detach().reshape({-1}).narrow(0, piece.begin, piece.end - piece.begin));
    for (const dist::BucketSlot& slot : bucket.slots) {
      at::Tensor& p = params_[slot.param].tensor;
      at::Tensor view = compute_[b].narrow(0, slot.offset, slot.numel);
      view.copy_(p.detach().reshape({-1}));
      p.set_data(view.view(p.sizes()));
    }
  }
  std::vector<at::Tensor> zeros_m, zeros_v;
  for (const auto& m : master_) {
    zeros_m.push_back(at::zeros_like(m));
    zeros_v.push_back(at::zeros_like(m));
  }
  adam_.set_state(std::move(zeros_m), std::move(zeros_v), 0);
  if (options_.ema) ema_.emplace(*options_.ema, master_);
  std::vector<at::Tensor> leaves;
  for (const auto& p : params_) leaves.push_back(p.tensor);
  // After set_data: the parameters' gradient accumulators are (re)created for the new dtype only now.
  reducer_ = std::make_unique<dist::GradientReducer>(comm_, std::move(leaves), *layout_);
}

void TrainableParameters::backward(const at::Tensor& loss, bool first_micro_batch, bool last_micro_batch) {
  reducer_->begin_micro_batch(first_micro_batch, last_micro_batch);
  loss.backward();
  reducer_->end_micro_batch();
}

double TrainableParameters::reduce_gradients(int64_t micro_batches, std::optional<double> max_norm) {
  at::NoGradGuard no_grad;
  {
    SD_PERF_SCOPE("sdtrain::communication");
    grads_ = reducer_->finish();
  }
  // One norm per parameter (piece), as torch's clip_grad_norm_ takes them: a float32 norm over a whole bucket of
  // millions of elements would lose digits.
  double sum_of_squares = 0;
  {
    SD_PERF_SCOPE("sdtrain::optimizer");  // clip_grad_norm_'s pass over the gradients
    std::vector<at::Tensor> pieces;
    for (size_t b = 0; b < grads_.size(); ++b)
      for (const dist::OwnedPiece& piece : layout_->owned_pieces(b, rank_))
        pieces.push_back(narrow_pieces(grads_[b], piece.offset, piece.end - piece.begin));
    sum_of_squares = sum_of_squared_l2_norms(pieces);
  }
  if (layout_->sharded() && comm_->world_size() > 1) {
    SD_PERF_SCOPE("sdtrain::communication");
    std::vector<at::Tensor> total{at::tensor(sum_of_squares, at::kDouble)};
    comm_->allreduce_sum(total);
    sum_of_squares = total[0].item<double>();
  }
  // The mean over the global batch and the clipping are one factor, applied inside the optimizer's pass.
  const auto mean = static_cast<float>(1.0 / static_cast<double>(micro_batches * comm_->world_size()));
  const float total_norm = static_cast<float>(std::sqrt(sum_of_squares)) * mean;
  grad_multiplier_ = mean;
  if (max_norm) {
    // torch's clip_grad_norm_ in float32: max_norm * reciprocal(total_norm + 1e-6), clamped to 1.
    const float coefficient = (1.0f / (total_norm + 1e-6f)) * static_cast<float>(*max_norm);
    if (coefficient < 1.0f) grad_multiplier_ *= coefficient;
  }
  return total_norm;
}

void TrainableParameters::step(double lr) {
  SD_CHECK(grads_.size() == master_.size(), "optimizer step without reduced gradients");
  {
    SD_PERF_SCOPE("sdtrain::optimizer");
    // AdamW's pass also writes this rank's compute weights in bf16 (in float32 they are the masters themselves) and
    // moves the EMA.
    AdamWFollowers followers;
    if (options_.precision.compute == at::kBFloat16) followers.rounded_copies = owned_compute_weights();
    if (ema_) {
      followers.ema_shadows = ema_->shadow();
      followers.ema_one_minus_decay = ema_->advance();
    }
    adam_.step(master_, grads_, lr, grad_multiplier_, followers);
  }
  all_gather_compute_weights();
  grads_.clear();
}

at::Tensor TrainableParameters::gradient(size_t i) const {
  SD_CHECK(!grads_.empty(), "no reduced gradients (call reduce_gradients first)");
  SD_CHECK(!layout_->sharded() || comm_->world_size() == 1, "a sharded rank holds only its part of each gradient");
  const dist::BucketSlot& slot = layout_->slot_of(i);
  return narrow_pieces(grads_[layout_->bucket_of(i)], slot.offset, slot.numel)
             .view(params_[i].tensor.sizes())
             .to(at::kFloat) *
         grad_multiplier_;
}

std::vector<at::Tensor>& TrainableParameters::state_of(StateKind kind) {
  switch (kind) {
    case StateKind::kMaster: return master_;
    case StateKind::kExpAvg: return adam_.exp_avg();
    case StateKind::kExpAvgSq: return adam_.exp_avg_sq();
    case StateKind::kEma:
      SD_CHECK(ema_.has_value(), "this run keeps no EMA weights (--use_ema)");
      return ema_->shadow();
  }
  fail("unknown state kind");
}

std::vector<at::Tensor> TrainableParameters::owned_compute_weights() {
  std::vector<at::Tensor> owned;
  for (size_t b = 0; b < compute_.size(); ++b)
    owned.push_back(compute_[b].narrow(0, layout_->owned_begin(b, rank_), layout_->owned_numel(b, rank_)));
  return owned;
}

void TrainableParameters::refresh_compute_weights(StateKind from) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor>& source = state_of(from);
  std::vector<at::Tensor> owned = owned_compute_weights();
  for (size_t b = 0; b < owned.size(); ++b)
    if (!owned[b].is_same(source[b])) owned[b].copy_(source[b]);
  all_gather_compute_weights();
}

void TrainableParameters::all_gather_compute_weights() {
  if (!layout_->sharded() || comm_->world_size() == 1) return;
  SD_PERF_SCOPE("sdtrain::communication");
  std::vector<std::unique_ptr<dist::PendingCollective>> pending;
  for (auto& c : compute_) pending.push_back(comm_->all_gather_async(c));
  for (auto& p : pending) p->wait();
}

io::TensorMap TrainableParameters::gather(StateKind kind) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor>& state = state_of(kind);
  io::TensorMap out;
  const bool distributed = layout_->sharded() && comm_->world_size() > 1;
  for (size_t b = 0; b < state.size(); ++b) {
    at::Tensor whole = state[b];
    if (distributed) {
      whole = at::zeros({layout_->buckets()[b].padded_numel}, at::kFloat);
      whole.narrow(0, layout_->owned_begin(b, rank_), layout_->owned_numel(b, rank_)).copy_(state[b]);
      comm_->all_gather_async(whole)->wait();
    }
    if (rank_ != 0) continue;
    for (const dist::BucketSlot& slot : layout_->buckets()[b].slots) {
      const NamedParameter& p = params_[slot.param];
      out[p.name] = whole.narrow(0, slot.offset, slot.numel).view(p.tensor.sizes()).clone();
    }
  }
  return out;
}

std::unique_ptr<TrainableParameters::ComputeSwap> TrainableParameters::swap_in_ema() {
  SD_CHECK(ema_.has_value(), "no EMA weights to swap in");
  auto guard = std::make_unique<ComputeSwap>(this);
  // In float32 the masters live inside the compute buffers: keep them aside until the guard restores them.
  if (options_.precision.compute == at::kFloat)
    for (const auto& m : master_) guard->saved_masters_.push_back(m.clone());
  refresh_compute_weights(StateKind::kEma);
  return guard;
}

TrainableParameters::ComputeSwap::~ComputeSwap() {
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < saved_masters_.size(); ++b) owner_->master_[b].copy_(saved_masters_[b]);
  owner_->refresh_compute_weights(StateKind::kMaster);
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoints. Without sharding rank 0 holds every state whole and writes it under the parameters' own names (so
// the files are useful alone); with sharding every rank writes the pieces of its slices. The returned JSON lists
// where every piece of every state is, so a checkpoint loads into any world size and either sharding mode.

json TrainableParameters::save(const fs::path& dir, const WholeTensorFiles& whole) {
  std::vector<StateKind> kinds = {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq};
  if (ema_) kinds.push_back(StateKind::kEma);
  json manifest = {{"sharding", sharding_name(options_.sharding)},
                   {"world_size", comm_->world_size()},
                   {"optimizer_steps", adam_.steps()},
                   {"ema_optimization_step", ema_ ? ema_->optimization_step() : 0}};
  json parameters = json::array();
  for (const auto& p : params_) parameters.push_back({{"name", p.name}, {"shape", p.tensor.sizes().vec()}});
  manifest["parameters"] = std::move(parameters);

  if (!layout_->sharded() || comm_->world_size() == 1) {
    json files = json::object();
    std::map<std::string, io::TensorMap> contents;
    for (StateKind kind : kinds) {
      const json entry = whole_files_entry(whole, kind);
      files[state_kind_name(kind)] = entry;
      if (rank_ != 0) continue;
      for (auto& [name, tensor] : gather(kind)) {
        const auto [file, key] = whole_location(entry, name);
        contents[file][key] = std::move(tensor);
      }
    }
    for (const auto& [file, tensors] : contents) {
      fs::create_directories((dir / file).parent_path());
      io::save_safetensors(dir / file, tensors);
    }
    manifest["whole_files"] = std::move(files);
    return manifest;
  }

  // Sharded: every rank writes its own file; the piece list is the same computation on every rank.
  io::TensorMap mine;
  json pieces = json::array();
  for (int r = 0; r < comm_->world_size(); ++r) {
    const std::string file = shard_file(r, comm_->world_size());
    for (size_t b = 0; b < layout_->buckets().size(); ++b) {
      for (const dist::OwnedPiece& piece : layout_->owned_pieces(b, r)) {
        const std::string& name = params_[piece.param].name;
        for (StateKind kind : kinds) {
          const std::string key = fmt::format("{}/{}", state_kind_name(kind), name);
          pieces.push_back({{"kind", state_kind_name(kind)},
                            {"param", name},
                            {"file", file},
                            {"key", key},
                            {"begin", piece.begin},
                            {"end", piece.end}});
          if (r == rank_) mine[key] = state_of(kind)[b].narrow(0, piece.offset, piece.end - piece.begin);
        }
      }
    }
  }
  fs::create_directories((dir / shard_file(rank_, comm_->world_size())).parent_path());
  io::save_safetensors(dir / shard_file(rank_, comm_->world_size()), mine);
  mine.clear();
  // The weights (and their EMA) also whole, where an unsharded checkpoint keeps them: what diffusers and `sdtrain
  // generate` load. A resume reads the pieces; one kind at a time is gathered, to bound rank 0's memory.
  write_whole(dir, StateKind::kMaster, whole_files_entry(whole, StateKind::kMaster));
  if (ema_) write_whole(dir, StateKind::kEma, whole_files_entry(whole, StateKind::kEma));
  manifest["pieces"] = std::move(pieces);
  return manifest;
}

void TrainableParameters::write_whole(const fs::path& dir, StateKind kind, const json& entry) {
  std::map<std::string, io::TensorMap> contents;
  for (auto& [name, tensor] : gather(kind)) {
    const auto [file, key] = whole_location(entry, name);
    contents[file][key] = std::move(tensor);
  }
  if (rank_ != 0) return;
  for (const auto& [file, tensors] : contents) {
    fs::create_directories((dir / file).parent_path());
    io::save_safetensors(dir / file, tensors);
  }
}

namespace {

struct StoredPiece {
  std::string file, key;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> shape;  // the parameter's, for a whole tensor (begin 0, end numel); empty for a piece
};

// (kind, parameter) -> where its elements are stored.
using PieceIndex = std::map<std::pair<std::string, std::string>, std::vector<StoredPiece>>;

// The trained-state part of a manifest, every field a resume reads checked for its type and range, so that a
// damaged checkpoint is named in one line instead of resuming as if nothing happened.
struct StoredState {
  std::map<std::string, std::vector<int64_t>> shapes;  // parameter -> shape
  std::vector<std::string> names;                      // in the checkpoint's order
  int64_t optimizer_steps = 0;
  int64_t ema_optimization_step = 0;
  PieceIndex index;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StoredState parse_stored_state(const json& manifest, const fs::path& dir) {
  const std::string where = (dir / "manifest.json").string();
  StoredState s;
  try {
    for (const auto& p : manifest.at("parameters")) {
      const auto name = p.at("name").get<std::string>();
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      SD_CHECK(shape.size() <= 8 && std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; }) &&
                   numel_of(shape) <= (int64_t{1} << 40),
               "{}: trained tensor {} has an impossible shape [{}]", where, name, fmt::join(shape, ", "));
      s.names.push_back(name);
      s.shapes[name] = shape;
    }
    s.optimizer_steps = manifest.at("optimizer_steps").get<int64_t>();
    s.ema_optimization_step = manifest.value("ema_optimization_step", int64_t{0});
    if (manifest.contains("whole_files"))
      for (const auto& name : s.names)
        for (const auto& [kind, entry] : manifest.at("whole_files").items()) {
          auto [file, key] = whole_location(entry, name);
          s.index[{kind, name}].push_back(
              {std::move(file), std::move(key), 0, numel_of(s.shapes[name]), s.shapes[name]});
        }
    if (manifest.contains("pieces"))
      for (const auto& p : manifest.at("pieces")) {
        StoredPiece piece{p.at("file").get<std::string>(),
                          p.at("key").get<std::string>(),
                          p.at("begin").get<int64_t>(),
                          p.at("end").get<int64_t>(),
                          {}};
        const auto param = p.at("param").get<std::string>();
        SD_CHECK(s.shapes.count(param), "{}: a piece of '{}', which the checkpoint does not train", where, param);
        SD_CHECK(0 <= piece.begin && piece.begin <= piece.end && piece.end <= numel_of(s.shapes[param]),
                 "{}: the piece {}..{} of {} lies outside its {} elements", where, piece.begin, piece.end, param,
                 numel_of(s.shapes[param]));
        s.index[{p.at("kind").get<std::string>(), param}].push_back(std::move(piece));
      }
  } catch (const json::exception& e) {
    fail("{}: malformed trained state ({})", where, e.what());
  }
  SD_CHECK(s.optimizer_steps >= 0, "{}: negative optimizer step count {}", where, s.optimizer_steps);
  SD_CHECK(s.ema_optimization_step >= 0 && s.ema_optimization_step <= s.optimizer_steps,
           "{}: EMA step {} is outside 0..{} (the optimizer steps)", where, s.ema_optimization_step, s.optimizer_steps);
  return s;
}

// A stored state tensor as training wrote it: float32, finite, shaped like its parameter when whole, and for the
// second moments never negative (AdamW takes their square root).
void check_stored_tensor(const at::Tensor& t, const StoredPiece& piece, const std::string& kind, const fs::path& file) {
  const std::string what = fmt::format("{}: tensor '{}'", file.string(), piece.key);
  SD_CHECK(t.scalar_type() == at::kFloat, "{} is {}, expected float32 {} state", what,
           std::string(c10::toString(t.scalar_type())), kind);
  if (!piece.shape.empty())
    SD_CHECK(t.sizes().vec() == piece.shape, "{} has shape [{}], its parameter [{}]", what, fmt::join(t.sizes(), ", "),
             fmt::join(piece.shape, ", "));
  SD_CHECK(t.numel() == piece.end - piece.begin, "{} has {} elements, the manifest says {}", what, t.numel(),
           piece.end - piece.begin);
  const int64_t nonfinite = io::count_nonfinite(t);
  SD_CHECK(nonfinite == 0,
           "{} holds {} NaN or infinite values ({} state): the checkpoint is damaged or the run had diverged", what,
           nonfinite, kind);
  SD_CHECK(kind != "exp_avg_sq" || t.numel() == 0 || t.min().item<float>() >= 0,
           "{} holds negative second moments (exp_avg_sq is a mean of squares): the checkpoint is damaged", what);
}

}  // namespace

void TrainableParameters::load(const fs::path& dir, const json& manifest) {
  at::NoGradGuard no_grad;
  const StoredState stored = parse_stored_state(manifest, dir);
  SD_CHECK(stored.names.size() == params_.size(), "{}: the checkpoint trains {} tensors, this run {}", dir.string(),
           stored.names.size(), params_.size());
  // By name: the order is the layout's business, not the checkpoint's.
  for (const NamedParameter& p : params_) {
    const auto stored_shape = stored.shapes.find(p.name);
    SD_CHECK(stored_shape != stored.shapes.end(), "{}: the checkpoint does not train {}, which this run trains",
             dir.string(), p.name);
    SD_CHECK(stored_shape->second == p.tensor.sizes().vec(),
             "{}: the checkpoint's trained tensor {} is [{}], this run's is [{}]", dir.string(), p.name,
             fmt::join(stored_shape->second, ", "), fmt::join(p.tensor.sizes(), ", "));
  }
  std::map<std::string, std::unique_ptr<io::SafeTensorsFile>> files;
  auto read = [&](const StoredPiece& piece, const std::string& kind) {
    auto& file = files[piece.file];
    if (!file) file = std::make_unique<io::SafeTensorsFile>(dir / piece.file);
    SD_CHECK(file->contains(piece.key), "{}: missing tensor '{}'", (dir / piece.file).string(), piece.key);
    at::Tensor t = file->read(piece.key);
    check_stored_tensor(t, piece, kind, dir / piece.file);
    return t.reshape({-1});
  };

  std::vector<StateKind> kinds = {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq};
  const bool stored_ema = stored.index.count({"ema", params_.front().name}) > 0;
  if (ema_ && stored_ema) kinds.push_back(StateKind::kEma);
  for (StateKind kind : kinds) {
    const std::string kind_name = state_kind_name(kind);
    for (size_t b = 0; b < layout_->buckets().size(); ++b) {
      for (const dist::OwnedPiece& want : layout_->owned_pieces(b, rank_)) {
        const std::string& name = params_[want.param].name;
        auto it = stored.index.find({kind_name, name});
        SD_CHECK(it != stored.index.end(), "{}: the checkpoint has no {} state for {}", dir.string(), kind_name, name);
        int64_t covered = 0;
        for (const StoredPiece& have : it->second) {
          const int64_t lo = std::max(want.begin, have.begin), hi = std::min(want.end, have.end);
          if (lo >= hi) continue;
          state_of(kind)[b]
              .narrow(0, want.offset + lo - want.begin, hi - lo)
              .copy_(read(have, kind_name).narrow(0, lo - have.begin, hi - lo));
          covered += hi - lo;
        }
        SD_CHECK(covered == want.end - want.begin, "{}: the checkpoint's {} state of {} covers {} of {} elements",
                 dir.string(), kind_name, name, covered, want.end - want.begin);
      }
    }
  }
  adam_.set_state(adam_.exp_avg(), adam_.exp_avg_sq(), stored.optimizer_steps);
  if (ema_) {
    if (!stored_ema) {
      for (size_t b = 0; b < master_.size(); ++b) ema_->shadow()[b].copy_(master_[b]);
      log::warn("{} holds no EMA weights; the EMA starts from the resumed weights", dir.string());
    }
    ema_->set_optimization_step(stored_ema ? stored.ema_optimization_step : 0);
  }
  refresh_compute_weights(StateKind::kMaster);
}

}  // namespace sd::train

// The trained weights of a task and everything training keeps for them, laid out in flat buckets
// (dist/bucket_layout.h):
//   compute weights  the tensors the model reads: its parameters become views into one buffer per bucket, in the
//                    compute dtype, refreshed from the masters by every optimizer step (a bf16 model is never cast
//                    per micro-batch);
//   master weights   float32 (the compute buffer itself when computing in float32);
//   gradients        reduced across ranks bucket by bucket during backward (dist/gradient_reducer.h), in float32;
//                    one rank's single micro-batch, where nothing is summed, keeps autograd's own per parameter;
//   AdamW moments and the EMA shadow, float32.
// With sharding (FSDP's SHARD_GRAD_OP) each rank keeps masters, gradients, moments and EMA for its slice of every
// bucket only, updates that slice, and all-gathers the new compute weights; without it every rank keeps everything.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dist/bucket_layout.h"
#include "dist/communicator.h"
#include "dist/gradient_reducer.h"
#include "io/safetensors.h"
#include "train/adamw.h"
#include "train/ema.h"
#include "train/precision.h"

namespace sd::train {

enum class Sharding { kNoShard, kShardGradOp };
// "no_shard" | "shard_grad_op" (PyTorch FSDP's names); anything else throws sd::Error naming --sharding.
Sharding parse_sharding(const std::string& name);
std::string sharding_name(Sharding sharding);

struct NamedParameter {
  std::string name;
  at::Tensor tensor;  // a leaf that requires grad, holding its float32 starting value
};

struct TrainableOptions {
  PrecisionPolicy precision;
  Sharding sharding = Sharding::kNoShard;
  AdamWOptions adam;
  std::optional<EmaOptions> ema;
  int64_t bucket_cap_bytes = int64_t{25} << 20;  // per float32 gradient bucket, as PyTorch DDP's default
};

// Per-parameter state a checkpoint stores.
enum class StateKind { kMaster, kExpAvg, kExpAvgSq, kEma };
const char* state_kind_name(StateKind kind);

// The weights (and EMA) of the parameters whose names start with `prefix`, kept in files of their own under the
// rest of their names: e.g. a trained text encoder's "text_encoder." tensors in text_encoder/model.safetensors.
struct WholeFileRoute {
  std::string prefix;
  std::string master_file;
  std::string ema_file;
};

// Where a checkpoint keeps whole tensors, so the files are useful on their own (e.g.
// unet/diffusion_pytorch_model.safetensors loads in diffusers): every state when one rank holds everything (no
// sharding), the weights and their EMA also beside the shards of a sharded run. `{}` in a key is the parameter name.
struct WholeTensorFiles {
  std::string master_file = "model.safetensors";
  std::string master_key = "{}";
  std::string ema_file = "ema.safetensors";
  std::string ema_key = "{}";
  std::string optimizer_file = "optimizer.safetensors";
  std::vector<WholeFileRoute> routes;  // the first whose prefix starts a name wins; the optimizer file takes all
};

class TrainableParameters {
 public:
  TrainableParameters(std::vector<NamedParameter> params, TrainableOptions options,
                      std::shared_ptr<dist::Communicator> comm);

  // Backward of one micro-batch's loss, its gradients going into the buckets.
  void backward(const at::Tensor& loss, bool first_micro_batch, bool last_micro_batch);
  // After the last micro-batch: gradients become the mean over `micro_batches` x ranks; returns their global L2
  // norm before clipping (as torch.nn.utils.clip_grad_norm_), having clipped them to `max_norm` if given.
  double reduce_gradients(int64_t micro_batches, std::optional<double> max_norm);
  // AdamW at `lr`, the EMA moved in the same pass, then fresh compute weights on every rank.
  void step(double lr);
  // Drops the reduced gradients without updating anything (a step whose gradient is not finite).
  void discard_gradients() { grads_.clear(); }

  const std::vector<NamedParameter>& parameters() const { return params_; }
  // Parameter i's gradient as the optimizer will use it, between reduce_gradients() and step() (shaped like the
  // parameter; when sharded, only this rank's part of it is here, so this needs an unsharded run).
  at::Tensor gradient(size_t i) const;
  int64_t numel() const { return numel_; }
  bool has_ema() const { return ema_.has_value(); }
  double last_ema_decay() const { return ema_ ? ema_->last_decay() : 0.0; }
  int64_t optimizer_steps() const { return adam_.steps(); }

  // Whole float32 tensors of `kind` by parameter name, assembled on rank 0 (a collective when sharded; other ranks
  // get an empty map).
  io::TensorMap gather(StateKind kind);
  // Until the returned guard dies, the compute weights hold the EMA weights (for validation with them).
  class ComputeSwap;
  std::unique_ptr<ComputeSwap> swap_in_ema();

  // Writes this rank's state under `dir` (every rank; files as `whole` names them when one rank holds everything,
  // else shards/rank-R-of-W.safetensors plus the whole weights and EMA) and returns the manifest entries describing
  // every rank's pieces.
  nlohmann::json save(const std::filesystem::path& dir, const WholeTensorFiles& whole);
  // Reads this rank's slices back from a checkpoint written by save() on any number of ranks, sharded or not.
  void load(const std::filesystem::path& dir, const nlohmann::json& manifest_state);

 private:
  // Each bucket's part of the compute weights this rank updates (all of it without sharding).
  std::vector<at::Tensor> owned_compute_weights();
  // The compute weights from the masters (or the EMA): this rank's part, then everyone's.
  void refresh_compute_weights(StateKind from);
  void all_gather_compute_weights();
  std::vector<at::Tensor>& state_of(StateKind kind);
  // Gathers one state whole and writes it on rank 0 where `entry` (a manifest's whole_files entry) puts each tensor.
  void write_whole(const std::filesystem::path& dir, StateKind kind, const nlohmann::json& entry);

  std::vector<NamedParameter> params_;
  TrainableOptions options_;
  std::shared_ptr<dist::Communicator> comm_;
  int rank_;
  int64_t numel_ = 0;
  std::unique_ptr<dist::BucketLayout> layout_;
  std::vector<at::Tensor> compute_;  // per bucket, padded, compute dtype; the parameters are views into it
  std::vector<at::Tensor> master_;   // per bucket, this rank's slice, float32
  std::vector<FlatPieces> grads_;    // per bucket, this rank's slice: sums over ranks and micro-batches
  float grad_multiplier_ = 1;        // what turns grads_ into the gradient AdamW uses (mean, then clipping)
  AdamW adam_;
  std::optional<Ema> ema_;
  std::unique_ptr<dist::GradientReducer> reducer_;
};

// Restores the compute weights from the masters when it dies.
class TrainableParameters::ComputeSwap {
 public:
  explicit ComputeSwap(TrainableParameters* owner) : owner_(owner) {}
  ~ComputeSwap();
  ComputeSwap(const ComputeSwap&) = delete;
  ComputeSwap& operator=(const ComputeSwap&) = delete;

 private:
  friend class TrainableParameters;
  TrainableParameters* owner_;
  std::vector<at::Tensor> saved_masters_;  // float32 compute: the masters the swap overwrote
};

}  // namespace sd::train

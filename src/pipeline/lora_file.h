// LoRA files as diffusers and kohya/A1111 write them, and attaching their adapters to a pipeline's models
// (models/lora.h). The one place that knows both naming schemes:
//   diffusers 0.24 (pytorch_lora_weights.safetensors, LoraLoaderMixin):
//     unet.<module>.lora.down.weight [r, in], unet.<module>.lora.up.weight [out, r]
//     text_encoder.<module>.lora_linear_layer.down.weight / .up.weight
//     no alpha: the scale alone multiplies up·down. Read also: peft's lora_A / lora_B (diffusers >= 0.25) and
//     its DoRA's .lora_magnitude_vector ([out] or [1, out, 1, 1]: the norms of the updated weight's output rows).
//   kohya sd-scripts (networks/lora.py) and A1111:
//     lora_unet_<module with '.' -> '_'>.lora_down.weight, .lora_up.weight, .alpha (a scalar; absent = rank)
//     lora_te_<text encoder module with '.' -> '_'>..., training metadata as ss_* keys in __metadata__
//   LyCORIS (read, as A1111 reads it), under kohya's stems: LoHa's .hada_w1_a, .hada_w1_b, .hada_w2_a, .hada_w2_b
//     (with .hada_t1 / .hada_t2 for a kxk conv in Tucker form) and LoKr's .lokr_w1 (or .lokr_w1_a, .lokr_w1_b),
//     .lokr_w2 (or .lokr_w2_a, .lokr_w2_b, with .lokr_t2 for a conv), with .alpha; LoCon is kohya's LoRA on convs
//     (with .lora_mid.weight in Tucker form); full updates .diff (with .diff_b for the bias); any of them with DoRA's
//     .dora_scale (weight decomposition).
// Module paths are diffusers' / transformers' (down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q,
// text_model.encoder.layers.0.self_attn.q_proj); conv layers (LoCon) have [r, in, kh, kw] / [out, r, 1, 1].
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pipeline/model_source.h"
#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

// The two models a LoRA file can adapt, named as the files' prefixes name them.
enum class LoraComponent { kUNet, kTextEncoder };

// One adapted layer.
struct LoraModule {
  LoraComponent component = LoraComponent::kUNet;
  std::string module;  // module path inside the component
  at::Tensor down, up;
  double alpha = 0;  // the adapter's output is multiplied by alpha / rank
};
using LoraWeights = std::vector<LoraModule>;

// One layer's whole weight update from a LyCORIS LoHa, LoKr, Tucker LoCon, full, IA³, OFT, GLoRA, norm or DoRA
// module, or a peft DoRA: not a low-rank product (or, for DoRA, not even linear in the weight), so it is merged into
// the weight (as A1111 applies every LoRA) rather than attached as an adapter.
struct WeightUpdate {
  LoraComponent component = LoraComponent::kUNet;
  std::string module;
  at::Tensor delta;       // as many values as the layer's weight, already multiplied by the file's alpha / dim
  at::Tensor bias_delta;  // as many values as the layer's bias (a full update's diff_b); undefined for the rest
  // peft's DoRA: one norm per output row that W + scale·delta is rescaled to when applied, so the update is not a
  // multiple of delta (apply_weight_updates); undefined for the rest.
  at::Tensor magnitude;
  // LyCORIS' norm module: delta and bias_delta add to a GroupNorm's or LayerNorm's weight and bias.
  bool norm_layer = false;
};

// What a LoRA file holds: low-rank adapters (LoRA, LoCon) and whole weight updates (the rest).
struct LoraFileContents {
  LoraWeights adapters;
  std::vector<WeightUpdate> updates;
};

enum class LoraFormat { kDiffusers, kKohya };
// "diffusers" | "kohya"; anything else throws sd::Error naming --lora_format.
LoraFormat parse_lora_format(const std::string& name);

// The LoRA file `path` names: itself, or for a folder its pytorch_lora_weights.safetensors (else .bin), as diffusers'
// load_lora_weights(folder) reads; nullopt when there is none.
std::optional<std::filesystem::path> find_lora_file(const std::filesystem::path& path);

// diffusers' key of a LoRA tensor: part is "down" or "up" (e.g. unet.<module>.lora.down.weight). Training names
// its adapter tensors with these, so a checkpoint's tensors load in diffusers as they are.
std::string diffusers_lora_key(LoraComponent component, const std::string& module, const std::string& part);

// Writes `weights` in `format` (safetensors, float32). The diffusers format has no alpha, so alpha / rank is folded
// into up; kohya's keeps it as .alpha. `metadata` goes into __metadata__ besides {"format": "pt"}.
void save_lora_file(const std::filesystem::path& path, const LoraWeights& weights, LoraFormat format,
                    const std::map<std::string, std::string>& metadata = {});

// Reads a file in any of the formats above, told apart by its key names: safetensors, or a torch.save .bin as
// diffusers 0.24 also writes; a folder stands for its pytorch_lora_weights.safetensors (else .bin), as
// load_lora_weights(folder) reads. Kohya's names lose the dots of module paths, so they are resolved against the
// pipeline's own layers. A DoRA module's update is taken against the layer's weight as it stands: after earlier
// files' merged updates (apply_lora_files), before their attached adapters. Throws one sd::Error line naming the
// file (and the key or layer) for a missing file, an unknown key, a kohya name no layer has, a down without its up,
// a LoHa or LoKr module missing a factor, factors that do not make the layer's weight, or a dora_scale or
// lora_magnitude_vector of another size.
LoraFileContents load_lora_file(const std::filesystem::path& path, StableDiffusion& pipe);

// What `sdtrain inspect` shows of a LoRA file, read without a model: from the tensors' names and shapes and the
// stored alphas.
struct LoraFileSummary {
  struct Kind {
    int64_t modules = 0;
    std::set<int64_t> ranks;  // none for a LoKr of whole factors
    std::set<double> alphas;  // as stored; none where the file has no alpha (diffusers': alpha = rank)
  };
  std::set<std::string> namings;  // "diffusers", "kohya"
  bool sdxl = false;              // kohya's names of SDXL's two text encoders (te1, te2): not for SD-1.x/2.x
  // "LoRA" (linear or 1x1 conv), "LoCon" (kxk conv), "LoHa", "LoKr", "Full", "IA3", "OFT", "GLoRA", "Norm", each
  // "+DoRA" where it has a dora_scale
  std::map<std::string, Kind> kinds;
  int64_t unet_modules = 0, text_encoder_modules = 0;
  ComponentSummary weights;  // parameters, bytes and dtypes of the weights (alphas not counted)
  std::map<std::string, std::string> metadata;
};

// The summary of a file in any format load_lora_file reads; nullopt when some tensor name is not a LoRA file's
// (e.g. a checkpoint's). Throws sd::Error for a file that is not a tensor file at all.
std::optional<LoraFileSummary> summarize_lora_file(const std::filesystem::path& path);

// Attaches every adapter to the pipeline's UNet or text encoder with strength `scale`. Throws one sd::Error line
// naming `source` (the file) and the module for a layer the models do not have or shapes that do not fit it.
void attach_lora(StableDiffusion& pipe, const LoraWeights& weights, double scale, const std::string& source);

// Adds scale · delta to each update's layer weight (and scale · bias_delta to its bias); for a peft DoRA sets the
// weight to (W + scale · delta) · magnitude / ‖W + scale · delta‖ by output rows instead. Throws one sd::Error line
// naming `source` and the module for a layer the models do not have, a delta of another size or a bias update for a
// layer without a bias.
void apply_weight_updates(StableDiffusion& pipe, const std::vector<WeightUpdate>& updates, double scale,
                          const std::string& source);

// What `generate --lora F --lora_scale S ... [--fuse_lora]` does: loads each file and attaches its adapters and
// applies its weight updates with its scale (every scale 1 when none is given, else one per file, in order), then
// merges the adapters into the weights when `fuse` (diffusers' fuse_lora: faster, same images up to float rounding).
void apply_lora_files(StableDiffusion& pipe, const std::vector<std::string>& files, const std::vector<double>& scales,
                      bool fuse);

}  // namespace sd::pipeline

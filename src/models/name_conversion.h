// Every translation between diffusers/transformers parameter names and the original single-file layout (the
// CompVis/Stability "LDM" keys that .ckpt files, A1111 and ComfyUI use), in one place, as stable-diffusion.cpp keeps
// its name_conversion. The mapping is a table of module prefixes built from the configs (block and layer counts
// decide the LDM numbering), plus the few renames inside a module; both directions read the same table. For example:
//
//   UNet: model.diffusion_model.input_blocks.4.1.proj_in.weight = down_blocks.1.attentions.0.proj_in.weight
//   VAE: first_stage_model.decoder.up.3.block.0.nin_shortcut.* = decoder.up_blocks.0.resnets.0.conv_shortcut.*
//   SD-1 text encoder: cond_stage_model.transformer.text_model.* = text_model.*
//   SD-2 text encoder: cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight = the q_proj, k_proj and
//                      v_proj weights of text_model.encoder.layers.0.self_attn, fused
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "models/clip/clip_config.h"
#include "models/unet/unet_config.h"
#include "models/vae/vae_config.h"

namespace sd::models {

enum class Component { kUnet, kVae, kTextEncoder };
// "unet", "vae", "text_encoder": the diffusers folder names.
const char* component_folder(Component component);

// How a single file stores the text encoder: SD-1's OpenAI CLIP keeps transformers' names; SD-2's OpenCLIP (GELU
// activations) has its own names, with the attention's q/k/v projections fused into one tensor.
enum class TextEncoderLayout { kOpenAiClip, kOpenClip };
TextEncoderLayout text_encoder_layout(const ClipTextConfig& config);
// "SD-1 (OpenAI CLIP)" / "SD-2 (OpenCLIP)", for messages.
const char* describe(TextEncoderLayout layout);

// Where one diffusers tensor lives in a single file.
struct LdmLocation {
  std::string key;
  int chunk = 0;  // the diffusers tensor is chunk `chunk` of `chunks` equal parts of key's tensor along dim 0
  int chunks = 1;
  bool conv1x1 = false;  // stored as a [out, in, 1, 1] convolution where diffusers has a [out, in] linear weight
};

class LdmNames {
 public:
  LdmNames(const UNetConfig& unet, const VaeConfig& vae, const ClipTextConfig& text_encoder);

  TextEncoderLayout text_encoder_layout() const { return text_layout_; }
  // Where diffusers tensor `name` of `component` lives; throws sd::Error if the layout has no place for it.
  LdmLocation to_ldm(Component component, const std::string& name) const;
  // The diffusers tensors a single-file key holds (three for a fused q/k/v tensor); none for keys diffusers does not
  // use (EMA copies, noise-schedule buffers, OpenCLIP's projection and unused last layer, a VAE's training loss).
  std::vector<std::pair<Component, std::string>> to_diffusers(const std::string& key) const;

 private:
  // A rename inside a module; strings ending in '.' are prefixes, others whole names.
  struct Leaf {
    std::string ldm, diffusers;
    int chunk = 0, chunks = 1;
    bool conv1x1_weight = false;
  };
  // A module path in both layouts (the same prefix rule), with the renames of the kind of module it is. A read-only
  // module is an older spelling of an LDM path: read, never written.
  struct Module {
    Component component;
    std::string ldm, diffusers;
    const std::vector<Leaf>* leaves;
    bool read_only = false;
  };

  void add(Component component, std::string ldm, std::string diffusers, const std::vector<Leaf>* leaves = nullptr);
  void add_older_spelling(Component component, std::string ldm, std::string diffusers);
  void add_unet(const UNetConfig& config);
  void add_vae(const VaeConfig& config);
  void add_text_encoder(const ClipTextConfig& config);

  TextEncoderLayout text_layout_;
  std::vector<Module> modules_;
};

}  // namespace sd::models

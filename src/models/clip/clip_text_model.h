// CLIPTextModel (transformers 4.35), the Stable Diffusion text encoder, with transformers' parameter names
// (text_model.embeddings.token_embedding.weight, text_model.encoder.layers.N.self_attn.q_proj.weight, ...).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/tensor_file.h"
#include "models/clip/clip_config.h"
#include "models/lora.h"

namespace sd::models {

class ClipAttentionImpl : public torch::nn::Module {
 public:
  explicit ClipAttentionImpl(const ClipTextConfig& config);
  // x: [B, S, D], causal_mask: [S, S] additive (0 / most negative) -> [B, S, D]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal_mask);

  Linear k_proj{nullptr}, v_proj{nullptr}, q_proj{nullptr}, out_proj{nullptr};

 private:
  int64_t heads_, head_dim_;
  double scale_, dropout_;
};
TORCH_MODULE(ClipAttention);

class ClipMlpImpl : public torch::nn::Module {
 public:
  explicit ClipMlpImpl(const ClipTextConfig& config);
  // x: [B, S, D] -> [B, S, D]
  at::Tensor forward(const at::Tensor& x);

  Linear fc1{nullptr}, fc2{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(ClipMlp);

class ClipEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderLayerImpl(const ClipTextConfig& config);
  // x: [B, S, D] -> [B, S, D] (pre-norm residual blocks)
  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal_mask);

  ClipAttention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr};
  ClipMlp mlp{nullptr};
  torch::nn::LayerNorm layer_norm2{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

class ClipTextEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit ClipTextEmbeddingsImpl(const ClipTextConfig& config);
  // input_ids: [B, S] int64 -> [B, S, D]; token_embeds [B, S, D], when given, replaces token_embedding(input_ids)
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_embeds = {});

  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(ClipTextEmbeddings);

class ClipEncoderImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderImpl(const ClipTextConfig& config);
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(ClipEncoder);

class ClipTextTransformerImpl : public torch::nn::Module {
 public:
  explicit ClipTextTransformerImpl(const ClipTextConfig& config);
  ClipTextEmbeddings embeddings{nullptr};
  ClipEncoder encoder{nullptr};
  torch::nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(ClipTextTransformer);

struct ClipTextOutput {
  at::Tensor last_hidden_state;           // [B, S, D], after final_layer_norm
  at::Tensor pooler_output;               // [B, D], last_hidden_state at the eos position
  std::vector<at::Tensor> hidden_states;  // L+1 tensors [B, S, D]: embeddings, then each layer's output
};

class ClipTextModel;

class ClipTextModelImpl : public torch::nn::Module {
 public:
  explicit ClipTextModelImpl(const ClipTextConfig& config);

  // input_ids: [B, S] int64, S <= max_position_embeddings. Causal self-attention, no padding mask (as the SD
  // pipelines call it). token_embeds [B, S, D], when given, stands in for the token-embedding lookup (textual
  // inversion feeds rows that carry gradients only for the learned tokens); input_ids still pick the pooled row.
  ClipTextOutput forward(const at::Tensor& input_ids, const at::Tensor& token_embeds = {});
  // hidden: [B, S, D] -> final_layer_norm(hidden); what clip-skip applies to hidden_states[-(skip + 1)].
  at::Tensor apply_final_layer_norm(const at::Tensor& hidden);

  // Grows (or shrinks) the token embedding to n rows, keeping the existing rows; new rows are N(0, 1) like the
  // fresh nn.Embedding transformers' resize_token_embeddings creates. Keeps dtype, device and requires_grad.
  void resize_token_embeddings(int64_t n);
  // token_embedding.weight[dst] = token_embedding.weight[src] (textual inversion's initializer token).
  void copy_token_embedding_row(int64_t src, int64_t dst);
  torch::nn::Embedding& token_embedding() { return text_model->embeddings->token_embedding; }

  // A copy whose linear layers hold their weights in `dtype` (bfloat16), sharing every other tensor (embeddings,
  // layer norms) with this model: the projections and attention matmuls then run in bf16 while the residual stream,
  // layer norms and softmax stay float32 - what diffusers' textual_inversion.py gets from accelerate's autocast under
  // --mixed_precision bf16. Later changes to the shared tensors (e.g. resizing the token table) are not seen.
  ClipTextModel with_linears_in(at::ScalarType dtype);

  // transformers' gradient_checkpointing_enable(): when a gradient is needed, each encoder layer keeps only its input
  // for backward and runs again there.
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }

  const ClipTextConfig& config() const { return config_; }

  ClipTextTransformer text_model{nullptr};

 private:
  ClipTextConfig config_;
  bool gradient_checkpointing_ = false;
};
TORCH_MODULE(ClipTextModel);

// Loads a `text_encoder/` folder (config.json and the weights open_weights picks, of `variant` if given) with weights
// in `dtype` (float32 or bfloat16; float64 for checks). Stored fp16/bf16/fp32 weights are converted. A
// `position_ids` tensor in the file is ignored.
ClipTextModel load_text_encoder(const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat,
                                const std::string& variant = "");
// The same from a config and weights already opened (e.g. the text-encoder part of a single-file checkpoint).
ClipTextModel load_text_encoder(const ClipTextConfig& config, const io::TensorFile& weights,
                                at::ScalarType dtype = at::kFloat);
// Writes config.json (torch_dtype set from `dtype`) and model[.variant].safetensors, as transformers'
// save_pretrained.
void save_text_encoder(ClipTextModel& model, const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat,
                       const std::string& variant = "");

}  // namespace sd::models

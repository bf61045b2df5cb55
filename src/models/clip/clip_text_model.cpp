#include "models/clip/clip_text_model.h"

#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"
#include "models/checkpoint.h"
#include "models/diffusers_blocks.h"
#include "models/lora.h"
#include "models/small_head_attention.h"
#include "models/weights.h"

namespace sd::models {

namespace nn = torch::nn;

// A projection in its weight's dtype. The layers of a mixed-precision copy (ClipTextModelImpl::with_linears_in) hold
// bf16 weights while the residual stream stays float32: their input is rounded to bf16 and their output is bf16, as
// under torch.autocast, where adding it back into the stream promotes to float32.
at::Tensor project(Linear& layer, const at::Tensor& x) { return layer->forward(x.to(layer->weight.scalar_type())); }

ClipAttentionImpl::ClipAttentionImpl(const ClipTextConfig& c)
    : heads_(c.num_attention_heads),
      head_dim_(c.head_dim()),
      scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim()))),
      dropout_(c.attention_dropout) {
  const int64_t d = c.hidden_size;
  k_proj = register_module("k_proj", Linear(d, d));
  v_proj = register_module("v_proj", Linear(d, d));
  q_proj = register_module("q_proj", Linear(d, d));
  out_proj = register_module("out_proj", Linear(d, d));
}

at::Tensor ClipAttentionImpl::forward(const at::Tensor& x, const at::Tensor& causal_mask) {
  const int64_t b = x.size(0), s = x.size(1), d = x.size(2);
  // Same op order as transformers' CLIPAttention: scale q after the projection, then q kᵀ per head.
  const at::Tensor q_scaled = project(q_proj, x) * scale_, k_rows = project(k_proj, x), v_rows = project(v_proj, x);
  // Heads of up to 16 channels (tiny models) take one fused node for the ~20 ops below; it applies the same causal
  // mask itself (its masked probabilities are exact zeros, as the mask's lowest value makes them here).
  const bool drops = dropout_ > 0 && is_training();
  if (!drops && small_head_attention_fits(q_scaled, k_rows, v_rows, heads_))
    return project(out_proj, small_head_attention(q_scaled, k_rows, v_rows, heads_, /*scale=*/1.0,
                                                  /*upcast_attention=*/false, /*causal=*/true));
  auto heads = [&](const at::Tensor& t) {  // [B, S, D] -> [B*H, S, hd]
    return t.view({b, s, heads_, head_dim_}).transpose(1, 2).contiguous().view({b * heads_, s, head_dim_});
  };
  const at::Tensor q = heads(q_scaled), k = heads(k_rows), v = heads(v_rows);
  at::Tensor weights = at::bmm(q, k.transpose(1, 2));  // [B*H, S, S]
  weights = (weights.view({b, heads_, s, s}) + causal_mask).view({b * heads_, s, s});
  weights = at::softmax(weights, -1);  // in the mask's (the stream's) dtype
  if (dropout_ > 0 && is_training()) weights = at::dropout(weights, dropout_, /*train=*/true);
  at::Tensor out = at::bmm(weights.to(v.scalar_type()), v);  // [B*H, S, hd]
  out = out.view({b, heads_, s, head_dim_}).transpose(1, 2).reshape({b, s, d});
  return project(out_proj, out);
}

ClipMlpImpl::ClipMlpImpl(const ClipTextConfig& c) : act_(c.hidden_act) {
  fc1 = register_module("fc1", Linear(c.hidden_size, c.intermediate_size));
  fc2 = register_module("fc2", Linear(c.intermediate_size, c.hidden_size));
}

at::Tensor ClipMlpImpl::forward(const at::Tensor& x) {
  at::Tensor h = project(fc1, x);
  if (act_ == "quick_gelu") {
    h = h * at::sigmoid(h * 1.702);
  } else if (act_ == "gelu") {
    h = at::gelu(h);  // exact erf form
  } else if (act_ == "gelu_new" || act_ == "gelu_pytorch_tanh") {
    h = at::gelu(h, "tanh");
  } else if (act_ == "relu") {
    h = at::relu(h);
  } else {
    h = at::silu(h);
  }
  return project(fc2, h);
}

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipTextConfig& c) {
  const auto norm = nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps);
  self_attn = register_module("self_attn", ClipAttention(c));
  layer_norm1 = register_module("layer_norm1", nn::LayerNorm(norm));
  mlp = register_module("mlp", ClipMlp(c));
  layer_norm2 = register_module("layer_norm2", nn::LayerNorm(norm));
}

at::Tensor ClipEncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& causal_mask) {
  at::Tensor h = x + self_attn->forward(layer_norm(layer_norm1, x), causal_mask);
  return h + mlp->forward(layer_norm(layer_norm2, h));
}

ClipTextEmbeddingsImpl::ClipTextEmbeddingsImpl(const ClipTextConfig& c) {
  token_embedding = register_module("token_embedding", embedding_layer(c.vocab_size, c.hidden_size));
  position_embedding = register_module("position_embedding", embedding_layer(c.max_position_embeddings, c.hidden_size));
}

at::Tensor ClipTextEmbeddingsImpl::forward(const at::Tensor& input_ids, const at::Tensor& token_embeds) {
  const int64_t s = input_ids.size(1);
  const at::Tensor positions = at::arange(s, input_ids.options().dtype(at::kLong)).unsqueeze(0);  // [1, S]
  const at::Tensor tokens = token_embeds.defined() ? token_embeds : token_embedding->forward(input_ids);
  return tokens + position_embedding->forward(positions);
}

ClipEncoderImpl::ClipEncoderImpl(const ClipTextConfig& c) {
  layers = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(ClipEncoderLayer(c));
}

ClipTextTransformerImpl::ClipTextTransformerImpl(const ClipTextConfig& c) {
  embeddings = register_module("embeddings", ClipTextEmbeddings(c));
  encoder = register_module("encoder", ClipEncoder(c));
  final_layer_norm =
      register_module("final_layer_norm", nn::LayerNorm(nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps)));
}

ClipTextModelImpl::ClipTextModelImpl(const ClipTextConfig& config) : config_(config) {
  text_model = register_module("text_model", ClipTextTransformer(config));
}

ClipTextOutput ClipTextModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& token_embeds) {
  SD_CHECK(input_ids.dim() == 2, "text encoder: input_ids must be [batch, seq], got {} dims", input_ids.dim());
  const int64_t b = input_ids.size(0), s = input_ids.size(1);
  SD_CHECK(s >= 1 && s <= config_.max_position_embeddings,
           "text encoder: sequence length {} is outside 1..max_position_embeddings ({})", s,
           config_.max_position_embeddings);
  const at::Tensor ids = input_ids.to(at::kLong);

  ClipTextOutput out;
  at::Tensor h = text_model->embeddings->forward(ids, token_embeds);  // [B, S, D]
  out.hidden_states.push_back(h);
  // Additive causal mask in the hidden dtype, as transformers' _create_4d_causal_attention_mask: the dtype's most
  // negative value strictly above the diagonal.
  const double neg = h.scalar_type() == at::kDouble     ? std::numeric_limits<double>::lowest()
                     : h.scalar_type() == at::kHalf     ? -65504.0
                     : h.scalar_type() == at::kBFloat16 ? -3.3895313892515355e38
                                                        : static_cast<double>(std::numeric_limits<float>::lowest());
  const at::Tensor mask = at::full({s, s}, neg, h.options()).triu(1);
  for (const auto& layer : *text_model->encoder->layers) {
    auto* impl = layer->as<ClipEncoderLayer>();
    h = gradient_checkpointing_
            ? checkpoint([impl, mask](const TensorList& in) { return TensorList{impl->forward(in[0], mask)}; }, {h},
                         parameters_and_adapters(*impl))[0]
            : impl->forward(h, mask);
    out.hidden_states.push_back(h);
  }
  out.last_hidden_state = layer_norm(text_model->final_layer_norm, h);

  // Pooled output: legacy configs (eos_token_id == 2) take the row of the largest id, which is eos for
  // unextended vocabularies; newer ones the first position of eos_token_id.
  const at::Tensor ids32 = ids.to(at::kInt);
  const at::Tensor pos =
      config_.eos_token_id == 2 ? ids32.argmax(-1) : (ids32 == config_.eos_token_id).to(at::kInt).argmax(-1);
  const at::Tensor rows = at::arange(b, pos.options()) * s + pos;  // [B] flat indices into [B*S]
  out.pooler_output = out.last_hidden_state.reshape({b * s, -1}).index_select(0, rows);
  return out;
}

at::Tensor ClipTextModelImpl::apply_final_layer_norm(const at::Tensor& hidden) {
  return layer_norm(text_model->final_layer_norm, hidden);
}

ClipTextModel ClipTextModelImpl::with_linears_in(at::ScalarType dtype) {
  ClipTextModel copy = [&] {
    ScopedDefaultDtype built_in(parameters().front().scalar_type());
    ScopedUninitializedLayers weights_read_next;
    return ClipTextModel(config_);
  }();
  torch::NoGradGuard no_grad;
  const auto sources = modules(), targets = copy->modules();  // the same architecture, visited in the same order
  for (size_t m = 0; m < sources.size(); ++m) {
    const bool is_linear = dynamic_cast<const LinearImpl*>(targets[m].get()) != nullptr;
    const auto from = sources[m]->named_parameters(/*recurse=*/false);
    for (auto& to : targets[m]->named_parameters(/*recurse=*/false)) {
      const at::Tensor& source = from[to.key()];
      to.value().set_data(is_linear ? source.to(dtype) : source);  // .to(same dtype) shares the storage
    }
  }
  copy->train(is_training());
  return copy;
}

void ClipTextModelImpl::resize_token_embeddings(int64_t n) {
  SD_CHECK(n > 0, "resize_token_embeddings: size must be positive, got {}", n);
  nn::Embedding& old = text_model->embeddings->token_embedding;
  const at::Tensor old_weight = old->weight;
  if (n == old_weight.size(0)) return;
  nn::Embedding fresh = [&] {
    ScopedUninitializedLayers filled_next;
    return embedding_layer(n, config_.hidden_size);
  }();
  fresh->to(old_weight.device(), old_weight.scalar_type());
  {
    torch::NoGradGuard no_grad;
    const int64_t keep = std::min(n, old_weight.size(0));
    fresh->weight.narrow(0, 0, keep).copy_(old_weight.narrow(0, 0, keep));
    fresh->weight.narrow(0, keep, n - keep).normal_();  // only the new rows are drawn, as nn.Embedding's N(0, 1)
  }
  fresh->weight.set_requires_grad(old_weight.requires_grad());
  fresh->train(old->is_training());
  text_model->embeddings->token_embedding = text_model->embeddings->replace_module("token_embedding", fresh);
  config_.vocab_size = n;
}

void ClipTextModelImpl::copy_token_embedding_row(int64_t src, int64_t dst) {
  const at::Tensor& w = text_model->embeddings->token_embedding->weight;
  const int64_t n = w.size(0);
  SD_CHECK(src >= 0 && src < n && dst >= 0 && dst < n, "copy_token_embedding_row: rows {} -> {} outside 0..{}", src,
           dst, n - 1);
  torch::NoGradGuard no_grad;
  w[dst].copy_(w[src]);
}

ClipTextModel load_text_encoder(const std::filesystem::path& dir, at::ScalarType dtype, const std::string& variant) {
  const ClipTextConfig config = ClipTextConfig::load(dir / "config.json");
  return load_text_encoder(config, *open_weights(dir, WeightFileNames::transformers(), variant), dtype);
}

ClipTextModel load_text_encoder(const ClipTextConfig& config, const io::TensorFile& weights, at::ScalarType dtype) {
  // LibTorch 1.13 has no CPU float16 matmul/bmm/softmax, so float16 is a storage format only here.
  SD_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble,
           "text encoder: cannot run in {} on CPU; use float32 or bfloat16 (float16 files load into either)",
           c10::toString(dtype));
  ClipTextModel model = [&] {
    ScopedDefaultDtype built_in(dtype);
    ScopedUninitializedLayers weights_read_next;
    return ClipTextModel(config);
  }();
  // transformers < 4.31 saved the position_ids buffer; 4.35 recomputes it (and so do we).
  load_weights(*model, weights, {"text_model.embeddings.position_ids"});
  model->eval();
  return model;
}

void save_text_encoder(ClipTextModel& model, const std::filesystem::path& dir, at::ScalarType dtype,
                       const std::string& variant) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SD_CHECK(!ec, "{}: cannot create folder ({})", dir.string(), ec.message());
  ClipTextConfig config = model->config();
  config.torch_dtype = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  io::write_text_file(dir / "config.json", config.to_json().dump(2) + "\n");
  save_weights(*model, dir / with_variant(WeightFileNames::transformers().safetensors, variant), dtype);
}

}  // namespace sd::models

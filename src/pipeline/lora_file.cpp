#include "pipeline/lora_file.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <torch/nn/modules/normalization.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/tensor_file.h"
#include "models/lora.h"
#include "models/name_conversion.h"

namespace sd::pipeline {

namespace fs = std::filesystem;

namespace {

const char* component_label(LoraComponent c) { return c == LoraComponent::kUNet ? "the UNet" : "the text encoder"; }

std::string underscored(std::string path) {
  std::replace(path.begin(), path.end(), '.', '_');
  return path;
}

std::string kohya_stem(LoraComponent c, const std::string& module) {
  return (c == LoraComponent::kUNet ? "lora_unet_" : "lora_te_") + underscored(module);
}

torch::nn::Module& model_of(StableDiffusion& pipe, LoraComponent c) {
  if (c == LoraComponent::kUNet) {
    SD_CHECK(!pipe.unet.is_empty(), "a UNet LoRA needs the pipeline's UNet");
    return *pipe.unet;
  }
  SD_CHECK(!pipe.text_encoder.is_empty(), "a text-encoder LoRA needs the pipeline's text encoder");
  return *pipe.text_encoder;
}

std::map<std::string, models::LoraHost*> hosts_by_path(StableDiffusion& pipe, LoraComponent c) {
  std::map<std::string, models::LoraHost*> hosts;
  for (const auto& [path, host] : models::lora_hosts(model_of(pipe, c))) hosts[path] = host;
  return hosts;
}

// The module paths of a component's GroupNorm and LayerNorm layers (what LyCORIS' norm modules update).
std::vector<std::string> norm_layer_paths(StableDiffusion& pipe, LoraComponent c) {
  std::vector<std::string> paths;
  for (const auto& item : model_of(pipe, c).named_modules("", /*include_self=*/false))
    if (item.value()->as<torch::nn::GroupNormImpl>() || item.value()->as<torch::nn::LayerNormImpl>())
      paths.push_back(item.key());
  return paths;
}

// The pipeline's adaptable layers by component and module path, and its parameters by name, each gathered once per
// component on first use.
class PipelineLayers {
 public:
  explicit PipelineLayers(StableDiffusion& pipe) : pipe_(pipe) {}

  // Throws sd::Error naming `source` unless the component has the layer.
  models::LoraHost& at(LoraComponent c, const std::string& module, const std::string& source) {
    if (!hosts_.count(c)) hosts_[c] = hosts_by_path(pipe_, c);
    const auto it = hosts_[c].find(module);
    SD_CHECK(it != hosts_[c].end(), "{}: {} has no Linear or Conv2d layer '{}'", source, component_label(c), module);
    return *it->second;
  }

  // A norm layer's "weight" or "bias" (a handle to the parameter); throws sd::Error naming `source` unless the
  // component has it.
  at::Tensor norm_parameter(LoraComponent c, const std::string& module, const std::string& name,
                            const std::string& source) {
    if (!parameters_.count(c)) parameters_.emplace(c, model_of(pipe_, c).named_parameters());
    const at::Tensor* parameter = parameters_.at(c).find(module + "." + name);
    SD_CHECK(parameter, "{}: {} has no norm layer '{}' with a {}", source, component_label(c), module, name);
    return *parameter;
  }

 private:
  StableDiffusion& pipe_;
  std::map<LoraComponent, std::map<std::string, models::LoraHost*>> hosts_;
  std::map<LoraComponent, torch::OrderedDict<std::string, at::Tensor>> parameters_;
};

// Where one key of a file goes. `part` is "down", "up", "mid" or "alpha" for a LoRA, else LyCORIS' own name
// (hada_w1_a, lokr_w2, dora_scale, ...).
struct KeyTarget {
  LoraComponent component;
  std::string module;
  std::string part;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// unet.<module>.lora.down.weight and the other spellings diffusers has used; nullopt for anything else.
std::optional<KeyTarget> parse_diffusers_key(const std::string& key) {
  static const std::vector<std::pair<std::string, LoraComponent>> prefixes = {
      {"unet.", LoraComponent::kUNet}, {"text_encoder.", LoraComponent::kTextEncoder}};
  static const std::vector<std::pair<std::string, std::string>> suffixes = {
      {".lora.down.weight", "down"},
      {".lora.up.weight", "up"},
      {".lora_linear_layer.down.weight", "down"},
      {".lora_linear_layer.up.weight", "up"},
      {".lora_A.weight", "down"},
      {".lora_B.weight", "up"},
      {".lora_magnitude_vector", "lora_magnitude_vector"}};
  for (const auto& [prefix, component] : prefixes) {
    if (key.rfind(prefix, 0) != 0) continue;
    for (const auto& [suffix, part] : suffixes)
      if (ends_with(key, suffix) && key.size() > prefix.size() + suffix.size())
        return KeyTarget{component, key.substr(prefix.size(), key.size() - prefix.size() - suffix.size()), part};
  }
  return std::nullopt;
}

// The endings of kohya-named keys and the parts they name: LoRA's, and LyCORIS' (which keep their names).
const std::vector<std::pair<std::string, std::string>>& kohya_suffixes() {
  static const std::vector<std::pair<std::string, std::string>> suffixes = [] {
    std::vector<std::pair<std::string, std::string>> lora = {{".lora_down.weight", "down"},
                                                             {".lora_up.weight", "up"},
                                                             {".lora_mid.weight", "mid"},
                                                             {".alpha", "alpha"},
                                                             {".dora_scale", "dora_scale"}};
    for (const char* part :
         {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2", "lokr_w1", "lokr_w1_a", "lokr_w1_b",
          "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2", "diff", "diff_b"})
      lora.emplace_back(std::string(".") + part, part);
    return lora;
  }();
  return suffixes;
}

LoraComponent kohya_component(const std::string& stem) {
  return stem.rfind("lora_unet_", 0) == 0 ? LoraComponent::kUNet : LoraComponent::kTextEncoder;
}

// kohya names SDXL's two text encoders te1 and te2 (SD-1.x/2.x's one: te).
bool is_sdxl_key(const std::string& key) { return key.rfind("lora_te1_", 0) == 0 || key.rfind("lora_te2_", 0) == 0; }

// lora_unet_<module with _>.lora_down.weight, .hada_w1_a etc. as {stem, part}, a part kohya_suffixes() does not name
// (IA³'s weight and on_input, OFT's oft_blocks, GLoRA's a1.weight ..., w_norm and b_norm) as it stands after the
// stem's dot; nullopt for a key of another shape.
std::optional<std::pair<std::string, std::string>> split_kohya_key(const std::string& key) {
  if (key.rfind("lora_unet_", 0) != 0 && key.rfind("lora_te_", 0) != 0 && !is_sdxl_key(key)) return std::nullopt;
  for (const auto& [suffix, part] : kohya_suffixes())
    if (ends_with(key, suffix)) return std::pair{key.substr(0, key.size() - suffix.size()), part};
  const size_t dot = key.find('.');  // kohya's stems have none
  if (dot == std::string::npos || dot + 1 == key.size()) return std::nullopt;
  return std::pair{key.substr(0, dot), key.substr(dot + 1)};
}

// A kohya-named key with its module path found among the model's layers (`paths`: kohya stem -> module path, over
// both components); nullopt for a key of another shape.
std::optional<KeyTarget> parse_kohya_key(const std::string& key,
                                         const std::map<std::string, std::pair<LoraComponent, std::string>>& paths,
                                         const std::string& file) {
  const auto split = split_kohya_key(key);
  if (!split) return std::nullopt;
  const auto& [stem, part] = *split;
  const auto it = paths.find(stem);
  SD_CHECK(it != paths.end(), "{}: '{}': {} has no Linear, Conv2d or norm layer named {}", file, key,
           component_label(kohya_component(stem)), stem);
  return KeyTarget{it->second.first, it->second.second, part};
}

// One layer's tensors in a file, by part name (KeyTarget::part).
using Parts = std::map<std::string, at::Tensor>;

enum class ModuleKind { kLora, kLoha, kLokr, kFull, kIa3, kOft, kGlora, kNorm };

// The kind of module a part belongs to: down, up and mid make a LoRA, hada_* a LoHa, lokr_* a LoKr, diff and diff_b
// a full update, weight and on_input an IA³ scaling, oft_blocks or oft_diag (and rescale) a rotation (OFT's or BOFT's),
// a1/a2/b1/b2/bm.weight a GLoRA, w_norm and b_norm a norm layer's update; nullopt for alpha and the DoRA norms
// (LyCORIS' dora_scale, peft's lora_magnitude_vector), which any kind can have.
std::optional<ModuleKind> kind_of_part(const std::string& part) {
  if (part == "down" || part == "up" || part == "mid") return ModuleKind::kLora;
  if (part.rfind("hada_", 0) == 0) return ModuleKind::kLoha;
  if (part.rfind("lokr_", 0) == 0) return ModuleKind::kLokr;
  if (part == "diff" || part == "diff_b") return ModuleKind::kFull;
  if (part == "weight" || part == "on_input") return ModuleKind::kIa3;
  if (part == "oft_blocks" || part == "oft_diag" || part == "rescale") return ModuleKind::kOft;
  if (part == "a1.weight" || part == "a2.weight" || part == "b1.weight" || part == "b2.weight" || part == "bm.weight")
    return ModuleKind::kGlora;
  if (part == "w_norm" || part == "b_norm") return ModuleKind::kNorm;
  return std::nullopt;
}

// Parts that set how a module's weights apply rather than hold them: alpha and the DoRA norms.
bool is_setting_part(const std::string& part) {
  return part == "alpha" || part == "dora_scale" || part == "lora_magnitude_vector";
}

// Parts of a module that no kind reads (split_kohya_key's parts of LyCORIS' other modules).
template <typename PartMap>
std::vector<std::string> unread_parts(const PartMap& parts) {
  std::vector<std::string> unread;
  for (const auto& entry : parts)
    if (!kind_of_part(entry.first) && !is_setting_part(entry.first)) unread.push_back(entry.first);
  return unread;
}

// What a layer's parts make (each with an optional alpha), for any map keyed by part name.
template <typename PartMap>
ModuleKind kind_of(const PartMap& parts, const std::string& layer) {
  const std::vector<std::string> unread = unread_parts(parts);
  SD_CHECK(unread.empty(),
           "{}: '{}' is not read: sdtrain reads LoRA and LoCon (lora_down, lora_up, lora_mid), LoHa (hada_*), LoKr "
           "(lokr_*), full (diff, diff_b), IA3 (weight, on_input), OFT and BOFT (oft_blocks, oft_diag, rescale), GLoRA "
           "(a1.weight, ...) and norm (w_norm, b_norm) modules, with alpha and dora_scale",
           layer, fmt::join(unread, "', '"));
  std::set<ModuleKind> kinds;
  std::vector<std::string> others;
  for (const auto& entry : parts) {
    if (const auto kind = kind_of_part(entry.first))
      kinds.insert(*kind);
    else
      others.push_back(entry.first);
  }
  SD_CHECK(!kinds.empty(), "{} has {} but no weights", layer, fmt::join(others, " and "));
  SD_CHECK(kinds.size() == 1,
           "{} mixes the keys of LoRA (lora_down/lora_up), LoHa (hada_*), LoKr (lokr_*), full (diff), IA3 (weight), "
           "OFT (oft_blocks), GLoRA (a1.weight, ...) and norm (w_norm) modules",
           layer);
  return *kinds.begin();
}

// up·down with their trailing dimensions flattened: [out, in·kh·kw].
at::Tensor low_rank_product(const at::Tensor& up, const at::Tensor& down) {
  return at::mm(up.flatten(1), down.flatten(1));
}

// LyCORIS' Tucker form of a kxk conv's factor: core [r, r, kh, kw], up [r, out], down [r, in] ->
// [out, in, kh, kw] = Σ_ab core[a, b]·up[a, out]·down[b, in].
at::Tensor tucker_product(const at::Tensor& core, const at::Tensor& up, const at::Tensor& down) {
  return at::einsum("abhw,ao,bi->oihw", {core, up, down});
}

// LoHa factor n (1 or 2), shaped as the layer's weight: hada_wn_a·hada_wn_b, or their Tucker product with hada_tn.
at::Tensor loha_factor(const Parts& p, const std::string& n, at::IntArrayRef weight) {
  const at::Tensor &up = p.at("hada_w" + n + "_a"), &down = p.at("hada_w" + n + "_b");
  const auto core = p.find("hada_t" + n);
  return (core != p.end() ? tucker_product(core->second, up, down) : low_rank_product(up, down)).reshape(weight);
}

// LoKr's w1 or w2: the whole factor, or the product of its _a and _b (for w2 of a conv, in Tucker form with lokr_t2).
at::Tensor lokr_factor(const Parts& p, const std::string& n) {
  const std::string w = "lokr_w" + n;
  if (p.count(w)) return p.at(w);
  const auto core = p.find("lokr_t" + n);
  return core != p.end() ? tucker_product(core->second, p.at(w + "_a"), p.at(w + "_b"))
                         : low_rank_product(p.at(w + "_a"), p.at(w + "_b"));
}

const char* kind_label(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kLora: return "LoRA";
    case ModuleKind::kLoha: return "LoHa";
    case ModuleKind::kLokr: return "LoKr";
    case ModuleKind::kFull: return "Full";
    case ModuleKind::kIa3: return "IA3";
    case ModuleKind::kOft: return "OFT";
    case ModuleKind::kGlora: return "GLoRA";
    case ModuleKind::kNorm: return "Norm";
  }
  return "";
}

// Throws sd::Error naming which of `parts` a module of `kind` lacks, when it lacks any.
void check_all_parts(const Parts& p, const std::vector<std::string>& parts, ModuleKind kind, const std::string& layer) {
  std::vector<std::string> missing;
  for (const std::string& part : parts)
    if (!p.count(part)) missing.push_back(part);
  SD_CHECK(missing.empty(), "{}: a {} module needs {} and {}; {} missing", layer, kind_label(kind),
           fmt::join(parts.begin(), parts.end() - 1, ", "), parts.back(), fmt::join(missing, ", "));
}

// Throws sd::Error naming the factors a module of `kind` needs and lacks.
void check_factors(const Parts& p, ModuleKind kind, const std::string& layer) {
  switch (kind) {
    case ModuleKind::kLora: {
      const bool has_down = p.count("down"), has_up = p.count("up");
      SD_CHECK(has_down && has_up, "{} has {} weight but no {} weight", layer, has_down ? "a down" : "an up",
               has_down ? "up" : "down");
      break;
    }
    case ModuleKind::kLoha:
      check_all_parts(p, {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"}, kind, layer);
      break;
    case ModuleKind::kGlora:
      check_all_parts(p, {"a1.weight", "a2.weight", "b1.weight", "b2.weight"}, kind, layer);
      break;
    case ModuleKind::kLokr:
      for (const std::string n : {"1", "2"})
        SD_CHECK(p.count("lokr_w" + n) || (p.count("lokr_w" + n + "_a") && p.count("lokr_w" + n + "_b")),
                 "{}: a LoKr module needs lokr_w{} or both lokr_w{}_a and lokr_w{}_b", layer, n, n, n);
      break;
    case ModuleKind::kFull: SD_CHECK(p.count("diff"), "{}: a full module needs diff besides diff_b", layer); break;
    case ModuleKind::kIa3: SD_CHECK(p.count("weight"), "{}: an IA3 module needs weight besides on_input", layer); break;
    case ModuleKind::kNorm:
      SD_CHECK(p.count("w_norm"), "{}: a norm module needs w_norm besides b_norm", layer);
      SD_CHECK(!p.count("dora_scale") && !p.count("lora_magnitude_vector"), "{}: a norm module takes no DoRA norms",
               layer);
      break;
    case ModuleKind::kOft:
      SD_CHECK(p.count("oft_blocks") + p.count("oft_diag") == 1,
               "{}: an OFT module needs oft_blocks or (LyCORIS' early files) oft_diag, one of them", layer);
      break;
  }
}

// The part whose rows count a module's rank, which its alpha is divided by: nullopt for modules without one (a LoKr
// of whole factors, a full update, an IA³ scaling, an OFT rotation).
template <typename PartMap>
std::optional<std::string> rank_part(const PartMap& p, ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kLora: return "down";
    case ModuleKind::kLoha: return "hada_w1_b";
    case ModuleKind::kLokr:
      if (p.count("lokr_w2_b")) return "lokr_w2_b";
      if (p.count("lokr_w1_b")) return "lokr_w1_b";
      return std::nullopt;
    case ModuleKind::kFull:
    case ModuleKind::kIa3:
    case ModuleKind::kOft:
    case ModuleKind::kNorm: return std::nullopt;
    case ModuleKind::kGlora: return "a2.weight";
  }
  return std::nullopt;
}

// IA³'s update of weight W (LyCORIS' ia3 module): W's output rows scaled by `weight` ([out], a conv's [1, out, 1,
// 1]), or with on_input 1 its input columns ([in], [1, in, 1, 1]).
at::Tensor ia3_update(const Parts& p, const at::Tensor& weight) {
  const bool on_input = p.count("on_input") && p.at("on_input").item<double>() != 0;
  const int64_t dim = on_input ? 1 : 0;
  const at::Tensor& scales = p.at("weight");
  std::vector<int64_t> shape(weight.dim(), 1);
  shape[dim] = weight.size(dim);  // a reshape that fails unless there is one scale for each
  return weight.to(scales.options()) * scales.reshape(shape);
}

// `t` in float32, or in double if it is.
at::Tensor float32_at_least(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? t : t.to(at::kFloat); }

// The rotations of OFT's and BOFT's oft_blocks B: the orthogonal R = (I + Q)(I − Q)⁻¹ (Cayley) of each block's
// skew-symmetric Q = B − Bᵀ. A positive `constraint` (the file's alpha) bounds ‖Q‖ (over all blocks) by
// constraint · out, scaling Q down to that norm when it is larger. In float32 at least (LyCORIS inverts in float).
at::Tensor cayley_rotations(const at::Tensor& oft_blocks, std::optional<double> constraint, int64_t out) {
  const at::Tensor blocks = float32_at_least(oft_blocks);
  at::Tensor q = blocks - blocks.transpose(-1, -2);
  const double bound = constraint.value_or(0) * static_cast<double>(out);
  if (const double norm = q.norm().item<double>() + 1e-8; bound > 0 && norm > bound) q = q * (bound / norm);
  const at::Tensor eye = at::eye(q.size(-1), q.options()).expand(q.sizes());
  return at::matmul(eye + q, at::inverse(eye - q));
}

// OFT's rotation (kohya's networks.oft, LyCORIS' diag-oft) of rows [out, c]: in k blocks of n rows, each rotated by
// the transpose of its R [k, n, n]: W'_k = R_kᵀ·W_k.
at::Tensor oft_rotated(const at::Tensor& rotations, const at::Tensor& rows) {
  const int64_t k = rotations.size(0), n = rotations.size(1);
  SD_CHECK(k * n == rows.size(0), "blocks that do not cover the layer's outputs");
  return at::matmul(rotations.transpose(1, 2), rows.reshape({k, n, -1})).reshape(rows.sizes());
}

// BOFT's rotation (LyCORIS' boft, arXiv 2311.06243) of rows [out, c] by m butterfly factors, R [m, out/b, b, b]:
// factor i takes the rows in groups of 2s (s = 2^i · b/2), interleaves each group's two halves, rotates each run of
// b rows by its R (R·W_b, not OFT's transpose), and puts the rows back in their order.
at::Tensor boft_rotated(const at::Tensor& rotations, const at::Tensor& rows) {
  const int64_t b = rotations.size(2), out = rows.size(0), c = rows.size(1);
  SD_CHECK(b % 2 == 0 && rotations.size(1) * b == out, "blocks that do not cover the layer's outputs");
  at::Tensor w = rows;
  for (int64_t i = 0; i < rotations.size(0); ++i) {
    const int64_t s = (int64_t{1} << i) * (b / 2);
    const at::Tensor interleaved = w.reshape({-1, 2, s, c}).transpose(1, 2).reshape({-1, b, c});
    w = at::matmul(rotations[i], interleaved).reshape({-1, s, 2, c}).transpose(1, 2).reshape({out, c});
  }
  return w;
}

// The update of weight W by an OFT module (oft_blocks [k, n, n]) or a BOFT one (oft_blocks [m, k, b, b]): W's
// output rows rotated (oft_rotated, boft_rotated), then, with LyCORIS' rescale [out, 1, ...], each output row scaled.
// LyCORIS' early OFT (Oct 2023 - Feb 2024) saved the rotations themselves, oft_diag [k, n, n], its rescale folded in
// and its constraint applied; A1111 reads them as they are, and so does this.
at::Tensor oft_update(const Parts& p, const at::Tensor& weight, std::optional<double> constraint) {
  const auto stored = p.find("oft_diag");
  const at::Tensor& blocks = stored != p.end() ? stored->second : p.at("oft_blocks");
  SD_CHECK(blocks.dim() == 3 || (blocks.dim() == 4 && stored == p.end()), "blocks of 3 (OFT) or 4 (BOFT) dimensions");
  SD_CHECK(blocks.size(-1) == blocks.size(-2), "square blocks");
  const at::Tensor rotations =
      stored != p.end() ? float32_at_least(blocks) : cayley_rotations(blocks, constraint, weight.size(0));
  const at::Tensor w = weight.to(rotations.options());
  const at::Tensor rows = w.reshape({w.size(0), -1});
  at::Tensor rotated = (blocks.dim() == 3 ? oft_rotated(rotations, rows) : boft_rotated(rotations, rows));
  if (const auto rescale = p.find("rescale"); rescale != p.end())
    rotated = rotated * rescale->second.to(rotations.options()).reshape({w.size(0), 1});
  return rotated.reshape(weight.sizes()) - w;
}

// GLoRA's update of weight W (LyCORIS' glora, arXiv 2306.07967): ΔW = W·(a1·a2) + b1·b2, the first mixing W's input
// channels (a1 [in, r], a2 [r, in]; 1x1 for a conv), the second a LoCon's product (b1 [out, r], b2 [r, in, kh, kw];
// with bm [r, r, kh, kw] the Tucker form, b2 1x1).
at::Tensor glora_update(const Parts& p, const at::Tensor& weight) {
  const at::Tensor w = weight.to(p.at("a1.weight").options());
  const at::Tensor mix = low_rank_product(p.at("a1.weight"), p.at("a2.weight"));  // [in, in]
  const at::Tensor mixed = at::tensordot(w, mix, {1}, {0}).movedim(-1, 1);  // [out, ..., in] back to [out, in, ...]
  const at::Tensor &b1 = p.at("b1.weight"), &b2 = p.at("b2.weight");
  const auto bm = p.find("bm.weight");
  const at::Tensor b =
      bm != p.end() ? tucker_product(bm->second, b1.flatten(1).t(), b2.flatten(1)) : low_rank_product(b1, b2);
  return mixed + b.reshape(weight.sizes());
}

// A module's whole weight update (A1111's network_lora / network_hada / network_lokr / network_full / network_ia3 /
// network_oft / network_glora) for a layer whose weight is now `weight`, times alpha / dim, where dim is the rank of
// its low-rank products (down's for LoRA, w1_b's for LoHa; w2_b's, else w1_b's, for LoKr; a2's for GLoRA). Without an
// alpha or a rank (a LoKr of whole factors, a full update, IA³, OFT) the update is taken as it is.
//   LoRA:                            ΔW = up·down, or with LyCORIS' lora_mid (a kxk conv in Tucker form) the
//                                         Tucker product of mid [r, r, kh, kw], up [out, r, 1, 1], down [r, in, 1, 1]
//   LoHa (FedPara, arXiv 2108.06098): ΔW = (w1_a·w1_b) ⊙ (w2_a·w2_b)
//   LoKr (arXiv 2309.14859):         ΔW = w1 ⊗ w2 (Kronecker; w1 [a, b] acts as [a, b, 1, 1] beside a conv's w2)
//   full:                            ΔW = diff (its bias update, diff_b, is the caller's)
//   IA³ (arXiv 2205.05638):          ΔW = W ⊙ w, w per output row or per input column (the bias is left, as LyCORIS
//                                         and A1111 merge it)
//   OFT (arXiv 2306.07280):          ΔW = Rᵀ·W − W, R block-diagonal and orthogonal (alpha bounds it instead of
//                                         scaling it); BOFT (arXiv 2311.06243): R a product of butterfly factors
//   GLoRA (arXiv 2306.07967):        ΔW = W·(a1·a2) + b1·b2
//   norm (LyCORIS' norms):           ΔW = w_norm, of a GroupNorm's or LayerNorm's weight (its bias update, b_norm,
//                                         is the caller's)
at::Tensor module_update(const Parts& p, ModuleKind kind, const at::Tensor& weight, std::optional<double> alpha,
                         const std::string& layer) {
  at::Tensor update;
  double multiplier = 1;
  try {
    const std::optional<std::string> rank = rank_part(p, kind);
    if (alpha && rank) multiplier = *alpha / static_cast<double>(p.at(*rank).size(0));
    switch (kind) {
      case ModuleKind::kLora: {
        const at::Tensor &up = p.at("up"), &down = p.at("down");
        const auto mid = p.find("mid");
        update = mid != p.end() ? tucker_product(mid->second, up.flatten(1).t(), down.flatten(1))
                                : low_rank_product(up, down);
        break;
      }
      case ModuleKind::kLoha: update = loha_factor(p, "1", weight.sizes()) * loha_factor(p, "2", weight.sizes()); break;
      case ModuleKind::kLokr: {
        const at::Tensor w1 = lokr_factor(p, "1"), w2 = lokr_factor(p, "2");
        // at::kron of 1.13 views its second operand, so a Tucker product (not contiguous) is made contiguous first.
        update = at::kron(w2.dim() == 4 ? w1.reshape({w1.size(0), w1.size(1), 1, 1}) : w1, w2.contiguous());
        break;
      }
      case ModuleKind::kFull: update = p.at("diff"); break;
      case ModuleKind::kNorm: update = p.at("w_norm"); break;
      case ModuleKind::kIa3: update = ia3_update(p, weight); break;
      case ModuleKind::kOft: update = oft_update(p, weight, alpha); break;
      case ModuleKind::kGlora: update = glora_update(p, weight); break;
    }
    update = update.reshape(weight.sizes());
  } catch (const std::exception&) {  // c10::Error from sizes and products, std::runtime_error from reshape
    std::vector<std::string> shapes;
    for (const auto& [part, tensor] : p)
      if (!is_setting_part(part) && part != "diff_b" && part != "b_norm")
        shapes.push_back(fmt::format("{} [{}]", part, fmt::join(tensor.sizes(), ", ")));
    fail("{}: the {} factors {} do not make the layer's weight [{}]", layer, kind_label(kind), fmt::join(shapes, ", "),
         fmt::join(weight.sizes(), ", "));
  }
  return multiplier == 1 ? update : update * multiplier;
}

// DoRA's weight decomposition (arXiv 2402.09353): `merged` (a weight V) rescaled in place to V · m / (‖V‖ + ε),
// where m holds one norm per index of dimension `dim` and ‖V‖ is taken over every other dimension.
at::Tensor& rescale_to_norms(at::Tensor& merged, const at::Tensor& norms, int64_t dim, double epsilon) {
  std::vector<int64_t> reduced;
  for (int64_t d = 0; d < merged.dim(); ++d)
    if (d != dim) reduced.push_back(d);
  const at::Tensor norm = at::norm(merged, 2, reduced, /*keepdim=*/true).add_(epsilon);
  return merged.mul_(norms.reshape(norm.sizes()) / norm);
}

// DoRA as LyCORIS stores and merges it: the updated weight W + ΔW rescaled to the norms dora_scale holds, per output
// row when dora_scale is [out, 1, ...] (LyCORIS' wd_on_out, its default), per input column when it is [1, in, ...]
// (its earlier default), returned as an update of W:
//   W' = (W + ΔW) · dora_scale / (‖W + ΔW‖ + ε),  update = W' − W   (ε = float32's epsilon, as LyCORIS adds).
// Merged with strength s, W + s·(W' − W) is W' at s = 1 and W at s = 0, as ComfyUI applies it.
at::Tensor weight_decomposed_update(const at::Tensor& update, const at::Tensor& dora_scale, const at::Tensor& weight,
                                    const std::string& layer) {
  const int64_t out = weight.size(0), in = weight.size(1);
  const bool per_output = dora_scale.dim() >= 1 && dora_scale.size(0) == out && dora_scale.numel() == out;
  const bool per_input = dora_scale.dim() >= 2 && dora_scale.size(1) == in && dora_scale.numel() == in;
  SD_CHECK(per_output || per_input,
           "{}: dora_scale [{}] fits neither the layer's outputs [{}, 1, ...] nor its inputs [1, {}, ...]", layer,
           fmt::join(dora_scale.sizes(), ", "), out, in);
  // In place on one new tensor: the model's weights are large (SD-1.5's attention, 80 M values) and this runs once.
  at::Tensor merged = update.reshape(weight.sizes()) + weight;
  return rescale_to_norms(merged, dora_scale, per_output ? 0 : 1, std::numeric_limits<float>::epsilon()).sub_(weight);
}

// DoRA as peft computes it (diffusers' lora_magnitude_vector), with the adapter's strength s inside the norm:
//   W' = (W + s·ΔW) · magnitude / ‖W + s·ΔW‖   per output row, no ε;   returned as W' − W.
// At s = 0 the weight is still rescaled to the magnitudes, as peft does.
at::Tensor peft_dora_update(const at::Tensor& weight, const at::Tensor& delta, const at::Tensor& magnitude,
                            double scale) {
  at::Tensor merged = delta.reshape(weight.sizes()) * scale;
  merged.add_(weight);
  return rescale_to_norms(merged, magnitude, 0, 0.0).sub_(weight);
}

// peft's magnitude of `layer`: one norm per output row, [out] for a Linear, [1, out, 1, 1] for a Conv2d.
at::Tensor checked_magnitude(const at::Tensor& magnitude, at::IntArrayRef weight, const std::string& layer) {
  SD_CHECK(magnitude.numel() == weight[0] && magnitude.dim() >= 1,
           "{}: lora_magnitude_vector [{}] does not hold one norm per output of the layer's weight [{}]", layer,
           fmt::join(magnitude.sizes(), ", "), fmt::join(weight, ", "));
  return magnitude.flatten();
}

// The original (LDM) module path of a UNet layer: input_blocks.4.1.proj_in for down_blocks.1.attentions.0.proj_in.
std::string ldm_unet_module(const models::LdmNames& names, const std::string& path) {
  const std::string prefix = "model.diffusion_model.", suffix = ".weight";
  const std::string key = names.to_ldm(models::Component::kUnet, path + suffix).key;
  SD_CHECK(key.rfind(prefix, 0) == 0 && ends_with(key, suffix), "unexpected LDM key '{}' for {}", key, path);
  return key.substr(prefix.size(), key.size() - prefix.size() - suffix.size());
}

// Kohya stem of every adaptable layer of the pipeline's models, named by diffusers' module paths (as kohya's
// sd-scripts name SD-1.x/2.x layers) and, for the UNet, by the original LDM paths too
// (lora_unet_input_blocks_4_1_proj_in, as A1111 also reads them). The text encoder's LDM names are transformers'.
std::map<std::string, std::pair<LoraComponent, std::string>> kohya_paths(StableDiffusion& pipe) {
  const models::LdmNames ldm(pipe.unet->config(), pipe.vae.is_empty() ? models::VaeConfig() : pipe.vae->config(),
                             pipe.text_encoder->config());
  std::map<std::string, std::pair<LoraComponent, std::string>> paths;
  for (LoraComponent c : {LoraComponent::kUNet, LoraComponent::kTextEncoder}) {
    std::vector<std::string> layers = norm_layer_paths(pipe, c);
    for (const auto& [path, host] : hosts_by_path(pipe, c)) layers.push_back(path);
    for (const std::string& path : layers) {
      paths[kohya_stem(c, path)] = {c, path};
      if (c == LoraComponent::kUNet) paths[kohya_stem(c, ldm_unet_module(ldm, path))] = {c, path};
    }
  }
  return paths;
}

}  // namespace

std::optional<fs::path> find_lora_file(const fs::path& path) {
  if (fs::is_regular_file(path)) return path;
  for (const char* name : {"pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin"})
    if (fs::is_directory(path) && fs::is_regular_file(path / name)) return path / name;
  return std::nullopt;
}

LoraFormat parse_lora_format(const std::string& name) {
  if (name == "diffusers") return LoraFormat::kDiffusers;
  if (name == "kohya") return LoraFormat::kKohya;
  fail("--lora_format: expected diffusers or kohya, got '{}'", name);
}

std::string diffusers_lora_key(LoraComponent component, const std::string& module, const std::string& part) {
  // diffusers 0.24 names the text encoder's adapters after its PatchedLoraProjection.lora_linear_layer.
  if (component == LoraComponent::kUNet) return fmt::format("unet.{}.lora.{}.weight", module, part);
  return fmt::format("text_encoder.{}.lora_linear_layer.{}.weight", module, part);
}

void save_lora_file(const fs::path& path, const LoraWeights& weights, LoraFormat format,
                    const std::map<std::string, std::string>& metadata) {
  io::TensorMap tensors;
  for (const LoraModule& m : weights) {
    const at::Tensor down = m.down.to(at::kFloat), up = m.up.to(at::kFloat);
    if (format == LoraFormat::kDiffusers) {
      const double rank = static_cast<double>(down.size(0));
      tensors[diffusers_lora_key(m.component, m.module, "down")] = down;
      tensors[diffusers_lora_key(m.component, m.module, "up")] = m.alpha == rank ? up : up * (m.alpha / rank);
    } else {
      const std::string stem = kohya_stem(m.component, m.module);
      tensors[stem + ".lora_down.weight"] = down;
      tensors[stem + ".lora_up.weight"] = up;
      tensors[stem + ".alpha"] = at::scalar_tensor(m.alpha, at::kFloat);
    }
  }
  std::map<std::string, std::string> header = metadata;
  header["format"] = "pt";
  io::save_safetensors(path, tensors, header);
}

LoraFileContents load_lora_file(const fs::path& given, StableDiffusion& pipe) {
  const std::optional<fs::path> found = find_lora_file(given);
  SD_CHECK(found, "{}: {}", given.string(),
           fs::is_directory(given) ? "a folder without pytorch_lora_weights.safetensors or pytorch_lora_weights.bin"
                                   : "no such LoRA file");
  const fs::path& path = *found;
  const std::unique_ptr<io::TensorFile> opened = io::open_tensor_file(path);
  const io::TensorFile& file = *opened;
  const std::string name = path.string();
  std::optional<std::map<std::string, std::pair<LoraComponent, std::string>>> kohya;  // built on the first kohya key
  std::map<std::pair<LoraComponent, std::string>, Parts> modules;
  for (const std::string& key : file.names()) {
    SD_CHECK(!is_sdxl_key(key), "{}: an SDXL LoRA (key '{}'); sdtrain runs SD-1.x and SD-2.x models", name, key);
    std::optional<KeyTarget> target = parse_diffusers_key(key);
    if (!target && key.rfind("lora_", 0) == 0) {
      if (!kohya) kohya = kohya_paths(pipe);
      target = parse_kohya_key(key, *kohya, name);
    }
    SD_CHECK(target,
             "{}: unknown key '{}' (expected diffusers' unet.<module>.lora.down.weight or kohya's "
             "lora_unet_<module>.lora_down.weight, LyCORIS' .hada_w1_a (LoHa) or .lokr_w1 (LoKr), and their "
             "text-encoder, up and alpha twins)",
             name, key);
    const at::Tensor value = file.read(key).to(at::kFloat);
    io::check_finite(value, name, key);  // a NaN in any factor makes every image NaN
    SD_CHECK(target->part != "alpha" || value.numel() == 1, "{}: '{}': alpha must be a single number, got {} values",
             name, key, value.numel());
    modules[{target->component, target->module}][target->part] = value;
  }
  SD_CHECK(!modules.empty(), "{}: no LoRA weights in the file", name);
  LoraFileContents contents;
  PipelineLayers layers(pipe);  // the shapes (and for DoRA the weights) that whole updates take
  for (auto& [where, parts] : modules) {
    const std::string layer = fmt::format("{}: layer {}", name, where.second);
    const std::optional<double> alpha =
        parts.count("alpha") ? std::optional<double>(parts.at("alpha").item<double>()) : std::nullopt;
    const ModuleKind kind = kind_of(parts, layer);
    check_factors(parts, kind, layer);
    const auto dora_scale = parts.find("dora_scale"), magnitude = parts.find("lora_magnitude_vector");
    if (kind == ModuleKind::kLora && !parts.count("mid") && dora_scale == parts.end() && magnitude == parts.end()) {
      const at::Tensor &down = parts.at("down"), &up = parts.at("up");
      SD_CHECK(down.dim() >= 2, "{}: the down weight must be [rank, in] or [rank, in, kh, kw]", layer);
      contents.adapters.push_back({where.first, where.second, down, up, alpha.value_or(down.size(0))});
      continue;
    }
    if (kind == ModuleKind::kNorm) {
      const at::Tensor weight = layers.norm_parameter(where.first, where.second, "weight", name).detach();
      const auto bias = parts.find("b_norm");
      SD_CHECK(bias == parts.end() || bias->second.numel() == weight.numel(),
               "{}: b_norm [{}] does not fit the layer's bias [{}]", layer, fmt::join(bias->second.sizes(), ", "),
               weight.numel());
      contents.updates.push_back({where.first, where.second, module_update(parts, kind, weight, alpha, layer),
                                  bias != parts.end() ? bias->second : at::Tensor(), at::Tensor(),
                                  /*norm_layer=*/true});
      continue;
    }
    models::LoraHost& host = layers.at(where.first, where.second, name);
    at::Tensor update = module_update(parts, kind, host.current_weight(), alpha, layer);
    if (dora_scale != parts.end())
      update = weight_decomposed_update(update, dora_scale->second, host.current_weight(), layer);
    const auto bias = parts.find("diff_b");
    contents.updates.push_back({where.first, where.second, update, bias != parts.end() ? bias->second : at::Tensor(),
                                magnitude != parts.end()
                                    ? checked_magnitude(magnitude->second, host.base_weight_shape(), layer)
                                    : at::Tensor()});
  }
  return contents;
}

namespace {

// The kind and rank of one module of a file, from its parts' shapes (part -> key), marked +DoRA when it has a
// dora_scale; "no weights" for a module of an alpha or dora_scale alone, which load_lora_file refuses but a summary
// shows.
std::pair<std::string, std::optional<int64_t>> module_kind_and_rank(const io::TensorFile& file,
                                                                    const std::map<std::string, std::string>& parts,
                                                                    const std::string& layer) {
  auto shape_of = [&](const std::string& part) { return file.info(parts.at(part)).shape; };
  auto rank_of = [&](const std::string& part) -> std::optional<int64_t> {
    if (!parts.count(part) || shape_of(part).empty()) return std::nullopt;
    return shape_of(part)[0];
  };
  if (const auto unread = unread_parts(parts); !unread.empty())
    return {fmt::format("not read ({})", fmt::join(unread, ", ")), std::nullopt};
  if (std::none_of(parts.begin(), parts.end(), [](const auto& part) { return kind_of_part(part.first); }))
    return {"no weights", std::nullopt};
  const ModuleKind kind = kind_of(parts, layer);
  const std::optional<std::string> rank = rank_part(parts, kind);
  const std::string dora = parts.count("dora_scale") || parts.count("lora_magnitude_vector") ? "+DoRA" : "";
  // OFT and BOFT load alike (oft_update tells them apart by oft_blocks' dimensions), but a user asks which it is.
  if (kind == ModuleKind::kOft && parts.count("oft_blocks") && shape_of("oft_blocks").size() == 4)
    return {"BOFT" + dora, std::nullopt};
  if (kind != ModuleKind::kLora) return {kind_label(kind) + dora, rank ? rank_of(*rank) : std::nullopt};
  auto kxk = [&](const std::string& part) {
    const std::vector<int64_t> shape = parts.count(part) ? shape_of(part) : std::vector<int64_t>{};
    return shape.size() == 4 && shape[2] * shape[3] > 1;
  };
  return {(kxk("down") || kxk("mid") ? "LoCon" : "LoRA") + dora, rank_of(*rank)};
}

}  // namespace

std::optional<LoraFileSummary> summarize_lora_file(const fs::path& path) {
  const std::unique_ptr<io::TensorFile> file = io::open_tensor_file(path);
  LoraFileSummary summary;
  std::map<std::pair<LoraComponent, std::string>, std::map<std::string, std::string>> modules;  // part -> key
  for (const std::string& key : file->names()) {
    if (const auto diffusers = parse_diffusers_key(key)) {
      modules[{diffusers->component, diffusers->module}][diffusers->part] = key;
      summary.namings.insert("diffusers");
    } else if (const auto kohya = split_kohya_key(key)) {
      modules[{kohya_component(kohya->first), kohya->first}][kohya->second] = key;
      summary.namings.insert("kohya");
      summary.sdxl = summary.sdxl || is_sdxl_key(key);
    } else {
      return std::nullopt;
    }
  }
  if (modules.empty()) return std::nullopt;
  for (const auto& [where, parts] : modules) {
    ++(where.first == LoraComponent::kUNet ? summary.unet_modules : summary.text_encoder_modules);
    const auto [kind, rank] =
        module_kind_and_rank(*file, parts, fmt::format("{}: module {}", path.string(), where.second));
    LoraFileSummary::Kind& k = summary.kinds[kind];
    ++k.modules;
    if (rank) k.ranks.insert(*rank);
    for (const auto& [part, key] : parts) {
      if (part == "alpha") {
        const at::Tensor alpha = file->read(key);
        if (alpha.numel() == 1) k.alphas.insert(alpha.to(at::kDouble).item<double>());
        continue;
      }
      count_tensor(file->info(key), summary.weights);
    }
  }
  summary.metadata = file->metadata();
  return summary;
}

void attach_lora(StableDiffusion& pipe, const LoraWeights& weights, double scale, const std::string& source) {
  PipelineLayers layers(pipe);
  for (const LoraModule& m : weights)
    layers.at(m.component, m.module, source).add_adapter({m.down, m.up, m.alpha, scale}, source + ": " + m.module);
}

namespace {

// LyCORIS' norm module merged as LyCORIS and A1111 merge it: weight += scale · w_norm, bias += scale · b_norm.
void add_to_norm_layer(PipelineLayers& layers, const WeightUpdate& u, double scale, const std::string& source) {
  at::Tensor weight = layers.norm_parameter(u.component, u.module, "weight", source);
  models::add_in_float32(weight, u.delta, scale);
  if (!u.bias_delta.defined()) return;
  at::Tensor bias = layers.norm_parameter(u.component, u.module, "bias", source);
  models::add_in_float32(bias, u.bias_delta, scale);
}

}  // namespace

void apply_weight_updates(StableDiffusion& pipe, const std::vector<WeightUpdate>& updates, double scale,
                          const std::string& source) {
  PipelineLayers layers(pipe);
  for (const WeightUpdate& u : updates) {
    if (u.norm_layer) {
      add_to_norm_layer(layers, u, scale, source);
      continue;
    }
    models::LoraHost& layer = layers.at(u.component, u.module, source);
    if (u.magnitude.defined())
      layer.add_to_weight(peft_dora_update(layer.current_weight(), u.delta, u.magnitude, scale), 1.0,
                          source + ": " + u.module);
    else
      layer.add_to_weight(u.delta, scale, source + ": " + u.module);
    if (u.bias_delta.defined()) layer.add_to_bias(u.bias_delta, scale, source + ": " + u.module);
  }
}

void apply_lora_files(StableDiffusion& pipe, const std::vector<std::string>& files, const std::vector<double>& scales,
                      bool fuse) {
  SD_CHECK(scales.empty() || scales.size() == files.size(),
           "--lora_scale given {} time(s) for {} --lora file(s): give one scale per --lora, in the same order",
           scales.size(), files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const LoraFileContents contents = load_lora_file(files[i], pipe);
    const double scale = scales.empty() ? 1.0 : scales[i];
    attach_lora(pipe, contents.adapters, scale, files[i]);
    apply_weight_updates(pipe, contents.updates, scale, files[i]);
  }
  if (!fuse) return;
  models::merge_adapters(*pipe.unet);
  models::merge_adapters(*pipe.text_encoder);
}

}  // namespace sd::pipeline

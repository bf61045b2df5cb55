#include "perf/op_profiler.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace sd::perf {

namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// One open op on the profiled thread.
struct Frame {
  std::string name;
  OpClass op_class;
  Clock::time_point start;
  double children_s = 0;
  bool is_scope = false;
  bool counts_flops = false;  // the FLOPs of everything inside were counted at this frame
  int64_t flops = 0;
  std::string product;  // a product's op and shapes (product_name), for its FLOPs counted here
};

struct State {
  std::thread::id thread;
  bool count_flops = false;
  std::vector<Frame> stack;
  std::map<OpClass, double> seconds;
  std::map<OpClass, int64_t> flops;
  std::map<std::string, OpTotals> by_op;
  std::map<std::string, ProductTotals> products;
  mutable std::mutex mutex;  // profile() may read from another thread
};

std::atomic<State*> g_state{nullptr};

int64_t product(at::IntArrayRef sizes) {
  int64_t p = 1;
  for (int64_t s : sizes) p *= s;
  return p;
}

int64_t conv_flops(at::IntArrayRef x, at::IntArrayRef w, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation) {
  // A one-element stride, padding or dilation applies to every spatial dimension (at::conv2d's defaults are {1}).
  auto of_dim = [](const std::vector<int64_t>& v, size_t d) { return v.size() == 1 ? v[0] : v.at(d); };
  int64_t out_pixels = 1;
  for (size_t d = 0; d + 2 < x.size(); ++d)
    out_pixels *=
        (x[d + 2] + 2 * of_dim(padding, d) - of_dim(dilation, d) * (w[d + 2] - 1) - 1) / of_dim(stride, d) + 1;
  return 2 * x[0] * product(w) * out_pixels;  // weight = [out, in / groups, k...]
}

// 2 x multiply-adds of the ops that carry a model's FLOPs, from their inputs.
int64_t op_flops(const at::RecordFunction& fn) {
  const std::string name = fn.name();
  const auto inputs = fn.inputs();
  auto sizes = [&](size_t i) { return inputs[i].toTensor().sizes(); };
  if (name == "aten::convolution" && inputs.size() >= 9 && inputs[0].isTensor() && inputs[1].isTensor())
    return conv_flops(sizes(0), sizes(1), inputs[3].toIntVector(), inputs[4].toIntVector(), inputs[5].toIntVector());
  if (name == "aten::convolution_backward" && inputs.size() >= 11 && inputs[1].isTensor() && inputs[2].isTensor()) {
    // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask):
    // the input gradient and the weight gradient each cost a forward.
    const auto mask = inputs[10].toBoolList();
    return conv_flops(sizes(1), sizes(2), inputs[4].toIntVector(), inputs[5].toIntVector(), inputs[6].toIntVector()) *
           (int64_t{mask.get(0)} + int64_t{mask.get(1)});
  }
  if ((name == "aten::mm" || name == "aten::addmm" || name == "sdtrain::mm") && inputs.size() >= 2) {
    const size_t a = name == "aten::addmm" ? 1 : 0;
    // sdtrain::mm's third input says whether b is given as its transpose (a linear layer's weight); its a [S, M, K]
    // or b [S, K, N] is a batch of samples, each multiplied alone.
    const bool b_transposed = name == "sdtrain::mm" && inputs.size() >= 3 && inputs[2].toBool();
    const auto as = sizes(a), bs = sizes(a + 1);
    const int64_t samples = as.size() == 3 ? as[0] : bs.size() == 3 ? bs[0] : 1;
    return 2 * samples * as[as.size() - 2] * as.back() * (b_transposed ? bs[0] : bs.back());
  }
  if ((name == "aten::bmm" || name == "aten::baddbmm") && inputs.size() >= 2) {
    const size_t a = name == "aten::bmm" ? 0 : 1;
    return 2 * sizes(a)[0] * sizes(a)[1] * sizes(a)[2] * sizes(a + 1)[2];
  }
  if ((name == "sdtrain::attention" || name == "sdtrain::attention_backward") && inputs.size() >= 3) {
    // q kᵀ and P v forward; backward twice that (dq and dk from dS, dP and dv).
    const int64_t forward = 2 * sizes(0)[0] * sizes(0)[1] * sizes(1)[1] * (sizes(0)[2] + sizes(2)[2]);
    return name == "sdtrain::attention" ? forward : 2 * forward;
  }
  return 0;
}

// "aten::mm 11520x1280^T 1280x16": the op and its tensor inputs' sizes, ^T marking a matrix that is a transposed
// view (a product's speed depends on it).
std::string product_name(const at::RecordFunction& fn) {
  std::string name = fn.name();
  for (const c10::IValue& input : fn.inputs()) {
    if (!input.isTensor() || !input.toTensor().defined()) continue;  // e.g. a convolution without bias
    const at::Tensor& t = input.toTensor();
    name += ' ';
    for (int64_t d = 0; d < t.dim(); ++d) name += (d ? "x" : "") + std::to_string(t.size(d));
    if (t.dim() == 2 && t.stride(0) == 1 && t.size(1) > 1 && t.stride(1) != 1) name += "^T";
  }
  return name;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  State* state = g_state.load();
  if (!state || std::this_thread::get_id() != state->thread) return nullptr;
  const std::string name = fn.name();
  std::lock_guard<std::mutex> lock(state->mutex);
  const bool scope = fn.scope() == at::RecordScope::USER_SCOPE && name.rfind("sdtrain::", 0) == 0;
  // An op belongs to the outermost enclosing op of a class other than elementwise (the copies and allocations
  // inside a convolution are the convolution's), or to sdtrain's scope around it; else to its own class.
  OpClass c = classify_op(name);
  for (const Frame& f : state->stack)
    if (f.is_scope || f.op_class != OpClass::kElementwise) {
      c = f.op_class;
      break;
    }
  bool inside_counted = false;
  for (const Frame& f : state->stack) inside_counted |= f.counts_flops;
  const bool counts = state->count_flops && !inside_counted && (scope || fn.scope() == at::RecordScope::FUNCTION);
  const int64_t flops = counts ? op_flops(fn) : 0;
  state->flops[c] += flops;
  state->stack.push_back(
      {name, c, Clock::now(), 0, scope, scope && flops > 0, flops, flops > 0 ? product_name(fn) : std::string()});
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  State* state = g_state.load();
  if (!state || std::this_thread::get_id() != state->thread) return;
  std::lock_guard<std::mutex> lock(state->mutex);
  if (state->stack.empty()) return;  // an op that started before the profiler
  const Frame f = state->stack.back();
  state->stack.pop_back();
  const double total = std::chrono::duration<double>(Clock::now() - f.start).count();
  state->seconds[f.op_class] += total - f.children_s;
  OpTotals& op = state->by_op[f.name];
  op.self_seconds += total - f.children_s;
  ++op.calls;
  if (!f.product.empty()) {
    ProductTotals& product = state->products[f.product];
    product.seconds += total;
    ++product.calls;
    product.flops += f.flops;
  }
  if (!state->stack.empty()) state->stack.back().children_s += total;
}

}  // namespace

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::kConv: return "conv";
    case OpClass::kLinear: return "linear";
    case OpClass::kAttention: return "attention";
    case OpClass::kNorm: return "norm";
    case OpClass::kElementwise: return "elementwise";
    case OpClass::kOptimizer: return "optimizer";
    case OpClass::kCommunication: return "communication";
    case OpClass::kDataWait: return "data_wait";
  }
  return "?";
}

OpClass classify_op(const std::string& name) {
  if (name == "sdtrain::optimizer") return OpClass::kOptimizer;
  if (name == "sdtrain::communication") return OpClass::kCommunication;
  if (name == "sdtrain::data_wait") return OpClass::kDataWait;
  if (name == "sdtrain::attention" || name == "sdtrain::attention_backward") return OpClass::kAttention;
  if (contains(name, "conv") || contains(name, "Convolution")) return OpClass::kConv;
  if (contains(name, "bmm") || contains(name, "softmax") || contains(name, "Softmax")) return OpClass::kAttention;
  if (name == "aten::mm" || name == "aten::addmm" || name == "sdtrain::mm" || name == "aten::linear" ||
      name == "aten::matmul" || contains(name, "MmBackward") || contains(name, "AddmmBackward"))
    return OpClass::kLinear;
  if (name == "sdtrain::norm" || name == "sdtrain::norm_backward" || contains(name, "group_norm") ||
      contains(name, "layer_norm") || contains(name, "GroupNorm") || contains(name, "LayerNorm"))
    return OpClass::kNorm;
  return OpClass::kElementwise;
}

OpProfiler::OpProfiler(bool count_flops) {
  auto* state = new State;
  state->thread = std::this_thread::get_id();
  state->count_flops = count_flops;
  State* expected = nullptr;
  if (!g_state.compare_exchange_strong(expected, state)) {
    delete state;
    fail("only one OpProfiler may run at a time");
  }
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end).needsInputs(count_flops));
}

OpProfiler::~OpProfiler() {
  at::removeCallback(handle_);
  delete g_state.exchange(nullptr);
}

OpProfile OpProfiler::profile() const {
  State* state = g_state.load();
  std::lock_guard<std::mutex> lock(state->mutex);
  OpProfile p;
  for (const auto& [c, s] : state->seconds) p.seconds[op_class_name(c)] = s;
  p.by_op = state->by_op;
  p.products = state->products;
  for (const auto& [c, f] : state->flops) {
    if (f > 0) p.flops[op_class_name(c)] = f;
    p.matmul_flops += f;
  }
  return p;
}

}  // namespace sd::perf

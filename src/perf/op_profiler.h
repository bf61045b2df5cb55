// Where the time of a training step goes, by op class, and how many matmul/convolution FLOPs each class really ran
// (forward and backward; model FLOPs, so attention's recomputation in backward is not counted), from
// LibTorch's RecordFunction hooks on the thread that started the profiler:
//   conv, linear, attention (bmm, baddbmm, softmax), norm, elementwise (everything else LibTorch runs),
//   optimizer (gradient norm, AdamW, EMA), communication (waiting for collectives), data wait (waiting for the loader)
// An op's self time (its time minus the ops it called) goes to the class of the outermost op around it that is not
// elementwise (a convolution's internal copies are the convolution's), or to sdtrain's own scope around it
// (SD_PERF_SCOPE), else to its own class.
#pragma once
#include <ATen/record_function.h>

#include <cstdint>
#include <map>
#include <string>

namespace sd::perf {

enum class OpClass { kConv, kLinear, kAttention, kNorm, kElementwise, kOptimizer, kCommunication, kDataWait };
const char* op_class_name(OpClass c);
// The class of a LibTorch op or autograd node by its name ("aten::convolution_backward" -> conv).
OpClass classify_op(const std::string& name);

// Marks a region of sdtrain's own code for the profiler (a RecordFunction user scope; free when no profiler runs).
// The names are the classes: "sdtrain::optimizer", "sdtrain::communication", "sdtrain::data_wait", and
// "sdtrain::attention" / "sdtrain::attention_backward" around models/tiled_attention.h, whose GEMMs run on every
// thread (the scope's inputs q, k, v give its FLOPs; the GEMMs inside are not counted again), and "sdtrain::mm"
// around core/onednn_matmul.h's products (linear, as at::mm; a third input says whether b came as its transpose).
#define SD_PERF_SCOPE(name) RECORD_USER_SCOPE(name)

// One op's totals: its own time (its children's excluded) and how often it ran (a small model's cost is its op
// count).
struct OpTotals {
  double self_seconds = 0;
  int64_t calls = 0;
};

// One product's totals (a convolution, matrix product or attention whose FLOPs were counted), over every call of one
// op on one set of input shapes: its whole time (what ran inside included), calls and FLOPs.
struct ProductTotals {
  double seconds = 0;
  int64_t calls = 0;
  int64_t flops = 0;
};

struct OpProfile {
  std::map<std::string, double> seconds;  // by op class name
  int64_t matmul_flops = 0;               // 2 x multiply-adds of convolutions and (batched) matrix products
  std::map<std::string, int64_t> flops;   // matmul_flops by op class name
  std::map<std::string, OpTotals> by_op;  // by op name
  // With FLOPs counted: by op name and input shapes, e.g. "aten::mm 11520x1280^T 1280x16" (^T: a matrix given as a
  // transposed view), the roofline of a step shape by shape.
  std::map<std::string, ProductTotals> products;
};

// Records while alive (one at a time); profile() reads what was recorded so far.
class OpProfiler {
 public:
  // `count_flops` also reads every op's inputs to count FLOPs (slower).
  explicit OpProfiler(bool count_flops = false);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  OpProfile profile() const;

 private:
  at::CallbackHandle handle_;
};

}  // namespace sd::perf

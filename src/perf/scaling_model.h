// A model of one data-parallel training step on N machines (docs/scaling.md), to carry what a few machines measure
// to many: each rank computes its micro-batches, and its float32 gradient buckets cross its network link in rings
// while backward still runs (dist/gradient_reducer.h), so only the communication backward cannot hide adds to the
// step. From compute times, the trained parameters, the bucket size and the link it predicts step time, efficiency
// and the bytes each rank puts on the wire. bench_scaling_model evaluates it.
#pragma once
#include <cstdint>

namespace sd::perf {

struct LinkModel {
  double gbit_per_s = 10;  // in each direction (links are full duplex: a ring sends and receives at once)
  double latency_s = 0;    // per message, one way: wire, switches and the communication library's own overhead
};

struct StepModel {
  int machines = 1;                // one rank each
  int micro_batches = 1;           // per rank per step
  double micro_batch_s = 0;        // forward + backward of one micro-batch
  double backward_share = 2. / 3;  // of micro_batch_s: backward runs twice the forward's FLOPs
  double update_s = 0;             // per step after the last backward: clipping, optimizer, EMA, on this rank
  bool sharded = false;            // shard_grad_op: buckets reduce-scattered every micro-batch, weights all-gathered
  int64_t parameters = 0;          // trained
  double bucket_cap_bytes = 25 << 20;  // float32 gradients per bucket (--bucket_cap_mb)
  double compute_weight_bytes = 2;     // per parameter, all-gathered after the update when sharded (bf16: 2)
  LinkModel link;
};

struct StepPrediction {
  double compute_s = 0;   // the step on a machine that never waits for the network
  double link_s = 0;      // time the link is busy per step
  double exposed_s = 0;   // communication the step waits for
  double step_s = 0;      // compute_s + exposed_s
  double efficiency = 0;  // compute_s / step_s: throughput per machine against one that never waits
  double wire_bytes = 0;  // sent by each rank per step; it receives as many
  int64_t messages = 0;   // sent by each rank per step
  int64_t buckets = 0;
};

StepPrediction predict_step(const StepModel& model);

// The fewest micro-batches per rank per step (1..limit) that keep predict_step's efficiency >= `target`, or 0 if
// even `limit` does not.
int micro_batches_for_efficiency(StepModel model, double target, int limit = 4096);

}  // namespace sd::perf

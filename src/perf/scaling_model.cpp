#include "perf/scaling_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sd::perf {

namespace {

// A ring collective over `ranks` ranks in `steps` steps, each sending one ranks-th of `bytes` to the next rank.
double ring_seconds(double bytes, int ranks, int steps, const LinkModel& link) {
  return steps * (link.latency_s + bytes / ranks / (link.gbit_per_s * 1e9 / 8));
}

// The link as a queue: a bucket leaves once it is ready and the bucket before it has gone.
struct LinkQueue {
  double free_at = 0, busy_s = 0;
  void send(double ready_at, double seconds) {
    free_at = std::max(free_at, ready_at) + seconds;
    busy_s += seconds;
  }
};

}  // namespace

StepPrediction predict_step(const StepModel& m) {
  SD_CHECK(m.machines >= 1 && m.micro_batches >= 1, "scaling model: machines and micro-batches must be >= 1");
  SD_CHECK(m.link.gbit_per_s > 0 && m.bucket_cap_bytes > 0, "scaling model: bandwidth and bucket size must be > 0");
  StepPrediction p;
  const double gradient_bytes = 4.0 * static_cast<double>(m.parameters);
  p.buckets = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(gradient_bytes / m.bucket_cap_bytes)));
  const double bucket_bytes = gradient_bytes / static_cast<double>(p.buckets);
  const double backward_s = m.backward_share * m.micro_batch_s;
  const double compute_end = m.micro_batches * m.micro_batch_s;
  p.compute_s = compute_end + m.update_s;
  const int n = m.machines, ring = n - 1;  // a reduce-scatter or an all-gather takes n - 1 steps
  // Without sharding only the last micro-batch's backward sends, an allreduce (2 rings) per bucket; with sharding
  // every micro-batch's backward reduce-scatters its buckets.
  const int first_sending = m.sharded ? 0 : m.micro_batches - 1;
  const int steps_per_bucket = m.sharded ? ring : 2 * ring;
  LinkQueue link;
  for (int mb = first_sending; mb < m.micro_batches && n > 1; ++mb) {
    const double backward_end = (mb + 1) * m.micro_batch_s;
    for (int64_t k = 0; k < p.buckets; ++k) {
      // Buckets fill in proportion to the parameters backward has reached (they are laid out in backward's order).
      const double ready_at = backward_end - backward_s * (1 - static_cast<double>(k + 1) / p.buckets);
      link.send(ready_at, ring_seconds(bucket_bytes, n, steps_per_bucket, m.link));
    }
    p.messages += p.buckets * steps_per_bucket;
    p.wire_bytes += bucket_bytes * p.buckets * steps_per_bucket / n;
  }
  // Every step ends with the mean loss over ranks, one scalar allreduce.
  const double scalar_allreduce_s = 2 * ring * m.link.latency_s;
  double t = std::max(compute_end, link.free_at) + m.update_s + scalar_allreduce_s;
  p.messages += 2 * ring;
  if (m.sharded && n > 1) {
    // The global gradient norm, one more scalar allreduce, comes before the update; then the updated compute
    // weights are all-gathered with nothing left to hide behind.
    t += scalar_allreduce_s;
    const double weight_bytes = m.compute_weight_bytes * static_cast<double>(m.parameters) / p.buckets;
    const double gather_s = p.buckets * ring_seconds(weight_bytes, n, ring, m.link);
    t += gather_s;
    link.busy_s += gather_s;
    p.messages += 2 * ring + p.buckets * ring;
    p.wire_bytes += weight_bytes * p.buckets * ring / n;
  }
  p.step_s = t;
  p.link_s = link.busy_s;
  p.exposed_s = p.step_s - p.compute_s;
  p.efficiency = p.compute_s / p.step_s;
  return p;
}

int micro_batches_for_efficiency(StepModel model, double target, int limit) {
  for (int m = 1; m <= limit; ++m) {
    model.micro_batches = m;
    if (predict_step(model).efficiency >= target) return m;
  }
  return 0;
}

}  // namespace sd::perf

// The loops of bf16_silu.cpp, written once against core/simd.h's operations and included there once per vector
// width. Not a header of its own. Values are bf16 (their bits as uint16_t), arithmetic float32, each result rounded
// once; the last n % kLanes values go through masked loads and stores.

// σ(x) = 1 / (1 + e^-x), which exp's clamping keeps finite at both ends (0 below x = -88.3, 1 above 87.3).
inline Vec sigmoid(Vec x) { return div(splat(1.f), add(splat(1.f), exp(sub(zero(), x)))); }

// y = x · σ(x) over n values.
inline void silu_values(const uint16_t* x, uint16_t* y, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t j = 0; j < full; j += kLanes) {
    const Vec v = load(x + j);
    store(y + j, mul(v, sigmoid(v)));
  }
  if (rest) {
    const Vec v = load_first(x + full, rest, 0.f);
    store_first(y + full, mul(v, sigmoid(v)), rest);
  }
}

// dx = dy · σ(x) · (1 + x · (1 − σ(x))) over n values, as LibTorch's silu_backward.
inline Vec silu_gradient(Vec dy, Vec x) {
  const Vec s = sigmoid(x);
  return mul(mul(dy, s), fmadd(x, sub(splat(1.f), s), splat(1.f)));
}
inline void silu_gradient_values(const uint16_t* dy, const uint16_t* x, uint16_t* dx, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t j = 0; j < full; j += kLanes) store(dx + j, silu_gradient(load(dy + j), load(x + j)));
  if (rest)
    store_first(dx + full, silu_gradient(load_first(dy + full, rest, 0.f), load_first(x + full, rest, 0.f)), rest);
}

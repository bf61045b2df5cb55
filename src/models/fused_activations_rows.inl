// The loops of fused_activations.cpp, written once against core/simd.h's operations and included there once per vector
// width. Not a header of its own. Values are T: float32, or bf16 as their bits (uint16_t); arithmetic float32, each
// result rounded once to T; the last n % kLanes values go through masked loads and stores.

// σ(x) = 1 / (1 + e^-x), which exp's clamping keeps finite at both ends (0 below x = -88.3, 1 above 87.3).
inline Vec sigmoid(Vec x) { return div(splat(1.f), add(splat(1.f), exp(sub(zero(), x)))); }

// y = x · σ(x) over n values.
template <typename T>
inline void silu_values(const T* x, T* y, int64_t n) {
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
template <typename T>
inline void silu_gradient_values(const T* dy, const T* x, T* dx, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t j = 0; j < full; j += kLanes) store(dx + j, silu_gradient(load(dy + j), load(x + j)));
  if (rest)
    store_first(dx + full, silu_gradient(load_first(dy + full, rest, 0.f), load_first(x + full, rest, 0.f)), rest);
}

// Φ(x), the standard normal distribution function, from erfc (Numerical Recipes' erfcc, relative error below 1.2e-7
// for every argument): a tail's small values keep their precision, as GELU's negative side needs.
constexpr float kErfcPolynomial[] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                     -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f, -1.26551223f};
inline Vec normal_cdf(Vec x) {
  const Vec z = mul(max(x, sub(zero(), x)), splat(0.70710678118654752f));  // |x| / √2
  const Vec t = div(splat(1.f), fmadd(z, splat(0.5f), splat(1.f)));
  Vec p = splat(kErfcPolynomial[0]);
  for (int i = 1; i < 10; ++i) p = fmadd(p, t, splat(kErfcPolynomial[i]));
  const Vec tail = mul(splat(0.5f), mul(t, exp(fnmadd(z, z, p))));  // ½ erfc(|x| / √2) = Φ(-|x|)
  return select_where_negative(x, tail, sub(splat(1.f), tail));
}

// x rounded to T, as an op of LibTorch's that stores its result as T does (float32 values are already).
template <typename T>
inline Vec rounded_to(Vec x) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return round_to_bf16(x);
  else
    return x;
}

// GELU(x) = x · Φ(x), rounded to T as LibTorch's GELU stores it.
template <typename T>
inline Vec gelu_rounded(Vec x) { return rounded_to<T>(mul(x, normal_cdf(x))); }

// GELU'(x) = Φ(x) + x · φ(x), φ(x) = e^(-x²/2) / √(2π).
inline Vec gelu_derivative(Vec x) {
  const Vec density = mul(exp(mul(mul(x, x), splat(-0.5f))), splat(0.39894228040143268f));
  return fmadd(x, density, normal_cdf(x));
}

// GEGLU over `rows` rows of 2·n values h = [a, g]: out = a · GELU(g), n values per row, GELU(g) and the product
// each rounded once to T.
template <typename T>
inline void geglu_rows(const T* h, T* out, int64_t rows, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, h += 2 * n, out += n) {
    for (int64_t j = 0; j < full; j += kLanes) store(out + j, mul(load(h + j), gelu_rounded<T>(load(h + n + j))));
    if (rest) {
      const Vec a = load_first(h + full, rest, 0.f), g = load_first(h + n + full, rest, 0.f);
      store_first(out + full, mul(a, gelu_rounded<T>(g)), rest);
    }
  }
}

// GEGLU's backward into dh = [da, dg]: da = d_out · GELU(g) and dg = (d_out · a) · GELU'(g), with the roundings
// to T of the two products that LibTorch's mul and gelu_backward make.
template <typename T>
inline Vec geglu_gate_gradient(Vec d, Vec a, Vec g) { return mul(rounded_to<T>(mul(d, a)), gelu_derivative(g)); }
template <typename T>
inline void geglu_gradient_rows(const T* d_out, const T* h, T* dh, int64_t rows, int64_t n) {
  const int64_t full = n / kLanes * kLanes, rest = n - full;
  for (int64_t r = 0; r < rows; ++r, d_out += n, h += 2 * n, dh += 2 * n) {
    for (int64_t j = 0; j < full; j += kLanes) {
      const Vec d = load(d_out + j), g = load(h + n + j);
      store(dh + j, mul(d, gelu_rounded<T>(g)));
      store(dh + n + j, geglu_gate_gradient<T>(d, load(h + j), g));
    }
    if (rest) {
      const Vec d = load_first(d_out + full, rest, 0.f), g = load_first(h + n + full, rest, 0.f);
      store_first(dh + full, mul(d, gelu_rounded<T>(g)), rest);
      store_first(dh + n + full, geglu_gate_gradient<T>(d, load_first(h + full, rest, 0.f), g), rest);
    }
  }
}

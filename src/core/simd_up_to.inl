// Loads and stores of a range's first values, up to one vector: the whole vector while count >= kLanes, else masked
// to the first `count` lanes. For the kernel files compiled once per width (core/simd_each_width.inl), which include
// it at their top; it sees that width's operations. Not a header of its own.

// The first min(count, kLanes) values from p, the lanes past them `fill`.
// T is float or uint16_t (bf16 bits), as for load() and store().
template <typename T>
inline Vec load_up_to(const T* p, int64_t count, float fill = 0.f) {
  return count >= kLanes ? load(p) : load_first(p, count, fill);
}
template <typename T>
inline void store_up_to(T* p, Vec x, int64_t count) {
  if (count >= kLanes)
    store(p, x);
  else
    store_first(p, x, count);
}

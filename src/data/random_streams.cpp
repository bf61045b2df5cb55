#include "data/random_streams.h"

#include <ATen/CPUGeneratorImpl.h>

namespace sd::data {

namespace {
// splitmix64's finaliser: a cheap bijective mix, so nearby inputs give unrelated seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

at::Generator stream_generator(uint64_t seed, Stream purpose, uint64_t a, uint64_t b) {
  uint64_t h = mix(seed);
  h = mix(h ^ static_cast<uint64_t>(purpose));
  h = mix(h ^ a);
  h = mix(h ^ b);
  return at::make_generator<at::CPUGeneratorImpl>(h);
}

}  // namespace sd::data

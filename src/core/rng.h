// Deterministic, seedable random numbers (splitmix64 + Box-Muller) for initialisation and tests.
// Same seed -> same numbers on every machine and thread count. Not torch's generator.
#pragma once

#include <cmath>
#include <cstdint>

namespace st {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t NextU64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return NextU64() % n; }
  // Standard normal.
  double Normal() {
    double u1 = Uniform(), u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Advances the stream by n draws of NextU64 (a normal value takes two) in O(1): the generator
  // is counter-based, so any element of a stream can be produced without the ones before it.
  void Skip(uint64_t n) { state_ += n * 0x9e3779b97f4a7c15ull; }
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace st

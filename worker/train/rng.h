// Deterministic random numbers that do not depend on the C++ library's distributions (whose
// algorithms are implementation-defined): the same seed gives the same bits on every compiler.
#ifndef LOOM_WORKER_TRAIN_RNG_H_
#define LOOM_WORKER_TRAIN_RNG_H_

#include <cmath>
#include <cstdint>

namespace loom::train {

// SplitMix64's finaliser: a bijective mix of 64 bits. Used as a counter-based hash, so a value
// is a pure function of its inputs (no hidden state to save in checkpoints).
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hashes a tuple of integers into 64 bits; order matters.
constexpr uint64_t HashTuple(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  return Mix64(Mix64(Mix64(Mix64(a) ^ b) ^ c) ^ d);
}

// A small sequential generator (SplitMix64 stream). Its whole state is one uint64.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t NextU64() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1) with 53 random bits.
  double NextUniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0 (bias below 2^-40 for n < 2^24; fine for sampling text).
  uint64_t NextBelow(uint64_t n) { return NextU64() % n; }

  // Standard normal by Box-Muller (one value per call; the pair's second half is dropped so the
  // state stays a single integer).
  double NextNormal() {
    double u1 = NextUniform();
    double u2 = NextUniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_RNG_H_

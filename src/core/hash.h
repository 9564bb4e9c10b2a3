// The project's two non-cryptographic hashes, so that each is written once: byte-wise FNV-1a 64
// (the model hash engines record) and its word-wise variant (engine-file checksums, weight keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln {

// FNV-1a 64 over bytes: the model hash (Network::model_hash) stored in every engine header.
inline uint64_t fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t h = 14695981039346656037ull;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

// FNV-1a 64 over little-endian 64-bit words, then over the tail bytes. Each step (h ^= w; h *= odd
// prime) is a bijection of the state, so any change confined to one word, in particular one flipped
// byte, always changes the result; going a word at a time keeps the pass over large weight sections
// about 8x faster than byte-wise FNV-1a without pulling in CRC tables or SSE4.2 intrinsics.
inline uint64_t checksum64(std::span<const uint8_t> bytes) {
  constexpr uint64_t kOffset = 0xcbf29ce484222325ull;
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = kOffset;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k) w |= uint64_t(bytes[i + k]) << (8 * k);
    h = (h ^ w) * kPrime;
  }
  for (; i < bytes.size(); ++i) h = (h ^ bytes[i]) * kPrime;
  return h;
}

}  // namespace kiln

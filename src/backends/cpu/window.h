// The geometry of a sliding window along one axis (convolution and pooling on the CPU), and the
// outputs whose window start falls inside the input.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::backends::cpu {

// One spatial axis of a sliding window: input size, kernel size, output size, and how they relate.
struct Axis {
  int64_t in = 1, k = 1, out = 1, stride = 1, dil = 1, pb = 0, pe = 0;
};

// The j in [0, count) with 0 <= start + j*step < limit form [*lo, *hi).
inline void valid_range(int64_t start, int64_t step, int64_t count, int64_t limit, int64_t* lo,
                        int64_t* hi) {
  int64_t l = start >= 0 ? 0 : (-start + step - 1) / step;
  int64_t h = start > limit - 1 ? 0 : (limit - 1 - start) / step + 1;
  l = std::min(l, count);
  h = std::min(h, count);
  *lo = l;
  *hi = std::max(h, l);
}

}  // namespace kiln::backends::cpu

#include "backends/cpu/conv_nhwc.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backends/cpu/thread_pool.h"

namespace kiln::backends::cpu {
namespace {

// The tile of output pixels a GEMM task computes: its A rows (patches) and C rows together about
// this many bytes, so that both stay in the core's L2 while the epilogue reads C.
constexpr int64_t kTileBytes = 256 * 1024;
// Tiles are whole multiples of the micro-kernel's rows (12 on AVX-512, 6 below).
constexpr int64_t kTileRowsMultiple = 12;

struct Geometry {
  int64_t n, h, w, c, oh, ow, m;
  Axis ah, aw;
};

Status geometry(const NhwcConvWeights& wt, const TensorView& x, const TensorView& y, Geometry* g) {
  if (x.rank() != 4 || y.rank() != 4 || x.dtype != DType::kFloat32 || y.dtype != DType::kFloat32) {
    return invalid_argument("FusedConv (NHWC): X " + shape_to_string(x.shape) + " and Y " +
                            shape_to_string(y.shape) + " must be float32 of rank 4");
  }
  *g = Geometry{x.shape[0], x.shape[1], x.shape[2], x.shape[3], y.shape[1],
                y.shape[2], y.shape[3], {},         {}};
  if (g->c != wt.c || g->m != wt.m || y.shape[0] != g->n) {
    return invalid_argument("FusedConv (NHWC): X " + shape_to_string(x.shape) + " and Y " +
                            shape_to_string(y.shape) + " do not match the filter's " +
                            std::to_string(wt.c) + " input and " + std::to_string(wt.m) +
                            " output channels");
  }
  const int64_t in[2] = {g->h, g->w}, k[2] = {wt.kh, wt.kw}, out[2] = {g->oh, g->ow};
  Axis ax[3];
  KILN_RETURN_IF_ERROR(resolve_axes("FusedConv", wt.attrs, 2, in, k, out, ax));
  g->ah = ax[1];
  g->aw = ax[2];
  return ok_status();
}

// The patches of output pixels [p0, p1) as rows of kh * kw * C floats in the filter's (kh, kw, c)
// order, zeros where a tap falls in the padding. A run of taps along W at dilation 1 is one copy.
// Walks the pixels by output row, so that no pixel pays for divisions.
void im2col_nhwc(const float* x, const Geometry& g, int64_t p0, int64_t p1, float* col) {
  const Axis &ah = g.ah, &aw = g.aw;
  const int64_t row = ah.k * aw.k * g.c, span = aw.k * g.c;
  int64_t ow = p0 % g.ow, oh = (p0 / g.ow) % g.oh, b = p0 / (g.ow * g.oh);
  for (int64_t p = p0; p < p1; ++p) {
    float* dst = col + (p - p0) * row;
    const float* img = x + b * g.h * g.w * g.c;
    const int64_t iw0 = ow * aw.stride - aw.pb;
    int64_t kw_lo = 0, kw_hi = 0;
    valid_range(iw0, aw.dil, aw.k, g.w, &kw_lo, &kw_hi);
    for (int64_t kh = 0; kh < ah.k; ++kh, dst += span) {
      const int64_t ih = oh * ah.stride - ah.pb + kh * ah.dil;
      if (ih < 0 || ih >= g.h || kw_lo >= kw_hi) {
        std::fill_n(dst, span, 0.f);
        continue;
      }
      const float* src = img + ih * g.w * g.c;
      if (aw.dil == 1 && kw_lo == 0 && kw_hi == aw.k) {
        const float* s = src + iw0 * g.c;
        for (int64_t j = 0; j < span; ++j) dst[j] = s[j];
        continue;
      }
      std::fill_n(dst, kw_lo * g.c, 0.f);
      for (int64_t kw = kw_lo; kw < kw_hi; ++kw) {
        std::memcpy(dst + kw * g.c, src + (iw0 + kw * aw.dil) * g.c, size_t(g.c) * sizeof(float));
      }
      std::fill_n(dst + kw_hi * g.c, (aw.k - kw_hi) * g.c, 0.f);
    }
    if (++ow == g.ow) {
      ow = 0;
      if (++oh == g.oh) {
        oh = 0;
        ++b;
      }
    }
  }
}

// Output pixels [p0, p1) of a dense conv with few output channels (sgemm_small_n) into y (pixel
// p's row at y + p * M): a pixel whose taps all lie inside the image reads its patch where it lies
// (one offset per tap, the same for every such pixel); the others, along the padding, through
// im2col. Both sum the taps in the filter's order, so a pixel's bits do not depend on which.
void small_n_tile(const NhwcConvWeights& wt, const Geometry& g, const float* x, float* y,
                  int64_t p0, int64_t p1) {
  const Axis &ah = g.ah, &aw = g.aw;
  const int64_t k = wt.kh * wt.kw * g.c;
  static thread_local std::vector<int64_t> off;
  static thread_local std::vector<float> col;
  off.resize(size_t(k));
  for (int64_t kh = 0, t = 0; kh < ah.k; ++kh) {
    for (int64_t kw = 0; kw < aw.k; ++kw) {
      for (int64_t c = 0; c < g.c; ++c)
        off[size_t(t++)] = (kh * ah.dil * g.w + kw * aw.dil) * g.c + c;
    }
  }
  auto through_col = [&](int64_t q0, int64_t q1) {
    if (q0 >= q1) return;
    if (col.size() < size_t((q1 - q0) * k)) col.resize(size_t((q1 - q0) * k));
    im2col_nhwc(x, g, q0, q1, col.data());
    sgemm_small_n(q1 - q0, g.m, k, col.data(), k, wt.small.data(), y + q0 * g.m, g.m);
  };
  // The output columns whose taps along W all lie inside the image: [lo, hi).
  const int64_t span_w = (aw.k - 1) * aw.dil;
  const int64_t lo = std::min(g.ow, (aw.pb + aw.stride - 1) / aw.stride);
  const int64_t hi =
      g.w - 1 - span_w + aw.pb < 0 ? 0 : std::min(g.ow, (g.w - 1 - span_w + aw.pb) / aw.stride + 1);
  for (int64_t p = p0; p < p1;) {
    const int64_t ow = p % g.ow, oh = (p / g.ow) % g.oh, b = p / (g.ow * g.oh);
    const int64_t row = p - ow, end = std::min(p1, row + g.ow);
    const int64_t ih0 = oh * ah.stride - ah.pb;
    const int64_t s = std::max(p, row + lo), e = std::min(end, row + hi);
    if (ih0 < 0 || ih0 + (ah.k - 1) * ah.dil >= g.h || s >= e) {
      through_col(p, end);
    } else {
      through_col(p, s);
      const float* a = x + ((b * g.h + ih0) * g.w + (s - row) * aw.stride - aw.pb) * g.c;
      sgemm_small_n_gather(e - s, g.m, k, a, aw.stride * g.c, off.data(), wt.small.data(),
                           y + s * g.m, g.m);
      through_col(e, end);
    }
    p = end;
  }
}

// Output pixels [p0, p1) of a dense conv: the GEMM over their patches (the pixels themselves at
// 1x1 with unit stride and no padding), then the bias and the epilogue.
void gemm_tile(const NhwcConvWeights& wt, const Geometry& g, bool pointwise, const float* x,
               const float* filter, const float* bias, float* y, const NhwcEpilogue& epi,
               int64_t p0, int64_t p1) {
  const int64_t k = wt.kh * wt.kw * g.c;
  const float* a = x + p0 * g.c;
  float* yt = y + p0 * g.m;
  if (!pointwise && !wt.small.empty() && p1 - p0 > 1) {
    small_n_tile(wt, g, x, y, p0, p1);
    if (bias) add_rows_f32(yt, bias, p1 - p0, g.m);
    epi.apply(yt, p0, p1 - p0);
    return;
  }
  if (!pointwise) {
    static thread_local std::vector<float> col;
    if (col.size() < size_t((p1 - p0) * k)) col.resize(size_t((p1 - p0) * k));
    im2col_nhwc(x, g, p0, p1, col.data());
    a = col.data();
  }
  if (p1 - p0 == 1) {
    // One pixel (a squeeze-excitation's 1x1 map): the filter's rows against it, streamed once.
    sgemm(false, false, g.m, 1, k, 1.f, filter, k, a, 1, 0.f, yt, 1);
  } else if (!wt.small.empty()) {
    sgemm_small_n(p1 - p0, g.m, k, a, k, wt.small.data(), yt, g.m);
  } else {
    sgemm_packed(p1 - p0, 1.f, a, k, filter, k, *wt.gemm, 0.f, yt, g.m);
  }
  if (bias) add_rows_f32(yt, bias, p1 - p0, g.m);
  epi.apply(yt, p0, p1 - p0);
}

void dense(const NhwcConvWeights& wt, const Geometry& g, const float* x, const float* filter,
           const float* bias, float* y, const NhwcEpilogue& epi) {
  const bool pointwise = wt.kh == 1 && wt.kw == 1 && g.ah.stride == 1 && g.aw.stride == 1 &&
                         g.ah.pb == 0 && g.aw.pb == 0 && g.h == g.oh && g.w == g.ow;
  const int64_t pixels = g.n * g.oh * g.ow, k = wt.kh * wt.kw * g.c;
  int64_t tile = kTileBytes / int64_t(sizeof(float)) / (k + g.m);
  tile = std::max(kTileRowsMultiple, tile / kTileRowsMultiple * kTileRowsMultiple);
  const int64_t threads = thread_limit();
  const bool worth_threads = threads > 1 && pixels * k * g.m >= kParallelGrain * 64;
  // Where the tiles are fewer than two a thread, the pixels are split evenly over the threads
  // instead (rows in fours), each tile's GEMM on one thread: sgemm_small_n has no threads of its
  // own, and the packed GEMM's split of a 7x7 or 14x14 map's 1x1 conv measured slower (MobileNetV3-
  // small's 40 -> 240, 48 -> 144 and 96 -> 576 convs 25-35% faster this way on two cores).
  const bool split_evenly = worth_threads && pixels > 1 && (pixels + tile - 1) / tile < 2 * threads;
  if (split_evenly) tile = std::max<int64_t>(4, ((pixels + threads - 1) / threads + 3) / 4 * 4);
  const int64_t tiles = (pixels + tile - 1) / tile;
  auto run = [&](int64_t t) {
    gemm_tile(wt, g, pointwise, x, filter, bias, y, epi, t * tile,
              std::min(pixels, (t + 1) * tile));
  };
  if (worth_threads && (tiles >= 2 * threads || (split_evenly && tiles > 1))) {
    // Tiles over the threads, each GEMM on its own thread.
    parallel_for(tiles, [&](int64_t t) {
      ScopedThreadLimit one(1);
      run(t);
    });
  } else {
    // Few tiles: one after another, each GEMM split over the threads by its own rule.
    for (int64_t t = 0; t < tiles; ++t) run(t);
  }
}

// Output rows (n, oh) [r0, r1) of a depthwise conv: the interior of each row (every tap along W
// inside the input) of a 3x3 or 5x5 conv at dilation 1 through depthwise_row_f32, 16 (or 8)
// channels at a time with the filter in registers; the other pixels and channels with their valid
// taps listed, summed over the channels in vectors. Both sum the taps in (kh, kw) order.
void depthwise_rows(const NhwcConvWeights& wt, const Geometry& g, const float* x, const float* bias,
                    float* y, const NhwcEpilogue& epi, int64_t r0, int64_t r1) {
  static thread_local std::vector<int64_t> off, wrow;
  const int64_t taps = wt.kh * wt.kw;
  off.resize(size_t(taps));
  wrow.resize(size_t(taps));
  const Axis &ah = g.ah, &aw = g.aw;
  // Channels [c0, c) of output pixel (oh, ow) of image `img` into yr (the row), its valid taps
  // listed.
  auto pixel = [&](float* yr, const float* img, int64_t oh, int64_t ow, int64_t c0) {
    int64_t kh_lo = 0, kh_hi = 0, kw_lo = 0, kw_hi = 0;
    valid_range(oh * ah.stride - ah.pb, ah.dil, ah.k, g.h, &kh_lo, &kh_hi);
    const int64_t iw0 = ow * aw.stride - aw.pb;
    valid_range(iw0, aw.dil, aw.k, g.w, &kw_lo, &kw_hi);
    int64_t n = 0;
    for (int64_t kh = kh_lo; kh < kh_hi; ++kh) {
      const int64_t ih = oh * ah.stride - ah.pb + kh * ah.dil;
      for (int64_t kw = kw_lo; kw < kw_hi; ++kw) {
        off[size_t(n)] = (ih * g.w + iw0 + kw * aw.dil) * g.c;
        wrow[size_t(n)] = (kh * aw.k + kw) * g.c;
        ++n;
      }
    }
    depthwise_pixel_f32(yr + ow * g.m + c0, img + c0, off.data(), wt.taps.data() + c0, wrow.data(),
                        n, bias ? bias + c0 : nullptr, g.c - c0);
  };
  // 3x3 and 5x5 filters at stride 1: bands of rows of one image copied with their padding, eight
  // pixels at once, the borders on the interior's path (depthwise_band_f32). MobileNetV3-small at
  // batch 1 on the 2-core development VM (bench/ab_layers.sh 5 2, per-layer minima): its 5x5
  // layers at 14x14 45.2 -> 33.5 us (240 channels), 27.1 -> 21.4 (120); at stride 2 the copied
  // rows serve fewer outputs and the band lost (3x3 on 56x56, 72 channels: 33.6 -> 45.4 us), and
  // rows narrower than its eight-pixel step (7x7 maps) gained nothing: those stay on
  // depthwise_row_f32 below.
  const bool band = wt.kh == wt.kw && (wt.kh == 3 || wt.kh == 5) && ah.dil == 1 && aw.dil == 1 &&
                    ah.stride == 1 && aw.stride == 1 && g.c >= 8 && g.ow >= 8;
  if (band) {
    static thread_local std::vector<float> scratch;
    scratch.resize(size_t(depthwise_band_scratch_floats(wt.kh, ah.stride, g.ow)));
    const int64_t cv = g.c / 8 * 8;
    for (int64_t r = r0; r < r1;) {
      const int64_t b = r / g.oh, end = std::min(r1, (b + 1) * g.oh);
      const float* img = x + b * g.h * g.w * g.c;
      depthwise_band_f32(y + r * g.ow * g.m, img, wt.taps.data(), bias, wt.kh, ah.stride, g.c, cv,
                         g.h, g.w, r % g.oh, end - b * g.oh, g.ow, ah.pb, aw.pb, scratch.data());
      for (; r < end; ++r) {
        float* yr = y + r * g.ow * g.m;
        if (cv < g.c) {
          for (int64_t ow = 0; ow < g.ow; ++ow) pixel(yr, img, r % g.oh, ow, cv);
        }
        epi.apply(yr, r * g.ow, g.ow);
      }
    }
    return;
  }
  const bool rows_fast =
      wt.kh == wt.kw && (wt.kh == 3 || wt.kh == 5) && ah.dil == 1 && aw.dil == 1 && g.c >= 16;
  int64_t in_lo = 0, in_hi = 0;  // the row's interior pixels
  if (rows_fast && g.w - aw.k + aw.pb >= 0) {
    in_lo = std::min(g.ow, (aw.pb + aw.stride - 1) / aw.stride);
    in_hi = std::min(g.ow, (g.w - aw.k + aw.pb) / aw.stride + 1);
  }
  const int64_t cv = in_lo < in_hi ? g.c / 8 * 8 : 0;  // the row kernel's channels
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % g.oh, b = r / g.oh;
    const float* img = x + b * g.h * g.w * g.c;
    float* yr = y + r * g.ow * g.m;
    int64_t kh_lo = 0, kh_hi = 0;
    valid_range(oh * ah.stride - ah.pb, ah.dil, ah.k, g.h, &kh_lo, &kh_hi);
    if (cv > 0) {
      depthwise_row_f32(yr, img, wt.taps.data(), bias, wt.kh, g.c, cv, g.w, aw.stride,
                        oh * ah.stride - ah.pb, kh_lo, kh_hi, -aw.pb, in_lo, in_hi);
    }
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const int64_t c0 = ow >= in_lo && ow < in_hi ? cv : 0;
      if (c0 != g.c) pixel(yr, img, oh, ow, c0);
    }
    epi.apply(yr, r * g.ow, g.ow);
  }
}

}  // namespace

StatusOr<std::shared_ptr<const NhwcConvWeights>> prepare_nhwc_conv(const KernelQuery& q) {
  const std::shared_ptr<const NhwcConvWeights> none;
  KILN_ASSIGN_OR_RETURN(std::string layout, q.node.attrs.get_string("layout", "NCHW"));
  KILN_ASSIGN_OR_RETURN(std::string in_act, q.node.attrs.get_string("input_activation", "none"));
  KILN_ASSIGN_OR_RETURN(int64_t group, q.node.attrs.get_int("group", 1));
  if (layout != "NHWC" || in_act != "none" || q.input_dtype(0) != DType::kFloat32 ||
      !q.input_is_constant(1) || q.outputs.size() != 1 || q.output_dtype(0) != DType::kFloat32) {
    return none;
  }
  const Tensor& f = *q.inputs[1]->constant;
  if (f.dtype() != DType::kFloat32 || f.rank() != 4 || f.numel() == 0) return none;
  auto w = std::make_shared<NhwcConvWeights>();
  KILN_RETURN_IF_ERROR(parse_spatial("FusedConv", q.node.attrs, &w->attrs));
  const int64_t m = f.shape()[0], kh = f.shape()[1], kw = f.shape()[2], cg = f.shape()[3];
  w->m = m;
  w->kh = kh;
  w->kw = kw;
  w->c = cg * group;
  const float* src = f.data_as<const float>();
  if (group == 1) {
    const int64_t k = kh * kw * cg;
    if (m <= kSmallN) {
      const int64_t ld = small_n_stride(m);
      w->small.assign(size_t(k * ld), 0.f);
      for (int64_t o = 0; o < m; ++o) {
        for (int64_t p = 0; p < k; ++p) w->small[size_t(p * ld + o)] = src[o * k + p];
      }
    } else {
      w->gemm.emplace(/*trans_b=*/true, k, m, src, k);
    }
  } else if (cg == 1 && m == group) {
    // [M, kh, kw, 1] -> [kh * kw][M]
    w->taps.resize(size_t(m * kh * kw));
    for (int64_t o = 0; o < m; ++o) {
      for (int64_t t = 0; t < kh * kw; ++t) w->taps[size_t(t * m + o)] = src[o * kh * kw + t];
    }
  } else {
    return none;
  }
  return std::shared_ptr<const NhwcConvWeights>(std::move(w));
}

Status conv_nhwc_f32(const NhwcConvWeights& w, const TensorView& x, const TensorView& filter,
                     const float* bias, const TensorView& y, const NhwcEpilogue& epi) {
  Geometry g;
  KILN_RETURN_IF_ERROR(geometry(w, x, y, &g));
  if (y.numel() == 0) return ok_status();
  const float* xp = x.as<const float>();
  float* yp = y.as<float>();
  if (w.gemm || !w.small.empty()) {
    if (filter.dtype != DType::kFloat32 || filter.numel() != w.m * w.kh * w.kw * g.c) {
      return invalid_argument("FusedConv (NHWC): W " + shape_to_string(filter.shape) +
                              " is not the prepared float32 filter");
    }
    dense(w, g, xp, filter.as<const float>(), bias, yp, epi);
    return ok_status();
  }
  // Rows over the threads by their multiply-adds (a 5x5 row of a 7x7 map with 576 channels is
  // 100k of them: seven rows are worth two threads).
  const int64_t rows = g.n * g.oh;
  const int64_t row_work = std::max<int64_t>(1, g.ow * g.m * w.kh * w.kw / 4);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / row_work);
  parallel_chunks(rows, grain,
                  [&](int64_t r0, int64_t r1) { depthwise_rows(w, g, xp, bias, yp, epi, r0, r1); });
  return ok_status();
}

}  // namespace kiln::backends::cpu

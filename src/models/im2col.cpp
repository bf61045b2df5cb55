#include "models/im2col.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace sd::models {

namespace {

// One unfolding: a map of height x width read by kh x kw patches at the given stride and zero padding.
struct Geometry {
  int64_t height, width, kh, kw, ph, pw, sh, sw, out_h, out_w;

  Geometry(int64_t height, int64_t width, at::IntArrayRef kernel, at::IntArrayRef padding, at::IntArrayRef stride)
      : height(height),
        width(width),
        kh(kernel[0]),
        kw(kernel[1]),
        ph(padding[0]),
        pw(padding[1]),
        sh(stride[0]),
        sw(stride[1]),
        out_h((height + 2 * ph - kh) / sh + 1),
        out_w((width + 2 * pw - kw) / sw + 1) {}

  int64_t column_rows_per_plane() const { return kh * kw; }
  int64_t map_pixels() const { return height * width; }
  int64_t out_pixels() const { return out_h * out_w; }
  // Planes per parallel chunk: enough copying to be worth a thread.
  int64_t grain() const { return std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, kh * kw * out_pixels())); }
};

// Copies n elements in fixed-size moves: rows of SD's lowest levels are 4-16 elements long, where a call to memcpy
// costs more than the row and an element-by-element loop (which the compiler did not vectorize) ran at 1-3 GB/s.
template <typename T>
inline void copy_run(T* __restrict dst, const T* __restrict src, int64_t n) {
  auto* d = reinterpret_cast<char*>(dst);
  const auto* s = reinterpret_cast<const char*>(src);
  int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  for (; bytes >= 32; bytes -= 32, d += 32, s += 32) std::memcpy(d, s, 32);
  for (const int64_t chunk : {16, 8, 4, 2})
    if (bytes >= chunk) {
      std::memcpy(d, s, static_cast<size_t>(chunk));
      bytes -= chunk, d += chunk, s += chunk;
    }
}

// A plane with its zero padding around it, [height + 2·ph][width + 2·pw]: every row of patch entries is then one
// run of it, read at the stride, with no test for the border.
template <typename T>
class PaddedPlane {
 public:
  explicit PaddedPlane(const Geometry& g)
      : g_(g), width_(g.width + 2 * g.pw), values_(static_cast<size_t>((g.height + 2 * g.ph) * width_), T(0)) {}

  // The map's pixels into the middle; the border stays zero.
  void fill(const T* plane) {
    for (int64_t iy = 0; iy < g_.height; ++iy) copy_run(row(iy + g_.ph) + g_.pw, plane + iy * g_.width, g_.width);
  }
  // Padded row y (input row y - ph).
  T* row(int64_t y) { return values_.data() + y * width_; }
  int64_t width() const { return width_; }
  // The map's pixels out of the middle, converted to U.
  template <typename U>
  void read_into(U* plane) {
    for (int64_t iy = 0; iy < g_.height; ++iy) {
      const T* from = row(iy + g_.ph) + g_.pw;
      for (int64_t ix = 0; ix < g_.width; ++ix) plane[iy * g_.width + ix] = static_cast<U>(from[ix]);
    }
  }
  void zero() { std::fill(values_.begin(), values_.end(), T(0)); }

 private:
  const Geometry& g_;
  int64_t width_;
  std::vector<T> values_;
};

// Runs f(W, S), two std::integral_constant<int64_t>, with the rows' width W and the stride S across them when they
// are one of SD's small maps' (3x3 convolutions at 16, 8 or 4 pixels a side, downsamplers to 8 or 4): the row loops
// then unroll into a few moves. Else W = S = 0: any width and stride.
template <typename F>
void with_row_shape(const Geometry& g, F&& f) {
  using std::integral_constant;
  if (g.sw == 1) switch (g.out_w) {
      case 4: return f(integral_constant<int64_t, 4>{}, integral_constant<int64_t, 1>{});
      case 8: return f(integral_constant<int64_t, 8>{}, integral_constant<int64_t, 1>{});
      case 16: return f(integral_constant<int64_t, 16>{}, integral_constant<int64_t, 1>{});
    }
  if (g.sw == 2) switch (g.out_w) {
      case 4: return f(integral_constant<int64_t, 4>{}, integral_constant<int64_t, 2>{});
      case 8: return f(integral_constant<int64_t, 8>{}, integral_constant<int64_t, 2>{});
    }
  f(integral_constant<int64_t, 0>{}, integral_constant<int64_t, 0>{});
}

// columns[ky][kx][oy][ox] = padded[oy·sh + ky][ox·sw + kx]. The geometry is read into locals first: the copies'
// byte stores could alias it, and reloading it for every row cost as much as the row.
template <int64_t kRowWidth, int64_t kStride, typename T>
void unfold_plane(const T* plane, T* __restrict columns, const Geometry& g, PaddedPlane<T>& padded) {
  padded.fill(plane);
  const int64_t kh = g.kh, kw = g.kw, out_h = g.out_h, out_w = kRowWidth ? kRowWidth : g.out_w, sh = g.sh,
                sw = kStride ? kStride : g.sw;
  const T* top = padded.row(0);
  const int64_t width = padded.width();
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < kw; ++kx)
      for (int64_t oy = 0; oy < out_h; ++oy, columns += out_w) {
        const T* src = top + (oy * sh + ky) * width + kx;
        if (sw == 1)
          copy_run(columns, src, out_w);
        else
          for (int64_t ox = 0; ox < out_w; ++ox) columns[ox] = src[ox * sw];
      }
}

// The adjoint of unfold_plane, summed in `sum` in at::col2im's order (the entries in the border fall away), then
// rounded once into `plane`.
template <int64_t kRowWidth, int64_t kStride, typename T, typename Sum>
void fold_plane(const T* __restrict columns, T* plane, const Geometry& g, PaddedPlane<Sum>& sum) {
  sum.zero();
  const int64_t kh = g.kh, kw = g.kw, out_h = g.out_h, out_w = kRowWidth ? kRowWidth : g.out_w, sh = g.sh,
                sw = kStride ? kStride : g.sw;
  Sum* top = sum.row(0);
  const int64_t width = sum.width();
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < kw; ++kx)
      for (int64_t oy = 0; oy < out_h; ++oy, columns += out_w) {
        Sum* __restrict row = top + (oy * sh + ky) * width + kx;
        if (sw == 1)
          for (int64_t ox = 0; ox < out_w; ++ox) row[ox] += static_cast<Sum>(columns[ox]);
        else
          for (int64_t ox = 0; ox < out_w; ++ox) row[ox * sw] += static_cast<Sum>(columns[ox]);
      }
  sum.read_into(plane);
}

at::Tensor unfold(const at::Tensor& x, const Geometry& g) {
  const at::Tensor in = x.contiguous();
  at::Tensor columns = at::empty({x.size(0), x.size(1) * g.column_rows_per_plane(), g.out_pixels()}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "unfold_patches", [&] {
    const scalar_t* src = in.data_ptr<scalar_t>();
    scalar_t* dst = columns.data_ptr<scalar_t>();
    sd::parallel_for(0, x.size(0) * x.size(1), g.grain(), [&](int64_t begin, int64_t end) {
      PaddedPlane<scalar_t> padded(g);
      with_row_shape(g, [&](auto width, auto stride) {
        for (int64_t p = begin; p < end; ++p)
          unfold_plane<width(), stride()>(src + p * g.map_pixels(),
                                          dst + p * g.column_rows_per_plane() * g.out_pixels(), g, padded);
      });
    });
  });
  return columns;
}

at::Tensor fold(const at::Tensor& columns, int64_t batch, int64_t channels, const Geometry& g) {
  const at::Tensor in = columns.contiguous();
  at::Tensor map = at::empty({batch, channels, g.height, g.width}, columns.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, columns.scalar_type(), "fold_patches", [&] {
    using Sum = at::opmath_type<scalar_t>;
    const scalar_t* src = in.data_ptr<scalar_t>();
    scalar_t* dst = map.data_ptr<scalar_t>();
    sd::parallel_for(0, batch * channels, g.grain(), [&](int64_t begin, int64_t end) {
      PaddedPlane<Sum> sum(g);
      with_row_shape(g, [&](auto width, auto stride) {
        for (int64_t p = begin; p < end; ++p)
          fold_plane<width(), stride()>(src + p * g.column_rows_per_plane() * g.out_pixels(), dst + p * g.map_pixels(),
                                        g, sum);
      });
    });
  });
  return map;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct UnfoldPatches : torch::autograd::Function<UnfoldPatches> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef padding,
                            at::IntArrayRef stride) {
    ctx->saved_data["input_size"] = x.sizes().vec();
    ctx->saved_data["kernel"] = kernel.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["stride"] = stride.vec();
    return unfold(x, Geometry(x.size(2), x.size(3), kernel, padding, stride));
  }
  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const std::vector<int64_t> size = ctx->saved_data["input_size"].toIntVector();
    return {fold_patches(grads[0], {size[2], size[3]}, ctx->saved_data["kernel"].toIntVector(),
                         ctx->saved_data["padding"].toIntVector(), ctx->saved_data["stride"].toIntVector()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_pairs(at::IntArrayRef kernel, at::IntArrayRef padding, at::IntArrayRef stride) {
  SD_CHECK(kernel.size() == 2 && padding.size() == 2 && stride.size() == 2 && kernel[0] > 0 && kernel[1] > 0 &&
               stride[0] > 0 && stride[1] > 0 && padding[0] >= 0 && padding[1] >= 0,
           "im2col: expected a positive kernel and stride and a non-negative padding, two values each");
}

}  // namespace

at::Tensor unfold_patches(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef padding,
                          at::IntArrayRef stride) {
  check_pairs(kernel, padding, stride);
  SD_CHECK(x.dim() == 4 && x.size(2) + 2 * padding[0] >= kernel[0] && x.size(3) + 2 * padding[1] >= kernel[1],
           "unfold_patches: expected a map [N, C, H, W] at least as large as the {}x{} kernel, got [{}]", kernel[0],
           kernel[1], fmt::join(x.sizes(), ", "));
  return UnfoldPatches::apply(x, kernel, padding, stride);
}

at::Tensor fold_patches(const at::Tensor& columns, at::IntArrayRef map_size, at::IntArrayRef kernel,
                        at::IntArrayRef padding, at::IntArrayRef stride) {
  check_pairs(kernel, padding, stride);
  SD_CHECK(map_size.size() == 2, "fold_patches: expected the map's height and width");
  const Geometry g(map_size[0], map_size[1], kernel, padding, stride);
  SD_CHECK(columns.dim() == 3 && columns.size(1) % (g.kh * g.kw) == 0 && columns.size(2) == g.out_pixels(),
           "fold_patches: expected columns [N, C·{}, {}], got [{}]", g.kh * g.kw, g.out_pixels(),
           fmt::join(columns.sizes(), ", "));
  return fold(columns, columns.size(0), columns.size(1) / (g.kh * g.kw), g);
}

}  // namespace sd::models

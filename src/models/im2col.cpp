#include "models/im2col.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
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
  // The input row a patch row ky reads for output row oy (outside [0, height) in the padding).
  int64_t input_row(int64_t oy, int64_t ky) const { return oy * sh - ph + ky; }
  // The output columns [first, last) whose patch column kx falls inside the map (first <= last).
  int64_t first_inside(int64_t kx) const { return std::clamp<int64_t>((pw - kx + sw - 1) / sw, 0, out_w); }
  int64_t last_inside(int64_t kx) const {
    const int64_t last = width - 1 + pw - kx < 0 ? 0 : std::min(out_w, (width - 1 + pw - kx) / sw + 1);
    return std::max(first_inside(kx), last);
  }
  // Where in the map output column ox of patch column kx reads.
  int64_t input_column(int64_t ox, int64_t kx) const { return ox * sw - pw + kx; }
  // Planes per parallel chunk: enough copying to be worth a thread.
  int64_t grain() const { return std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, kh * kw * out_pixels())); }
};

// Plain loops rather than std::fill/std::copy: rows of SD's lowest levels are 4-8 elements long, where a library call
// per row costs more than the row (1.6x slower on a 1280-channel 8x8 map).
template <typename T>
void unfold_plane(const T* plane, T* columns, const Geometry& g) {
  const T zero(0);
  for (int64_t ky = 0; ky < g.kh; ++ky)
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      const int64_t lo = g.first_inside(kx), hi = g.last_inside(kx);
      for (int64_t oy = 0; oy < g.out_h; ++oy, columns += g.out_w) {
        const int64_t iy = g.input_row(oy, ky);
        const bool row_inside = iy >= 0 && iy < g.height;
        const int64_t first = row_inside ? lo : g.out_w, last = row_inside ? hi : g.out_w;
        for (int64_t ox = 0; ox < first; ++ox) columns[ox] = zero;
        if (first < last) {
          const T* src = plane + iy * g.width + g.input_column(first, kx);
          if (g.sw == 1)
            for (int64_t i = 0; i < last - first; ++i) columns[first + i] = src[i];
          else
            for (int64_t i = 0; i < last - first; ++i) columns[first + i] = src[i * g.sw];
        }
        for (int64_t ox = last; ox < g.out_w; ++ox) columns[ox] = zero;
      }
    }
}

// The adjoint of unfold_plane, summed in `sum` (the plane's pixels, overwritten) in at::col2im's order.
template <typename T, typename Sum>
void fold_plane(const T* columns, T* plane, const Geometry& g, Sum* sum) {
  std::fill(sum, sum + g.map_pixels(), Sum(0));
  for (int64_t ky = 0; ky < g.kh; ++ky)
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      const int64_t lo = g.first_inside(kx), hi = g.last_inside(kx);
      for (int64_t oy = 0; oy < g.out_h; ++oy, columns += g.out_w) {
        const int64_t iy = g.input_row(oy, ky);
        if (iy < 0 || iy >= g.height) continue;
        Sum* row = sum + iy * g.width;
        for (int64_t ox = lo; ox < hi; ++ox) row[g.input_column(ox, kx)] += static_cast<Sum>(columns[ox]);
      }
    }
  std::transform(sum, sum + g.map_pixels(), plane, [](Sum s) { return static_cast<T>(s); });
}

at::Tensor unfold(const at::Tensor& x, const Geometry& g) {
  const at::Tensor in = x.contiguous();
  at::Tensor columns = at::empty({x.size(0), x.size(1) * g.column_rows_per_plane(), g.out_pixels()}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "unfold_patches", [&] {
    const scalar_t* src = in.data_ptr<scalar_t>();
    scalar_t* dst = columns.data_ptr<scalar_t>();
    sd::parallel_for(0, x.size(0) * x.size(1), g.grain(), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        unfold_plane(src + p * g.map_pixels(), dst + p * g.column_rows_per_plane() * g.out_pixels(), g);
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
      std::vector<Sum> sum(static_cast<size_t>(g.map_pixels()));
      for (int64_t p = begin; p < end; ++p)
        fold_plane(src + p * g.column_rows_per_plane() * g.out_pixels(), dst + p * g.map_pixels(), g, sum.data());
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

#include "schedulers/numpy_compat.h"

#include <algorithm>
#include <cmath>

namespace sd::schedulers::np {

std::vector<double> linspace(double start, double stop, int64_t num) {
  std::vector<double> out;
  if (num <= 0) return out;
  out.reserve(num);
  if (num == 1) {
    out.push_back(start);  // numpy: div = 0, y = [0] * delta + start
    return out;
  }
  const double delta = stop - start;
  const double step = delta / static_cast<double>(num - 1);
  for (int64_t i = 0; i < num; ++i) {
    // numpy divides instead when step == 0 (start == stop); both give start.
    out.push_back(step == 0 ? static_cast<double>(i) / static_cast<double>(num - 1) * delta + start
                            : static_cast<double>(i) * step + start);
  }
  out.back() = stop;
  return out;
}

std::vector<double> arange(double start, double stop, double step) {
  std::vector<double> out;
  const double len = std::ceil((stop - start) / step);
  if (!(len > 0)) return out;
  const auto n = static_cast<int64_t>(len);
  out.reserve(n);
  out.push_back(start);
  if (n == 1) return out;
  out.push_back(start + step);
  const double delta = out[1] - out[0];
  for (int64_t i = 2; i < n; ++i) out.push_back(start + static_cast<double>(i) * delta);
  return out;
}

double round(double x) {
  // nearbyint follows the current rounding mode, which is round-to-nearest-even unless someone changed it.
  return std::nearbyint(x);
}

std::vector<double> round(std::vector<double> values) {
  for (double& v : values) v = round(v);
  return values;
}

std::vector<double> reversed(std::vector<double> values) {
  std::reverse(values.begin(), values.end());
  return values;
}

std::vector<double> interp(const std::vector<double>& x, const std::vector<double>& fp) {
  std::vector<double> out;
  out.reserve(x.size());
  const auto n = static_cast<int64_t>(fp.size());
  for (double xv : x) {
    if (std::isnan(xv)) {
      out.push_back(xv);
    } else if (xv <= 0) {
      out.push_back(fp.front());  // left fill value, and x == xp[0]
    } else if (xv >= static_cast<double>(n - 1)) {
      out.push_back(fp.back());
    } else {
      const auto j = static_cast<int64_t>(std::floor(xv));
      if (static_cast<double>(j) == xv) {
        out.push_back(fp[j]);
      } else {
        const double slope = (fp[j + 1] - fp[j]) / (static_cast<double>(j + 1) - static_cast<double>(j));
        out.push_back(slope * (xv - static_cast<double>(j)) + fp[j]);
      }
    }
  }
  return out;
}

}  // namespace sd::schedulers::np

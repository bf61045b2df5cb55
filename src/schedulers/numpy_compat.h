// The few numpy routines diffusers uses to build timestep and sigma tables, re-done with numpy's exact float64
// arithmetic, so integer tables match bit for bit and float tables to the last ulp.
#pragma once
#include <cstdint>
#include <vector>

namespace sd::schedulers::np {

// numpy.linspace(start, stop, num) (endpoint=True): i * ((stop - start) / (num - 1)) + start, last = stop.
std::vector<double> linspace(double start, double stop, int64_t num);
// numpy.arange(start, stop, step) for floats: length ceil((stop - start) / step), values start + i * delta
// with delta = (start + step) - start, as numpy's fill does.
std::vector<double> arange(double start, double stop, double step);
// numpy.round / rint: round half to even.
double round(double x);
std::vector<double> round(std::vector<double> values);
std::vector<double> reversed(std::vector<double> values);
// numpy.interp(x, arange(len(fp)), fp).
std::vector<double> interp(const std::vector<double>& x, const std::vector<double>& fp);

}  // namespace sd::schedulers::np

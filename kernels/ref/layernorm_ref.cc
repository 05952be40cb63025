// Double-precision reference: layernorm. Contract: layernorm_ref.h.
// The backward is written out term by term from the chain rule (through mean and variance
// separately) rather than in the fused form of the CPU kernel, so the two derivations check
// each other.
#include "kernels/ref/layernorm_ref.h"

#include <cmath>
#include <vector>

namespace loom::kernels::ref {
namespace {

constexpr double kEps = 1e-5;

}  // namespace

void layernorm_forward(double* out, double* mean, double* rstd, const double* inp,
                       const double* weight, const double* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const double* x = inp + static_cast<long>(n) * C;
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + kEps);
    for (int c = 0; c < C; ++c)
      out[static_cast<long>(n) * C + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout,
                        const double* inp, const double* weight, const double* mean,
                        const double* rstd, int N, int C) {
  std::vector<double> dxhat(C);
  for (int n = 0; n < N; ++n) {
    const double* x = inp + static_cast<long>(n) * C;
    const double* dy = dout + static_cast<long>(n) * C;
    double* dx = dinp + static_cast<long>(n) * C;
    const double m = mean[n];
    const double s = rstd[n];
    // y = xhat * w + b, xhat = (x - m) * s, s = (var + eps)^(-1/2), var = mean((x - m)^2).
    double dvar = 0.0;   // d/dvar
    double dmean = 0.0;  // d/dmean, through xhat only (the path through var has zero sum)
    for (int c = 0; c < C; ++c) {
      dxhat[c] = dy[c] * weight[c];
      dweight[c] += dy[c] * (x[c] - m) * s;
      dbias[c] += dy[c];
      dvar += dxhat[c] * (x[c] - m) * (-0.5) * s * s * s;
      dmean += -dxhat[c] * s;
    }
    for (int c = 0; c < C; ++c) {
      dx[c] += dxhat[c] * s + dvar * 2.0 * (x[c] - m) / C + dmean / C;
    }
  }
}

}  // namespace loom::kernels::ref

// Double-precision reference: fully connected layer, as plain loops. Contract: matmul_ref.h.
#include "kernels/ref/matmul_ref.h"

namespace loom::kernels::ref {

void matmul_forward(double* out, const double* inp, const double* weight, const double* bias, int N,
                    int C, int OC) {
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double acc = bias != nullptr ? bias[o] : 0.0;
      for (int c = 0; c < C; ++c) {
        acc += inp[static_cast<long>(n) * C + c] * weight[static_cast<long>(o) * C + c];
      }
      out[static_cast<long>(n) * OC + o] = acc;
    }
  }
}

void matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout,
                     const double* inp, const double* weight, int N, int C, int OC) {
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      const double d = dout[static_cast<long>(n) * OC + o];
      for (int c = 0; c < C; ++c) {
        if (dinp != nullptr)
          dinp[static_cast<long>(n) * C + c] += d * weight[static_cast<long>(o) * C + c];
        dweight[static_cast<long>(o) * C + c] += d * inp[static_cast<long>(n) * C + c];
      }
      if (dbias != nullptr) dbias[o] += d;
    }
  }
}

}  // namespace loom::kernels::ref

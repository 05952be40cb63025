// Double-precision reference: token + position embedding. Contract: encoder_ref.h.
#include "kernels/ref/encoder_ref.h"

namespace loom::kernels::ref {

void encoder_forward(double* out, const int* tokens, const double* wte, const double* wpe, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const long r = static_cast<long>(b) * T + t;
      for (int c = 0; c < C; ++c) {
        out[r * C + c] =
            wte[static_cast<long>(tokens[r]) * C + c] + wpe[static_cast<long>(t) * C + c];
      }
    }
  }
}

void encoder_backward(double* dwte, double* dwpe, const double* dout, const int* tokens, int B,
                      int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const long r = static_cast<long>(b) * T + t;
      for (int c = 0; c < C; ++c) {
        dwte[static_cast<long>(tokens[r]) * C + c] += dout[r * C + c];
        dwpe[static_cast<long>(t) * C + c] += dout[r * C + c];
      }
    }
  }
}

}  // namespace loom::kernels::ref

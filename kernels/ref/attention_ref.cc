// Double-precision reference: causal multi-head self-attention, as plain loops.
// Contract: attention_ref.h.
#include "kernels/ref/attention_ref.h"

#include <cmath>
#include <vector>

namespace loom::kernels::ref {

void attention_forward(double* out, double* att, const double* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const long C3 = 3L * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      double* a = att + (static_cast<long>(b) * NH + h) * T * T;  // (T,T)
      for (int t = 0; t < T; ++t) {
        const double* q = qkv + (static_cast<long>(b) * T + t) * C3 + h * HS;
        double maxv = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const double* k = qkv + (static_cast<long>(b) * T + j) * C3 + C + h * HS;
          double s = 0.0;
          for (int i = 0; i < HS; ++i) s += q[i] * k[i];
          s *= scale;
          a[static_cast<long>(t) * T + j] = s;
          if (s > maxv) maxv = s;
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) {
          double& e = a[static_cast<long>(t) * T + j];
          e = std::exp(e - maxv);
          sum += e;
        }
        for (int j = 0; j <= t; ++j) a[static_cast<long>(t) * T + j] /= sum;
        for (int j = t + 1; j < T; ++j) a[static_cast<long>(t) * T + j] = 0.0;
        double* o = out + (static_cast<long>(b) * T + t) * C + h * HS;
        for (int i = 0; i < HS; ++i) {
          double acc = 0.0;
          for (int j = 0; j <= t; ++j) {
            acc += a[static_cast<long>(t) * T + j] *
                   qkv[(static_cast<long>(b) * T + j) * C3 + 2 * C + h * HS + i];
          }
          o[i] = acc;
        }
      }
    }
  }
}

void attention_backward(double* dqkv, double* scratch, const double* dout, const double* qkv,
                        const double* att, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const long C3 = 3L * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const double* a = att + (static_cast<long>(b) * NH + h) * T * T;  // (T,T)
      double* da = scratch + (static_cast<long>(b) * NH + h) * T * T;   // (T,T)
      auto at = [&](long row, int part) {
        return (static_cast<long>(b) * T + row) * C3 + part * C + h * HS;
      };
      for (int t = 0; t < T; ++t) {
        const double* dy = dout + (static_cast<long>(b) * T + t) * C + h * HS;
        // out[t] = sum_j a[t,j] v[j]: grads to a and v.
        for (int j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int i = 0; i < HS; ++i) {
            d += dy[i] * qkv[at(j, 2) + i];
            dqkv[at(j, 2) + i] += a[static_cast<long>(t) * T + j] * dy[i];
          }
          da[static_cast<long>(t) * T + j] = d;
        }
        // Softmax: dscore[t,j] = sum_i a[t,i] (delta_ij - a[t,j]) da[t,i].
        for (int j = 0; j <= t; ++j) {
          double ds = 0.0;
          for (int i = 0; i <= t; ++i) {
            const double indicator = i == j ? 1.0 : 0.0;
            ds += a[static_cast<long>(t) * T + i] * (indicator - a[static_cast<long>(t) * T + j]) *
                  da[static_cast<long>(t) * T + i];
          }
          // score = scale * q[t] . k[j].
          for (int i = 0; i < HS; ++i) {
            dqkv[at(t, 0) + i] += ds * scale * qkv[at(j, 1) + i];
            dqkv[at(j, 1) + i] += ds * scale * qkv[at(t, 0) + i];
          }
        }
      }
    }
  }
}

}  // namespace loom::kernels::ref

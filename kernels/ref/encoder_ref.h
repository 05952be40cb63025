// Double-precision reference of the token + position embedding, for tests only.
// Same contracts as kernels/encoder.h, with double buffers.
#ifndef LOOM_KERNELS_REF_ENCODER_REF_H_
#define LOOM_KERNELS_REF_ENCODER_REF_H_

namespace loom::kernels::ref {

// out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C).
void encoder_forward(double* out, const int* tokens, const double* wte, const double* wpe, int B,
                     int T, int C);
// dwte (V,C), dwpe (maxT,C) += scatter of dout (B,T,C). Accumulates.
void encoder_backward(double* dwte, double* dwpe, const double* dout, const int* tokens, int B,
                      int T, int C);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_ENCODER_REF_H_

// GELU activation, tanh approximation as in GPT-2:
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Conventions (forward overwrites, backward accumulates): see kernels/README.md.
#ifndef LOOM_KERNELS_GELU_H_
#define LOOM_KERNELS_GELU_H_

namespace loom::kernels::cpu {

// out (n) = gelu(inp (n)). out may alias inp.
void gelu_forward(float* out, const float* inp, long n);

// dinp (n) += gelu'(inp) * dout. inp, dout (n). Accumulates.
void gelu_backward(float* dinp, const float* inp, const float* dout, long n);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_GELU_H_

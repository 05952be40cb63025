// Residual connection: elementwise sum of two tensors.
// Conventions (forward overwrites, backward accumulates): see kernels/README.md.
#ifndef LOOM_KERNELS_RESIDUAL_H_
#define LOOM_KERNELS_RESIDUAL_H_

namespace loom::kernels::cpu {

// out (n) = a (n) + b (n). out may alias a or b.
void residual_forward(float* out, const float* a, const float* b, long n);

// da (n) += dout; db (n) += dout. Accumulates into both. da and db must not alias.
void residual_backward(float* da, float* db, const float* dout, long n);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_RESIDUAL_H_

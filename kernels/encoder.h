// Token + position embedding ("encoder") of GPT-2.
//
// Conventions shared by every op header in kernels/ (see kernels/README.md):
//   - Shapes use one alphabet: B batch, T sequence, C channels, NH heads, HS head size,
//     V vocab, N = B*T rows, OC output channels. All buffers are dense, row-major.
//   - Forward functions overwrite their outputs.
//   - Backward functions ACCUMULATE (+=) into every gradient they write (parameter and input
//     gradients alike); the caller zeroes gradient buffers once per optimizer step.
//   - An impossible argument (non-positive size, null required pointer, out-of-range token)
//     prints file:line and a message and exits non-zero.
//   - Functions are reentrant and keep no state; concurrent calls are safe when their output
//     buffers do not overlap. Results are bit-for-bit deterministic for a fixed thread count.
#ifndef LOOM_KERNELS_ENCODER_H_
#define LOOM_KERNELS_ENCODER_H_

namespace loom::kernels::cpu {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t].
// tokens (B,T), each in [0, V); wte (V,C); wpe (maxT,C) with maxT >= T.
// The vocabulary size is not passed, so token ids are only checked to be non-negative; the
// caller validates them against V (the data loader does).
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C);

// dwte (V,C) += scatter of dout by token; dwpe (maxT,C) += sum over b of dout[b,t].
// dout (B,T,C); tokens (B,T). Accumulates. Rows of dwte are updated in a fixed order
// (b, then t) so the result is deterministic.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_ENCODER_H_

// The GEMMs of the matmul and attention ops as cuBLAS sees them (column-major, strided-batched),
// in plain C++: the launchers in matmul.cu and attention.cu build their cuBLAS calls from these
// and nothing else, and tests/kernels/cuda_ops_test.cc replays them on the CPU with a
// column-major GEMM emulator against the double references, so the row-major to column-major
// mapping is tested on machines without a GPU.
//
// Row-major to column-major: a row-major (R, K) buffer with row stride ld is the column-major
// (K, R) matrix with leading dimension ld, i.e. its transpose. Every row-major product is
// therefore computed as its transpose (see each function).
#ifndef LOOM_KERNELS_CUDA_GEMM_SHAPES_H_
#define LOOM_KERNELS_CUDA_GEMM_SHAPES_H_

namespace loom::kernels::cuda::launch {

// D = op(A) op(B) + beta D, column-major: op(A) is (m,k), op(B) (k,n), D (m,n); alpha is 1.
// With batch > 1, matrix i of X starts at X + x_offset + i * stride_x. Offsets and strides are in
// elements of the buffer each operand names (documented per function).
struct GemmShape {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  long a_offset = 0;
  int lda = 0;
  long long stride_a = 0;
  long b_offset = 0;
  int ldb = 0;
  long long stride_b = 0;
  long d_offset = 0;
  int ldd = 0;
  long long stride_d = 0;
  int batch = 1;
  float beta = 0.0f;
};

// ---- matmul: inp (N,C), weight (OC,C), out/dout (N,OC). ----

// out^T (OC,N) = W (OC,C) . inp^T (C,N).  A = weight (stored (C,OC), op T), B = inp, D = out.
constexpr GemmShape MatmulForwardShape(int N, int C, int OC) {
  GemmShape g;
  g.trans_a = true;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.lda = C;
  g.ldb = C;
  g.ldd = OC;
  return g;
}

// dinp^T (C,N) += W^T (C,OC) . dout^T (OC,N).  A = weight, B = dout, D = dinp; beta 1.
constexpr GemmShape MatmulBackwardInputShape(int N, int C, int OC) {
  GemmShape g;
  g.m = C;
  g.n = N;
  g.k = OC;
  g.lda = C;
  g.ldb = OC;
  g.ldd = C;
  g.beta = 1.0f;
  return g;
}

// dW^T (C,OC) += inp^T (C,N) . dout (N,OC).  A = inp, B = dout (stored (OC,N), op T),
// D = dweight; beta 1.
constexpr GemmShape MatmulBackwardWeightShape(int N, int C, int OC) {
  GemmShape g;
  g.trans_b = true;
  g.m = C;
  g.n = OC;
  g.k = N;
  g.lda = C;
  g.ldb = OC;
  g.ldd = C;
  g.beta = 1.0f;
  return g;
}

// ---- attention, batch element b, all NH heads in one strided batch (stride HS between heads'
// q/k/v/out/dout channels, T*T between their (T,T) matrices). qkv, dqkv (B,T,3C): q at channel
// offset 0, k at C, v at 2C, rows of 3C. out, dout (B,T,C). att (B,NH,T,T). The (NH,T,T) scratch
// matrices (scores, d(att), d(scores)) hold one batch element. ----

// S^T (T,T) = K (T,HS) . Q^T (HS,T): scores[h][t][j] = q_t . k_j (unscaled).
// A = qkv (k of b, op T), B = qkv (q of b), D = scores scratch (fp32).
constexpr GemmShape AttentionScoresShape(int b, int T, int C, int NH) {
  GemmShape g;
  g.batch = NH;
  const int HS = C / NH;
  const long row0 = static_cast<long>(b) * T * 3 * C;
  g.trans_a = true;
  g.m = T;
  g.n = T;
  g.k = HS;
  g.a_offset = row0 + C;
  g.lda = 3 * C;
  g.stride_a = HS;
  g.b_offset = row0;
  g.ldb = 3 * C;
  g.stride_b = HS;
  g.ldd = T;
  g.stride_d = static_cast<long long>(T) * T;
  return g;
}

// out^T (HS,T) = V^T (HS,T) . att^T (T,T).  A = qkv (v of b), B = att (of b), D = out (of b).
constexpr GemmShape AttentionOutputShape(int b, int T, int C, int NH) {
  GemmShape g;
  g.batch = NH;
  const int HS = C / NH;
  g.m = HS;
  g.n = T;
  g.k = T;
  g.a_offset = static_cast<long>(b) * T * 3 * C + 2 * C;
  g.lda = 3 * C;
  g.stride_a = HS;
  g.b_offset = static_cast<long>(b) * NH * T * T;
  g.ldb = T;
  g.stride_b = static_cast<long long>(T) * T;
  g.d_offset = static_cast<long>(b) * T * C;
  g.ldd = C;
  g.stride_d = HS;
  return g;
}

// dA^T (T,T) = V (T,HS) . dy^T (HS,T): datt[h][t][j] = dy_t . v_j.
// A = qkv (v of b, op T), B = dout (of b), D = d(att) scratch (fp32).
constexpr GemmShape AttentionDattShape(int b, int T, int C, int NH) {
  GemmShape g;
  g.batch = NH;
  const int HS = C / NH;
  g.trans_a = true;
  g.m = T;
  g.n = T;
  g.k = HS;
  g.a_offset = static_cast<long>(b) * T * 3 * C + 2 * C;
  g.lda = 3 * C;
  g.stride_a = HS;
  g.b_offset = static_cast<long>(b) * T * C;
  g.ldb = C;
  g.stride_b = HS;
  g.ldd = T;
  g.stride_d = static_cast<long long>(T) * T;
  return g;
}

// dV^T (HS,T) += dy^T (HS,T) . att (T,T).  A = dout (of b), B = att (of b, op T),
// D = dqkv (v of b); beta 1.
constexpr GemmShape AttentionDvShape(int b, int T, int C, int NH) {
  GemmShape g;
  g.batch = NH;
  const int HS = C / NH;
  g.trans_b = true;
  g.m = HS;
  g.n = T;
  g.k = T;
  g.a_offset = static_cast<long>(b) * T * C;
  g.lda = C;
  g.stride_a = HS;
  g.b_offset = static_cast<long>(b) * NH * T * T;
  g.ldb = T;
  g.stride_b = static_cast<long long>(T) * T;
  g.d_offset = static_cast<long>(b) * T * 3 * C + 2 * C;
  g.ldd = 3 * C;
  g.stride_d = HS;
  g.beta = 1.0f;
  return g;
}

// dQ^T (HS,T) += K^T (HS,T) . dS^T (T,T).  A = qkv (k of b), B = d(scores) scratch,
// D = dqkv (q of b); beta 1.
constexpr GemmShape AttentionDqShape(int b, int T, int C, int NH) {
  GemmShape g;
  g.batch = NH;
  const int HS = C / NH;
  const long row0 = static_cast<long>(b) * T * 3 * C;
  g.m = HS;
  g.n = T;
  g.k = T;
  g.a_offset = row0 + C;
  g.lda = 3 * C;
  g.stride_a = HS;
  g.ldb = T;
  g.stride_b = static_cast<long long>(T) * T;
  g.d_offset = row0;
  g.ldd = 3 * C;
  g.stride_d = HS;
  g.beta = 1.0f;
  return g;
}

// dK^T (HS,T) += Q^T (HS,T) . dS (T,T).  A = qkv (q of b), B = d(scores) scratch (op T),
// D = dqkv (k of b); beta 1.
constexpr GemmShape AttentionDkShape(int b, int T, int C, int NH) {
  GemmShape g = AttentionDqShape(b, T, C, NH);
  const long row0 = static_cast<long>(b) * T * 3 * C;
  g.trans_b = true;
  g.a_offset = row0;
  g.d_offset = row0 + C;
  return g;
}

}  // namespace loom::kernels::cuda::launch

#endif  // LOOM_KERNELS_CUDA_GEMM_SHAPES_H_

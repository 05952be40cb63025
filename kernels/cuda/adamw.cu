// AdamW update. Contract: kernels/cuda/adamw.h.
// Grid-stride over groups of W elements: W = kPack (16-byte bf16 vectors for grads and params)
// when those pointers are aligned, else 1. With W = kPack and the fp32 arrays (master, m, v)
// 16-byte aligned too, each thread reads and writes its 8 fp32 values of each as two 16-byte
// vectors; otherwise element by element (a ZeRO-1 range may start anywhere inside a tensor).
// Elementwise, so order-independent and deterministic: the vector and scalar paths compute the
// same values.
#include "kernels/cuda/adamw.h"

#include <cmath>

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, inv_c1, inv_c2, grad_scale;
};

// One element: m, v and p (the master weight) updated in place; returns the new weight.
__device__ __forceinline__ float Step(float& m, float& v, float& p, float grad,
                                      const AdamWArgs& a) {
  const float g = grad * a.grad_scale;
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  p = p - a.lr * ((m * a.inv_c1) / (sqrtf(v * a.inv_c2) + a.eps) + a.weight_decay * p);
  return p;
}

__device__ __forceinline__ float Step(float* master, float* m, float* v, long i, float grad,
                                      const AdamWArgs& a) {
  float mi = m[i], vi = v[i], p = master[i];
  const float updated = Step(mi, vi, p, grad, a);
  m[i] = mi;
  v[i] = vi;
  master[i] = p;
  return updated;
}

// x[0..W) := p[0..W) as W / 4 16-byte loads (p 16-byte aligned), and back.
template <int W>
__device__ __forceinline__ void Load4(const float* p, float (&x)[W]) {
#pragma unroll
  for (int k = 0; k < W / 4; ++k) {
    const float4 q = reinterpret_cast<const float4*>(p)[k];
    x[4 * k] = q.x;
    x[4 * k + 1] = q.y;
    x[4 * k + 2] = q.z;
    x[4 * k + 3] = q.w;
  }
}
template <int W>
__device__ __forceinline__ void Store4(float* p, const float (&x)[W]) {
#pragma unroll
  for (int k = 0; k < W / 4; ++k) {
    reinterpret_cast<float4*>(p)[k] =
        make_float4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3]);
  }
}

template <int W, bool kVectorF32>
__global__ void AdamWKernel(float* master, bf16* params, const bf16* grads, float* m, float* v,
                            long n, AdamWArgs args) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float grad[W], out[W];
    device::LoadF<W>(grads + g * W, grad);
    if constexpr (kVectorF32) {
      static_assert(W % 4 == 0, "16-byte fp32 vectors need groups of 4");
      float mm[W], vv[W];
      Load4<W>(master + g * W, out);
      Load4<W>(m + g * W, mm);
      Load4<W>(v + g * W, vv);
#pragma unroll
      for (int k = 0; k < W; ++k) Step(mm[k], vv[k], out[k], grad[k], args);
      Store4<W>(master + g * W, out);
      Store4<W>(m + g * W, mm);
      Store4<W>(v + g * W, vv);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) out[k] = Step(master, m, v, g * W + k, grad[k], args);
    }
    device::StoreF<W>(params + g * W, out);
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    params[i] = __float2bfloat16(Step(master, m, v, i, __bfloat162float(grads[i]), args));
  }
}

}  // namespace

void adamw_update(float* master, bf16* params, const bf16* grads, float* m, float* v, long n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(master && params && grads && m && v, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  LOOM_KERNEL_CHECK(t >= 1, "t is the 1-based step");
  LOOM_KERNEL_CHECK(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f,
                    "betas must lie in [0, 1)");
  LOOM_KERNEL_CHECK(eps > 0.0f, "eps must be positive");
  AdamWArgs args;
  args.lr = lr;
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.eps = eps;
  args.weight_decay = weight_decay;
  args.inv_c1 = static_cast<float>(1.0 / (1.0 - std::pow(double{beta1}, t)));
  args.inv_c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{beta2}, t)));
  args.grad_scale = grad_scale;
  if (launch::AllAligned16({params, grads, master, m, v})) {
    AdamWKernel<launch::kPack, true>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            master, params, grads, m, v, n, args);
  } else if (launch::AllAligned16({params, grads})) {
    AdamWKernel<launch::kPack, false>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            master, params, grads, m, v, n, args);
  } else {
    AdamWKernel<1, false><<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(
        master, params, grads, m, v, n, args);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda

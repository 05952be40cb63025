// AdamW update. Contract: kernels/cuda/adamw.h.
// Grid-stride over groups of W elements: W = kPack (16-byte bf16 vectors for grads and params)
// when those pointers are aligned, else 1; the fp32 arrays are read element by element
// (coalesced). Elementwise, so order-independent and deterministic.
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

__device__ __forceinline__ float Step(float* master, float* m, float* v, long i, float grad,
                                      const AdamWArgs& a) {
  const float g = grad * a.grad_scale;
  const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float p = master[i];
  const float updated =
      p - a.lr * ((mi * a.inv_c1) / (sqrtf(vi * a.inv_c2) + a.eps) + a.weight_decay * p);
  master[i] = updated;
  return updated;
}

template <int W>
__global__ void AdamWKernel(float* master, bf16* params, const bf16* grads, float* m, float* v,
                            long n, AdamWArgs args) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float grad[W], out[W];
    device::LoadF<W>(grads + g * W, grad);
#pragma unroll
    for (int k = 0; k < W; ++k) out[k] = Step(master, m, v, g * W + k, grad[k], args);
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
  if (launch::AllAligned16({params, grads})) {
    AdamWKernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            master, params, grads, m, v, n, args);
  } else {
    AdamWKernel<1><<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(
        master, params, grads, m, v, n, args);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda

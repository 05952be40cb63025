// GptCuda's state to and from the host (checkpoints): the fp32 master weights and AdamW moments
// of the master range, stored in the table's layout on the device as well, and the bf16
// parameters derived from the whole table (padded_layout.h).
#include <algorithm>
#include <vector>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/check.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt_cuda.h"

namespace loom::train {

namespace kc = loom::kernels::cuda;

GptCuda::HostState GptCuda::StateToHost() {
  // The masters and moments are stored in the table's layout already (the range's part).
  const size_t n = range_.end - range_.begin;
  HostState state;
  state.params.resize(n);
  state.m.resize(n);
  state.v.resize(n);
  // Pageable destinations: synchronised below.
  LOOM_CUDA_CHECK(cudaMemcpyAsync(state.params.data(), master_, n * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(state.m.data(), m_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(state.v.data(), v_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return state;
}

void GptCuda::LoadState(const float* params, const float* m, const float* v) {
  LOOM_CHECK(params != nullptr && (m == nullptr) == (v == nullptr),
             "LoadState needs the parameters, and both moments or neither");
  // The bf16 copy of every parameter (through master_ when it holds the whole table), then the
  // range's masters.
  UploadParams(params);
  const size_t n = range_.end - range_.begin;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(master_, params + range_.begin, n * sizeof(float),
                                  cudaMemcpyHostToDevice, stream_));
  if (m != nullptr) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(m_, m, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(v_, v, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  } else {
    LOOM_CUDA_CHECK(cudaMemsetAsync(m_, 0, std::max<size_t>(n, 1) * sizeof(float), stream_));
    LOOM_CUDA_CHECK(cudaMemsetAsync(v_, 0, std::max<size_t>(n, 1) * sizeof(float), stream_));
  }
  LOOM_CUDA_CHECK(cudaMemsetAsync(grads_, 0, layout_.total * sizeof(bf16), stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace loom::train

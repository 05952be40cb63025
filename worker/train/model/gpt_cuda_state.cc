// GptCuda's state to and from the host (checkpoints): the fp32 master weights and AdamW moments
// in the table's layout, converted from and to the padded device layout (padded_layout.h).
#include <vector>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/check.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt_cuda.h"

namespace loom::train {

namespace kc = loom::kernels::cuda;

GptCuda::HostState GptCuda::StateToHost() {
  const size_t n = layout_.total;
  std::vector<float> master(n), m(n), v(n);  // padded, pageable: synchronised below
  LOOM_CUDA_CHECK(cudaMemcpyAsync(master.data(), master_, n * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(m.data(), m_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(v.data(), v_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  HostState state;
  state.params.resize(num_params_);
  state.m.resize(num_params_);
  state.v.resize(num_params_);
  UnpadFromDevice(layout_, table_, master.data(), state.params.data());
  UnpadFromDevice(layout_, table_, m.data(), state.m.data());
  UnpadFromDevice(layout_, table_, v.data(), state.v.data());
  return state;
}

void GptCuda::LoadState(const float* params, const float* m, const float* v) {
  LOOM_CHECK(params != nullptr && (m == nullptr) == (v == nullptr),
             "LoadState needs the parameters, and both moments or neither");
  const size_t n = layout_.total;
  std::vector<float> padded(n);  // pageable: synchronised below before it goes away
  PadToDevice(layout_, table_, params, padded.data());
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(master_, padded.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  kc::cast_f32_to_bf16(params_, master_, static_cast<long>(n), stream_);
  std::vector<float> padded_m, padded_v;
  if (m != nullptr) {
    padded_m.resize(n);
    padded_v.resize(n);
    PadToDevice(layout_, table_, m, padded_m.data());
    PadToDevice(layout_, table_, v, padded_v.data());
    LOOM_CUDA_CHECK(cudaMemcpyAsync(m_, padded_m.data(), n * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(v_, padded_v.data(), n * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  } else {
    LOOM_CUDA_CHECK(cudaMemsetAsync(m_, 0, n * sizeof(float), stream_));
    LOOM_CUDA_CHECK(cudaMemsetAsync(v_, 0, n * sizeof(float), stream_));
  }
  LOOM_CUDA_CHECK(cudaMemsetAsync(grads_, 0, n * sizeof(bf16), stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace loom::train

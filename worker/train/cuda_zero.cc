#include "worker/train/cuda_zero.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/check.h"
#include "worker/train/device/cuda_stream.h"
#include "worker/train/error.h"

namespace loom::train {

using bf16 = GptCuda::bf16;

CudaZero::CudaZero(GptCuda* model, NcclCommunicator* dp, size_t piece) : model_(model), dp_(dp) {
  LOOM_CHECK(model_ != nullptr && dp_ != nullptr && dp_->size() > 1,
             "ZeRO-1 needs a model and a data-parallel group of more than one rank");
  LOOM_CHECK(dp_->device() == model_->device(), "the dp group lives on another device");
  LOOM_CHECK(piece > 0, "the ZeRO-1 piece must hold at least one element");
  range_ = RangeOf(model_->num_params(), dp_->size(), dp_->rank());
  LOOM_CHECK(model_->range_begin() == range_.begin && model_->range_end() == range_.end,
             "the model's master range is not this dp rank's ZeRO-1 range");
  piece_ = std::min(piece, std::max<size_t>(range_.shard, 1));
  staging_bytes_ = (static_cast<size_t>(dp_->size()) + 1) * piece_ * sizeof(float);
  CachingAllocator* allocator = model_->allocator();
  staging_ = allocator->Allocate(staging_bytes_, ToStreamId(model_->stream()));
  // The collectives read and write it on the communicator's stream.
  allocator->RecordStream(staging_, ToStreamId(dp_->stream()));
  dp_->SetComputeStream(model_->stream());
}

CudaZero::~CudaZero() {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
  model_->allocator()->Free(staging_);
}

void CudaZero::ToFlat(const bf16* padded, size_t lo, size_t n, bf16* flat) {
  cudaStream_t stream = model_->stream();
  const size_t held = std::min(lo + n, model_->num_params());
  if (held < lo + n) {
    const size_t from = held > lo ? held - lo : 0;
    LOOM_CUDA_CHECK(cudaMemsetAsync(flat + from, 0, (n - from) * sizeof(bf16), stream));
  }
  model_->ForEachSpan(lo, lo + n, [&](int, size_t dev, size_t table, size_t count) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(flat + (table - lo), padded + dev, count * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, stream));
  });
}

void CudaZero::FromFlat(const bf16* flat, size_t lo, size_t n, bf16* padded) {
  cudaStream_t stream = model_->stream();
  model_->ForEachSpan(lo, lo + n, [&](int, size_t dev, size_t table, size_t count) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(padded + dev, flat + (table - lo), count * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, stream));
  });
}

size_t CudaZero::ReduceScatter() {
  const size_t P = dp_->size();
  auto* in = static_cast<bf16*>(staging_);  // (dp, piece): rank r's block of this piece
  bf16* out = in + P * piece_;              // (piece): this rank's block, summed
  for (size_t at = 0; at < range_.shard; at += piece_) {
    const size_t count = std::min(piece_, range_.shard - at);
    for (size_t r = 0; r < P; ++r)
      ToFlat(model_->grads(), r * range_.shard + at, count, in + r * count);
    // The host waits through the watchdog; the model's stream then waits on the device, so the
    // copies back (and the next piece's copies into the staging buffer) come after the sum.
    dp_->ReduceScatterSum(in, out, count, DeviceDType::kBFloat16)->Wait();
    dp_->StreamWaitAll(model_->stream());
    FromFlat(out, range_.begin + at, count, model_->grads());
  }
  return range_.shard * P * sizeof(bf16);
}

size_t CudaZero::GatherParams() {
  const size_t P = dp_->size();
  auto* in = static_cast<bf16*>(staging_);  // (piece): this rank's block
  bf16* out = in + piece_;                  // (dp, piece): every rank's block
  for (size_t at = 0; at < range_.shard; at += piece_) {
    const size_t count = std::min(piece_, range_.shard - at);
    ToFlat(model_->params(), dp_->rank() * range_.shard + at, count, in);
    dp_->AllGather(in, out, count, DeviceDType::kBFloat16)->Wait();
    dp_->StreamWaitAll(model_->stream());
    for (size_t r = 0; r < P; ++r) {
      if (static_cast<int>(r) == dp_->rank()) continue;  // its own block is already in place
      FromFlat(out + r * count, r * range_.shard + at, count, model_->params());
    }
  }
  return range_.shard * P * sizeof(bf16);
}

void CudaZero::GatherF32(const float* local, std::vector<float>* out) {
  const size_t P = dp_->size(), n = model_->num_params();
  const size_t held = range_.end - range_.begin;
  cudaStream_t stream = model_->stream();
  auto* in = static_cast<float*>(staging_);  // (piece)
  float* gathered = in + piece_;             // (dp, piece)
  out->assign(n, 0.0f);
  std::vector<float> host(P * piece_);
  for (size_t at = 0; at < range_.shard; at += piece_) {
    const size_t count = std::min(piece_, range_.shard - at);
    const size_t mine = at < held ? std::min(count, held - at) : 0;
    if (mine > 0) {
      LOOM_CUDA_CHECK(
          cudaMemcpyAsync(in, local + at, mine * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    }
    if (mine < count) {
      LOOM_CUDA_CHECK(cudaMemsetAsync(in + mine, 0, (count - mine) * sizeof(float), stream));
    }
    dp_->AllGather(in, gathered, count, DeviceDType::kFloat32)->Wait();
    dp_->StreamWaitAll(stream);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host.data(), gathered, P * count * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t r = 0; r < P; ++r) {
      const size_t lo = r * range_.shard + at;
      if (lo >= n) continue;
      const size_t k = std::min(count, n - lo);
      std::memcpy(out->data() + lo, host.data() + r * count, k * sizeof(float));
    }
  }
}

void CudaZero::GatherState(std::vector<float>* params, std::vector<float>* m,
                           std::vector<float>* v) {
  GatherF32(model_->master(), params);
  GatherF32(model_->moment1(), m);
  GatherF32(model_->moment2(), v);
}

}  // namespace loom::train

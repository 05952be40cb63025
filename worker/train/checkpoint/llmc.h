// llm.c's GPT-2 model file, for moving weights between Loom and the llm.c/nanoGPT tools:
// a header of 256 int32 [20240326, 3 (fp32), maxT, V, L, NH, C, Vp, 0...] where Vp is V rounded
// up to a multiple of 128, then the 16 parameter tensors in llm.c's order (ParamTable), fp32
// little-endian, with wte padded to (Vp, C) by zero rows.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_LLMC_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_LLMC_H_

#include <string>
#include <vector>

#include "worker/train/model/dims.h"
#include "worker/train/model/params.h"

namespace loom::train {

class GPT;

inline constexpr int kLlmcModelMagic = 20240326;
inline constexpr int kLlmcModelVersionFp32 = 3;

// V rounded up to a multiple of 128 (llm.c's padded vocabulary).
int PaddedVocab(int vocab);

// Writes `model` as an llm.c model file (durably, WriteFileAtomic). Throws IoError.
void ExportLlmc(const std::string& path, const GPT& model);
// The same from any backend's host copy: `params` laid out by `table` (the whole model's).
void ExportLlmc(const std::string& path, const ModelDims& dims,
                const std::vector<TensorInfo>& table, const float* params);

// Reads the dimensions from an llm.c model file's header. Throws InputError naming the file
// (unreadable, short, wrong magic, a version other than 3 such as bf16's 5, bad dimensions).
ModelDims ReadLlmcDims(const std::string& path);

// Loads the parameters of an llm.c model file into `model`, whose dimensions must match the
// file's (else an InputError naming both). The padding rows of wte are ignored.
void ImportLlmc(const std::string& path, GPT* model);
// The same into `params` laid out by `table` (the whole model's, dimensions `dims`).
void ImportLlmc(const std::string& path, const ModelDims& dims,
                const std::vector<TensorInfo>& table, float* params);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_LLMC_H_

#include "worker/train/checkpoint/llmc.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "worker/train/checkpoint/fs.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt.h"

namespace loom::train {
namespace {

// A FILE* that closes itself.
struct File {
  FILE* f;
  ~File() {
    if (f) std::fclose(f);
  }
};

void ReadExactly(FILE* f, void* dst, size_t bytes, const std::string& path,
                 const std::string& what) {
  if (std::fread(dst, 1, bytes, f) != bytes) {
    throw BadInput(path, "truncated: cannot read " + what);
  }
}

}  // namespace

int PaddedVocab(int vocab) { return (vocab + 127) / 128 * 128; }

void ExportLlmc(const std::string& path, const GPT& model) {
  ExportLlmc(path, model.dims(), model.tensors(), model.params());
}

void ExportLlmc(const std::string& path, const ModelDims& d, const std::vector<TensorInfo>& table,
                const float* params) {
  const int Vp = PaddedVocab(d.vocab);
  int32_t header[256] = {};
  header[0] = kLlmcModelMagic;
  header[1] = kLlmcModelVersionFp32;
  header[2] = d.max_seq_len;
  header[3] = d.vocab;
  header[4] = d.layers;
  header[5] = d.heads;
  header[6] = d.channels;
  header[7] = Vp;
  const std::vector<float> padding(static_cast<size_t>(Vp - d.vocab) * d.channels, 0.0f);
  std::vector<std::pair<const void*, size_t>> pieces;
  pieces.emplace_back(header, sizeof(header));
  for (const TensorInfo& t : table) {
    pieces.emplace_back(params + t.offset, t.numel * sizeof(float));
    if (t.name == "wte" && !padding.empty()) {  // wte (V, C) -> (Vp, C)
      pieces.emplace_back(padding.data(), padding.size() * sizeof(float));
    }
  }
  WriteFileAtomic(path, pieces);
}

ModelDims ReadLlmcDims(const std::string& path) {
  File file{std::fopen(path.c_str(), "rb")};
  if (file.f == nullptr) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  int32_t header[256];
  ReadExactly(file.f, header, sizeof(header), path, "the 256-int32 header");
  if (header[0] != kLlmcModelMagic) {
    throw BadInput(path, "bad magic " + std::to_string(header[0]) + ", expected " +
                             std::to_string(kLlmcModelMagic) + " (llm.c GPT-2 model file)");
  }
  if (header[1] != kLlmcModelVersionFp32) {
    throw BadInput(path, "version " + std::to_string(header[1]) +
                             " is not supported, expected 3 (fp32; version 5 is bf16)");
  }
  ModelDims d{header[4], header[6], header[5], header[2], header[3]};
  if (std::string problem = DimsProblem(d); !problem.empty()) {
    throw BadInput(path, "header dimensions are invalid: " + problem);
  }
  if (header[7] != PaddedVocab(d.vocab)) {
    throw BadInput(path, "padded vocab " + std::to_string(header[7]) + ", expected " +
                             std::to_string(PaddedVocab(d.vocab)));
  }
  return d;
}

void ImportLlmc(const std::string& path, GPT* model) {
  ImportLlmc(path, model->dims(), model->tensors(), model->params());
}

void ImportLlmc(const std::string& path, const ModelDims& d, const std::vector<TensorInfo>& table,
                float* params) {
  const ModelDims file_dims = ReadLlmcDims(path);
  if (!(file_dims == d)) {
    throw BadInput(
        path, "model " + DimsString(file_dims) + " does not match the configured " + DimsString(d));
  }
  File file{std::fopen(path.c_str(), "rb")};
  if (file.f == nullptr) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  if (std::fseek(file.f, 256 * sizeof(int32_t), SEEK_SET) != 0) {
    throw BadInput(path, "cannot seek past the header");
  }
  const size_t pad_floats = static_cast<size_t>(PaddedVocab(d.vocab) - d.vocab) * d.channels;
  std::vector<float> skip(pad_floats);
  for (const TensorInfo& t : table) {
    ReadExactly(file.f, params + t.offset, t.numel * sizeof(float), path, "tensor " + t.name);
    if (t.name == "wte" && pad_floats > 0) {
      ReadExactly(file.f, skip.data(), pad_floats * sizeof(float), path, "wte's padding rows");
    }
  }
  char extra;
  if (std::fread(&extra, 1, 1, file.f) != 0) {
    throw BadInput(path, "longer than its header's dimensions say (wrong dimensions?)");
  }
}

}  // namespace loom::train

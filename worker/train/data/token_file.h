// Token files in the llm.c/nanoGPT layout: a header of 256 int32 (magic 20240520, version 1,
// token count, the rest zero) followed by `count` uint16 token ids, little-endian.
#ifndef LOOM_WORKER_TRAIN_DATA_TOKEN_FILE_H_
#define LOOM_WORKER_TRAIN_DATA_TOKEN_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::train {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderBytes = 256 * sizeof(int32_t);

// A read-only sequence of token ids: a memory-mapped token file or tokens held in memory.
// Movable, not copyable; the mapping is released with the object.
class TokenStream {
 public:
  // Maps `path` and validates it: readable, header present, magic and version right, the file
  // size exactly header + 2 * count, count >= 1, and every id < vocab. Throws InputError naming
  // the file and what was expected.
  static TokenStream Open(const std::string& path, int vocab);

  // Holds `tokens` in memory; `name` stands in for a file name in messages.
  static TokenStream FromTokens(std::vector<uint16_t> tokens, std::string name);

  TokenStream(TokenStream&& other) noexcept;
  TokenStream& operator=(TokenStream&& other) noexcept;
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;
  ~TokenStream();

  const uint16_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Bytes of memory this stream holds (0 for a mapping: the page cache owns it).
  size_t bytes_owned() const { return owned_.capacity() * sizeof(uint16_t); }

 private:
  TokenStream() = default;
  void Release();

  std::string name_;
  const uint16_t* data_ = nullptr;  // (size_) token ids
  size_t size_ = 0;
  void* map_ = nullptr;  // the mmap'ed file, when mapped
  size_t map_bytes_ = 0;
  std::vector<uint16_t> owned_;
};

// Writes `tokens` as a token file (temporary name, fsync, rename). Throws IoError on failure.
void WriteTokenFile(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DATA_TOKEN_FILE_H_

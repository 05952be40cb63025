#include "worker/train/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "worker/train/checkpoint/fs.h"
#include "worker/train/error.h"

namespace loom::train {

TokenStream TokenStream::Open(const std::string& path, int vocab) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BadInput(path, std::string("cannot open token file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw BadInput(path, "not a regular file");
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    throw BadInput(path, "too short for a token file: " + std::to_string(file_bytes) +
                             " bytes, expected a 1024-byte header (256 int32) and tokens");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    throw BadInput(path, std::string("cannot map token file: ") + std::strerror(map_errno));
  }
  TokenStream s;
  s.name_ = path;
  s.map_ = map;
  s.map_bytes_ = file_bytes;

  int32_t header[256];
  std::memcpy(header, map, sizeof(header));
  if (header[0] != kTokenFileMagic) {
    throw BadInput(path, "bad magic " + std::to_string(header[0]) + ", expected " +
                             std::to_string(kTokenFileMagic) + " (llm.c token file)");
  }
  if (header[1] != kTokenFileVersion) {
    throw BadInput(path, "unsupported version " + std::to_string(header[1]) + ", expected 1");
  }
  if (header[2] <= 0) {
    throw BadInput(path, "token count " + std::to_string(header[2]) + ", expected > 0");
  }
  const size_t count = static_cast<size_t>(header[2]);
  const size_t expected = kTokenFileHeaderBytes + count * sizeof(uint16_t);
  if (file_bytes != expected) {
    throw BadInput(path, "size " + std::to_string(file_bytes) + " bytes does not match the " +
                             std::to_string(count) + " tokens of its header (expected " +
                             std::to_string(expected) + " bytes; truncated?)");
  }
  s.data_ =
      reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kTokenFileHeaderBytes);
  s.size_ = count;
  for (size_t i = 0; i < count; ++i) {
    if (s.data_[i] >= vocab) {
      throw BadInput(path, "token id " + std::to_string(s.data_[i]) + " at position " +
                               std::to_string(i) + " is outside the model's vocabulary (vocab " +
                               std::to_string(vocab) + ")");
    }
  }
  return s;
}

TokenStream TokenStream::FromTokens(std::vector<uint16_t> tokens, std::string name) {
  TokenStream s;
  s.name_ = std::move(name);
  s.owned_ = std::move(tokens);
  s.data_ = s.owned_.data();
  s.size_ = s.owned_.size();
  return s;
}

TokenStream::TokenStream(TokenStream&& other) noexcept { *this = std::move(other); }

TokenStream& TokenStream::operator=(TokenStream&& other) noexcept {
  if (this == &other) return *this;
  Release();
  name_ = std::move(other.name_);
  size_ = other.size_;
  map_ = other.map_;
  map_bytes_ = other.map_bytes_;
  owned_ = std::move(other.owned_);
  data_ = map_ ? other.data_ : owned_.data();
  other.map_ = nullptr;
  other.map_bytes_ = 0;
  other.data_ = nullptr;
  other.size_ = 0;
  return *this;
}

TokenStream::~TokenStream() { Release(); }

void TokenStream::Release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

void WriteTokenFile(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > 0x7fffffffu) throw IoError(path + ": too many tokens for one file");
  std::string bytes(kTokenFileHeaderBytes + tokens.size() * sizeof(uint16_t), '\0');
  int32_t header[256] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::memcpy(bytes.data(), header, sizeof(header));
  if (!tokens.empty()) {
    std::memcpy(bytes.data() + kTokenFileHeaderBytes, tokens.data(),
                tokens.size() * sizeof(uint16_t));
  }
  WriteFileAtomic(path, bytes.data(), bytes.size());
}

}  // namespace loom::train

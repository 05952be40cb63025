// A private directory for the fuzz targets whose code under test reads files by path (the
// training core's checkpoint readers): created once per process, in /dev/shm when it exists
// (no disk I/O per input), removed at exit.
#ifndef LOOM_TESTS_FUZZ_FUZZ_TEMP_DIR_H_
#define LOOM_TESTS_FUZZ_FUZZ_TEMP_DIR_H_

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace loom::fuzz {

inline const std::string& TempDir() {
  static const std::string dir = [] {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string pattern = std::string(base) + "/loom-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    static struct Remover {
      std::string path;
      ~Remover() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
      }
    } remover{pattern};
    return pattern;
  }();
  return dir;
}

// Writes `size` bytes at `data` to `path`, replacing it.
inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();  // the harness, not the code under test, failed
}

}  // namespace loom::fuzz

#endif  // LOOM_TESTS_FUZZ_FUZZ_TEMP_DIR_H_

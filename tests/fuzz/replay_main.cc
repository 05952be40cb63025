// A main() for the fuzz targets in the ordinary build (no libFuzzer, any compiler): feeds every
// file of the directories and files named on the command line to LLVMFuzzerTestOneInput once,
// so the seed corpora and every crash input kept as a regression (tests/fuzz/corpus/<target>/)
// run in the normal test suite, and the targets keep compiling where clang is absent.
// Exit status 0 when every input ran (a failing input aborts, as under libFuzzer); 2 when an
// argument cannot be read or names no input at all.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg = argv[i];
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(arg, ec)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // a stable order, for reproducible logs
      for (const auto& f : files) {
        if (!RunFile(f)) return 2;
        ++ran;
      }
    } else {
      if (!RunFile(arg)) return 2;
      ++ran;
    }
  }
  if (ran == 0) {
    std::fprintf(stderr, "replay: no input; usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  std::printf("replay: %zu inputs ran\n", ran);
  return 0;
}

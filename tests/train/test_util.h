// Helpers shared by the worker/train tests: scratch directories and small configs.
#ifndef LOOM_TESTS_TRAIN_TEST_UTIL_H_
#define LOOM_TESTS_TRAIN_TEST_UTIL_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/train/config/job_config.h"
#include "worker/train/error.h"

namespace loom::train::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom-train-XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A valid config for the tiny preset on the built-in corpus (B=4, T=32 unless changed).
// The message of the InputError `fn` throws, or "" when it throws none.
template <typename F>
std::string ErrorOf(F fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The same for an InputError or an IoError, prefixed by which: "InputError: ..." or
// "IoError: ...".
template <typename F>
std::string KindAndErrorOf(F fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return std::string("InputError: ") + e.what();
  } catch (const IoError& e) {
    return std::string("IoError: ") + e.what();
  }
  return "";
}

inline JobConfig TinyConfig(int64_t steps) {
  JobConfig c;
  c.preset = "tiny";
  c.model = *PresetDims("tiny");
  c.data_builtin = "tiny-corpus";
  c.steps = steps;
  c.seq_len = 32;
  c.micro_batch = 4;
  c.global_batch_tokens = 4 * 32;
  return c;
}

}  // namespace loom::train::testing

#endif  // LOOM_TESTS_TRAIN_TEST_UTIL_H_

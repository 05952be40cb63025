#include "worker/train/comm/file_store.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <thread>

#include "worker/train/comm/communicator.h"

namespace loom::train {
namespace {

// Letters, digits, '-', '_' and '.' stay; everything else (including '/') becomes %XX, so every
// key is one file name and distinct keys are distinct names. A leading '.' is escaped too:
// temporary files start with one.
std::string Escape(const std::string& key) {
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    const bool plain = std::isalnum(c) || c == '-' || c == '_' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out.empty() ? "%" : out;
}

bool ReadFile(const std::string& path, std::string* value) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  value->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

}  // namespace

FileKeyValueStore::FileKeyValueStore(std::string dir) : dir_(std::move(dir)) {}

std::string FileKeyValueStore::PathOf(const std::string& key) const {
  return dir_ + "/" + Escape(key);
}

void FileKeyValueStore::Set(const std::string& key, const std::string& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw CommError("cannot create the file store " + dir_ + ": " + ec.message());
  const std::string path = PathOf(key);
  const std::string tmp = dir_ + "/." + Escape(key) + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(reinterpret_cast<uintptr_t>(this)) + "." +
                          std::to_string(writes_++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) throw CommError("cannot write " + tmp + " in the file store");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw CommError("cannot publish key " + key + " as " + path + ": " + ec.message());
  }
}

std::vector<std::string> FileKeyValueStore::Wait(const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> values(keys.size());
  std::vector<bool> have(keys.size(), false);
  for (;;) {
    std::string missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!have[i]) have[i] = ReadFile(PathOf(keys[i]), &values[i]);
      if (!have[i]) missing += (missing.empty() ? "" : ", ") + keys[i];
    }
    if (missing.empty()) return values;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw CommError("timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                      missing + " in " + Describe());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string FileKeyValueStore::Describe() const { return "the file store in " + dir_; }

}  // namespace loom::train

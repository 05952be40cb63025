// A KeyValueStore in a directory shared by the ranks (one machine, or a shared file system):
// the standalone rendezvous of DESIGN.md ("a file store when run standalone") for bootstraps
// that need no Gloo, such as the NCCL unique id on the GPU machine (which has no Gloo).
//
// One file per key. A value is written to a temporary name and renamed into place, so a reader
// sees all of it or nothing. Keys may hold any characters; they are escaped into file names.
//
// Threading: like every KeyValueStore, one instance is used from one thread; several instances
// (threads or processes) may share one directory.
#ifndef LOOM_WORKER_TRAIN_COMM_FILE_STORE_H_
#define LOOM_WORKER_TRAIN_COMM_FILE_STORE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/train/comm/key_value_store.h"

namespace loom::train {

class FileKeyValueStore : public KeyValueStore {
 public:
  // `dir` is created at the first Set when missing.
  explicit FileKeyValueStore(std::string dir);

  // Throws CommError when the directory or the file cannot be written.
  void Set(const std::string& key, const std::string& value) override;
  // Polls every 10 ms; on timeout throws CommError naming the keys still missing.
  std::vector<std::string> Wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) override;
  // "the file store in DIR".
  std::string Describe() const override;

 private:
  std::string PathOf(const std::string& key) const;

  std::string dir_;
  uint64_t writes_ = 0;  // makes temporary names unique within this instance
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_FILE_STORE_H_

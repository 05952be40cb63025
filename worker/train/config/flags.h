// loom-train's command line. Spec-shaped flags become an overlay merged over the spec file, so
// flags and spec share one validation path (and flags win).
#ifndef LOOM_WORKER_TRAIN_CONFIG_FLAGS_H_
#define LOOM_WORKER_TRAIN_CONFIG_FLAGS_H_

#include <string>
#include <vector>

#include "worker/train/config/json.h"

namespace loom::train {

struct Flags {
  bool help = false;
  std::string spec_path;       // --spec
  Value overlay;               // spec fields given as flags, e.g. {"train": {"steps": "100"}}
  std::string checkpoint_dir;  // --checkpoint-dir (wins over LOOM_CHECKPOINT_DIR and the spec)
  std::string export_llmc;     // --export-llmc FILE: write llm.c's model file after training
  std::string init_from_llmc;  // --init-from-llmc FILE: start from llm.c weights
  bool quiet = false;          // --quiet: no human progress on stderr
  std::string rendezvous_dir;  // --rendezvous-dir DIR (wins over LOOM_RENDEZVOUS_DIR)
  // --device cpu|cuda|cuda:N: where the model trains; empty when not given (then LOOM_DEVICE
  // decides, else the CPU). "cuda" means device 0.
  std::string device;
};

// Parses argv ("--flag value" or "--flag=value"). Throws InputError naming the flag.
Flags ParseFlags(const std::vector<std::string>& args);

// The usage text printed by --help.
const char* FlagsUsage();

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CONFIG_FLAGS_H_

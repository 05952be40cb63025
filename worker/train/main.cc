// loom-train: the training process, one per device (DESIGN.md, "The training core").
#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/train/run.h"

int main(int argc, char** argv) {
  // A closed progress pipe must surface as EPIPE (reported, then skipped), not kill the rank.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  return loom::train::RunLoomTrain(args, [](const char* name) { return std::getenv(name); });
}

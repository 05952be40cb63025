// test_rank: plays the role of a rank (loom-train) in the integration tests. It follows the
// rank contract (docs/rank-contract.md) and does what a test asks through its environment,
// which the tests set through the job spec's `env` map. (The names start with TEST_RANK_, not
// LOOM_TEST_: loomd rejects spec env keys starting with LOOM_, which belong to the contract.)
//
//   TEST_RANK_OUT_DIR           where to write gen<G>-rank<R>.started (and .done); required
//   TEST_RANK_STEPS             steps to run (default 5)
//   TEST_RANK_STEP_MS           milliseconds per step (default 100)
//   TEST_RANK_CRASH_RANK        this rank crashes ...
//   TEST_RANK_CRASH_MODE        ... by "signal" (SIGSEGV), "exit2" (permanent) or "exit3"
//   TEST_RANK_CRASH_GENERATIONS ... in generations <= this value only (default: every one)
//   TEST_RANK_CRASH_AT_STEP     ... after this step (default 1), once every rank has started
//   TEST_RANK_IGNORE_TERM=1     ignore SIGTERM (the worker must escalate to SIGKILL)
//   TEST_RANK_CHECKPOINT=1      checkpoint like a trainer: start after the step committed in
//                               $LOOM_CHECKPOINT_DIR/committed (rank 0 commits every step by an
//                               atomic rename), and append "resume G STEP" / "commit G STEP" lines
//                               to TEST_RANK_OUT_DIR/history.log (the chaos run's evidence)
//
//   TEST_RANK_DEVICE            e.g. "cuda:0": the step lines carry the device and the memory
//                               figures a GPU rank reports (allocated 1 GiB, reserved 1.5 GiB,
//                               peak 1.25 GiB, fragmentation 0.25, one device allocation in
//                               the first step), so that loomd's loom_gpu_* series exist
//                               without a GPU (tests/monitoring plays a GPU rank with it)
//
// Like loom-train it answers SIGUSR1 (loomd's progress watchdog, through the worker) with a
// stack dump on stderr between the contract's first and last lines, and fences itself (exit 1)
// when its worker says nothing on LOOM_FENCE_FD for LOOM_FENCE_TIMEOUT_MS.
//
// The .started file is JSON: the pid, the whole rank environment as seen, and
// "previous_generation_alive": the pids of the previous generation's ranks that were still
// running when this rank started (a restarted gang must find none); "earlier_generations_alive"
// the same for every earlier generation; "launched_before": true when this generation's rank
// had already been started once (a gang launched twice); its uid/euid/gid, and whether it could
// create a file in LOOM_WORK_DIR and LOOM_CHECKPOINT_DIR. Files are written
// atomically (temp file + rename) so a test never reads half of one.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

long EnvInt(const char* name, long fallback) {
  const std::string v = Env(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0') {
    std::cerr << "test_rank: " << name << "='" << v << "' is not an integer" << std::endl;
    std::exit(2);
  }
  return n;
}

[[noreturn]] void BadConfig(const std::string& message) {
  std::cerr << "test_rank: " << message << std::endl;
  std::exit(2);
}

void WriteAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << content;
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool Alive(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

// Pids of gen<generation>-rank*.started files in `dir` that are still running.
std::vector<long> AliveRanksOfGeneration(const std::string& dir, long generation) {
  std::vector<long> alive;
  const std::string prefix = "gen" + std::to_string(generation) + "-rank";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return alive;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || name.size() < 8 ||
        name.substr(name.size() - 8) != ".started") {
      continue;
    }
    std::ifstream in(dir + "/" + name);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("pid") && Alive(j["pid"].get<long>())) {
      alive.push_back(j["pid"].get<long>());
    }
  }
  closedir(d);
  return alive;
}

// Pids of every gen<g>-rank*.started with g < `generation` that are still running.
std::vector<long> AliveRanksOfEarlierGenerations(const std::string& dir, long generation) {
  std::vector<long> alive;
  for (long g = 1; g < generation; ++g) {
    for (long pid : AliveRanksOfGeneration(dir, g)) alive.push_back(pid);
  }
  return alive;
}

// Appends one line with a single write (O_APPEND: lines of concurrent ranks never interleave).
void AppendLine(const std::string& path, const std::string& line) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string text = line + "\n";
  if (write(fd, text.data(), text.size()) < 0) std::cerr << "test_rank: cannot append" << std::endl;
  close(fd);
}

// Commits `step` as a trainer commits a checkpoint: write, fsync and close a temp file, checking
// each, and rename only then. False (nothing committed) when the disk is full or failing.
bool CommitStep(const std::string& dir, long step) {
  const std::string path = dir + "/committed";
  const std::string tmp = path + ".tmp";
  const std::string text = std::to_string(step) + "\n";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       fsync(fd) == 0;
  const bool closed = close(fd) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

long ReadCommitted(const std::string& dir) {
  std::ifstream in(dir + "/committed");
  long step = 0;
  if (in >> step) return step;
  return 0;
}

int CountStarted(const std::string& dir, long generation) {
  int n = 0;
  const std::string prefix = "gen" + std::to_string(generation) + "-rank";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0 && name.size() > 8 &&
        name.substr(name.size() - 8) == ".started") {
      ++n;
    }
  }
  closedir(d);
  return n;
}

void Crash(const std::string& mode, long rank) {
  std::cerr << "test_rank " << rank << ": crashing as asked (" << mode << ")" << std::endl;
  if (mode == "exit2") std::exit(2);
  if (mode == "exit3") std::exit(3);
  if (mode == "signal") {
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // a crash, not a core file in the work dir
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  }
  BadConfig("TEST_RANK_CRASH_MODE='" + mode + "'; use signal, exit2 or exit3");
}

// The rank contract's stack dump, as loom-train writes it (async-signal-safe: write only).
void OnSigusr1(int) {
  static constexpr char kDump[] =
      "loom-train: stack dump (SIGUSR1), test_rank\n#0 test_rank main loop\n"
      "last collectives: all_reduce #0\nloom-train: end of stack dump\n";
  (void)!write(STDERR_FILENO, kDump, sizeof(kDump) - 1);
}

// The rank contract's self-fencing, as loom-train does it (worker/train/diag/fence.h).
void WatchFence() {
  const long fd = EnvInt("LOOM_FENCE_FD", -1);
  const long timeout_ms = EnvInt("LOOM_FENCE_TIMEOUT_MS", 30000);
  if (fd < 0) return;
  std::thread([fd, timeout_ms] {
    for (;;) {
      pollfd p{static_cast<int>(fd), POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(timeout_ms));
      char buf[64];
      if (ready == 0 || (ready > 0 && read(static_cast<int>(fd), buf, sizeof(buf)) <= 0)) {
        std::cerr << "test_rank: self-fencing: no word from loom-worker" << std::endl;
        std::_Exit(1);
      }
    }
  }).detach();
}

}  // namespace

int main() {
  signal(SIGUSR1, OnSigusr1);
  WatchFence();
  // As loom-train does (worker/train/main.cc): a progress pipe the worker closed must surface as
  // EPIPE, not kill the rank with SIGPIPE. Set here: the worker starts ranks with every signal at
  // its default action, so nothing inherited can stand in for it.
  signal(SIGPIPE, SIG_IGN);
  const std::string out_dir = Env("TEST_RANK_OUT_DIR");
  if (out_dir.empty()) BadConfig("TEST_RANK_OUT_DIR is not set; put it in the job spec's env");
  for (const char* required : {"LOOM_JOB", "LOOM_JOB_GENERATION", "LOOM_RANK", "LOOM_WORLD_SIZE",
                               "LOOM_LOCAL_RANK", "LOOM_LOCAL_WORLD_SIZE", "LOOM_NODE_RANK",
                               "LOOM_NUM_NODES", "LOOM_DEVICE", "LOOM_LAYOUT"}) {
    if (Env(required).empty()) BadConfig(std::string(required) + " is not set by the worker");
  }
  const long generation = EnvInt("LOOM_JOB_GENERATION", 0);
  const long rank = EnvInt("LOOM_RANK", -1);
  const long world = EnvInt("LOOM_WORLD_SIZE", 0);
  const long steps = EnvInt("TEST_RANK_STEPS", 5);
  const long step_ms = EnvInt("TEST_RANK_STEP_MS", 100);
  const long crash_rank = EnvInt("TEST_RANK_CRASH_RANK", -1);
  const long crash_generations = EnvInt("TEST_RANK_CRASH_GENERATIONS", 1L << 30);
  const long crash_at = EnvInt("TEST_RANK_CRASH_AT_STEP", 1);
  const std::string crash_mode = Env("TEST_RANK_CRASH_MODE", "signal");
  const long progress_fd = EnvInt("LOOM_PROGRESS_FD", -1);
  if (rank < 0 || rank >= world) BadConfig("LOOM_RANK is outside 0..LOOM_WORLD_SIZE-1");
  if (Env("TEST_RANK_IGNORE_TERM") == "1") signal(SIGTERM, SIG_IGN);

  nlohmann::json started = {{"pid", static_cast<long>(getpid())}};
  for (const char* name :
       {"LOOM_JOB", "LOOM_JOB_GENERATION", "LOOM_RANK", "LOOM_WORLD_SIZE", "LOOM_LOCAL_RANK",
        "LOOM_LOCAL_WORLD_SIZE", "LOOM_NODE_RANK", "LOOM_NUM_NODES", "LOOM_DEVICE", "LOOM_LAYOUT",
        "LOOM_RENDEZVOUS", "LOOM_SPEC_FILE", "LOOM_CHECKPOINT_DIR", "LOOM_WORK_DIR",
        "LOOM_PROGRESS_FD"}) {
    started[name] = Env(name);
  }
  started["previous_generation_alive"] = AliveRanksOfGeneration(out_dir, generation - 1);
  started["earlier_generations_alive"] = AliveRanksOfEarlierGenerations(out_dir, generation);
  // Who the rank runs as, and whether it can write the folders the worker prepared for it.
  started["uid"] = static_cast<long>(getuid());
  started["euid"] = static_cast<long>(geteuid());
  started["gid"] = static_cast<long>(getgid());
  for (const char* dir : {"LOOM_WORK_DIR", "LOOM_CHECKPOINT_DIR"}) {
    const std::string probe = Env(dir) + "/.test_rank_probe";
    const bool writable = std::ofstream(probe).good();
    std::remove(probe.c_str());
    started[std::string(dir) + "_writable"] = writable;
  }
  const std::string stem =
      out_dir + "/gen" + std::to_string(generation) + "-rank" + std::to_string(rank);
  started["launched_before"] = access((stem + ".started").c_str(), F_OK) == 0;
  const bool checkpoint = Env("TEST_RANK_CHECKPOINT") == "1";
  const std::string checkpoint_dir = Env("LOOM_CHECKPOINT_DIR");
  long first_step = 1;
  if (checkpoint) {
    if (checkpoint_dir.empty()) BadConfig("TEST_RANK_CHECKPOINT=1 needs LOOM_CHECKPOINT_DIR");
    std::filesystem::create_directories(checkpoint_dir);
    first_step = ReadCommitted(checkpoint_dir) + 1;
    if (rank == 0) {
      AppendLine(out_dir + "/history.log",
                 "resume " + std::to_string(generation) + " " + std::to_string(first_step - 1));
    }
  }
  WriteAtomically(stem + ".started", started.dump());

  std::cout << "test_rank " << rank << ": started generation " << generation << " of "
            << Env("LOOM_JOB") << " on " << Env("LOOM_DEVICE") << std::endl;
  std::cerr << "test_rank " << rank << ": a line on stderr" << std::endl;

  const bool crashes = rank == crash_rank && generation <= crash_generations;
  const std::string device = Env("TEST_RANK_DEVICE");
  for (long step = first_step; step <= steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    const double loss = 5.0 / static_cast<double>(step + 1);
    if (progress_fd >= 0) {
      nlohmann::json line = {{"event", "step"},
                                   {"rank", rank},
                                   {"step", step},
                                   {"total_steps", steps},
                                   {"loss", loss},
                                   {"tokens_per_second", 1000.0},
                                   {"step_seconds", step_ms / 1000.0}};
      if (!device.empty()) {
        constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
        line["device"] = device;
        line["memory_bytes"] = static_cast<uint64_t>(1.0 * kGiB);
        line["peak_memory_bytes"] = static_cast<uint64_t>(1.25 * kGiB);
        line["reserved_memory_bytes"] = static_cast<uint64_t>(1.5 * kGiB);
        line["rss_bytes"] = static_cast<uint64_t>(0.5 * kGiB);
        line["memory_fragmentation"] = 0.25;
        line["device_allocations"] = step == first_step ? 1 : 0;
      }
      const std::string text = line.dump() + "\n";
      if (write(static_cast<int>(progress_fd), text.data(), text.size()) < 0) {
        std::cerr << "test_rank " << rank << ": cannot write progress" << std::endl;
      }
    }
    std::cout << "test_rank " << rank << ": step " << step << "/" << steps << " loss " << loss
              << std::endl;
    if (checkpoint && rank == 0) {
      if (!CommitStep(checkpoint_dir, step)) {
        // As loom-train: a checkpoint that cannot be written fails the rank (retryable).
        std::cerr << "test_rank 0: cannot commit step " << step << " in " << checkpoint_dir << ": "
                  << std::strerror(errno) << std::endl;
        return 1;
      }
      AppendLine(out_dir + "/history.log",
                 "commit " + std::to_string(generation) + " " + std::to_string(step));
    }
    if (crashes && step == crash_at) {
      // Crash only once the whole gang is up, so that the test sees every rank stopped.
      for (int i = 0; i < 500 && CountStarted(out_dir, generation) < world; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      Crash(crash_mode, rank);
    }
  }
  WriteAtomically(stem + ".done", "ok\n");
  std::cout << "test_rank " << rank << ": done" << std::endl;
  return 0;
}

// Self-fencing: the rank's watch of its worker's fence (diag/fence.h) fences after silence or
// when the worker's end closes, and not while bytes keep coming. The issue: a frozen worker's
// rank kept training unsupervised.
#include "worker/train/diag/fence.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

struct Pair {
  int rank = -1, worker = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    rank = fds[0];
    worker = fds[1];
  }
};

TEST(FenceTest, FencesAfterSilenceButNotWhileTheWorkerSpeaks) {
  Pair pair;
  auto fenced = std::make_shared<std::promise<std::string>>();
  std::future<std::string> why = fenced->get_future();
  const auto start = std::chrono::steady_clock::now();
  StartFenceWatch(pair.rank, 300ms, [fenced](const std::string& w) { fenced->set_value(w); });
  for (int i = 0; i < 12; ++i) {  // 600 ms of a byte every 50 ms
    ASSERT_EQ(::write(pair.worker, "\n", 1), 1);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(why.wait_for(0ms), std::future_status::timeout) << "fenced while the worker spoke";
  ASSERT_EQ(why.wait_for(2s), std::future_status::ready);
  EXPECT_THAT(why.get(), HasSubstr("no word from loom-worker for 300 ms"));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 850ms);
  ::close(pair.worker);
}

TEST(FenceTest, FencesAtOnceWhenTheWorkerEndCloses) {
  Pair pair;
  auto fenced = std::make_shared<std::promise<std::string>>();
  std::future<std::string> why = fenced->get_future();
  StartFenceWatch(pair.rank, 10s, [fenced](const std::string& w) { fenced->set_value(w); });
  ::close(pair.worker);
  ASSERT_EQ(why.wait_for(2s), std::future_status::ready);
  EXPECT_THAT(why.get(), HasSubstr("closed its end"));
}

TEST(FenceTest, TheEnvironmentIsOptionalAndChecked) {
  StartFenceWatchFromEnv([](const char*) -> const char* { return nullptr; });  // no-op
  EXPECT_THROW(StartFenceWatchFromEnv([](const char* name) -> const char* {
                 return std::string(name) == "LOOM_FENCE_FD" ? "five" : nullptr;
               }),
               std::runtime_error);
}

}  // namespace
}  // namespace loom::train

// RendezvousStore: set/get/add, wait with timeout and cancellation, scoping by (job,
// generation), limits, and dropping a generation.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/rendezvous_store.h"

namespace loom::rendezvous {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::RendezvousScope Scope(const std::string& job, int64_t generation) {
  v1::RendezvousScope scope;
  scope.set_job(job);
  scope.set_generation(generation);
  return scope;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(RendezvousTest, SetGetAndAdd) {
  RendezvousStore store(nullptr);
  const std::string binary("id\0with\xffnul", 11);
  ASSERT_TRUE(store.Set(Scope("jobs/a", 1), "nccl-id", binary).ok());
  absl::StatusOr<std::string> value = store.Get(Scope("jobs/a", 1), "nccl-id");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, binary);
  EXPECT_EQ(store.Get(Scope("jobs/a", 1), "other").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(*store.Add(Scope("jobs/a", 1), "counter", 2), 2);
  EXPECT_EQ(*store.Add(Scope("jobs/a", 1), "counter", -5), -3);
  EXPECT_EQ(*store.Get(Scope("jobs/a", 1), "counter"), "-3");
  EXPECT_EQ(store.Add(Scope("jobs/a", 1), "nccl-id", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store.Set(Scope("jobs/a", 1), "big", "9223372036854775807").ok());
  EXPECT_EQ(store.Add(Scope("jobs/a", 1), "big", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(RendezvousTest, OneJobCannotFillTheStoreForOthers) {
  RendezvousStore store(nullptr);
  const std::string mib(1 << 20, 'x');
  int stored = 0;
  absl::Status status;
  for (int i = 0; i < 64 && status.ok(); ++i) {
    status = store.Set(Scope("jobs/greedy", 1), "k" + std::to_string(i), mib);
    if (status.ok()) ++stored;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(status), HasSubstr("quota"));
  EXPECT_EQ(stored, static_cast<int>(kMaxScopeBytes >> 20) - 1);  // keys count too
  // Replacing a value within the quota still works, and other jobs start as usual.
  EXPECT_TRUE(store.Set(Scope("jobs/greedy", 1), "k0", "small").ok());
  EXPECT_TRUE(store.Set(Scope("jobs/other", 1), "nccl-id", mib).ok());
}

TEST(RendezvousTest, ScopesAreSeparateByJobAndGeneration) {
  RendezvousStore store(nullptr);
  ASSERT_TRUE(store.Set(Scope("jobs/a", 1), "k", "gen1").ok());
  EXPECT_EQ(store.Get(Scope("jobs/a", 2), "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(Scope("jobs/b", 1), "k").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set(Scope("jobs/a", 2), "k", "gen2").ok());
  store.DropJob("jobs/a", 2);  // generation 1 is gone, 2 stays
  EXPECT_EQ(store.Get(Scope("jobs/a", 1), "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store.Get(Scope("jobs/a", 2), "k"), "gen2");
}

TEST(RendezvousTest, WaitReturnsOnceEveryKeyIsSet) {
  RendezvousStore store(nullptr);
  ASSERT_TRUE(store.Set(Scope("jobs/a", 1), "rank0", "x").ok());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(store.Set(Scope("jobs/a", 1), "rank1", "y").ok());
  });
  absl::StatusOr<std::vector<std::string>> values =
      store.Wait(Scope("jobs/a", 1), {"rank1", "rank0"}, absl::Seconds(10), nullptr);
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("y", "x"));
}

TEST(RendezvousTest, WaitTimesOutNamingTheMissingKeys) {
  RendezvousStore store(nullptr);
  ASSERT_TRUE(store.Set(Scope("jobs/a", 1), "rank0", "x").ok());
  absl::StatusOr<std::vector<std::string>> values =
      store.Wait(Scope("jobs/a", 1), {"rank0", "rank1", "rank2"}, absl::Milliseconds(50), nullptr);
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(values.status()), HasSubstr("\"rank1\", \"rank2\""));
  EXPECT_THAT(Message(values.status()), ::testing::Not(HasSubstr("\"rank0\"")));
}

TEST(RendezvousTest, WaitEndsWhenTheClientCancelsOrTheGenerationIsDropped) {
  RendezvousStore store(nullptr);
  std::atomic<bool> cancelled{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    cancelled = true;
  });
  absl::StatusOr<std::vector<std::string>> values = store.Wait(
      Scope("jobs/a", 1), {"never"}, absl::Seconds(30), [&] { return cancelled.load(); });
  canceller.join();
  EXPECT_EQ(values.status().code(), absl::StatusCode::kCancelled);

  std::thread dropper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    store.DropJob("jobs/a", std::numeric_limits<int64_t>::max());
  });
  values = store.Wait(Scope("jobs/a", 1), {"never"}, absl::Seconds(30), nullptr);
  dropper.join();
  EXPECT_EQ(values.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.ScopeCount(), 0u);
}

TEST(RendezvousTest, MalformedRequestsAreRejected) {
  RendezvousStore store(nullptr);
  EXPECT_THAT(Message(store.Set(Scope("a", 1), "k", "v")), HasSubstr("scope.job"));
  EXPECT_THAT(Message(store.Set(Scope("jobs/a", 0), "k", "v")), HasSubstr("scope.generation"));
  EXPECT_THAT(Message(store.Set(Scope("jobs/a", 1), "", "v")), HasSubstr("key"));
  EXPECT_THAT(Message(store.Set(Scope("jobs/a", 1), std::string(513, 'k'), "v")), HasSubstr("key"));
  EXPECT_THAT(Message(store.Set(Scope("jobs/a", 1), "k", std::string((1 << 20) + 1, 'v'))),
              HasSubstr("value"));
  EXPECT_TRUE(store.Set(Scope("jobs/a", 1), "k", std::string(1 << 20, 'v')).ok());
  EXPECT_THAT(Message(store.Wait(Scope("jobs/a", 1), {}, absl::Seconds(1), nullptr).status()),
              HasSubstr("keys"));
  std::vector<std::string> too_many(4097, "k");
  EXPECT_EQ(store.Wait(Scope("jobs/a", 1), too_many, absl::Seconds(1), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Wait(Scope("jobs/a", 1), {"k"}, absl::Milliseconds(-1), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, TheScopeCheckerDecides) {
  RendezvousStore store([](std::string_view job, int64_t generation) -> absl::Status {
    if (job != "jobs/live") return absl::NotFoundError("no such job");
    if (generation != 3) return absl::FailedPreconditionError("stale generation");
    return absl::OkStatus();
  });
  EXPECT_EQ(store.Set(Scope("jobs/dead", 1), "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Set(Scope("jobs/live", 2), "k", "v").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store.Set(Scope("jobs/live", 3), "k", "v").ok());
  EXPECT_EQ(store.ScopeCount(), 1u);  // rejected scopes leave nothing behind
}

TEST(RendezvousTest, ShutdownWakesWaiters) {
  RendezvousStore store(nullptr);
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    store.Shutdown();
  });
  absl::StatusOr<std::vector<std::string>> values =
      store.Wait(Scope("jobs/a", 1), {"never"}, absl::Seconds(30), nullptr);
  stopper.join();
  EXPECT_EQ(values.status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace loom::rendezvous

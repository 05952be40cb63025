// StreamLimiter (server/rpc/stream_limiter.h): a caller's open streams are bounded, the refusal
// names the flag, callers are counted apart, and a closed stream gives its place back.
#include "server/rpc/stream_limiter.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::rpc {
namespace {

using ::testing::HasSubstr;

TEST(StreamLimiterTest, BoundsEachCallerAndFreesPlacesOnClose) {
  StreamLimiter limiter(2);
  std::vector<std::unique_ptr<StreamSlot>> alice;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<StreamSlot>> slot = limiter.Acquire("alice");
    ASSERT_TRUE(slot.ok()) << slot.status();
    alice.push_back(*std::move(slot));
  }
  absl::StatusOr<std::unique_ptr<StreamSlot>> third = limiter.Acquire("alice");
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("\"alice\""));
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("--max-streams-per-client"));
  // Another caller has its own count.
  EXPECT_TRUE(limiter.Acquire("bob").ok());
  EXPECT_EQ(limiter.open("alice"), 2);
  alice.pop_back();
  EXPECT_EQ(limiter.open("alice"), 1);
  EXPECT_TRUE(limiter.Acquire("alice").ok());
  alice.clear();
  EXPECT_EQ(limiter.open("alice"), 0);
}

TEST(StreamLimiterTest, TheRefusalNamesWhatIsCountedAndTheWayOut) {
  StreamLimiter traces(1, "GetJobTrace calls in flight", "wait for them to answer");
  absl::StatusOr<std::unique_ptr<StreamSlot>> first = traces.Acquire("alice");
  ASSERT_TRUE(first.ok());
  absl::Status refused = traces.Acquire("alice").status();
  EXPECT_EQ(refused.message(),
            "\"alice\" already has 1 GetJobTrace calls in flight (the limit is 1 per client); "
            "wait for them to answer");
  EXPECT_TRUE(traces.Acquire("bob").ok());
}

}  // namespace
}  // namespace loom::rpc

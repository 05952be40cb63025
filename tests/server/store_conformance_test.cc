// The JobStore contract (server/store/job_store.h), run against every implementation: the
// in-memory store and the SQLite store must be interchangeable for the job manager.
#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/store/job_store.h"
#include "tests/server/store_test_util.h"

namespace loom::store {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::loom::store::testing::MakeEvent;
using ::loom::store::testing::MakeJob;
using ::loom::store::testing::MakeNode;
using ::loom::store::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MATCHER_P(EqualsProto, expected, "equals " + expected.ShortDebugString()) {
  return MessageDifferencer::Equals(arg, expected);
}

struct MemoryStoreFactory {
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const TempDir&) {
    return NewMemoryJobStore();
  }
};

struct SqliteStoreFactory {
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const TempDir& dir) {
    return OpenSqliteJobStore(dir.File("loom.db"));
  }
};

template <typename Factory>
class JobStoreConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Factory::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Creates jobs/{id} with a first QUEUED event and returns its sequence.
  int64_t Create(const std::string& id, v1::JobState state = v1::QUEUED,
                 const std::string& request_id = "") {
    auto sequence = store_->CreateJob(MakeJob(id, state, request_id),
                                      MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created"));
    EXPECT_TRUE(sequence.ok()) << sequence.status();
    return sequence.value_or(-1);
  }

  std::vector<std::string> Names(const std::vector<StoredJob>& jobs) {
    std::vector<std::string> names;
    for (const StoredJob& job : jobs) names.push_back(job.job.name());
    return names;
  }

  int CountAll() {
    auto page = store_->ListJobs(std::nullopt, 0, 100000);
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? static_cast<int>(page->jobs.size()) : -1;
  }

  TempDir dir_;
  std::unique_ptr<JobStore> store_;
};

using Factories = ::testing::Types<MemoryStoreFactory, SqliteStoreFactory>;
class FactoryNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, MemoryStoreFactory> ? "Memory" : "Sqlite";
  }
};
TYPED_TEST_SUITE(JobStoreConformanceTest, Factories, FactoryNames);

TYPED_TEST(JobStoreConformanceTest, CreateThenGetReturnsTheJobWithoutEvents) {
  v1::Job job = MakeJob("a", v1::QUEUED, "req-1");
  *job.add_events() = MakeEvent(v1::QUEUED, v1::RUNNING, "must not be stored in the job");
  auto sequence =
      this->store_->CreateJob(job, MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created"));
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_GT(*sequence, 0);

  auto stored = this->store_->GetJob("jobs/a");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->sequence, *sequence);
  job.clear_events();
  EXPECT_THAT(stored->job, EqualsProto(job));

  auto events = this->store_->ListEvents("jobs/a");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].sequence(), 1);
  EXPECT_EQ((*events)[0].reason(), "created");
  EXPECT_EQ((*events)[0].to_state(), v1::QUEUED);
}

TYPED_TEST(JobStoreConformanceTest, SequencesStrictlyIncrease) {
  const int64_t a = this->Create("a");
  const int64_t b = this->Create("b");
  const int64_t c = this->Create("c");
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
}

TYPED_TEST(JobStoreConformanceTest, UnknownJobIsNotFound) {
  auto job = this->store_->GetJob("jobs/missing");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("jobs/missing"));
  EXPECT_EQ(this->store_->ListEvents("jobs/missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(this->store_->UpdateJob(MakeJob("missing"), std::nullopt).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(this->CountAll(), 0) << "an update of an unknown job must not create it";
}

TYPED_TEST(JobStoreConformanceTest, MalformedNamesAreRejectedAndWriteNothing) {
  v1::Job job = MakeJob("x");
  job.set_name("x");
  auto created =
      this->store_->CreateJob(job, MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "c"));
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(created.status().message(), HasSubstr("job.name"));
  job.set_name("jobs/");
  EXPECT_EQ(this->store_->CreateJob(job, MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "c"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(this->CountAll(), 0);

  v1::Node node = MakeNode("n", 1);
  node.set_name("n");
  absl::Status put = this->store_->PutNode(node);
  EXPECT_EQ(put.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.message(), HasSubstr("node.name"));
  EXPECT_TRUE(this->store_->ListNodes()->empty());
}

TYPED_TEST(JobStoreConformanceTest, DuplicateNameIsAlreadyExistsAndWritesNothing) {
  this->Create("a", v1::QUEUED, "req-1");
  auto again = this->store_->CreateJob(MakeJob("a", v1::RUNNING, "req-2"),
                                       MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "dup"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("jobs/a"));

  EXPECT_EQ(this->CountAll(), 1);
  EXPECT_EQ(this->store_->GetJob("jobs/a")->job.state(), v1::QUEUED);
  EXPECT_FALSE(this->store_->FindJobByRequestId("req-2")->has_value());
  auto events = this->store_->ListEvents("jobs/a");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].reason(), "created");
}

TYPED_TEST(JobStoreConformanceTest, DuplicateRequestIdIsAlreadyExistsAndWritesNothing) {
  this->Create("a", v1::QUEUED, "req-1");
  auto again = this->store_->CreateJob(MakeJob("b", v1::QUEUED, "req-1"),
                                       MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "dup"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("req-1"));
  EXPECT_THAT(again.status().message(), HasSubstr("jobs/a"));
  EXPECT_EQ(this->store_->GetJob("jobs/b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(this->CountAll(), 1);

  auto found = this->store_->FindJobByRequestId("req-1");
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->job.name(), "jobs/a");
  EXPECT_FALSE(this->store_->FindJobByRequestId("req-unknown")->has_value());
}

TYPED_TEST(JobStoreConformanceTest, RequestIdsArePerTenantAndReadBackAsGiven) {
  v1::Job a = MakeJob("a", v1::QUEUED, "req-1");
  a.set_tenant("team-a");
  v1::Job b = MakeJob("b", v1::QUEUED, "req-1");
  b.set_tenant("team-b");
  const v1::JobEvent event = MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created");
  ASSERT_TRUE(this->store_->CreateJob(a, event).ok());
  ASSERT_TRUE(this->store_->CreateJob(b, event).ok());  // same key, other tenant
  auto found = this->store_->FindJobByRequestId(store::RequestKey("team-b", "req-1"));
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->job.name(), "jobs/b");
  EXPECT_FALSE(this->store_->FindJobByRequestId("req-1")->has_value());
  // Updates keep the key as the user gave it.
  b.set_state(v1::CANCELLED);
  ASSERT_TRUE(this->store_->UpdateJob(b, std::nullopt).ok());
  auto stored = this->store_->GetJob("jobs/b");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->job.request_id(), "req-1");
  EXPECT_EQ(stored->job.tenant(), "team-b");
}

TYPED_TEST(JobStoreConformanceTest, EmptyRequestIdsNeverCollide) {
  this->Create("a");
  this->Create("b");
  EXPECT_EQ(this->CountAll(), 2);
  auto found = this->store_->FindJobByRequestId("");
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
}

TYPED_TEST(JobStoreConformanceTest, ListPagesInOrderWithStateFilter) {
  // j0..j6, RUNNING at even indices.
  std::vector<std::string> all, running;
  for (int i = 0; i < 7; ++i) {
    const std::string id = "j" + std::to_string(i);
    const v1::JobState state = i % 2 == 0 ? v1::RUNNING : v1::QUEUED;
    this->Create(id, state);
    all.push_back("jobs/" + id);
    if (state == v1::RUNNING) running.push_back("jobs/" + id);
  }

  auto collect = [&](std::optional<v1::JobState> state, int limit, int* pages) {
    std::vector<std::string> names;
    int64_t after = 0;
    *pages = 0;
    while (true) {
      auto page = this->store_->ListJobs(state, after, limit);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      ++*pages;
      EXPECT_LE(static_cast<int>(page->jobs.size()), limit);
      for (const StoredJob& job : page->jobs) {
        EXPECT_GT(job.sequence, after) << "ascending sequence";
        after = job.sequence;
        names.push_back(job.job.name());
        if (state.has_value()) {
          EXPECT_EQ(job.job.state(), *state);
        }
      }
      if (!page->has_more) break;
      EXPECT_EQ(static_cast<int>(page->jobs.size()), limit) << "only the last page is short";
    }
    return names;
  };
  int pages = 0;
  EXPECT_EQ(collect(std::nullopt, 2, &pages), all);
  EXPECT_EQ(pages, 4);
  EXPECT_EQ(collect(std::nullopt, 7, &pages), all);
  EXPECT_EQ(pages, 1) << "a page that ends exactly at the last job has has_more == false";
  EXPECT_EQ(collect(v1::RUNNING, 3, &pages), running);
  EXPECT_EQ(pages, 2);
  EXPECT_TRUE(collect(v1::CANCELLED, 5, &pages).empty());

  auto bad = this->store_->ListJobs(std::nullopt, 0, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("limit"));
}

TYPED_TEST(JobStoreConformanceTest, PagingNeitherSkipsNorRepeatsWhileAnotherThreadInserts) {
  constexpr int kBefore = 40;
  constexpr int kDuring = 160;
  for (int i = 0; i < kBefore; ++i) this->Create("before-" + std::to_string(i));

  std::atomic<bool> failed{false};
  std::thread writer([&] {
    for (int i = 0; i < kDuring; ++i) {
      auto sequence =
          this->store_->CreateJob(MakeJob("during-" + std::to_string(i)),
                                  MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created"));
      if (!sequence.ok()) failed = true;
    }
  });

  std::vector<std::string> seen;
  int64_t after = 0;
  auto page_through = [&] {
    while (true) {
      auto page = this->store_->ListJobs(std::nullopt, after, 7);
      ASSERT_TRUE(page.ok()) << page.status();
      for (const StoredJob& job : page->jobs) {
        ASSERT_GT(job.sequence, after);
        after = job.sequence;
        seen.push_back(job.job.name());
      }
      if (!page->has_more) break;
    }
  };
  page_through();  // races the writer
  writer.join();
  page_through();  // picks up whatever the writer added after the reader caught up
  ASSERT_FALSE(failed);

  const std::set<std::string> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), seen.size()) << "a job was listed twice";
  EXPECT_EQ(seen.size(), static_cast<size_t>(kBefore + kDuring)) << "a job was skipped";
  // Insertion order is kept: "during-i" appear in i order.
  std::vector<std::string> during;
  for (const std::string& name : seen) {
    if (name.rfind("jobs/during-", 0) == 0) during.push_back(name);
  }
  for (int i = 0; i < static_cast<int>(during.size()); ++i) {
    EXPECT_EQ(during[i], "jobs/during-" + std::to_string(i));
  }
}

TYPED_TEST(JobStoreConformanceTest, UpdateReplacesTheJobAndAppendsTheEvent) {
  this->Create("a", v1::QUEUED, "req-1");
  auto stored = this->store_->GetJob("jobs/a");
  ASSERT_TRUE(stored.ok());
  v1::Job job = stored->job;
  job.set_state(v1::RUNNING);
  job.set_state_reason("every rank started");
  job.set_generation(1);
  job.set_request_id("req-other");  // ignored: the idempotency key is fixed at creation
  *job.add_events() = MakeEvent(v1::QUEUED, v1::QUEUED, "must not be stored in the job");
  v1::JobEvent event = MakeEvent(v1::QUEUED, v1::RUNNING, "every rank started");
  event.set_sequence(99);  // ignored: the store assigns sequences
  ASSERT_TRUE(this->store_->UpdateJob(job, event).ok());

  auto updated = this->store_->GetJob("jobs/a");
  ASSERT_TRUE(updated.ok());
  EXPECT_EQ(updated->sequence, stored->sequence) << "an update keeps the list position";
  EXPECT_EQ(updated->job.state(), v1::RUNNING);
  EXPECT_EQ(updated->job.generation(), 1);
  EXPECT_EQ(updated->job.request_id(), "req-1");
  EXPECT_EQ(updated->job.events_size(), 0);
  EXPECT_TRUE(this->store_->FindJobByRequestId("req-1")->has_value());
  EXPECT_FALSE(this->store_->FindJobByRequestId("req-other")->has_value());

  // An update without an event leaves the log alone.
  job.mutable_progress()->set_step(5);
  ASSERT_TRUE(this->store_->UpdateJob(job, std::nullopt).ok());
  EXPECT_EQ(this->store_->GetJob("jobs/a")->job.progress().step(), 5);

  auto events = this->store_->ListEvents("jobs/a");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].sequence(), 2);
  EXPECT_EQ((*events)[1].reason(), "every rank started");

  // The state filter follows the update.
  EXPECT_EQ(this->store_->ListJobs(v1::QUEUED, 0, 10)->jobs.size(), 0u);
  EXPECT_EQ(this->store_->ListJobs(v1::RUNNING, 0, 10)->jobs.size(), 1u);
}

// A reader that reads the job and then its log must never see an update without its event:
// each update sets progress.step = i and appends event i, so the log always holds at least
// step + 1 events (the creation event plus one per update).
TYPED_TEST(JobStoreConformanceTest, UpdateAndEventAppearTogether) {
  constexpr int kUpdates = 150;
  this->Create("a");
  std::atomic<bool> done{false};
  std::thread writer([&] {
    v1::Job job = MakeJob("a");
    for (int i = 1; i <= kUpdates; ++i) {
      job.mutable_progress()->set_step(i);
      EXPECT_TRUE(
          this->store_->UpdateJob(job, MakeEvent(v1::QUEUED, v1::QUEUED, std::to_string(i))).ok());
    }
    done = true;
  });
  int checks = 0;
  while (!done || checks == 0) {
    auto job = this->store_->GetJob("jobs/a");
    auto events = this->store_->ListEvents("jobs/a");
    ASSERT_TRUE(job.ok() && events.ok());
    ASSERT_GE(static_cast<int64_t>(events->size()), job->job.progress().step() + 1);
    ++checks;
  }
  writer.join();
  auto events = this->store_->ListEvents("jobs/a");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), static_cast<size_t>(kUpdates + 1));
}

TYPED_TEST(JobStoreConformanceTest, EventsAreOrderedPerJobWithStoreAssignedSequences) {
  this->Create("a");
  this->Create("b");
  const std::vector<std::pair<std::string, std::string>> appends = {
      {"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"a", "a3"}, {"b", "b2"}};
  for (const auto& [id, reason] : appends) {
    ASSERT_TRUE(
        this->store_->UpdateJob(MakeJob(id), MakeEvent(v1::QUEUED, v1::QUEUED, reason)).ok());
  }
  auto reasons = [&](const std::string& name) {
    std::vector<std::string> out;
    auto events = this->store_->ListEvents(name);
    EXPECT_TRUE(events.ok());
    for (int i = 0; events.ok() && i < static_cast<int>(events->size()); ++i) {
      EXPECT_EQ((*events)[i].sequence(), i + 1);
      out.push_back((*events)[i].reason());
    }
    return out;
  };
  EXPECT_THAT(reasons("jobs/a"), ElementsAre("created", "a1", "a2", "a3"));
  EXPECT_THAT(reasons("jobs/b"), ElementsAre("created", "b1", "b2"));
}

TYPED_TEST(JobStoreConformanceTest, ListActiveJobsReturnsEveryNonTerminalJobInOrder) {
  const std::vector<std::pair<std::string, v1::JobState>> jobs = {
      {"restarting", v1::RESTARTING}, {"succeeded", v1::SUCCEEDED}, {"queued", v1::QUEUED},
      {"failed", v1::FAILED},         {"running", v1::RUNNING},     {"cancelled", v1::CANCELLED},
      {"scheduled", v1::SCHEDULED}};
  for (const auto& [id, state] : jobs) this->Create(id, state);
  auto active = this->store_->ListActiveJobs();
  ASSERT_TRUE(active.ok()) << active.status();
  EXPECT_THAT(this->Names(*active),
              ElementsAre("jobs/restarting", "jobs/queued", "jobs/running", "jobs/scheduled"));

  // A job that reaches a terminal state leaves the active set.
  v1::Job running = MakeJob("running", v1::SUCCEEDED);
  ASSERT_TRUE(this->store_->UpdateJob(running, std::nullopt).ok());
  EXPECT_THAT(this->Names(*this->store_->ListActiveJobs()),
              ElementsAre("jobs/restarting", "jobs/queued", "jobs/scheduled"));
}

TYPED_TEST(JobStoreConformanceTest, NodesAreDeletedByName) {
  ASSERT_TRUE(this->store_->PutNode(MakeNode("a", 1)).ok());
  ASSERT_TRUE(this->store_->PutNode(MakeNode("b", 2)).ok());
  ASSERT_TRUE(this->store_->DeleteNode("nodes/a").ok());
  EXPECT_EQ(this->store_->DeleteNode("nodes/a").code(), absl::StatusCode::kNotFound);
  auto nodes = this->store_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_THAT((*nodes)[0], EqualsProto(MakeNode("b", 2)));
}

TYPED_TEST(JobStoreConformanceTest, NodesArePutAndListedByName) {
  ASSERT_TRUE(this->store_->PutNode(MakeNode("b", 2)).ok());
  ASSERT_TRUE(this->store_->PutNode(MakeNode("a", 4)).ok());
  ASSERT_TRUE(this->store_->PutNode(MakeNode("b", 3, v1::NODE_STATE_LOST)).ok());  // replaces
  auto nodes = this->store_->ListNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_THAT((*nodes)[0], EqualsProto(MakeNode("a", 4)));
  EXPECT_THAT((*nodes)[1], EqualsProto(MakeNode("b", 3, v1::NODE_STATE_LOST)));
}

TYPED_TEST(JobStoreConformanceTest, ConcurrentCreatorsGetDistinctSequences) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 40;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> sequences(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto sequence =
            this->store_->CreateJob(MakeJob("t" + std::to_string(t) + "-" + std::to_string(i)),
                                    MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created"));
        EXPECT_TRUE(sequence.ok()) << sequence.status();
        if (sequence.ok()) sequences[t].push_back(*sequence);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<int64_t> all;
  for (const auto& per_thread : sequences) {
    EXPECT_TRUE(std::is_sorted(per_thread.begin(), per_thread.end()));
    all.insert(per_thread.begin(), per_thread.end());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(this->CountAll(), kThreads * kPerThread);
}

TYPED_TEST(JobStoreConformanceTest, RacingRetriesOfOneRequestCreateOneJob) {
  constexpr int kThreads = 6;
  std::atomic<int> created{0}, already_exists{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto sequence =
          this->store_->CreateJob(MakeJob("retry-" + std::to_string(t), v1::QUEUED, "same-request"),
                                  MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created"));
      if (sequence.ok()) ++created;
      if (sequence.status().code() == absl::StatusCode::kAlreadyExists) ++already_exists;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(created, 1);
  EXPECT_EQ(already_exists, kThreads - 1);
  EXPECT_EQ(this->CountAll(), 1);
}

}  // namespace
}  // namespace loom::store

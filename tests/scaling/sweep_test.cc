// The scaling sweep's pure parts (server/scaling/sweep.h): the request's checks, the copy's spec
// at each size, and the state machine from tables; then the two ScaleTestStores on one contract.
#include "server/scaling/sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "server/scaling/scale_test_store.h"
#include "server/store/job_store.h"
#include "tests/server/store_test_util.h"

namespace loom::scaling {
namespace {

using ::testing::HasSubstr;

google::protobuf::RepeatedField<int32_t> Sizes(std::initializer_list<int> sizes) {
  google::protobuf::RepeatedField<int32_t> out;
  for (int s : sizes) out.Add(s);
  return out;
}

TEST(CheckDevices, AcceptsIncreasingSizesWithinTheCluster) {
  EXPECT_TRUE(CheckDevices(Sizes({1, 2, 4}), 4, "CPU devices").ok());
  EXPECT_TRUE(CheckDevices(Sizes({3}), 4, "CPU devices").ok());
}

TEST(CheckDevices, RefusesEachBadListNamingTheFieldAndTheFix) {
  struct Case {
    std::initializer_list<int> sizes;
    const char* message;
  };
  const Case cases[] = {
      {{}, "devices is required"},
      {{1, 2, 3, 4, 5, 6, 7, 8, 9}, "at most 8"},
      {{0, 1}, "devices[0] is 0"},
      {{1, -2}, "devices[1] is -2"},
      {{2, 2}, "strictly increasing"},
      {{4, 2}, "devices[1] is 2 after 4"},
      {{1, 2, 8}, "devices[2] is 8 but the cluster has 4 CPU devices"},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckDevices(Sizes(c.sizes), 4, "CPU devices");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

TEST(CheckSteps, DefaultOrBounded) {
  EXPECT_TRUE(CheckSteps(0).ok());
  EXPECT_TRUE(CheckSteps(4).ok());
  EXPECT_THAT(CheckSteps(3).message(), HasSubstr("steps is 3"));
  EXPECT_FALSE(CheckSteps(-1).ok());
  EXPECT_FALSE(CheckSteps(10001).ok());
  EXPECT_EQ(WarmupSteps(8), 2);
  EXPECT_EQ(WarmupSteps(20), 5);
}

v1::JobSpec Base() {
  v1::JobSpec spec;
  spec.set_name("demo");
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_train()->set_steps(5000);
  spec.mutable_train()->set_eval_every(100);
  spec.mutable_resources()->set_cpu_devices(8);
  spec.mutable_restart()->set_max_restarts(3);
  spec.mutable_checkpoint()->set_every_steps(100);
  spec.mutable_rebalance()->set_mode("auto");
  return spec;
}

TEST(SpecForSize, AutoStaysAutoAtEachSizeAndTheCopyIsShortAndFixed) {
  v1::JobSpec base = Base();
  base.mutable_parallelism()->mutable_auto_();
  absl::StatusOr<v1::JobSpec> s = SpecForSize(base, 2, 20, 4096);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->parallelism().has_auto_());
  EXPECT_EQ(s->resources().cpu_devices(), 2);
  EXPECT_EQ(s->train().steps(), 20);
  EXPECT_EQ(s->train().global_batch_tokens(), 4096);
  EXPECT_EQ(s->train().eval_every(), 0);
  EXPECT_EQ(s->restart().max_restarts(), 0);
  EXPECT_EQ(s->checkpoint().every_steps(), 0);
  EXPECT_EQ(s->rebalance().mode(), "off");
  EXPECT_EQ(s->name(), "demo-scale-2");
}

TEST(SpecForSize, ExplicitKeepsTensorTimesPipelineAndScalesData) {
  v1::JobSpec base = Base();
  base.mutable_parallelism()->set_data(4);
  base.mutable_parallelism()->set_pipeline(2);
  base.mutable_parallelism()->set_micro_batch(2);
  absl::StatusOr<v1::JobSpec> s = SpecForSize(base, 6, 20, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->parallelism().data(), 3);
  EXPECT_EQ(s->parallelism().tensor(), 1);
  EXPECT_EQ(s->parallelism().pipeline(), 2);
  EXPECT_EQ(s->parallelism().micro_batch(), 2);
  const absl::StatusOr<v1::JobSpec> odd = SpecForSize(base, 3, 20, 0);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(), HasSubstr("3 devices cannot run"));
  EXPECT_THAT(odd.status().message(), HasSubstr("multiples of 2"));
}

TEST(SpecForSize, GpuJobsStayOnGpusAndLongNamesAreCut) {
  v1::JobSpec base = Base();
  base.mutable_resources()->set_cpu_devices(0);
  base.mutable_resources()->set_gpus(8);
  base.set_name(std::string(63, 'a'));
  absl::StatusOr<v1::JobSpec> s = SpecForSize(base, 4, 20, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->resources().gpus(), 4);
  EXPECT_EQ(s->resources().cpu_devices(), 0);
  EXPECT_EQ(s->name().size(), 63u);
  EXPECT_THAT(s->name(), ::testing::EndsWith("-scale-4"));
}

v1::ScaleTest Sweep(std::initializer_list<int> sizes) {
  v1::ScaleTest t;
  t.set_name("scaletests/s1");
  t.set_state(v1::SCALE_TEST_RUNNING);
  for (int d : sizes) t.add_points()->set_devices(d);
  return t;
}

TEST(NextAction, TheStateMachineFromATable) {
  v1::ScaleTest fresh = Sweep({1, 2});
  v1::ScaleTest waiting = fresh;
  waiting.mutable_points(0)->set_job("jobs/a");
  v1::ScaleTest second = waiting;
  second.mutable_points(0)->set_measured(true);
  v1::ScaleTest second_running = second;
  second_running.mutable_points(1)->set_job("jobs/b");
  v1::ScaleTest done = second_running;
  done.mutable_points(1)->set_measured(true);
  v1::ScaleTest cancelled = second_running;
  cancelled.set_state(v1::SCALE_TEST_CANCELLED);

  struct Case {
    const char* name;
    const v1::ScaleTest* sweep;
    std::optional<CopyView> copy;
    ActionKind kind;
    int index;
  };
  const Case cases[] = {
      {"no copy yet: create the first", &fresh, std::nullopt, ActionKind::kCreateCopy, 0},
      {"copy unreadable: wait", &waiting, std::nullopt, ActionKind::kWait, 0},
      {"copy queued: wait", &waiting, CopyView{v1::QUEUED, ""}, ActionKind::kWait, 0},
      {"copy running: wait", &waiting, CopyView{v1::RUNNING, ""}, ActionKind::kWait, 0},
      {"copy restarting: wait", &waiting, CopyView{v1::RESTARTING, ""}, ActionKind::kWait, 0},
      {"copy succeeded: measure", &waiting, CopyView{v1::SUCCEEDED, ""}, ActionKind::kMeasure, 0},
      {"copy failed: fail", &waiting, CopyView{v1::FAILED, "boom"}, ActionKind::kFail, 0},
      {"copy cancelled: fail", &waiting, CopyView{v1::CANCELLED, "x"}, ActionKind::kFail, 0},
      {"first measured: create the second (never two at once)", &second, std::nullopt,
       ActionKind::kCreateCopy, 1},
      {"second running", &second_running, CopyView{v1::RUNNING, ""}, ActionKind::kWait, 1},
      {"all measured: finish", &done, std::nullopt, ActionKind::kFinish, -1},
      {"ended: nothing", &cancelled, CopyView{v1::RUNNING, ""}, ActionKind::kNone, -1},
  };
  for (const Case& c : cases) {
    const Action a = NextAction(*c.sweep, c.copy);
    EXPECT_EQ(a.kind, c.kind) << c.name;
    EXPECT_EQ(a.index, c.index) << c.name;
  }
  const Action failed = NextAction(waiting, CopyView{v1::FAILED, "rank 0 exited 1"});
  EXPECT_THAT(failed.reason, HasSubstr("the copy at 1 devices (jobs/a) ended FAILED"));
  EXPECT_THAT(failed.reason, HasSubstr("rank 0 exited 1"));
}

// ---- The stores, one contract ----

class StoreTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      absl::StatusOr<std::unique_ptr<store::JobStore>> jobs =
          store::OpenSqliteJobStore(dir_.File("loomd.db"));
      ASSERT_TRUE(jobs.ok()) << jobs.status();
      jobs_ = *std::move(jobs);
      absl::StatusOr<std::unique_ptr<ScaleTestStore>> s =
          OpenSqliteScaleTestStore(dir_.File("loomd.db"));
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = *std::move(s);
    } else {
      store_ = NewMemoryScaleTestStore();
    }
  }
  v1::ScaleTest Make(const std::string& id, const std::string& tenant) {
    v1::ScaleTest t = Sweep({1, 2});
    t.set_name("scaletests/" + id);
    t.set_tenant(tenant);
    return t;
  }
  store::testing::TempDir dir_;
  std::unique_ptr<store::JobStore> jobs_;
  std::unique_ptr<ScaleTestStore> store_;
};

TEST_P(StoreTest, CreateGetUpdateListAndRunning) {
  ASSERT_TRUE(store_->Create(Make("a", "t1"), "t1/req").ok());
  ASSERT_TRUE(store_->Create(Make("b", "t2"), "").ok());
  ASSERT_TRUE(store_->Create(Make("c", "t1"), "").ok());
  EXPECT_EQ(store_->Create(Make("a", "t1"), "").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Create(Make("d", "t1"), "t1/req").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(store_->Create(Make("e", "t1"), "").ok());

  absl::StatusOr<std::optional<StoredScaleTest>> by_key = store_->FindByRequestKey("t1/req");
  ASSERT_TRUE(by_key.ok() && by_key->has_value());
  EXPECT_EQ((*by_key)->test.name(), "scaletests/a");

  v1::ScaleTest a = Make("a", "t1");
  a.set_state(v1::SCALE_TEST_SUCCEEDED);
  a.mutable_points(0)->set_efficiency(1);
  ASSERT_TRUE(store_->Update(a).ok());
  absl::StatusOr<StoredScaleTest> got = store_->Get("scaletests/a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->test.state(), v1::SCALE_TEST_SUCCEEDED);
  EXPECT_EQ(store_->Get("scaletests/zz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Update(Make("zz", "t1")).code(), absl::StatusCode::kNotFound);

  absl::StatusOr<ScaleTestPage> page = store_->List(0, 2, std::string("t1"));
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->tests.size(), 2u);
  EXPECT_EQ(page->tests[0].test.name(), "scaletests/a");
  EXPECT_EQ(page->tests[1].test.name(), "scaletests/c");
  EXPECT_TRUE(page->has_more);
  page = store_->List(page->tests[1].sequence, 2, std::string("t1"));
  ASSERT_EQ(page->tests.size(), 1u);
  EXPECT_EQ(page->tests[0].test.name(), "scaletests/e");
  EXPECT_FALSE(page->has_more);

  absl::StatusOr<std::vector<StoredScaleTest>> running = store_->ListRunning();
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->size(), 3u);  // b, c, e: a has ended
}

INSTANTIATE_TEST_SUITE_P(Both, StoreTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Sqlite" : "Memory"; });

TEST(SqliteScaleTestStore, RefusesAFileThatIsNotALoomDatabase) {
  store::testing::TempDir dir;
  const absl::StatusOr<std::unique_ptr<ScaleTestStore>> s =
      OpenSqliteScaleTestStore(dir.File("missing.db"));
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace loom::scaling

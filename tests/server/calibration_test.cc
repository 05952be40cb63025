// Calibration (server/calibration): the pure update from tables, and the store's contract on
// both implementations, with the SQLite one's round-trip across a reopen and its upgrade of a
// database written before calibration existed.
#include "server/calibration/calibration.h"

#include <sqlite3.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/calibration/calibration_store.h"
#include "server/calibration/calibrator.h"
#include "server/store/job_store.h"
#include "tests/server/store_test_util.h"

namespace loom::calibration {
namespace {

v1::PlanPhases Phases(double forward, double backward, double optimizer, double comm,
                      double bubble = 0) {
  v1::PlanPhases p;
  p.set_forward(forward);
  p.set_backward(backward);
  p.set_optimizer(optimizer);
  p.set_comm_exposed(comm);
  p.set_bubble(bubble);
  return p;
}

v1::PlanCheck Check(const v1::PlanPhases& predicted, double measured_step,
                    const v1::PlanPhases& measured, int steps = 8) {
  v1::PlanCheck c;
  c.set_predicted_step_seconds(predicted.forward() + predicted.backward() + predicted.optimizer() +
                               predicted.comm_exposed() + predicted.bubble());
  c.set_measured_step_seconds(measured_step);
  c.set_measured_steps(steps);
  *c.mutable_predicted_phases() = predicted;
  *c.mutable_measured_phases() = measured;
  return c;
}

v1::PlanCalibration Planned(const std::string& model, double compute, double comm, int jobs = 1) {
  v1::PlanCalibration c;
  c.set_device_model(model);
  c.set_jobs(jobs);
  c.set_compute_scale(compute);
  c.set_comm_jobs(comm != 1 ? 1 : 0);
  c.set_comm_scale(comm);
  return c;
}

// ---- The pure update --------------------------------------------------------------------------

struct RatioCase {
  const char* name;
  v1::PlanCheck check;
  v1::PlanCalibration planned_with;
  std::optional<double> compute;  // nullopt: the job teaches nothing
  std::optional<double> comm;
  std::optional<double> optimizer;
};

TEST(CalibrationTest, RatiosFromTable) {
  const CalibrationPolicy policy;
  const v1::PlanPhases none;
  const std::nullopt_t no = std::nullopt;
  const std::vector<RatioCase> cases = {
      // CPU, dp = 1, by phase: the optimizer 0.005 against 0.002; the rest of the step, 0.032,
      // against forward + backward 0.003.
      {"cpu by phase", Check(Phases(0.001, 0.002, 0.002, 0), 0.037, Phases(0.01, 0.02, 0.005, 0)),
       Planned("cpu", 1, 1, 0), 0.032 / 0.003, no, 2.5},
      // Without measured phases the whole step is compute: 0.037 over 0.005.
      {"no measured phases", Check(Phases(0.001, 0.002, 0.002, 0), 0.037, none),
       Planned("cpu", 1, 1, 0), 7.4, no, no},
      // Planned with compute ×2 already (the optimizer too: none learnt): the catalog predicted
      // half; an optimizer phase too small to measure counts as compute.
      {"planned calibrated", Check(Phases(0.002, 0.004, 0.004, 0), 0.05, Phases(0, 0.03, 0, 0)),
       Planned("cpu", 2, 1), 10.0, no, no},
      // Planned with a learnt optimizer scale of 4: the catalog's optimizer was 0.001.
      {"planned optimizer scale",
       [] {
         v1::PlanCheck c =
             Check(Phases(0.002, 0.004, 0.004, 0), 0.05, Phases(0.01, 0.03, 0.006, 0));
         return c;
       }(),
       [] {
         v1::PlanCalibration c = Planned("cpu", 2, 1);
         c.set_optimizer_jobs(1);
         c.set_optimizer_scale(4);
         return c;
       }(),
       0.044 / 0.003, no, 6.0},
      // Communication measured beside compute: (1.2 − 0.3 − 0.1) / 0.5, 0.3 / 0.1, 0.1 / 0.1.
      {"gpu with comm", Check(Phases(0.2, 0.3, 0.1, 0.1), 1.2, Phases(0.3, 0.5, 0.1, 0.3)),
       Planned("H100-SXM", 1, 1, 0), 1.6, 3.0, 1.0},
      // Planned with comm ×2: the catalog's communication was 0.05.
      {"planned comm scale", Check(Phases(0.2, 0.3, 0.1, 0.1), 1.2, Phases(0.3, 0.5, 0.1, 0.3)),
       Planned("H100-SXM", 1, 2), 1.6, 6.0, 1.0},
      // Without measured phases, the predicted comm stands in and only compute is learnt.
      {"comm unmeasured", Check(Phases(0.2, 0.3, 0.1, 0.1), 1.3, none),
       Planned("H100-SXM", 1, 1, 0), 2.0, no, no},
      // Comm too small to measure: no comm ratio.
      {"comm noise", Check(Phases(0.2, 0.3, 0.1, 1e-6), 0.6, Phases(0.2, 0.3, 0.1, 1e-6)),
       Planned("H100-SXM", 1, 1, 0), (0.5 - 1e-6) / 0.5, no, 1.0},
      // Clamped to the policy's range.
      {"hung job", Check(Phases(0.001, 0.002, 0.002, 0), 1000, none), Planned("cpu", 1, 1, 0),
       policy.max_scale, no, no},
      {"too fast", Check(Phases(1, 1, 1, 0), 1e-6, none), Planned("cpu", 1, 1, 0), policy.min_scale,
       no, no},
      // Teaches nothing: too few measured steps, nothing measured, nothing predicted, NaN.
      {"two steps", Check(Phases(1, 1, 1, 0), 3, none, 2), Planned("cpu", 1, 1, 0), no, no, no},
      {"zero measured", Check(Phases(1, 1, 1, 0), 0, none), Planned("cpu", 1, 1, 0), no, no, no},
      {"nothing predicted", Check(none, 3, none), Planned("cpu", 1, 1, 0), no, no, no},
      {"nan", Check(Phases(1, 1, 1, 0), std::nan(""), none), Planned("cpu", 1, 1, 0), no, no, no},
  };
  for (const RatioCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::optional<JobRatios> r = RatiosOf(c.check, c.planned_with, policy);
    ASSERT_EQ(r.has_value(), c.compute.has_value());
    if (!r.has_value()) continue;
    EXPECT_NEAR(r->compute, *c.compute, 1e-9 * *c.compute);
    ASSERT_EQ(r->comm.has_value(), c.comm.has_value());
    if (c.comm.has_value()) {
      EXPECT_NEAR(*r->comm, *c.comm, 1e-9 * *c.comm);
    }
    ASSERT_EQ(r->optimizer.has_value(), c.optimizer.has_value());
    if (c.optimizer.has_value()) {
      EXPECT_NEAR(*r->optimizer, *c.optimizer, 1e-9 * *c.optimizer);
    }
  }
}

TEST(CalibrationTest, FoldIsAnExponentiallyWeightedGeometricMean) {
  CalibrationPolicy policy;
  policy.weight = 0.5;
  v1::PlanCalibration c;
  c.set_device_model("cpu");
  // The first job sets the scale; comm untouched without a comm ratio.
  c = Fold(c, JobRatios{8.0, std::nullopt, std::nullopt}, policy);
  EXPECT_EQ(c.device_model(), "cpu");
  EXPECT_EQ(c.jobs(), 1);
  EXPECT_DOUBLE_EQ(c.compute_scale(), 8.0);
  EXPECT_EQ(c.comm_jobs(), 0);
  EXPECT_DOUBLE_EQ(c.comm_scale(), 1.0);
  // Then halfway in log space: sqrt(8 · 2) = 4.
  c = Fold(c, JobRatios{2.0, 3.0, 5.0}, policy);
  EXPECT_EQ(c.jobs(), 2);
  EXPECT_NEAR(c.compute_scale(), 4.0, 1e-12);
  EXPECT_EQ(c.comm_jobs(), 1);
  EXPECT_DOUBLE_EQ(c.comm_scale(), 3.0);
  EXPECT_EQ(c.optimizer_jobs(), 1);
  EXPECT_DOUBLE_EQ(c.optimizer_scale(), 5.0);
  c = Fold(c, JobRatios{4.0, std::nullopt, 20.0}, policy);
  EXPECT_NEAR(c.compute_scale(), 4.0, 1e-12);
  EXPECT_NEAR(c.optimizer_scale(), 10.0, 1e-12);  // sqrt(5 · 20)
  EXPECT_EQ(c.optimizer_jobs(), 2);
  EXPECT_EQ(c.comm_jobs(), 1);
  // A weight of 0.25: 4^0.75 · 16^0.25 = 4·√2 (the compute scale is 4 after the third job).
  policy.weight = 0.25;
  c = Fold(c, JobRatios{16.0, std::nullopt, std::nullopt}, policy);
  EXPECT_NEAR(c.compute_scale(), 4.0 * std::sqrt(2.0), 1e-12);
  EXPECT_DOUBLE_EQ(c.comm_scale(), 3.0);
  // Repeated identical jobs converge to their ratio, and never leave the clamp.
  for (int i = 0; i < 80; ++i) {
    c = Fold(c, JobRatios{1000.0, 1e-9, std::nullopt}, policy);
    ASSERT_LE(c.compute_scale(), policy.max_scale);
    ASSERT_GE(c.comm_scale(), policy.min_scale);
  }
  EXPECT_NEAR(c.compute_scale(), policy.max_scale, 1e-6 * policy.max_scale);
  EXPECT_NEAR(c.comm_scale(), policy.min_scale, 1e-6 * policy.min_scale);
  EXPECT_EQ(c.jobs(), 84);
}

TEST(CalibrationTest, ApplicableOnlyAfterMinJobs) {
  CalibrationPolicy policy;
  policy.min_jobs = 2;
  v1::PlanCalibration stored = Planned("cpu", 7.0, 1.0, 1);
  v1::PlanCalibration c = Applicable("cpu", stored, policy);
  EXPECT_EQ(c.device_model(), "cpu");
  EXPECT_EQ(c.jobs(), 0);
  EXPECT_DOUBLE_EQ(c.compute_scale(), 1.0);
  stored.set_jobs(2);
  c = Applicable("cpu", stored, policy);
  EXPECT_EQ(c.jobs(), 2);
  EXPECT_DOUBLE_EQ(c.compute_scale(), 7.0);
  EXPECT_DOUBLE_EQ(Applicable("cpu", std::nullopt, policy).compute_scale(), 1.0);
}

// ---- The store, both implementations -----------------------------------------------------------

enum class Kind { kMemory, kSqlite };

class CalibrationStoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kMemory) {
      store_ = NewMemoryCalibrationStore();
      return;
    }
    Reopen();
  }
  void Reopen() {
    store_.reset();
    jobs_.reset();
    auto jobs = store::OpenSqliteJobStore(dir_.File("loomd.db"));
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    jobs_ = std::move(*jobs);
    auto store = OpenSqliteCalibrationStore(dir_.File("loomd.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  CalibrationRecord Record(const std::string& job, const std::string& model, double measured) {
    CalibrationRecord r;
    r.job = job;
    r.planned_with = Planned(model, 1.0, 1.0, 0);
    r.check = Check(Phases(0.001, 0.002, 0.002, 0), measured, Phases(0.01, 0.02, 0.005, 0));
    r.time = absl::FromUnixMillis(1'700'000'000'123);
    return r;
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::JobStore> jobs_;
  std::unique_ptr<CalibrationStore> store_;
};

TEST_P(CalibrationStoreTest, RecordsOnceAndRoundTrips) {
  v1::PlanCalibration cpu = Planned("cpu", 7.4, 1.0, 1);
  ASSERT_EQ(store_->Record(Record("jobs/a", "cpu", 0.037), cpu).value_or(false), true);
  v1::PlanCalibration gpu = Planned("H100-SXM", 1.25, 0.5, 1);
  ASSERT_TRUE(store_->Record(Record("jobs/b", "H100-SXM", 1.0), gpu).ok());
  // A job is learnt from once: the second record of jobs/a changes nothing.
  v1::PlanCalibration other = Planned("cpu", 99.0, 1.0, 2);
  absl::StatusOr<bool> again = store_->Record(Record("jobs/a", "cpu", 5.0), other);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  ASSERT_TRUE(store_->Record(Record("jobs/c", "cpu", 0.04), Planned("cpu", 7.5, 1.0, 2)).ok());

  if (GetParam() == Kind::kSqlite) Reopen();  // survives a restart of loomd
  absl::StatusOr<std::vector<v1::PlanCalibration>> all = store_->ListCalibrations();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  const v1::PlanCalibration& h100 = (*all)[0].device_model() == "H100-SXM" ? (*all)[0] : (*all)[1];
  const v1::PlanCalibration& c = (*all)[0].device_model() == "cpu" ? (*all)[0] : (*all)[1];
  EXPECT_EQ(c.jobs(), 2);
  EXPECT_EQ(c.compute_scale(), 7.5);  // exact: the blob keeps the double's bits
  EXPECT_EQ(h100.compute_scale(), 1.25);
  EXPECT_EQ(h100.comm_scale(), 0.5);

  absl::StatusOr<std::vector<CalibrationRecord>> records = store_->ListRecords("cpu");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].job, "jobs/a");
  EXPECT_EQ((*records)[0].check.measured_step_seconds(), 0.037);  // the first record stays
  EXPECT_EQ((*records)[0].time, absl::FromUnixMillis(1'700'000'000'123));
  EXPECT_EQ((*records)[0].planned_with.device_model(), "cpu");
  EXPECT_EQ((*records)[1].job, "jobs/c");
  EXPECT_EQ(store_->ListRecords("A100-40GB")->size(), 0u);
}

TEST_P(CalibrationStoreTest, RefusesRecordsWithoutJobOrModel) {
  v1::PlanCalibration cpu = Planned("cpu", 2.0, 1.0);
  EXPECT_EQ(store_->Record(Record("", "cpu", 1), cpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Record(Record("jobs/x", "", 1), Planned("", 2.0, 1.0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Record(Record("jobs/x", "H200", 1), cpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->ListCalibrations()->empty());
}

INSTANTIATE_TEST_SUITE_P(Both, CalibrationStoreTest,
                         ::testing::Values(Kind::kMemory, Kind::kSqlite),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kMemory ? "Memory" : "Sqlite";
                         });

std::string Query(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string value;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

TEST(SqliteCalibrationStoreTest, AnExistingDatabaseGainsTheTablesAndKeepsItsJobs) {
  store::testing::TempDir dir;
  const std::string path = dir.File("loomd.db");
  {
    // A database as a loomd before calibration left it: the job store's tables only.
    auto jobs = store::OpenSqliteJobStore(path);
    ASSERT_TRUE(jobs.ok());
    v1::Job job = store::testing::MakeJob("old");
    ASSERT_TRUE((*jobs)
                    ->CreateJob(job, store::testing::MakeEvent(v1::JOB_STATE_UNSPECIFIED,
                                                               v1::QUEUED, "created"))
                    .ok());
  }
  EXPECT_EQ(Query(path, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'calibration%'"), "0");
  const std::string version = Query(path, "PRAGMA user_version");
  {
    auto jobs = store::OpenSqliteJobStore(path);
    ASSERT_TRUE(jobs.ok());
    auto store = OpenSqliteCalibrationStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->ListCalibrations()->empty());
    CalibrationRecord r;
    r.job = "jobs/old";
    r.planned_with = Planned("cpu", 1, 1, 0);
    ASSERT_TRUE((*store)->Record(r, Planned("cpu", 3, 1)).ok());
    EXPECT_TRUE((*jobs)->GetJob("jobs/old").ok());
  }
  EXPECT_EQ(Query(path, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'calibration%'"), "3");
  // The job store's schema version is untouched: the file opens as before, twice over.
  EXPECT_EQ(Query(path, "PRAGMA user_version"), version);
  auto jobs = store::OpenSqliteJobStore(path);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE((*jobs)->GetJob("jobs/old").ok());
  auto store = OpenSqliteCalibrationStore(path);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->ListCalibrations()->size(), 1u);
}

TEST(SqliteCalibrationStoreTest, RefusesAFileThatIsNotALoomDatabase) {
  store::testing::TempDir dir;
  EXPECT_EQ(OpenSqliteCalibrationStore(dir.File("missing.db")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string path = dir.File("other.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t (x)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  absl::StatusOr<std::unique_ptr<CalibrationStore>> store = OpenSqliteCalibrationStore(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), ::testing::HasSubstr("not a Loom database"));
  EXPECT_EQ(Query(path, "SELECT count(*) FROM sqlite_master"), "1");  // nothing written
}

// ---- The Calibrator ---------------------------------------------------------------------------

v1::Job FinishedJob(const std::string& name, const v1::PlanCalibration& planned_with,
                    const v1::PlanCheck& check) {
  v1::Job job;
  job.set_name(name);
  *job.mutable_plan()->mutable_calibration() = planned_with;
  job.mutable_plan()->set_step_seconds(check.predicted_step_seconds());
  *job.mutable_plan_check() = check;
  return job;
}

TEST(CalibratorTest, LearnsOncePerJobAndReloadsFromTheStore) {
  FakeClock clock;
  std::unique_ptr<CalibrationStore> store = NewMemoryCalibrationStore();
  auto calibrator = Calibrator::Create(store.get(), &clock);
  ASSERT_TRUE(calibrator.ok());
  EXPECT_TRUE((*calibrator)->Applicable().empty());

  const v1::PlanCheck slow = Check(Phases(0.001, 0.002, 0.002, 0), 0.035, Phases(0, 0.02, 0, 0));
  auto learnt =
      (*calibrator)->LearnFromFinishedJob(FinishedJob("jobs/a", Planned("cpu", 1, 1, 0), slow));
  ASSERT_TRUE(learnt.ok());
  ASSERT_TRUE(learnt->has_value());
  EXPECT_NEAR((*learnt)->compute_scale(), 7.0, 1e-9);
  // The same job again, and jobs without a plan by loomd or a check, teach nothing.
  EXPECT_FALSE((*calibrator)
                   ->LearnFromFinishedJob(FinishedJob("jobs/a", Planned("cpu", 1, 1, 0), slow))
                   ->has_value());
  v1::Job unplanned = FinishedJob("jobs/b", Planned("", 1, 1, 0), slow);
  EXPECT_FALSE((*calibrator)->LearnFromFinishedJob(unplanned)->has_value());
  v1::Job unmeasured = FinishedJob("jobs/c", Planned("cpu", 1, 1, 0), slow);
  unmeasured.clear_plan_check();
  EXPECT_FALSE((*calibrator)->LearnFromFinishedJob(unmeasured)->has_value());

  const calibration::CalibrationByModel applicable = (*calibrator)->Applicable();
  ASSERT_EQ(applicable.count("cpu"), 1u);
  EXPECT_EQ(applicable.at("cpu").jobs(), 1);
  EXPECT_EQ(store->ListRecords("cpu")->size(), 1u);
  EXPECT_EQ(store->ListRecords("cpu")->front().time, clock.Now());

  // A new calibrator (loomd restarted) starts from the store.
  auto reloaded = Calibrator::Create(store.get(), &clock);
  ASSERT_TRUE(reloaded.ok());
  EXPECT_NEAR((*reloaded)->Applicable().at("cpu").compute_scale(), 7.0, 1e-9);
}

}  // namespace
}  // namespace loom::calibration

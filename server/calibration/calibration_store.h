// CalibrationStore: the durable side of calibration. Per device model, the current scales
// (v1::PlanCalibration); and one record per finished job that was folded in, so that a job is
// learnt from once (a re-sent exit report, a loomd restart) and the history can be audited.
// Two implementations: SQLite (two tables in loomd's database, beside the job store's) and
// in memory (tests). Every method is thread-safe; a write that fails changes nothing.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::calibration {

// One finished job's contribution.
struct CalibrationRecord {
  std::string job;                   // "jobs/{id}", unique
  v1::PlanCalibration planned_with;  // the device model and the scales its plan was made with
  v1::PlanCheck check;               // its predicted and measured step
  absl::Time time;                   // when it was recorded
};

class CalibrationStore {
 public:
  virtual ~CalibrationStore() = default;

  // Appends `record` and replaces the calibration of `updated.device_model()` by `updated`, in
  // one transaction. Returns false, writing nothing, when `record.job` was recorded before.
  // INVALID_ARGUMENT for an empty job or device model.
  virtual absl::StatusOr<bool> Record(const CalibrationRecord& record,
                                      const v1::PlanCalibration& updated) = 0;

  // The stored calibration of every device model, by device model.
  virtual absl::StatusOr<std::vector<v1::PlanCalibration>> ListCalibrations() = 0;

  // The records of `device_model`, oldest first.
  virtual absl::StatusOr<std::vector<CalibrationRecord>> ListRecords(
      std::string_view device_model) = 0;
};

// Opens the calibration tables of loomd's SQLite database at `path`, creating them when
// missing (a database written before calibration existed gains them; its other tables and its
// schema version are untouched, so an older loomd still opens it). The file must already be a
// Loom database: open it with store::OpenSqliteJobStore first, which creates and checks it.
// FAILED_PRECONDITION naming the path otherwise.
absl::StatusOr<std::unique_ptr<CalibrationStore>> OpenSqliteCalibrationStore(
    const std::string& path);

std::unique_ptr<CalibrationStore> NewMemoryCalibrationStore();

}  // namespace loom::calibration

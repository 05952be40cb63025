// The in-memory CalibrationStore, for tests and tools: the SQLite store's contract without a
// file. One mutex guards everything.
#include <map>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/calibration/calibration_store.h"
#include "server/calibration/store_checks.h"

namespace loom::calibration {
namespace {

class MemoryCalibrationStore final : public CalibrationStore {
 public:
  absl::StatusOr<bool> Record(const CalibrationRecord& record,
                              const v1::PlanCalibration& updated) override {
    if (absl::Status s = CheckForRecord(record, updated); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    if (!jobs_.insert(record.job).second) return false;
    records_.push_back(record);
    calibrations_[updated.device_model()] = updated;
    return true;
  }

  absl::StatusOr<std::vector<v1::PlanCalibration>> ListCalibrations() override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::PlanCalibration> out;
    for (const auto& [model, calibration] : calibrations_) out.push_back(calibration);
    return out;
  }

  absl::StatusOr<std::vector<CalibrationRecord>> ListRecords(
      std::string_view device_model) override {
    absl::MutexLock lock(&mu_);
    std::vector<CalibrationRecord> out;
    for (const CalibrationRecord& r : records_) {
      if (r.planned_with.device_model() == device_model) out.push_back(r);
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::set<std::string> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<CalibrationRecord> records_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::map<std::string, v1::PlanCalibration> calibrations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<CalibrationStore> NewMemoryCalibrationStore() {
  return std::make_unique<MemoryCalibrationStore>();
}

}  // namespace loom::calibration

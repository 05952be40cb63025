// Argument checks shared by both CalibrationStore implementations, so that they refuse the same
// input with the same message. Internal to server/calibration/.
#pragma once

#include "absl/status/status.h"
#include "server/calibration/calibration_store.h"

namespace loom::calibration {

inline absl::Status CheckForRecord(const CalibrationRecord& record,
                                   const v1::PlanCalibration& updated) {
  if (record.job.empty()) {
    return absl::InvalidArgumentError("calibration record: job is empty; give jobs/{id}");
  }
  if (updated.device_model().empty()) {
    return absl::InvalidArgumentError(
        "calibration: device_model is empty; give the planner's catalog name (cpu, H100-SXM...)");
  }
  if (record.planned_with.device_model() != updated.device_model()) {
    return absl::InvalidArgumentError(
        "calibration record: planned_with.device_model differs from the updated calibration's");
  }
  return absl::OkStatus();
}

}  // namespace loom::calibration

// Helpers for the JobStore tests: a temporary directory removed at the end of the test, and
// small builders for jobs, events and nodes.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::store::testing {

// A fresh directory under the test's temp dir, removed (with its contents) on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "loom-store-XXXXXX";
    char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline v1::Job MakeJob(const std::string& id, v1::JobState state = v1::QUEUED,
                       const std::string& request_id = "") {
  v1::Job job;
  job.set_name("jobs/" + id);
  job.set_state(state);
  job.set_request_id(request_id);
  job.mutable_spec()->set_name(id);
  job.mutable_spec()->mutable_resources()->set_cpu_devices(2);
  job.mutable_spec()->mutable_env()->insert({"KEY", "value of " + id});
  job.mutable_create_time()->set_seconds(1'700'000'000);
  return job;
}

inline v1::JobEvent MakeEvent(v1::JobState from, v1::JobState to, const std::string& reason) {
  v1::JobEvent event;
  event.set_from_state(from);
  event.set_to_state(to);
  event.set_reason(reason);
  event.mutable_time()->set_seconds(1'700'000'001);
  return event;
}

inline v1::Node MakeNode(const std::string& id, int cpu_devices,
                         v1::NodeState state = v1::NODE_STATE_READY) {
  v1::Node node;
  node.set_name("nodes/" + id);
  node.set_hostname(id + ".local");
  node.set_state(state);
  for (int i = 0; i < cpu_devices; ++i) {
    v1::Device* device = node.add_devices();
    device->set_kind(v1::DEVICE_KIND_CPU);
    device->set_index(i);
    device->set_model("cpu");
  }
  return node;
}

}  // namespace loom::store::testing

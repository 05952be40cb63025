// Fuzz target: what loomd does with the messages of workers (NodeService): JobManager's
// RegisterNode, OpenSession, HandleWorkerMessage and CloseSession, with an in-memory store and
// a fake clock, as tests/server/job_manager_test.cc builds the manager (no network).
//
// Each input runs on a fresh manager that already has a READY node "n1" (4 CPU devices) with
// an open session and one SCHEDULED two-rank job on it, so fuzzed reports reach a live gang.
// The rest of the input is a script: an operation byte, then a protobuf message in wire bytes
// (FuzzedDataProvider's length-delimited strings). In a worker message, a job name "$" (in
// rank_status, rank_statuses, step, logs or hello.running) is replaced by the live job's name, so
// the fuzzer need not guess it. Contract (job_manager.h): never a crash on any input, and the
// manager still answers GetJob, ListJobs and ListNodes afterwards.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/log_store.h"
#include "server/store/job_store.h"
#include "tests/fuzz/fuzz_temp_dir.h"
#include "tests/server/loomd_test_util.h"

namespace {

using loom::jobs::JobManager;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "node_messages_fuzz: %s\n", what.c_str());
  std::abort();
}

void NameJob(std::string* job, const std::string& live) {
  if (*job == "$") *job = live;
}

// Replaces the placeholder job name "$" by the live job's.
void Bind(loom::v1::WorkerMessage* m, const std::string& live) {
  if (m->has_rank_status()) NameJob(m->mutable_rank_status()->mutable_job(), live);
  if (m->has_rank_statuses()) {
    for (auto& s : *m->mutable_rank_statuses()->mutable_statuses()) NameJob(s.mutable_job(), live);
  }
  if (m->has_step()) NameJob(m->mutable_step()->mutable_job(), live);
  if (m->has_logs()) NameJob(m->mutable_logs()->mutable_job(), live);
  if (m->has_hello()) {
    for (auto& r : *m->mutable_hello()->mutable_running()) NameJob(r.mutable_job(), live);
  }
}

}  // namespace

// Parsing fuzzed wire bytes logs every string field that is not UTF-8; quiet, for speed.
static google::protobuf::LogSilencer quiet_protobuf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static loom::jobs::LogStore* logs = [] {
    auto opened = loom::jobs::LogStore::Open(loom::fuzz::TempDir() + "/logs");
    if (!opened.ok()) Fail(std::string(opened.status().message()));
    return opened->release();
  }();
  FuzzedDataProvider in(data, size);
  loom::FakeClock clock;
  std::unique_ptr<loom::store::JobStore> store = loom::store::NewMemoryJobStore();
  loom::jobs::JobManagerOptions options;
  options.rendezvous_address = "loomd.fuzz:7070";
  auto created = JobManager::Create(store.get(), &clock, loom::jobs::MakeSpecValidator(), logs,
                                    nullptr, nullptr, options);
  if (!created.ok()) Fail(std::string(created.status().message()));
  std::unique_ptr<JobManager> manager = std::move(*created);

  // The live state the script acts on.
  if (!manager->RegisterNode(loom::testing::CpuNode("n1", 4)).ok()) Fail("RegisterNode n1");
  auto sink = std::make_shared<loom::testing::FakeSink>();
  loom::v1::SessionHello hello;
  hello.set_node_id("n1");
  absl::StatusOr<uint64_t> session = manager->OpenSession(hello, sink);
  if (!session.ok()) Fail("OpenSession n1");
  absl::StatusOr<loom::v1::Job> job =
      manager->CreateJob(loom::testing::CreateRequest(loom::testing::CpuSpec(2, 2)));
  if (!job.ok()) Fail(std::string(job.status().message()));
  const std::string live = job->name();
  uint64_t session_id = *session;

  for (int op = 0; op < 32 && in.remaining_bytes() > 0; ++op) {
    const int kind = in.ConsumeIntegralInRange(0, 5);
    const std::string bytes = in.ConsumeRandomLengthString(4096);
    switch (kind) {
      case 0: {  // RegisterNode
        loom::v1::RegisterNodeRequest request;
        if (request.ParseFromString(bytes)) (void)manager->RegisterNode(request);
        break;
      }
      case 1: {  // a new session (replacing n1's when the hello names it)
        loom::v1::SessionHello h;
        if (!h.ParseFromString(bytes)) break;
        for (auto& r : *h.mutable_running()) NameJob(r.mutable_job(), live);
        absl::StatusOr<uint64_t> opened =
            manager->OpenSession(h, std::make_shared<loom::testing::FakeSink>());
        if (opened.ok() && h.node_id() == "n1") session_id = *opened;
        break;
      }
      case 2:    // a message on n1's session
      case 3: {  // a message on another node's, or a stale, session
        loom::v1::WorkerMessage m;
        if (!m.ParseFromString(bytes)) break;
        Bind(&m, live);
        if (kind == 2) {
          (void)manager->HandleWorkerMessage("n1", session_id, m);
        } else {
          const std::string node = in.ConsumeRandomLengthString(32);
          (void)manager->HandleWorkerMessage(node, in.ConsumeIntegral<uint64_t>(), m);
        }
        break;
      }
      case 4:  // time passes (heartbeats, node timeouts, backoffs)
        clock.Advance(absl::Milliseconds(in.ConsumeIntegralInRange<int64_t>(0, 60'000)));
        manager->Tick();
        break;
      default:
        manager->CloseSession("n1", session_id);
    }
  }
  if (!manager->GetJob(live).ok()) Fail("the live job is gone");
  loom::v1::ListJobsRequest list;
  if (!manager->ListJobs(list).ok()) Fail("ListJobs failed");
  (void)manager->ListNodes();
  manager->Shutdown();
  return 0;
}

// loomctl --persist (client/persist_mux.h) against a real loomd over TLS: the calls of several
// loomctl processes go through one background mux and answer as the direct calls do; the mux
// refuses a call meant for another mux, survives a loomd restart without holding up loomd's
// shutdown, and ends when idle.
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/persist_mux.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

// Each test's mux sockets go to a runtime dir of its own (XDG_RUNTIME_DIR, restored after).
class PersistTest : public IntegrationTest {
 protected:
  void SetUp() override {
    IntegrationTest::SetUp();
    if (HasFatalFailure()) return;
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    had_runtime_ = old != nullptr;
    if (had_runtime_) saved_runtime_ = old;
    runtime_ = cluster_->dir() + "/run";
    ASSERT_EQ(::mkdir(runtime_.c_str(), 0700), 0);
    ::setenv("XDG_RUNTIME_DIR", runtime_.c_str(), 1);
    // The automatic mux is what these tests compare against: none of the caller's setting.
    if (const char* persist = std::getenv("LOOM_PERSIST"); persist != nullptr) {
      saved_persist_ = persist;
      ::unsetenv("LOOM_PERSIST");
    }
  }
  void TearDown() override {
    for (const pid_t pid : MuxPids()) ::kill(pid, SIGKILL);
    if (saved_persist_.has_value()) {
      ::setenv("LOOM_PERSIST", saved_persist_->c_str(), 1);
    } else {
      ::unsetenv("LOOM_PERSIST");
    }
    if (had_runtime_) {
      ::setenv("XDG_RUNTIME_DIR", saved_runtime_.c_str(), 1);
    } else {
      ::unsetenv("XDG_RUNTIME_DIR");
    }
    IntegrationTest::TearDown();
  }

  // The mux sockets in this test's directory.
  std::vector<std::string> Sockets() const {
    std::vector<std::string> out;
    DIR* d = ::opendir((runtime_ + "/loom").c_str());
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, "mux-") && absl::EndsWith(e->d_name, ".sock")) {
        out.push_back(runtime_ + "/loom/" + e->d_name);
      }
    }
    ::closedir(d);
    return out;
  }

  // The running muxes whose socket is in this test's directory.
  std::vector<pid_t> MuxPids() const {
    std::vector<pid_t> out;
    DIR* d = ::opendir("/proc");
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      const pid_t pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      std::ifstream f(absl::StrCat("/proc/", pid, "/cmdline"));
      const std::string cmdline((std::istreambuf_iterator<char>(f)), {});
      if (cmdline.find("--persist-mux") != std::string::npos &&
          cmdline.find(runtime_ + "/loom/") != std::string::npos && ProcessAlive(pid)) {
        out.push_back(pid);
      }
    }
    ::closedir(d);
    return out;
  }

  // How many sockets process `pid` holds (the mux: its listener, and one per connection to
  // loomd it keeps).
  static int SocketCount(pid_t pid) {
    int count = 0;
    const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
    DIR* d = ::opendir(fd_dir.c_str());
    if (d == nullptr) return -1;
    while (dirent* e = ::readdir(d)) {
      char target[256] = {};
      const std::string link = fd_dir + "/" + e->d_name;
      if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          absl::StartsWith(target, "socket:")) {
        ++count;
      }
    }
    ::closedir(d);
    return count;
  }

  CommandResult Persisted(std::vector<std::string> args, const std::string& idle = "30s") {
    args.insert(args.begin(), "--persist=" + idle);
    return cluster_->Loomctl(args);
  }

  // The marks of direct calls that an automatic mux looks for (client/persist_mux.h).
  std::vector<std::string> Marks() const {
    std::vector<std::string> out;
    DIR* d = ::opendir((runtime_ + "/loom").c_str());
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      if (absl::EndsWith(e->d_name, ".recent")) out.push_back(runtime_ + "/loom/" + e->d_name);
    }
    ::closedir(d);
    return out;
  }

  std::string runtime_;
  std::string saved_runtime_;
  bool had_runtime_ = false;
  std::optional<std::string> saved_persist_;
};

// Over TLS without --persist: a call alone goes directly and leaves no process; a call that
// follows another within two seconds starts the mux, and the calls after it go through it.
// LOOM_PERSIST=0 keeps every call direct.
TEST_F(PersistTest, OverTlsACallSoonAfterAnotherStartsTheMuxAndACallAloneLeavesNone) {
  ASSERT_EQ(cluster_->Loomctl({"list"}).exit_code, 0);
  EXPECT_TRUE(MuxPids().empty());
  EXPECT_TRUE(Sockets().empty());
  const std::vector<std::string> marks = Marks();
  ASSERT_EQ(marks.size(), 1u);

  // The same call again, but as if the first had been three seconds ago: still direct.
  const timespec past[2] = {{::time(nullptr) - 3, 0}, {::time(nullptr) - 3, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, marks[0].c_str(), past, 0), 0);
  ASSERT_EQ(cluster_->Loomctl({"list"}).exit_code, 0);
  EXPECT_TRUE(MuxPids().empty());

  // At once after it: the mux starts and takes the call, and the next call too.
  const std::string quick =
      cluster_->WriteFile("quick.yaml", JobYaml({.name = "quick", .devices = 1, .steps = 1}));
  const CommandResult submit = cluster_->Loomctl({"submit", "-f", quick});
  ASSERT_EQ(submit.exit_code, 0) << submit.Describe();
  EXPECT_TRUE(submit.err.empty()) << submit.Describe();
  const std::vector<pid_t> muxes = MuxPids();
  ASSERT_EQ(muxes.size(), 1u);
  const std::string name = submit.out.substr(0, submit.out.find('\n'));
  const CommandResult get = cluster_->Loomctl({"get", name});
  ASSERT_EQ(get.exit_code, 0) << get.Describe();
  EXPECT_THAT(get.out, HasSubstr(name));
  EXPECT_EQ(MuxPids(), muxes);
  EXPECT_GE(SocketCount(muxes[0]), 2);  // its listener and its connection to loomd
}

TEST_F(PersistTest, LoomPersistZeroKeepsEveryTlsCallDirect) {
  ::setenv("LOOM_PERSIST", "0", 1);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cluster_->Loomctl({"list"}).exit_code, 0);
  EXPECT_TRUE(MuxPids().empty());
  EXPECT_TRUE(Sockets().empty());
  EXPECT_TRUE(Marks().empty());
}

TEST_F(PersistTest, CallsOfSeveralProcessesGoThroughOneMuxAndAnswerAsDirectCalls) {
  const std::string quick =
      cluster_->WriteFile("quick.yaml", JobYaml({.name = "quick", .devices = 1, .steps = 1}));
  const CommandResult submit = Persisted({"submit", "-f", quick});
  ASSERT_EQ(submit.exit_code, 0) << submit.Describe();
  const std::string name = submit.out.substr(0, submit.out.find('\n'));
  ASSERT_THAT(name, ::testing::StartsWith("jobs/"));
  ASSERT_EQ(Sockets().size(), 1u);
  const std::vector<pid_t> muxes = MuxPids();
  ASSERT_EQ(muxes.size(), 1u);
  // The mux made the call: besides its listener it keeps the connection to loomd.
  EXPECT_GE(SocketCount(muxes[0]), 2);

  ASSERT_TRUE(
      cluster_
          ->WaitForJob(
              name, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, absl::Seconds(60))
          .ok());
  const CommandResult direct = cluster_->Loomctl({"-o", "json", "get", name});
  const CommandResult through = Persisted({"-o", "json", "get", name});
  ASSERT_EQ(direct.exit_code, 0) << direct.Describe();
  ASSERT_EQ(through.exit_code, 0) << through.Describe();
  // The same document (compared parsed: a map's keys print in each process's own order).
  EXPECT_EQ(nlohmann::json::parse(through.out, nullptr, false),
            nlohmann::json::parse(direct.out, nullptr, false))
      << through.out;
  EXPECT_FALSE(nlohmann::json::parse(through.out, nullptr, false).is_discarded());

  const CommandResult list = Persisted({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.Describe();
  EXPECT_THAT(list.out, HasSubstr(name));

  // loomd's errors come back as they are.
  const CommandResult missing = Persisted({"get", "jobs/doesnotexist1"});
  const CommandResult missing_direct = cluster_->Loomctl({"get", "jobs/doesnotexist1"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_EQ(missing.exit_code, missing_direct.exit_code);
  EXPECT_EQ(missing.err, missing_direct.err);
  EXPECT_THAT(missing.err, HasSubstr("not found"));

  const std::string slow = cluster_->WriteFile(
      "slow.yaml", JobYaml({.name = "slow", .devices = 1, .steps = 1000, .step_ms = 100}));
  const CommandResult second = Persisted({"submit", "-f", slow});
  ASSERT_EQ(second.exit_code, 0) << second.Describe();
  const std::string slow_name = second.out.substr(0, second.out.find('\n'));
  const CommandResult cancel = Persisted({"cancel", slow_name});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.Describe();
  absl::StatusOr<v1::Job> cancelled = cluster_->GetJob(slow_name);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);

  // Every call went to the one mux.
  EXPECT_EQ(MuxPids(), muxes);
  EXPECT_EQ(Sockets().size(), 1u);

  // A call meant for another mux (another server or TLS files) is refused, not relayed.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = Sockets()[0];
  ASSERT_LT(path.size(), sizeof(address.sun_path));
  std::copy(path.begin(), path.end(), address.sun_path);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  client::MuxRequest foreign;
  foreign.key = "loom-persist-1\nserver=10.9.9.9:7070\n";
  foreign.path = "/loom.v1.JobService/ListJobs";
  foreign.deadline_unix_ms = absl::ToUnixMillis(absl::Now() + absl::Seconds(10));
  const std::string frame = client::EncodeMuxRequest(foreign);
  ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  ::close(fd);
  absl::StatusOr<client::MuxAnswer> decoded = client::DecodeMuxAnswer(answer);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->code, client::kMuxRefused);
}

// A TLS target without --tls-ca (only a client certificate: the system's roots verify loomd)
// stays TLS through the mux. loomd's certificate comes from the development CA, which the
// system does not trust, so the call must fail on verification, directly and through the mux
// alike; a mux that took the empty CA for plaintext would fail otherwise (loomd speaks TLS).
TEST_F(PersistTest, ATlsTargetWithoutACaStaysTlsThroughTheMux) {
  const std::string certs = cluster_->dir() + "/client-certs";
  ASSERT_EQ(std::system(absl::StrCat("LOOM_DEV_CLIENTS=user:probe bash ", LOOM_SOURCE_DIR,
                                     "/scripts/dev-certs.sh ", certs, " >/dev/null 2>&1")
                            .c_str()),
            0);
  const std::vector<std::string> args = {cluster_->loomctl_path(),
                                         "--server",
                                         cluster_->loomd_address(),
                                         "--token-file=" + cluster_->certs_dir() + "/user.token",
                                         "--tls-cert=" + certs + "/user-probe.pem",
                                         "--tls-key=" + certs + "/user-probe.key",
                                         "list"};
  const CommandResult direct = RunCommand(args, absl::Seconds(30));
  std::vector<std::string> persisted = args;
  persisted.insert(persisted.end() - 1, "--persist=30s");
  const CommandResult through = RunCommand(persisted, absl::Seconds(30));
  EXPECT_NE(direct.exit_code, 0) << direct.Describe();
  EXPECT_THAT(direct.err, HasSubstr("not trusted")) << direct.Describe();
  EXPECT_EQ(through.exit_code, direct.exit_code) << through.Describe();
  EXPECT_THAT(through.err, HasSubstr("not trusted")) << through.Describe();
  // The mux was started, and it was the one that failed to verify loomd.
  EXPECT_EQ(MuxPids().size(), 1u);
}

TEST_F(PersistTest, TheMuxOutlivesALoomdRestartWithoutHoldingItUpAndEndsWhenIdle) {
  const std::string quick =
      cluster_->WriteFile("quick.yaml", JobYaml({.name = "quick", .devices = 1, .steps = 1}));
  CommandResult submit = Persisted({"submit", "-f", quick}, "4s");
  ASSERT_EQ(submit.exit_code, 0) << submit.Describe();
  const std::vector<pid_t> muxes = MuxPids();
  ASSERT_EQ(muxes.size(), 1u);

  // loomd's graceful stop does not wait for the mux's idle connection: the mux closes it when
  // loomd says GOAWAY.
  const int port = cluster_->loomd_port();
  const absl::Time stop_start = absl::Now();
  cluster_->loomd().Signal(SIGTERM);
  const std::optional<int> stopped = cluster_->loomd().Wait(absl::Seconds(30));
  ASSERT_TRUE(stopped.has_value());
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(12)) << "loomd's stop waited for the mux";
  ASSERT_TRUE(cluster_->StartLoomd(port).ok());

  // The same mux takes the next call, on a new connection to the new loomd.
  submit = Persisted({"submit", "-f", quick}, "4s");
  ASSERT_EQ(submit.exit_code, 0) << submit.Describe();
  EXPECT_EQ(MuxPids(), muxes);
  EXPECT_GE(SocketCount(muxes[0]), 2);

  // Idle for its 4 s: the mux ends and takes its socket with it.
  EXPECT_TRUE(WaitFor([&] { return MuxPids().empty() && Sockets().empty(); }, absl::Seconds(20)));
}

}  // namespace
}  // namespace loom::testing

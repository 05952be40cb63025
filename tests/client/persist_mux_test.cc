// loomctl's persistent connection (client/persist_mux.h) without a server: the frames on the
// mux's socket, the private directory and the key. tests/integration/persist_test.cc runs it
// against a real loomd.
#include "client/persist_mux.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace loom::client {
namespace {

// A fresh directory under the test temp dir, removed with its contents.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir() + "/persist_mux_test.XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

MuxRequest SampleRequest() {
  MuxRequest r;
  r.key = "loom-persist-1\nserver=127.0.0.1:7070\n";
  r.path = "/loom.v1.JobService/CreateJob";
  r.token = "s3cret";
  r.deadline_unix_ms = 1'800'000'000'123;
  r.body = std::string("\x0a\x03\x00\xff", 4);
  return r;
}

TEST(PersistMuxFrames, RequestAndAnswerRoundTrip) {
  const MuxRequest r = SampleRequest();
  absl::StatusOr<MuxRequest> back = DecodeMuxRequest(EncodeMuxRequest(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->key, r.key);
  EXPECT_EQ(back->path, r.path);
  EXPECT_EQ(back->token, r.token);
  EXPECT_EQ(back->deadline_unix_ms, r.deadline_unix_ms);
  EXPECT_EQ(back->body, r.body);

  MuxAnswer a;
  a.code = 5;
  a.message = "job jobs/x not found";
  a.body = "";
  absl::StatusOr<MuxAnswer> answer = DecodeMuxAnswer(EncodeMuxAnswer(a));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->code, 5);
  EXPECT_EQ(answer->message, a.message);

  a.code = kMuxRefused;
  answer = DecodeMuxAnswer(EncodeMuxAnswer(a));
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->code, kMuxRefused);
}

TEST(PersistMuxFrames, EveryTruncationAndExtensionIsRefused) {
  const std::string frame = EncodeMuxRequest(SampleRequest());
  for (size_t n = 0; n < frame.size(); ++n) {
    EXPECT_FALSE(DecodeMuxRequest(frame.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeMuxRequest(frame + "x").ok());
  // The answer's tag is not a request's, and the other way round.
  EXPECT_FALSE(DecodeMuxAnswer(frame).ok());
  EXPECT_FALSE(DecodeMuxRequest(EncodeMuxAnswer(MuxAnswer{})).ok());
}

TEST(PersistMuxFrames, FieldsBeyondTheirBoundsAndUnknownCodesAreRefused) {
  MuxRequest r = SampleRequest();
  r.path = std::string(kMuxMaxPathBytes + 1, 'p');
  EXPECT_FALSE(DecodeMuxRequest(EncodeMuxRequest(r)).ok());
  r = SampleRequest();
  r.token = std::string(kMuxMaxTokenBytes + 1, 't');
  EXPECT_FALSE(DecodeMuxRequest(EncodeMuxRequest(r)).ok());
  r = SampleRequest();
  r.key = std::string(kMuxMaxKeyBytes + 1, 'k');
  EXPECT_FALSE(DecodeMuxRequest(EncodeMuxRequest(r)).ok());

  // A length field that claims more than the frame holds.
  std::string frame = EncodeMuxRequest(SampleRequest());
  frame[8] = '\xff';  // the key's length, low byte
  frame[11] = '\x7f';
  EXPECT_FALSE(DecodeMuxRequest(frame).ok());

  MuxAnswer a;
  for (const int32_t code : {-1, 17, 999, 1001}) {
    a.code = code;
    EXPECT_FALSE(DecodeMuxAnswer(EncodeMuxAnswer(a)).ok()) << code;
  }
}

TEST(PersistMuxRelays, OnlyTheFourUnaryJobCalls) {
  for (const char* method : {"CreateJob", "GetJob", "ListJobs", "CancelJob"}) {
    EXPECT_TRUE(MuxRelays(std::string("/loom.v1.JobService/") + method)) << method;
  }
  for (const char* path : {"/loom.v1.JobService/WatchJob", "/loom.v1.NodeService/Session",
                           "/loom.v1.NodeService/DrainNode", "/loom.v1.JobService/GetJob2",
                           "/loom.v1.JobService/", "", "/loom.v1.JobService/GetJob\n"}) {
    EXPECT_FALSE(MuxRelays(path)) << path;
  }
}

// Points XDG_RUNTIME_DIR at a temp dir for one test, and back.
class PersistDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    if (old != nullptr) saved_ = old;
    had_ = old != nullptr;
    ::setenv("XDG_RUNTIME_DIR", dir_.path().c_str(), 1);
  }
  void TearDown() override {
    if (had_) {
      ::setenv("XDG_RUNTIME_DIR", saved_.c_str(), 1);
    } else {
      ::unsetenv("XDG_RUNTIME_DIR");
    }
  }
  ScratchDir dir_;
  std::string saved_;
  bool had_ = false;
};

TEST_F(PersistDirectoryTest, CreatesAPrivateDirectory) {
  absl::StatusOr<std::string> dir = PersistDirectory();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, dir_.path() + "/loom");
  struct stat st {};
  ASSERT_EQ(::lstat(dir->c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  // Found again as it is.
  EXPECT_TRUE(PersistDirectory().ok());
}

TEST_F(PersistDirectoryTest, RefusesADirectoryOthersCanEnterAndALink) {
  const std::string dir = dir_.path() + "/loom";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  absl::StatusOr<std::string> found = PersistDirectory();
  ASSERT_FALSE(found.ok());
  EXPECT_NE(found.status().message().find("not a private directory"), std::string::npos)
      << found.status();
  EXPECT_NE(found.status().message().find("mode 0755"), std::string::npos) << found.status();

  ASSERT_EQ(::rmdir(dir.c_str()), 0);
  const std::string elsewhere = dir_.path() + "/elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), dir.c_str()), 0);
  found = PersistDirectory();
  ASSERT_FALSE(found.ok());
  EXPECT_NE(found.status().message().find("not a directory"), std::string::npos) << found.status();
}

TEST(PersistKeyTest, NamesTheServerAndChangesWithATlsFile) {
  ScratchDir dir;
  const std::string ca = dir.path() + "/ca.pem";
  std::ofstream(ca) << "one";
  PersistTarget target{"10.0.0.1:7070", WireTls{ca, "", ""}, absl::Seconds(60)};
  absl::StatusOr<std::string> a = PersistKey(target);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(a->find("server=10.0.0.1:7070"), std::string::npos);
  EXPECT_NE(a->find(ca), std::string::npos);

  target.server = "10.0.0.2:7070";
  absl::StatusOr<std::string> other_server = PersistKey(target);
  ASSERT_TRUE(other_server.ok());
  EXPECT_NE(*other_server, *a);

  // A rotated CA (another size and time) is another mux.
  target.server = "10.0.0.1:7070";
  std::ofstream(ca) << "two, longer";
  absl::StatusOr<std::string> rotated = PersistKey(target);
  ASSERT_TRUE(rotated.ok());
  EXPECT_NE(*rotated, *a);

  target.tls->ca = dir.path() + "/missing.pem";
  absl::StatusOr<std::string> missing = PersistKey(target);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--tls-ca"), std::string::npos) << missing.status();

  // Plaintext and TLS to one server are two muxes.
  target.tls.reset();
  absl::StatusOr<std::string> plain = PersistKey(target);
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(*plain, *a);
}

}  // namespace
}  // namespace loom::client

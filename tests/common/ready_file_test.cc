#include "common/ready_file.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

// A fresh directory per test under the test temp dir.
class ReadyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "/ready_file_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir_.c_str());
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
    return out;
  }

  void WriteRaw(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

  std::string dir_;
};

TEST_F(ReadyFileTest, RoundTrip) {
  const std::string path = dir_ + "/loomd.ready";
  ASSERT_TRUE(WriteReadyFile(path, {{"grpc", "127.0.0.1:41234"},
                                    {"metrics", "[::1]:41235"},
                                    {"pid", "1234"},
                                    {"odd", "quote\" backslash\\ newline\n"}})
                  .ok());
  auto fields = ReadReadyFile(path);
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(*fields,
            (std::map<std::string, std::string>{{"grpc", "127.0.0.1:41234"},
                                                {"metrics", "[::1]:41235"},
                                                {"pid", "1234"},
                                                {"odd", "quote\" backslash\\ newline\n"}}));
  // Only the file itself is left: the temp file was renamed away.
  EXPECT_EQ(Entries(), std::vector<std::string>{"loomd.ready"});
}

TEST_F(ReadyFileTest, OverwritesAndLastDuplicateWins) {
  const std::string path = dir_ + "/r.json";
  ASSERT_TRUE(WriteReadyFile(path, {{"a", "1"}, {"b", "2"}}).ok());
  ASSERT_TRUE(WriteReadyFile(path, {{"a", "3"}, {"a", "4"}}).ok());
  auto fields = ReadReadyFile(path);
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(*fields, (std::map<std::string, std::string>{{"a", "4"}}));
}

TEST_F(ReadyFileTest, IsPlainJsonForScripts) {
  const std::string path = dir_ + "/r.json";
  ASSERT_TRUE(WriteReadyFile(path, {{"grpc", "127.0.0.1:1"}, {"pid", "7"}}).ok());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"grpc\":\"127.0.0.1:1\",\"pid\":\"7\"}\n");
}

TEST_F(ReadyFileTest, MissingFileIsNotFound) {
  auto fields = ReadReadyFile(dir_ + "/absent");
  ASSERT_FALSE(fields.ok());
  EXPECT_EQ(fields.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(fields.status().message(), HasSubstr("absent"));
}

TEST_F(ReadyFileTest, MalformedFilesAreInvalidArgument) {
  const std::string path = dir_ + "/bad";
  for (const char* text : {"", "{", "[\"a\"]", "{\"a\": 1}", "{\"a\": {\"b\": \"c\"}}", "null"}) {
    WriteRaw(path, text);
    auto fields = ReadReadyFile(path);
    ASSERT_FALSE(fields.ok()) << text;
    EXPECT_EQ(fields.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(fields.status().message(), HasSubstr(path));
  }
}

TEST_F(ReadyFileTest, UnwritableDirectoryIsAnErrorNamingThePath) {
  const std::string path = dir_ + "/no/such/dir/r.json";
  const absl::Status status = WriteReadyFile(path, {{"a", "b"}});
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(dir_ + "/no/such/dir/r.json"));
}

}  // namespace
}  // namespace loom

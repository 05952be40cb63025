// The pure parts of authentication (server/auth): the tokens file, certificate names, the
// authenticator's modes and reload, and the rendezvous secrets.
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/authenticator.h"
#include "server/auth/rendezvous_secrets.h"
#include "server/auth/token_table.h"
#include "tests/server/store_test_util.h"

namespace loom::auth {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "0123456789abcdef-token";

void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

TEST(TokenTableTest, ParsesRolesSubjectsAndDigests) {
  const std::string text = absl::StrCat("# comment\n\nuser team-a ", kToken,
                                        "\nadmin ops sha256:", Sha256Hex("admin-token-0123456789"),
                                        "\nnode * join-token-0123456789\n");
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 3u);
  const Principal* user = table->Find(kToken);
  ASSERT_NE(user, nullptr);
  EXPECT_EQ(user->role, Role::kUser);
  EXPECT_EQ(user->subject, "team-a");
  const Principal* admin = table->Find("admin-token-0123456789");
  ASSERT_NE(admin, nullptr);
  EXPECT_TRUE(admin->is_admin());
  const Principal* node = table->Find("join-token-0123456789");
  ASSERT_NE(node, nullptr);
  EXPECT_TRUE(node->may_be_node("any-node"));
  EXPECT_EQ(table->Find("join-token-012345678"), nullptr);
}

TEST(TokenTableTest, BadLinesNameTheLineAndNeverTheToken) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"user team-a", "three columns"},
           {"root team-a 0123456789abcdef", "role must be"},
           {"user Team_A 0123456789abcdef", "subject"},
           {"user * 0123456789abcdef", "subject"},
           {"user team-a short", "16 to 512"},
           {"admin ops sha256:abc", "64 hex"},
           {"user a 0123456789abcdef\nuser b 0123456789abcdef", "already listed"},
       }) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens");
    ASSERT_FALSE(table.ok()) << text;
    EXPECT_THAT(table.status().message(), HasSubstr(message)) << text;
    EXPECT_THAT(table.status().message(), HasSubstr("tokens:")) << text;
    EXPECT_THAT(table.status().message(), ::testing::Not(HasSubstr("0123456789abcdef")));
  }
}

TEST(TokenTableTest, AFileOthersCanReadIsRefused) {
  store::testing::TempDir dir;
  WriteFile(dir.File("tokens"), absl::StrCat("user a ", kToken, "\n"), 0644);
  absl::StatusOr<TokenTable> table = TokenTable::Load(dir.File("tokens"));
  ASSERT_FALSE(table.ok());
  EXPECT_THAT(table.status().message(), HasSubstr("chmod 600"));
  chmod(dir.File("tokens").c_str(), 0600);
  EXPECT_TRUE(TokenTable::Load(dir.File("tokens")).ok());
}

TEST(AuthenticatorTest, CertificateNamesMapToPrincipals) {
  absl::StatusOr<Principal> p = PrincipalFromCommonName("node:gpu-7");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->may_be_node("gpu-7"));
  EXPECT_FALSE(p->may_be_node("gpu-8"));
  EXPECT_EQ(p->method, "certificate");
  p = PrincipalFromCommonName("admin:ops");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->is_admin());
  for (const char* bad : {"loomd", "node:*", "user:", "root:x", "user:UPPER"}) {
    EXPECT_FALSE(PrincipalFromCommonName(bad).ok()) << bad;
  }
}

TEST(AuthenticatorTest, TokensCertificatesAndOpenMode) {
  store::testing::TempDir dir;
  WriteFile(dir.File("tokens"), absl::StrCat("user a ", kToken, "\n"), 0600);
  FakeClock clock;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(dir.File("tokens"), false, &clock);
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<Principal> p = (*auth)->Authenticate(absl::StrCat("Bearer ", kToken), "");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->subject, "a");
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("", "").status()));
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("Basic abc", "").status()));
  EXPECT_TRUE(
      absl::IsUnauthenticated((*auth)->Authenticate("Bearer nope-nope-nope-nope", "").status()));
  p = (*auth)->Authenticate("", "user:b");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->subject, "b");

  // Reload: a new file is seen only after a second on the injected clock.
  WriteFile(dir.File("tokens.new"), "user c other-token-0123456789\n", 0600);
  std::filesystem::rename(dir.File("tokens.new"), dir.File("tokens"));
  EXPECT_TRUE((*auth)->Authenticate(absl::StrCat("Bearer ", kToken), "").ok());
  clock.Advance(absl::Seconds(2));
  EXPECT_FALSE((*auth)->Authenticate(absl::StrCat("Bearer ", kToken), "").ok());
  EXPECT_TRUE((*auth)->Authenticate("Bearer other-token-0123456789", "").ok());

  absl::StatusOr<std::unique_ptr<Authenticator>> open = Authenticator::Create("", true, &clock);
  ASSERT_TRUE(open.ok());
  p = (*open)->Authenticate("", "");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->is_admin());
  EXPECT_EQ(p->subject, kDefaultTenant);
}

// The derivation is HMAC-SHA256(key, "JOB|GENERATION") in lowercase hex, as the header says: a
// loomd of another build must derive the secrets of the gangs that kept running. The expected
// value is from `openssl dgst -sha256 -mac HMAC -macopt key:...`. Threads share the keyed state.
TEST(RendezvousSecretsTest, SecretsAreHmacSha256OfJobAndGeneration) {
  const std::unique_ptr<RendezvousSecrets> secrets =
      RendezvousSecrets::ForKey("0123456789abcdef0123456789abcdef");
  const std::string expected = "1c1f8cfd2bded0a4709ea54e4718c753ce43194086ed5cadfba168c05a57711e";
  EXPECT_EQ(secrets->SecretFor("jobs/x", 1), expected);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (secrets->SecretFor("jobs/x", 1) != expected) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(RendezvousSecretsTest, KeyIsPrivateStableAndSecretsDifferPerScope) {
  store::testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<RendezvousSecrets>> a = RendezvousSecrets::Open(dir.File("k"));
  ASSERT_TRUE(a.ok()) << a.status();
  struct stat st {};
  ASSERT_EQ(stat(dir.File("k").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  // A restarted loomd derives the same secrets from the same key.
  absl::StatusOr<std::unique_ptr<RendezvousSecrets>> b = RendezvousSecrets::Open(dir.File("k"));
  ASSERT_TRUE(b.ok());
  const std::string s = (*a)->SecretFor("jobs/x", 1);
  EXPECT_EQ(s.size(), 64u);
  EXPECT_EQ((*b)->SecretFor("jobs/x", 1), s);
  EXPECT_NE((*a)->SecretFor("jobs/x", 2), s);
  EXPECT_NE((*a)->SecretFor("jobs/y", 1), s);
  EXPECT_TRUE((*b)->Check("jobs/x", 1, s));
  EXPECT_FALSE((*b)->Check("jobs/x", 2, s));
  EXPECT_FALSE((*b)->Check("jobs/x", 1, s.substr(1)));
  // A damaged key file is refused, not silently replaced.
  WriteFile(dir.File("k"), "short", 0600);
  EXPECT_FALSE(RendezvousSecrets::Open(dir.File("k")).ok());
}

}  // namespace
}  // namespace loom::auth

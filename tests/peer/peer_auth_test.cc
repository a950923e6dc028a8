// The cluster key file's rules and the HMAC proofs of the peer protocol's
// authentication (peer_auth.h). The handshake itself is tested against a real
// server in tests/cachenode/server_test.cc.

#include "granary/peer/peer_auth.h"

#include <gmock/gmock.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kKeyHex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
constexpr char kOtherHex[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

std::string WriteKeyFile(const TempDir& dir, const std::string& name, const std::string& text,
                         mode_t mode = 0600) {
  dir.WriteFile(name, text);
  const std::string path = dir.Join(name);
  EXPECT_EQ(::chmod(path.c_str(), mode), 0);
  return path;
}

TEST(ClusterKeysTest, LoadsOneOrTwoHexKeysWithCommentsAndBlankLines) {
  TempDir dir;
  auto keys = ClusterKeys::Load(WriteKeyFile(
      dir, "k",
      std::string("# the current key first\n\n") + kKeyHex + "\n  " + kOtherHex + "  \n"));
  ASSERT_OK(keys);
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_EQ(keys->current().size(), 32u);
  EXPECT_EQ(static_cast<uint8_t>(keys->current()[1]), 0x11);
  EXPECT_EQ(keys->current_id(), ClusterKeyId(keys->current()));
  ASSERT_NE(keys->Find(keys->current_id()), nullptr);
  EXPECT_EQ(*keys->Find(keys->current_id()), keys->current());
  auto other = ClusterKeys::Load(WriteKeyFile(dir, "o", std::string(kOtherHex) + "\n"));
  ASSERT_OK(other);
  // The second key of the first file is found by its id: rotation.
  ASSERT_NE(keys->Find(other->current_id()), nullptr);
  EXPECT_EQ(*keys->Find(other->current_id()), other->current());
  KeyId unknown{};
  EXPECT_EQ(keys->Find(unknown), nullptr);
}

TEST(ClusterKeysTest, AFileOthersMayReadIsRefusedNamingTheFix) {
  TempDir dir;
  for (mode_t mode : {mode_t{0644}, mode_t{0640}, mode_t{0604}, mode_t{0660}}) {
    auto keys = ClusterKeys::Load(WriteKeyFile(dir, "k", kKeyHex, mode));
    ASSERT_FALSE(keys.ok()) << std::oct << mode;
    EXPECT_EQ(keys.status().code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(keys.status().message(), HasSubstr("chmod 600"));
  }
  EXPECT_OK(ClusterKeys::Load(WriteKeyFile(dir, "k", kKeyHex, 0400)));
}

TEST(ClusterKeysTest, LinksAreCheckedByWhatTheyLeadToDirectoriesAndMissingFilesRefused) {
  TempDir dir;
  // A Kubernetes Secret volume: key -> ..data/key.
  const std::string real = WriteKeyFile(dir, "real", kKeyHex);
  std::filesystem::create_symlink(real, dir.Join("link"));
  EXPECT_OK(ClusterKeys::Load(dir.Join("link")));
  // A link to a file others may read is refused like the file.
  const std::string loose = WriteKeyFile(dir, "loose", kKeyHex, 0644);
  std::filesystem::create_symlink(loose, dir.Join("loose-link"));
  EXPECT_EQ(ClusterKeys::Load(dir.Join("loose-link")).status().code(),
            StatusCode::kPermissionDenied);
  std::filesystem::create_directory(dir.Join("d"));
  ::chmod(dir.Join("d").c_str(), 0700);
  auto directory = ClusterKeys::Load(dir.Join("d"));
  EXPECT_EQ(directory.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(directory.status().message(), HasSubstr("not a regular file"));
  auto missing = ClusterKeys::Load(dir.Join("none"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("granary cluster-key generate"));
}

TEST(ClusterKeysTest, AFileOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  TempDir dir;
  const std::string path = WriteKeyFile(dir, "k", kKeyHex);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  auto keys = ClusterKeys::Load(path);
  // Another user could rewrite it: refused even for root.
  EXPECT_EQ(keys.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(keys.status().message(), HasSubstr("uid 65534"));
}

TEST(ClusterKeysTest, BadContentsNameTheLine) {
  TempDir dir;
  struct Case {
    std::string text, want;
  } cases[] = {
      {"", "1 or 2 keys"},
      {"# only a comment\n", "1 or 2 keys"},
      {std::string(kKeyHex) + "\n" + kOtherHex + "\n" + kKeyHex + "\n", "not 3"},
      {std::string(kKeyHex) + "\n" + kKeyHex + "\n", "same key twice"},
      {"abc\n", "line 1"},
      {std::string("\n") + std::string(62, 'a') + "zz\n", "line 2: not a hex key"},
      {"00112233\n", "at least 32 bytes"},
  };
  for (const Case& c : cases) {
    auto keys = ClusterKeys::Load(WriteKeyFile(dir, "k", c.text));
    ASSERT_FALSE(keys.ok()) << c.text;
    EXPECT_THAT(keys.status().message(), HasSubstr(c.want)) << c.text;
  }
}

TEST(ClusterKeysTest, GeneratedKeysAreFreshAndLoad) {
  TempDir dir;
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) {
    auto hex = GenerateClusterKeyHex();
    ASSERT_OK(hex);
    EXPECT_EQ(hex->size(), 64u);
    EXPECT_TRUE(seen.insert(*hex).second);
    EXPECT_OK(ClusterKeys::Load(WriteKeyFile(dir, "g" + std::to_string(i), *hex + "\n")));
  }
}

TEST(ClusterKeyProofTest, EveryInputChangesTheProof) {
  const std::string key(32, 'k');
  const AuthNonce a = RandomNonce(), b = RandomNonce();
  EXPECT_NE(a, b);
  const AuthProof base = ClusterKeyProof(key, ProofRole::kClient, a, b, "node", "client");
  EXPECT_TRUE(ProofsEqual(base, ClusterKeyProof(key, ProofRole::kClient, a, b, "node", "client")));
  const AuthProof changed[] = {
      ClusterKeyProof(key, ProofRole::kServer, a, b, "node", "client"),
      ClusterKeyProof(std::string(32, 'K'), ProofRole::kClient, a, b, "node", "client"),
      ClusterKeyProof(key, ProofRole::kClient, b, a, "node", "client"),
      ClusterKeyProof(key, ProofRole::kClient, a, a, "node", "client"),
      ClusterKeyProof(key, ProofRole::kClient, a, b, "nod", "eclient"),
      ClusterKeyProof(key, ProofRole::kClient, a, b, "node", "client2"),
  };
  for (const AuthProof& p : changed) EXPECT_FALSE(ProofsEqual(base, p));
}

TEST(PeerIdentityTest, ScopeNamesTheNamespace) {
  PeerIdentity cluster;
  EXPECT_EQ(cluster.Scope(), "cluster");
  PeerIdentity ns{PeerIdentity::Kind::kNamespace, "team-a", "system:serviceaccount:team-a:x"};
  EXPECT_EQ(ns.Scope(), "namespace/team-a");
}

}  // namespace
}  // namespace granary

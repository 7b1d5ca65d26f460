// The tokens file: parsing, refusing mistakes without echoing them, and
// finding a token by its hash.
#include "server/auth/token_table.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TokenTableTest, ParsesHashesAndRefusesMistakesWithoutEchoingThem) {
  const std::string hash = auth::TokenHashField("s3cret-token-value");
  auto table = auth::TokenTable::Parse(
      absl::StrCat("# comment\n\nclient alice ", hash, "\n"), "t");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_TRUE(table->Find("s3cret-token-value").has_value());
  EXPECT_EQ(table->Find("s3cret-token-value")->name, "alice");
  EXPECT_FALSE(table->Find("s3cret-token-valuf").has_value());
  EXPECT_FALSE(table->Find("").has_value());

  // A plain token pasted instead of its hash: refused, and not echoed.
  auto plain =
      auth::TokenTable::Parse("client alice s3cret-token-value\n", "t");
  ASSERT_FALSE(plain.ok());
  EXPECT_THAT(plain.status().message(), HasSubstr("t:1"));
  EXPECT_THAT(plain.status().message(), Not(HasSubstr("s3cret")));
  EXPECT_FALSE(
      auth::TokenTable::Parse(absl::StrCat("boss alice ", hash, "\n"), "t")
          .ok());
  EXPECT_FALSE(auth::TokenTable::Parse(
                   absl::StrCat("client alice ", hash, "\nadmin alice ",
                                auth::TokenHashField("other"), "\n"),
                   "t")
                   .ok());
  EXPECT_FALSE(auth::TokenTable::Parse("# only comments\n", "t").ok());
}

}  // namespace
}  // namespace mutwo

// The bearer tokens mutwo-server accepts (--auth_tokens_file), as hashes.
//
// File format, one principal per line; blank lines and lines starting with
// '#' are ignored:
//
//   ROLE PRINCIPAL sha256:HEX
//
// ROLE is client, worker or admin; PRINCIPAL is the name jobs and workers are
// owned by ([A-Za-z0-9._@-], 1 to 64 characters, unique in the file); HEX is
// the lowercase SHA-256 of the token's bytes (`printf %s "$TOKEN" |
// sha256sum`). The file holds no token itself, so it may be read by the
// server's operators without giving their tokens away. Tokens should be
// long random strings (deploy/gen-auth.sh makes 32 random bytes, base64url).
//
// Thread safety: immutable after Parse; Find may be called from any thread.
#ifndef MUTWO_SERVER_AUTH_TOKEN_TABLE_H_
#define MUTWO_SERVER_AUTH_TOKEN_TABLE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth/principal.h"

namespace mutwo::auth {

class TokenTable {
 public:
  // InvalidArgument names `source`, the line number and what is wrong (never
  // the line's hash); an empty table is an error too.
  [[nodiscard]] static absl::StatusOr<TokenTable> Parse(
      absl::string_view text, absl::string_view source);
  // Reads and parses `path` (NotFound / PermissionDenied name the path).
  [[nodiscard]] static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The principal whose hash matches `token`. Compares the token's hash with
  // every entry in constant time, so the time taken says nothing about how
  // close a guess was or which entry matched.
  std::optional<Principal> Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string sha256_hex;
    Principal principal;
  };
  std::vector<Entry> entries_;
};

// "sha256:" + the lowercase hex SHA-256 of `token`: the file's third column.
std::string TokenHashField(absl::string_view token);

}  // namespace mutwo::auth

#endif  // MUTWO_SERVER_AUTH_TOKEN_TABLE_H_

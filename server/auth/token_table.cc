#include "server/auth/token_table.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"

namespace mutwo::auth {
namespace {

constexpr char kHashPrefix[] = "sha256:";

bool ValidPrincipalName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '@' && c != '-') {
      return false;
    }
  }
  return true;
}

// Equal-length comparison whose time does not depend on where the inputs
// differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace

std::string TokenHashField(absl::string_view token) {
  return absl::StrCat(kHashPrefix, Sha256Hex(token));
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text,
                                             absl::string_view source) {
  TokenTable table;
  std::set<std::string> names;
  std::set<std::string> hashes;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": ", what,
                       "; expected \"ROLE PRINCIPAL sha256:HEX\""));
    };
    if (fields.size() != 3) return error("not three fields");
    auto role = ParseRole(fields[0]);
    if (!role.ok()) return error(role.status().message());
    if (!ValidPrincipalName(fields[1])) {
      return error(absl::StrCat("principal \"", fields[1],
                                "\" must be 1 to 64 of [A-Za-z0-9._@-]"));
    }
    if (!absl::StartsWith(fields[2], kHashPrefix) ||
        !IsSha256Hex(fields[2].substr(sizeof(kHashPrefix) - 1))) {
      // Never echo the field: it might be a token pasted by mistake.
      return error(
          "the third field is not sha256: and 64 lowercase hex digits (store "
          "the token's hash, not the token)");
    }
    const std::string hex(fields[2].substr(sizeof(kHashPrefix) - 1));
    if (!names.insert(std::string(fields[1])).second) {
      return error(absl::StrCat("principal \"", fields[1], "\" appears twice"));
    }
    if (!hashes.insert(hex).second) {
      return error("this token hash appears twice");
    }
    Entry entry;
    entry.sha256_hex = hex;
    entry.principal.name = std::string(fields[1]);
    entry.principal.role = *role;
    table.entries_.push_back(std::move(entry));
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": no tokens; add lines \"ROLE PRINCIPAL "
                     "sha256:HEX\" or run without the tokens file"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("tokens file \"", path, "\" cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

std::optional<Principal> TokenTable::Find(absl::string_view token) const {
  const std::string hex = Sha256Hex(token);
  const Entry* found = nullptr;
  // No early exit: every entry is compared.
  for (const Entry& entry : entries_) {
    if (ConstantTimeEquals(hex, entry.sha256_hex)) found = &entry;
  }
  if (found == nullptr) return std::nullopt;
  return found->principal;
}

}  // namespace mutwo::auth

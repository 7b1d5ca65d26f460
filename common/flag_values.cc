#include "common/flag_values.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"

namespace mutwo {

std::string JoinChoices(const std::vector<std::string>& choices) {
  if (choices.size() <= 1) return absl::StrJoin(choices, "");
  return absl::StrCat(absl::StrJoin(choices.begin(), choices.end() - 1, ", "),
                      " or ", choices.back());
}

absl::StatusOr<std::string> ParseChoice(
    absl::string_view flag, absl::string_view value,
    const std::vector<std::string>& choices) {
  const absl::string_view v = absl::StripAsciiWhitespace(value);
  for (const std::string& c : choices) {
    if (absl::EqualsIgnoreCase(v, c)) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " \"", value, "\": use ", JoinChoices(choices)));
}

absl::StatusOr<std::string> ParseDeviceKind(absl::string_view flag,
                                            absl::string_view value) {
  if (absl::StripAsciiWhitespace(value).empty()) return std::string();
  auto kind = ParseChoice(flag, value, {"cpu", "cuda"});
  if (!kind.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind.status().message(), " (or leave it out: any worker)"));
  }
  return kind;
}

absl::StatusOr<int64_t> ParseMemorySize(absl::string_view flag,
                                        absl::string_view value) {
  const absl::string_view s = absl::StripAsciiWhitespace(value);
  double bare = 0;
  if (absl::SimpleAtod(s, &bare)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " \"", s, "\": a bare number is ambiguous; say ", s,
                     "GiB, ", s, "GB or ", s, "B"));
  }
  auto bytes = ParseBytes(s);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", bytes.status().message()));
  }
  return bytes;
}

}  // namespace mutwo

#include "client/time_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mutwo {

std::string DateTimeText(int64_t unix_ms, absl::TimeZone zone) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M", absl::FromUnixMillis(unix_ms),
                          zone);
}

std::string AgoText(int64_t unix_ms, int64_t now_ms) {
  if (unix_ms <= 0) return "-";
  const int64_t s = (now_ms - unix_ms) / 1000;
  if (s < 1) return "just now";
  if (s < 60) return absl::StrCat(s, "s ago");
  if (s < 3600) return absl::StrCat(s / 60, "m ago");
  if (s < 86400) {
    return absl::StrFormat("%dh%02dm ago", s / 3600, (s / 60) % 60);
  }
  return absl::StrCat(s / 86400, "d ago");
}

}  // namespace mutwo

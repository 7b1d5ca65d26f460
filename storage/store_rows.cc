#include "storage/store_rows.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace mutwo::storage {

std::string Quote(absl::string_view text) {
  return absl::StrCat("\"", text, "\"");
}

absl::Status ValidateSha256(absl::string_view sha256) {
  bool ok = sha256.size() == 64;
  for (char c : sha256) {
    ok = ok && (absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("model sha256 ", Quote(sha256.substr(0, 80)),
                     ": expected 64 lowercase hex digits"));
  }
  return absl::OkStatus();
}

absl::Status RequireNonEmpty(absl::string_view value, absl::string_view what) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("empty ", what));
  }
  return absl::OkStatus();
}

// Sortable unique ids: the creation time zero-padded, then random bits so
// that ids made in the same millisecond (or by another process) differ.
std::string NewId(absl::string_view prefix, int64_t now_ms) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s-%013d-%012x", prefix, now_ms,
                         rng() & 0xffffffffffffULL);
}

bool IsFinished(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED ||
         state == v1::Job::CANCELLED;
}

absl::Status ValidateBatchSize(int64_t batch_size) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be positive, got ", batch_size));
  }
  return absl::OkStatus();
}

}  // namespace mutwo::storage

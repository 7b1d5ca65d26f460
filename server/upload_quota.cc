#include "server/upload_quota.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/parse.h"
#include "common/status_macros.h"

namespace mutwo {

UploadQuota::Reservation& UploadQuota::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    principal_ = std::move(other.principal_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void UploadQuota::Reservation::Release() {
  if (owner_ != nullptr) {
    std::exchange(owner_, nullptr)->Give(principal_, bytes_);
  }
}

absl::StatusOr<absl::flat_hash_map<std::string, int64_t>>
UploadQuota::ParseOverrides(const std::string& text) {
  absl::flat_hash_map<std::string, int64_t> out;
  for (absl::string_view entry :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model_quota_overrides: \"", entry,
                       "\": expected PRINCIPAL=SIZE (e.g. alice=20GiB) or "
                       "PRINCIPAL=unlimited"));
    }
    if (kv.second == "unlimited") {
      out[std::string(kv.first)] = kUnlimited;
      continue;
    }
    absl::StatusOr<int64_t> bytes = ParseBytes(kv.second);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model_quota_overrides: \"", entry,
                       "\": ", bytes.status().message()));
    }
    out[std::string(kv.first)] = *bytes;
  }
  return out;
}

int64_t UploadQuota::LimitFor(const auth::Principal& caller) const {
  if (auto it = options_.overrides.find(caller.name);
      it != options_.overrides.end()) {
    return it->second;
  }
  if (caller.role == auth::Role::kAdmin) return kUnlimited;
  return options_.max_stored_bytes_per_client;
}

absl::StatusOr<UploadQuota::Reservation> UploadQuota::Admit(
    const auth::Principal& caller, const v1::UploadModelHeader& header) {
  const int64_t limit = LimitFor(caller);
  // A non-positive size is refused by the upload itself, naming it.
  if (limit == kUnlimited || header.size_bytes() <= 0) return Reservation();
  // The principal holds these bytes already: storing them again is free.
  MUTWO_ASSIGN_OR_RETURN(
      bool held, store_->HasUploadedModel(header.sha256(), caller.name));
  if (held) return Reservation();
  MUTWO_ASSIGN_OR_RETURN(int64_t stored,
                         store_->ModelBytesUploadedBy(caller.name));
  int64_t running = 0;
  {
    absl::MutexLock lock(&mu_);
    int64_t& reserved = reserved_[caller.name];
    running = reserved;
    if (stored + reserved + header.size_bytes() <= limit) {
      reserved += header.size_bytes();
      return Reservation(this, caller.name, header.size_bytes());
    }
    if (reserved == 0) reserved_.erase(caller.name);
  }
  if (options_.observe_refused) options_.observe_refused();
  return absl::ResourceExhaustedError(absl::StrCat(
      "upload: \"", caller.name, "\" stores ", FormatBytes(stored),
      " of models",
      running > 0 ? absl::StrCat(" and uploads ", FormatBytes(running), " more")
                  : "",
      "; this model's ", FormatBytes(header.size_bytes()),
      " would pass its quota of ", FormatBytes(limit),
      " (--max_stored_model_bytes_per_client; an operator may raise it for "
      "this principal with --model_quota_overrides)"));
}

void UploadQuota::Give(const std::string& principal, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = reserved_.find(principal);
  if (it == reserved_.end()) return;
  it->second -= bytes;
  if (it->second <= 0) reserved_.erase(it);
}

}  // namespace mutwo

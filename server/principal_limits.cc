#include "server/principal_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/waiters.h"

namespace mutwo {

PrincipalLimits::Slot& PrincipalLimits::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    principal_ = std::move(other.principal_);
  }
  return *this;
}

void PrincipalLimits::Slot::Release() {
  if (owner_ != nullptr) std::exchange(owner_, nullptr)->Give(principal_);
}

absl::StatusOr<std::unique_ptr<PrincipalLimits>> PrincipalLimits::Create(
    Options options) {
  if (options.max_per_principal < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.flag.empty() ? options.what : options.flag,
                     " must be at least 1, got ", options.max_per_principal));
  }
  if (options.retry_after_ms < 1) {
    return absl::InvalidArgumentError("retry_after_ms must be positive");
  }
  return std::unique_ptr<PrincipalLimits>(
      new PrincipalLimits(std::move(options)));
}

absl::StatusOr<PrincipalLimits::Slot> PrincipalLimits::Acquire(
    const std::string& principal) {
  if (principal.empty()) return Slot();
  {
    absl::MutexLock lock(&mu_);
    int& held = held_[principal];
    if (held < options_.max_per_principal) {
      ++held;
      return Slot(this, principal);
    }
  }
  if (options_.observe_refused) options_.observe_refused();
  return WaiterSet::RetryLater(
      absl::StrCat(
          options_.what, " of \"", principal,
          "\": ", options_.max_per_principal, " open, the limit per principal",
          options_.flag.empty() ? "" : absl::StrCat(" (", options_.flag, ")"),
          "; retry in ", options_.retry_after_ms, " ms"),
      options_.retry_after_ms);
}

int PrincipalLimits::held(const std::string& principal) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(principal);
  return it == held_.end() ? 0 : it->second;
}

void PrincipalLimits::Give(const std::string& principal) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(principal);
  if (it == held_.end()) return;
  // Forget principals holding nothing: the map stays as small as the
  // number of principals waiting now.
  if (--it->second <= 0) held_.erase(it);
}

}  // namespace mutwo

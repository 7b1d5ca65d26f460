#include "server/profile_trust.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace mutwo {
namespace {

bool Agree(int64_t a, int64_t b, double tolerance) {
  const double larger = static_cast<double>(std::max(a, b));
  return std::abs(static_cast<double>(a) - static_cast<double>(b)) <=
         tolerance * larger;
}

bool Trusted(const std::string& principal, const ProfileTrustOptions& options) {
  return !principal.empty() &&
         std::find(options.trusted_worker_principals.begin(),
                   options.trusted_worker_principals.end(),
                   principal) != options.trusted_worker_principals.end();
}

// The trust domain of `principal`: "trusted" for an operator-trusted one,
// its declared domain, or '' (none: confirms nothing).
std::string DomainOf(const std::string& principal,
                     const ProfileTrustOptions& options) {
  if (Trusted(principal, options)) return "trusted";
  auto it = options.worker_trust_domains.find(principal);
  return it == options.worker_trust_domains.end() ? "" : it->second;
}

// Whether `other`'s measurement may confirm `mine`'s: of another principal,
// and either trusted by the operator or of another declared domain.
bool Independent(const std::string& mine, const std::string& other,
                 const ProfileTrustOptions& options) {
  if (mine.empty() || other.empty() || mine == other) return false;
  if (Trusted(other, options)) return true;
  const std::string mine_domain = DomainOf(mine, options);
  const std::string other_domain = DomainOf(other, options);
  return !mine_domain.empty() && !other_domain.empty() &&
         mine_domain != other_domain;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseWorkerTrustDomains(
    absl::string_view text) {
  std::map<std::string, std::string> domains;
  for (absl::string_view entry :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits('=', 1));
    const std::string principal(absl::StripAsciiWhitespace(parts.first));
    const std::string domain(absl::StripAsciiWhitespace(parts.second));
    if (!absl::StrContains(entry, '=') || principal.empty() || domain.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--worker_trust_domains: \"", entry,
                       "\" is not PRINCIPAL=DOMAIN (e.g. w1=org-a,w2=org-b)"));
    }
    if (!domains.emplace(principal, domain).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--worker_trust_domains: principal \"", principal,
                       "\" is given twice"));
    }
  }
  return domains;
}

absl::Status ValidateProfileTrustOptions(const ProfileTrustOptions& options) {
  if (!(options.agreement_tolerance >= 0 && options.agreement_tolerance < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile_agreement_tolerance must be in [0, 1) (a fraction of the "
        "larger peak), got ",
        options.agreement_tolerance));
  }
  return absl::OkStatus();
}

std::string ProfileDigest(const v1::Profile& profile) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    profile.SerializeToCodedStream(&out);
  }
  return Sha256Hex(bytes);
}

ProfileTrust JudgeProfile(
    storage::ProfileMeasurement mine,
    const std::vector<storage::ProfileMeasurement>& others,
    const ProfileTrustOptions& options) {
  ProfileTrust trust;
  bool disputed = false;
  std::string confirmed_by;
  mine.flag.clear();
  for (const storage::ProfileMeasurement& other : others) {
    if (other.job_id == mine.job_id && other.batch_size == mine.batch_size) {
      continue;
    }
    if (!other.flag.empty()) disputed = true;
    if (!Agree(mine.peak_bytes, other.peak_bytes,
               options.agreement_tolerance)) {
      if (mine.flag.empty()) {
        mine.flag = absl::StrFormat(
            "measured peak %d B by worker %s (principal \"%s\") disagrees "
            "with %d B measured for job %s by worker %s (principal \"%s\"): "
            "more than %g%% apart (--profile_agreement_tolerance)",
            mine.peak_bytes, mine.worker_id, mine.worker_principal,
            other.peak_bytes, other.job_id, other.worker_id,
            other.worker_principal, 100 * options.agreement_tolerance);
      }
      continue;
    }
    if (confirmed_by.empty() && other.flag.empty() &&
        Independent(mine.worker_principal, other.worker_principal, options)) {
      confirmed_by = absl::StrCat("confirmed by worker ", other.worker_id,
                                  " (principal \"", other.worker_principal,
                                  "\", trust domain \"",
                                  DomainOf(other.worker_principal, options),
                                  "\") for job ", other.job_id);
    }
  }
  disputed = disputed || !mine.flag.empty();
  trust.use_shared = !disputed;
  if (!disputed) {
    if (Trusted(mine.worker_principal, options)) {
      trust.trusted_because = absl::StrCat("measured by trusted principal \"",
                                           mine.worker_principal,
                                           "\" (--trusted_worker_principals)");
    } else {
      trust.trusted_because = confirmed_by;
    }
    trust.share = !trust.trusted_because.empty();
  }
  trust.measurement = std::move(mine);
  return trust;
}

}  // namespace mutwo

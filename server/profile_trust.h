// Profile trust: whether a schedule planned from one job's profile may be
// served to another tenant's job. A profile is reported by a worker, and a
// worker token can forge one; the schedule cache therefore binds each entry
// to what produced it (the profile's digest and the measuring worker are in
// its key, storage/schedule_key.h) and shares an entry across tenants only
// when the profile it was planned from is trusted:
//
//  - measured by a worker whose principal an operator trusts
//    (--trusted_worker_principals), or
//  - confirmed: another job's profile of the same measurement key (model,
//    spec, batch size, device, LibTorch) agrees with it (peaks within
//    --profile_agreement_tolerance of the larger), measured by a worker of
//    another trust domain: a principal the operator trusts, or a principal
//    whose domain (--worker_trust_domains) is declared and differs from
//    this one's. Two principals of one domain, or principals of no declared
//    domain, never confirm each other: one party may hold several worker
//    tokens, and only the operator knows which tokens are independent;
//
// and no measurement of that key disagrees with another (a disagreement is
// flagged on the profile that revealed it, counted and logged, and from then
// on every job of that key is planned from its own profile only). A job is
// served a shared entry only when its own profile agrees with every
// measurement of the key, so a job's numbers are always within the tolerance
// of what its own worker measured.
//
// Pure functions over storage rows; thread-safe.
#ifndef MUTWO_SERVER_PROFILE_TRUST_H_
#define MUTWO_SERVER_PROFILE_TRUST_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"
#include "storage/store.h"

namespace mutwo {

struct ProfileTrustOptions {
  // Two measured peaks of one key agree when they differ by at most this
  // fraction of the larger (--profile_agreement_tolerance). Repeated honest
  // profiles of one model on one device differ by far less (the allocator
  // is deterministic; timings, which vary more, are not compared).
  double agreement_tolerance = 0.05;
  // Worker principals whose profiles are trusted without a second
  // measurement (--trusted_worker_principals): an operator's own pool.
  std::vector<std::string> trusted_worker_principals;
  // Worker principal -> the trust domain it belongs to (an organisation or
  // pool that holds its token; --worker_trust_domains). A profile is
  // confirmed only by a measurement from another declared domain (or by a
  // trusted principal); undeclared principals confirm nothing.
  std::map<std::string, std::string> worker_trust_domains;
};

// Parses --worker_trust_domains: comma-separated PRINCIPAL=DOMAIN entries
// (white space around each ignored; empty text: none). InvalidArgument naming
// the flag and the entry for one without '=', with an empty side, or a
// principal given twice.
[[nodiscard]] absl::StatusOr<std::map<std::string, std::string>>
ParseWorkerTrustDomains(absl::string_view text);

// InvalidArgument naming the flag when the tolerance is outside [0, 1).
[[nodiscard]] absl::Status ValidateProfileTrustOptions(
    const ProfileTrustOptions& options);

// SHA-256 (hex) of the profile's deterministic serialization.
std::string ProfileDigest(const v1::Profile& profile);

// What the schedule cache may do with one job's profile.
struct ProfileTrust {
  // The row to store with the profile; `flag` set when it disagrees.
  storage::ProfileMeasurement measurement;
  // May be answered by a shared entry (agrees with every measurement of the
  // key and the key is not disputed).
  bool use_shared = false;
  // Its schedules may be written as shared entries (trusted, see above).
  bool share = false;
  // Why it is trusted ('' when not), for the log.
  std::string trusted_because;
};

// Judges `mine` against `others` (the measurements of its key; its own row,
// if there, is ignored).
ProfileTrust JudgeProfile(
    storage::ProfileMeasurement mine,
    const std::vector<storage::ProfileMeasurement>& others,
    const ProfileTrustOptions& options);

}  // namespace mutwo

#endif  // MUTWO_SERVER_PROFILE_TRUST_H_

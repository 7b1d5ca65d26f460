// The schedule cache key: everything a planned schedule depends on, written
// as one canonical string so that equal requests hit the same row whatever
// way the user spelled them (`60%` and `60.0%`, an unspecified loss and
// `mean`, input order kept because inputs are positional).
//
// Stateless and thread-safe.
#ifndef MUTWO_STORAGE_SCHEDULE_KEY_H_
#define MUTWO_STORAGE_SCHEDULE_KEY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::storage {

struct ScheduleCacheKey {
  std::string model_sha256;
  std::vector<v1::TensorSpec> inputs;  // in the model's argument order
  v1::LossSpec loss;
  v1::OptimizerSpec optimizer;
  int64_t batch_size = 0;
  // From the profile's DeviceInfo: "cpu" or "cuda", and the device name
  // ("NVIDIA H100 80GB HBM3"), since timings and swap bandwidth (and so the
  // schedule) differ between GPU models of the same kind.
  std::string device_kind;
  std::string device_name;
  // Used only for `%dev` budgets, which resolve against it.
  int64_t device_total_bytes = 0;
  std::string libtorch_version;
  v1::MemoryBudget budget;        // `text` is display only and ignored
  v1::Policy policy = v1::MUTWO;  // POLICY_UNSPECIFIED means MUTWO
  std::string planner_version;    // kPlannerVersion unless testing upgrades
  // The owner of the job whose profile the entry was planned from ('' for
  // jobs of a server without authentication). A profile is reported by a
  // worker the tenant does not control, so an entry is served only to jobs
  // of the same tenant: a profile forged for one tenant's job never reaches
  // another tenant's results.
  std::string tenant;
  // What produced the entry: the digest of the profile it was planned from
  // (server/profile_trust.h, ProfileDigest) and the worker that measured it
  // (`principal/worker_id`). Both are part of the key, so an entry is served
  // only to a job whose own profile is that same measurement: a profile forged
  // for one job never answers another job, of any tenant.
  std::string profile_sha256;
  std::string measured_by;
  // A shared entry: planned from a profile the server trusts (confirmed by
  // another worker principal within the agreement tolerance, or measured by
  // an admin-trusted worker), served across tenants to jobs whose own profile
  // agrees with it (server/profile_trust.h). Its key text leaves out the
  // tenant, the digest and the worker; the row still records the last two.
  bool shared = false;
};

// Builds the key for one budget of a job of `tenant` (its owner) at one batch
// size, on the device the profile was measured on, with the current planner
// version.
ScheduleCacheKey MakeScheduleCacheKey(const v1::JobSpec& spec,
                                      int64_t batch_size,
                                      const v1::DeviceInfo& device,
                                      const v1::MemoryBudget& budget,
                                      v1::Policy policy,
                                      const std::string& tenant = "");

// The key of what a profile measures: model, spec, batch size, device and
// LibTorch. Two jobs whose profiles have the same measurement key measured
// the same thing, so their peaks should agree (server/profile_trust.h).
std::string MeasurementKeyString(const v1::JobSpec& spec, int64_t batch_size,
                                 const v1::DeviceInfo& device);

// InvalidArgument naming the first missing or malformed part.
[[nodiscard]] absl::Status ValidateScheduleCacheKey(
    const ScheduleCacheKey& key);

// Canonical text of the input/loss/optimizer part: `x:float32[B,3,224,224]`
// inputs joined by `;`, defaults made explicit (unspecified loss -> mean,
// unspecified optimizer -> sgd, learning rate 0 -> 0.001, momentum 0 -> 0.9
// for sgd_momentum), doubles printed exactly (the shortest of 15-17 significant
// digits that reads back the same).
std::string CanonicalSpecString(const std::vector<v1::TensorSpec>& inputs,
                                const v1::LossSpec& loss,
                                const v1::OptimizerSpec& optimizer);
// `bytes:4294967296`, `baseline:0.6`, `device:0.8@85899345920`.
std::string CanonicalBudgetString(const v1::MemoryBudget& budget,
                                  int64_t device_total_bytes);
// The whole key, `field=value` pairs joined by `|`, free-text values escaped
// so that no two different keys give the same string.
std::string CanonicalKeyString(const ScheduleCacheKey& key);

}  // namespace mutwo::storage

#endif  // MUTWO_STORAGE_SCHEDULE_KEY_H_

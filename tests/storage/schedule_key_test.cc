#include "storage/schedule_key.h"

#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo::storage {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_model_sha256(std::string(64, 'c'));
  *spec.add_inputs() = *ParseTensorSpec("x:float32[B,3,224,224]");
  *spec.add_inputs() = *ParseTensorSpec("tokens:int64[B,128]{0,30000}");
  return spec;
}

v1::DeviceInfo Device() {
  v1::DeviceInfo device;
  device.set_kind("cuda");
  device.set_name("NVIDIA H100 80GB HBM3");
  device.set_total_bytes(int64_t{80} << 30);
  device.set_libtorch_version("2.11.0");
  return device;
}

std::string Key(const v1::JobSpec& spec, const std::string& budget,
                v1::Policy policy = v1::MUTWO,
                const v1::DeviceInfo& device = Device()) {
  return CanonicalKeyString(
      MakeScheduleCacheKey(spec, 32, device, *ParseBudget(budget), policy));
}

TEST(ScheduleKeyTest, KeyNamesEveryPartReadably) {
  const std::string key = Key(Spec(), "60%");
  EXPECT_THAT(key, HasSubstr(std::string(64, 'c')));
  EXPECT_THAT(key, HasSubstr("x:float32[B,3,224,224];tokens:int64[B,128]{0,"));
  EXPECT_THAT(key, HasSubstr("|loss=mean|optimizer=sgd,lr=0.001"));
  EXPECT_THAT(key, HasSubstr("|batch=32|device=cuda,NVIDIA H100 80GB HBM3|"));
  EXPECT_THAT(key, HasSubstr("|libtorch=2.11.0|budget=baseline:0.6"));
  EXPECT_THAT(key, HasSubstr("|policy=MUTWO|planner="));
  EXPECT_THAT(key, HasSubstr(kPlannerVersion));
}

// Keys stored before mse and terms existed still hit: the loss part of a
// single-term loss is spelled as it was.
TEST(ScheduleKeyTest, SingleTermLossKeysAreUnchanged) {
  for (const auto& [text, canonical] :
       std::vector<std::pair<std::string, std::string>>{
           {"mean", "mean"},
           {"sum", "sum"},
           {"model", "model"},
           {"mean@out", "mean@out"},
           {"cross_entropy:y:int64[B]{0,1000}",
            "cross_entropy:y:int64[B]{0,1000}"},
           {"cross_entropy@logits:y:int64[B]{0,1000}",
            "cross_entropy@logits:y:int64[B]{0,1000}"}}) {
    v1::JobSpec spec = Spec();
    *spec.mutable_loss() = *ParseLossSpec(text);
    EXPECT_THAT(Key(spec, "60%"),
                HasSubstr(absl::StrCat("|loss=", canonical, "|optimizer=")))
        << text;
  }
}

// The loss part of the key, kind by kind, exactly as keys already stored in
// SQLite spell it: a change of spelling would miss every cached schedule.
TEST(ScheduleKeyTest, LossKindSpellingsAreTheStoredOnes) {
  for (const auto& [kind, target, canonical] :
       std::vector<std::tuple<v1::LossSpec::Kind, std::string, std::string>>{
           {v1::LossSpec::KIND_UNSPECIFIED, "",
            "inputs=|loss=mean@out|optimizer=sgd,lr=0.001,weight_decay=0"},
           {v1::LossSpec::MEAN, "",
            "inputs=|loss=mean@out|optimizer=sgd,lr=0.001,weight_decay=0"},
           {v1::LossSpec::SUM, "",
            "inputs=|loss=sum@out|optimizer=sgd,lr=0.001,weight_decay=0"},
           {v1::LossSpec::MODEL, "",
            "inputs=|loss=model@out|optimizer=sgd,lr=0.001,weight_decay=0"},
           {v1::LossSpec::CROSS_ENTROPY, "y:int64[B]{0,1000}",
            "inputs=|loss=cross_entropy@out:y:int64[B]{0,1000}|optimizer=sgd,"
            "lr=0.001,weight_decay=0"},
           {v1::LossSpec::MSE, "z:float32[B,4]",
            "inputs=|loss=mse@out:z:float32[B,4]|optimizer=sgd,lr=0.001,weight_"
            "decay=0"}}) {
    v1::LossSpec loss;
    loss.set_kind(kind);
    if (!target.empty()) *loss.mutable_target() = *ParseTensorSpec(target);
    loss.set_output("out");
    EXPECT_EQ(CanonicalSpecString({}, loss, v1::OptimizerSpec()), canonical)
        << v1::LossSpec::Kind_Name(kind);
  }
}

TEST(ScheduleKeyTest, EquivalentSpellingsGiveTheSameKey) {
  v1::JobSpec explicit_defaults = Spec();
  explicit_defaults.mutable_loss()->set_kind(v1::LossSpec::MEAN);
  explicit_defaults.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  explicit_defaults.mutable_optimizer()->set_learning_rate(0.001);
  explicit_defaults.set_model_name("a display name does not matter");
  explicit_defaults.set_max_overhead(0.5);
  EXPECT_EQ(Key(Spec(), "60%"), Key(explicit_defaults, "60.0%"));
  EXPECT_EQ(Key(Spec(), "4GiB"), Key(Spec(), "4096MiB"));
  EXPECT_EQ(Key(Spec(), "60%", v1::MUTWO),
            Key(Spec(), "60%", v1::POLICY_UNSPECIFIED));
}

TEST(ScheduleKeyTest, EveryPlanningInputChangesTheKey) {
  const std::string base = Key(Spec(), "60%");
  v1::JobSpec reordered;
  reordered.set_model_sha256(Spec().model_sha256());
  *reordered.add_inputs() = Spec().inputs(1);
  *reordered.add_inputs() = Spec().inputs(0);
  EXPECT_NE(Key(reordered, "60%"), base);  // inputs are positional
  v1::JobSpec adam = Spec();
  adam.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  EXPECT_NE(Key(adam, "60%"), base);
  // Temporaries of all parameters at once: another floor, another key.
  v1::JobSpec adam_foreach = adam;
  adam_foreach.mutable_optimizer()->set_foreach_update(true);
  EXPECT_NE(Key(adam_foreach, "60%"), Key(adam, "60%"));
  EXPECT_THAT(Key(adam_foreach, "60%"), HasSubstr(",weight_decay=0,foreach|"));
  v1::JobSpec ce = Spec();
  *ce.mutable_loss() = *ParseLossSpec("cross_entropy:y:int64[B]{0,1000}");
  EXPECT_NE(Key(ce, "60%"), base);
  // The output the loss reads: another step, another key.
  v1::JobSpec ce_logits = ce;
  ce_logits.mutable_loss()->set_output("logits");
  v1::JobSpec ce_aux = ce;
  ce_aux.mutable_loss()->set_output("aux");
  EXPECT_NE(Key(ce_logits, "60%"), Key(ce, "60%"));
  EXPECT_NE(Key(ce_logits, "60%"), Key(ce_aux, "60%"));
  // Another output, an mse target or another sum of terms is another step.
  std::set<std::string> losses;
  for (const char* text :
       {"mean", "mean@aux", "cross_entropy@logits:y:int64[B]{0,1000}",
        "mse:y:float32[B,1000]", "mse@aux:y:float32[B,1000]",
        "cross_entropy@logits:y:int64[B]{0,1000}+mse@aux:z:float32[B,4]",
        "cross_entropy@logits:y:int64[B]{0,1000}+mse@aux:z:float32[B,8]"}) {
    v1::JobSpec spec = Spec();
    *spec.mutable_loss() = *ParseLossSpec(text);
    EXPECT_TRUE(losses.insert(Key(spec, "60%")).second) << text;
  }
  // An output name cannot pose as another term or another field.
  v1::JobSpec plus = Spec();
  *plus.mutable_loss() = *ParseLossSpec("mean");
  plus.mutable_loss()->set_output("a+mean");
  v1::JobSpec two = Spec();
  *two.mutable_loss() = *ParseLossSpec("mean@a+mean");
  EXPECT_NE(Key(plus, "60%"), Key(two, "60%"));
  EXPECT_NE(Key(Spec(), "61%"), base);
  EXPECT_NE(Key(Spec(), "60%dev"), base);
  EXPECT_NE(Key(Spec(), "60%", v1::SQRT_N), base);
  v1::DeviceInfo a100 = Device();
  a100.set_name("NVIDIA A100-SXM4-40GB");
  EXPECT_NE(Key(Spec(), "60%", v1::MUTWO, a100), base);
  // A fraction of the device depends on how big the device is.
  v1::DeviceInfo small = Device();
  small.set_total_bytes(int64_t{40} << 30);
  EXPECT_NE(Key(Spec(), "80%dev", v1::MUTWO, small), Key(Spec(), "80%dev"));
  EXPECT_EQ(Key(Spec(), "60%", v1::MUTWO, small), base);  // not for %
}

// Entries are per tenant (the job's owner): the same request of two tenants
// is two keys, and a tenant name cannot spell its way into another's key.
// Without authentication (tenant '') the key is what it was before tenants.
TEST(ScheduleKeyTest, EachTenantHasItsOwnKey) {
  auto key = [](const std::string& tenant) {
    return CanonicalKeyString(MakeScheduleCacheKey(
        Spec(), 32, Device(), *ParseBudget("60%"), v1::MUTWO, tenant));
  };
  EXPECT_NE(key("alice"), key("bob"));
  EXPECT_NE(key("alice"), key(""));
  EXPECT_THAT(key("alice"), HasSubstr("|tenant=alice"));
  EXPECT_EQ(key(""), Key(Spec(), "60%"));
  EXPECT_THAT(key(""), Not(HasSubstr("tenant")));
  EXPECT_NE(key("a|tenant=b"), key("a"));
}

TEST(ScheduleKeyTest, SeparatorsInsideValuesCannotForgeAnotherKey) {
  v1::DeviceInfo forged = Device();
  forged.set_libtorch_version("2.11.0|budget=bytes:1");
  const std::string key = Key(Spec(), "60%", v1::MUTWO, forged);
  EXPECT_THAT(key, HasSubstr("2.11.0%7Cbudget%3Dbytes%3A1"));
  EXPECT_NE(key, Key(Spec(), "60%"));
}

TEST(ScheduleKeyTest, ValidateNamesTheMissingPart) {
  ScheduleCacheKey key = MakeScheduleCacheKey(Spec(), 32, Device(),
                                              *ParseBudget("60%"), v1::MUTWO);
  EXPECT_TRUE(ValidateScheduleCacheKey(key).ok());
  ScheduleCacheKey no_batch = key;
  no_batch.batch_size = 0;
  EXPECT_THAT(ValidateScheduleCacheKey(no_batch).message(),
              HasSubstr("batch size"));
  ScheduleCacheKey no_budget = key;
  no_budget.budget.Clear();
  EXPECT_THAT(ValidateScheduleCacheKey(no_budget).message(),
              HasSubstr("budget"));
  ScheduleCacheKey no_device_size = key;
  no_device_size.budget = *ParseBudget("80%dev");
  no_device_size.device_total_bytes = 0;
  EXPECT_THAT(ValidateScheduleCacheKey(no_device_size).message(),
              HasSubstr("device total bytes"));
}

}  // namespace
}  // namespace mutwo::storage

#include "common/parse.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseBytes, Units) {
  EXPECT_EQ(*ParseBytes("123456"), 123456);
  EXPECT_EQ(*ParseBytes("4GiB"), int64_t{4} << 30);
  EXPECT_EQ(*ParseBytes("4000MB"), int64_t{4000} * 1000 * 1000);
  EXPECT_EQ(*ParseBytes("1.5KiB"), 1536);
  EXPECT_EQ(*ParseBytes(" 2 MiB "), 2 << 20);
}

TEST(ParseBytes, ErrorsNameTheText) {
  EXPECT_EQ(ParseBytes("4GX").status().message(),
            "size \"4GX\": unknown unit \"GX\"; use B, KB, MB, GB, TB, KiB, "
            "MiB, GiB or TiB");
  EXPECT_EQ(ParseBytes("lots").status().message(),
            "size \"lots\": expected a number with an optional unit, like "
            "4GiB, 4000MB or 123456");
  EXPECT_FALSE(ParseBytes("0").ok());
  EXPECT_FALSE(ParseBytes("").ok());
}

TEST(ParseBudget, Kinds) {
  auto pct = ParseBudget("60%");
  ASSERT_TRUE(pct.ok());
  EXPECT_DOUBLE_EQ(pct->fraction_of_baseline(), 0.6);
  auto dev = ParseBudget("80%dev");
  ASSERT_TRUE(dev.ok());
  EXPECT_DOUBLE_EQ(dev->fraction_of_device(), 0.8);
  auto abs = ParseBudget("4GiB");
  ASSERT_TRUE(abs.ok());
  EXPECT_EQ(abs->bytes(), int64_t{4} << 30);
  EXPECT_EQ(abs->text(), "4GiB");
  auto floor = ParseBudget(" FLOOR ");
  ASSERT_TRUE(floor.ok());
  EXPECT_TRUE(floor->floor());
  EXPECT_EQ(floor->text(), "floor");
  EXPECT_EQ(FormatBudget(*floor), "floor");
}

TEST(ParseBudget, Errors) {
  EXPECT_EQ(ParseBudget("160%").status().message(),
            "budget \"160%\": a percentage must be a number in (0, 100], like "
            "60%");
  EXPECT_THAT(std::string(ParseBudget("big").status().message()),
              HasSubstr("budget \"big\": expected bytes"));
}

TEST(ValidateBudget, RefusesWhatNoTextParsesTo) {
  v1::MemoryBudget b;
  EXPECT_THAT(std::string(ValidateBudget(b).message()), HasSubstr("no kind"));
  b.set_bytes(0);
  EXPECT_EQ(ValidateBudget(b).message(),
            "budget \"0 B\": bytes must be positive, fractions in (0, 1] and "
            "knee or floor true");
  b.set_bytes(1);
  EXPECT_TRUE(ValidateBudget(b).ok());
  for (double f : {0.0, -0.5, 1.5}) {
    b.set_fraction_of_baseline(f);
    EXPECT_FALSE(ValidateBudget(b).ok()) << f;
    b.set_fraction_of_device(f);
    EXPECT_FALSE(ValidateBudget(b).ok()) << f;
  }
  b.set_fraction_of_device(1.0);
  EXPECT_TRUE(ValidateBudget(b).ok());
  b.set_knee(false);
  EXPECT_FALSE(ValidateBudget(b).ok());
  b.set_floor(true);
  EXPECT_TRUE(ValidateBudget(b).ok());
}

TEST(ParseBudget, BareNumbersAreRefusedAsAmbiguous) {
  for (const char* text : {"60", "60.5", "4000000"}) {
    auto budget = ParseBudget(text);
    ASSERT_FALSE(budget.ok()) << text;
    EXPECT_EQ(budget.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(budget.status().message()),
                HasSubstr("a bare number is ambiguous; say"));
  }
  EXPECT_EQ(ParseBudget("60").status().message(),
            "budget \"60\": a bare number is ambiguous; say 60% or 60MiB or "
            "60B");
  // Units and percentages keep working; a byte count says B.
  EXPECT_EQ(ParseBudget("60B")->bytes(), 60);
  EXPECT_EQ(ParseBudget("60MiB")->bytes(), int64_t{60} << 20);
  EXPECT_DOUBLE_EQ(ParseBudget("60%")->fraction_of_baseline(), 0.6);
  EXPECT_DOUBLE_EQ(ParseBudget("60%DEV")->fraction_of_device(), 0.6);
}

TEST(ParseNames, LossOptimizerAndDTypeInAnyCase) {
  EXPECT_EQ(ParseLossSpec("MEAN")->kind(), v1::LossSpec::MEAN);
  EXPECT_EQ(ParseLossSpec("Cross_Entropy:y:INT64[B]{0,10}")->kind(),
            v1::LossSpec::CROSS_ENTROPY);
  EXPECT_EQ(ParseOptimizerSpec("AdamW:lr=0.1")->kind(),
            v1::OptimizerSpec::ADAMW);
  EXPECT_EQ(ParseTensorSpec("x:Float32[B,3]")->dtype(), v1::FLOAT32);
}

TEST(CheckBatchDims, ASpecWithoutBIsRefusedNamingIt) {
  const v1::TensorSpec fixed = *ParseTensorSpec("x:float32[64,3,32,32]");
  const v1::TensorSpec batched = *ParseTensorSpec("y:float32[B,4]");
  const absl::Status s = CheckBatchDims({batched, fixed}, nullptr, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "input spec \"x:float32[64,3,32,32]\" has no batch dimension B, "
            "so --batch would not change it; write B where the batch size "
            "goes (like x:float32[B,3,32,32]), or pass --unbatched x if it "
            "really has no batch dimension");
  EXPECT_TRUE(CheckBatchDims({batched, fixed}, nullptr, {"x"}).ok());
  EXPECT_TRUE(CheckBatchDims({batched}, nullptr, {}).ok());
}

TEST(CheckBatchDims, LossTargetAndUnbatchedNamesAreCheckedToo) {
  const v1::TensorSpec x = *ParseTensorSpec("x:float32[B,4]");
  const v1::LossSpec loss = *ParseLossSpec("cross_entropy:y:int64[8]{0,4}");
  const v1::LossSpec terms =
      *ParseLossSpec("cross_entropy@a:y:int64[B]{0,4}+mse@b:z:float32[4]");
  EXPECT_THAT(std::string(CheckBatchDims({x}, &terms, {}).message()),
              HasSubstr("\"z:float32[4]\" has no batch dimension B"));
  EXPECT_TRUE(CheckBatchDims({x}, &terms, {"z"}).ok());
  EXPECT_THAT(std::string(CheckBatchDims({x}, &loss, {}).message()),
              HasSubstr("input spec \"y:int64[8]{0,4}\" has no batch"));
  EXPECT_TRUE(CheckBatchDims({x}, &loss, {"y"}).ok());
  EXPECT_THAT(std::string(CheckBatchDims({x}, nullptr, {"z"}).message()),
              HasSubstr("--unbatched \"z\": no --input"));
  EXPECT_THAT(std::string(CheckBatchDims({x}, nullptr, {"x"}).message()),
              HasSubstr("has the batch dimension B"));
}

TEST(ParseTensorSpec, FloatWithBatch) {
  auto spec = ParseTensorSpec("x:float32[B,3,224,224]");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "x");
  EXPECT_EQ(spec->dtype(), v1::FLOAT32);
  EXPECT_THAT(spec->dims(), ElementsAre(kBatchDim, 3, 224, 224));
  EXPECT_FALSE(spec->has_range());
  EXPECT_THAT(ConcreteDims(*spec, 8), ElementsAre(8, 3, 224, 224));
  EXPECT_EQ(TensorBytes(*spec, 8), int64_t{8} * 3 * 224 * 224 * 4);
  EXPECT_EQ(FormatTensorSpec(*spec), "x:float32[B,3,224,224]");
}

TEST(ParseTensorSpec, IntegerWithRange) {
  auto spec = ParseTensorSpec("tokens:int64[B,128]{0,30000}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dtype(), v1::INT64);
  EXPECT_DOUBLE_EQ(spec->range().low(), 0);
  EXPECT_DOUBLE_EQ(spec->range().high(), 30000);
  EXPECT_EQ(FormatTensorSpec(*spec), "tokens:int64[B,128]{0,30000}");
}

TEST(ParseTensorSpec, ErrorsAreExact) {
  const std::string kHint =
      "; expected NAME:DTYPE[DIMS]{LOW,HIGH}, like x:float32[B,3,224,224] or "
      "tokens:int64[B,128]{0,30000}";
  EXPECT_EQ(ParseTensorSpec("x:float33[B,3]").status().message(),
            "input spec \"x:float33[B,3]\": unknown dtype \"float33\"; use one "
            "of float32, float64, float16, bfloat16, int64, int32, int8, "
            "uint8, bool" +
                kHint);
  EXPECT_EQ(ParseTensorSpec("x:float32[B,0]").status().message(),
            "input spec \"x:float32[B,0]\": dimension \"0\" must be a positive "
            "integer or B" +
                kHint);
  EXPECT_EQ(ParseTensorSpec("tokens:int64[B,128]").status().message(),
            "input spec \"tokens:int64[B,128]\": integer input \"tokens\" "
            "needs a value range {LOW,HIGH}" +
                kHint);
  EXPECT_EQ(ParseTensorSpec("x float32[B]").status().message(),
            "input spec \"x float32[B]\": missing ':' after the name" + kHint);
  EXPECT_EQ(ParseTensorSpec("t:int64[B]{5,1}").status().message(),
            "input spec \"t:int64[B]{5,1}\": value range \"{5,1}\" must have "
            "LOW < HIGH" +
                kHint);
  EXPECT_FALSE(ParseTensorSpec("x:float32[B,3").ok());
}

TEST(ParseLossSpec, OutputSelector) {
  auto seg = ParseLossSpec("cross_entropy@out:y:int64[B,64,64]{0,21}");
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(seg->kind(), v1::LossSpec::CROSS_ENTROPY);
  EXPECT_EQ(seg->output(), "out");
  EXPECT_EQ(seg->target().dims_size(), 3);
  EXPECT_EQ(FormatLossSpec(*seg), "cross_entropy@out:y:int64[B,64,64]{0,21}");
  auto mean = ParseLossSpec("mean@0");
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(mean->output(), "0");
  EXPECT_EQ(FormatLossSpec(*mean), "mean@0");
  EXPECT_EQ(FormatLossSpec(*ParseLossSpec("mean")), "mean");
  EXPECT_THAT(std::string(ParseLossSpec("mean@").status().message()),
              HasSubstr("after '@'"));
  EXPECT_THAT(std::string(ParseLossSpec("mean:y:int64[B]").status().message()),
              HasSubstr("mean takes no target"));
}

TEST(ParseLossSpec, Kinds) {
  EXPECT_EQ(ParseLossSpec("mean")->kind(), v1::LossSpec::MEAN);
  EXPECT_EQ(ParseLossSpec("sum")->kind(), v1::LossSpec::SUM);
  EXPECT_EQ(ParseLossSpec("model")->kind(), v1::LossSpec::MODEL);
  auto ce = ParseLossSpec("cross_entropy:y:int64[B]{0,1000}");
  ASSERT_TRUE(ce.ok()) << ce.status();
  EXPECT_EQ(ce->kind(), v1::LossSpec::CROSS_ENTROPY);
  EXPECT_EQ(ce->target().name(), "y");
  EXPECT_EQ(FormatLossSpec(*ce), "cross_entropy:y:int64[B]{0,1000}");
  EXPECT_THAT(
      std::string(
          ParseLossSpec("cross_entropy:y:float32[B]").status().message()),
      HasSubstr("must be int64"));
  EXPECT_THAT(std::string(ParseLossSpec("mae").status().message()),
              HasSubstr("loss \"mae\": unknown loss kind \"mae\"; use mean, "
                        "sum, model, cross_entropy:TARGET"));
}

TEST(ParseLossSpec, MseRoundTripsAndWantsAFloatTarget) {
  for (const char* text : {"mse:z:float32[B,4]", "mse@aux:z:float64[B,4,4]",
                           "mse@1:z:bfloat16[B]"}) {
    auto mse = ParseLossSpec(text);
    ASSERT_TRUE(mse.ok()) << text << ": " << mse.status();
    EXPECT_EQ(mse->kind(), v1::LossSpec::MSE);
    EXPECT_EQ(FormatLossSpec(*mse), text);
    EXPECT_EQ(FormatLossSpec(*ParseLossSpec(FormatLossSpec(*mse))), text);
  }
  EXPECT_EQ(ParseLossSpec("MSE@aux:z:float32[B,4]")->output(), "aux");
  EXPECT_THAT(std::string(ParseLossSpec("mse").status().message()),
              HasSubstr("loss \"mse\": mse needs a target spec after ':', "
                        "like mse:z:float32[B,4]"));
  EXPECT_THAT(
      std::string(ParseLossSpec("mse:z:int64[B]{0,4}").status().message()),
      HasSubstr("loss \"mse:z:int64[B]{0,4}\": an mse target is compared "
                "with a floating-point output and must be float32"));
  EXPECT_THAT(
      std::string(ParseLossSpec("mse:z:float32[B,x]").status().message()),
      HasSubstr("loss \"mse:z:float32[B,x]\": target input spec"));
}

TEST(ParseLossSpec, TermsAreSummedAndRoundTrip) {
  const std::string text =
      "cross_entropy@logits:y:int64[B]{0,10}+mse@aux:z:float32[B,4]";
  auto loss = ParseLossSpec(text);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_EQ(loss->terms_size(), 2);
  EXPECT_EQ(loss->kind(), v1::LossSpec::KIND_UNSPECIFIED);
  EXPECT_EQ(loss->terms(0).kind(), v1::LossSpec::CROSS_ENTROPY);
  EXPECT_EQ(loss->terms(0).output(), "logits");
  EXPECT_EQ(loss->terms(1).kind(), v1::LossSpec::MSE);
  EXPECT_EQ(loss->terms(1).target().name(), "z");
  EXPECT_EQ(FormatLossSpec(*loss), text);
  // Spaces around +, and a + inside a value range, do not split.
  auto spaced = ParseLossSpec("mse@a:z:float32[B] + mean@b");
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_EQ(FormatLossSpec(*spaced), "mse@a:z:float32[B]+mean@b");
  auto range = ParseLossSpec("cross_entropy@a:y:int64[B]{0,1e+3}+sum@b");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->terms(0).target().range().high(), 1000);
  // The repeated flag is the same loss.
  auto flags = ParseLossFlags(
      {"cross_entropy@logits:y:int64[B]{0,10}", "mse@aux:z:float32[B,4]"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(FormatLossSpec(*flags), text);
  EXPECT_EQ(FormatLossSpec(*ParseLossFlags({})), "mean");
  // One target per term, in order.
  const std::vector<v1::TensorSpec> targets = LossTargets(*loss);
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[0].name(), "y");
  EXPECT_EQ(targets[1].name(), "z");
  // Errors name the whole loss and the bad term.
  EXPECT_THAT(
      std::string(
          ParseLossSpec("mean@a+mse@b:z:int8[B]{0,2}").status().message()),
      HasSubstr("loss \"mean@a+mse@b:z:int8[B]{0,2}\", term "
                "\"mse@b:z:int8[B]{0,2}\": an mse target"));
  EXPECT_THAT(std::string(ParseLossSpec("mean@a+").status().message()),
              HasSubstr("term \"\": empty term"));
  EXPECT_THAT(std::string(ParseLossSpec("mse@a:z:float32[B]+mse@b:z:float32[B]")
                              .status()
                              .message()),
              HasSubstr("two loss terms name their target \"z\""));
}

TEST(ValidateLossSpec, RefusesWhatNoParserMakes) {
  // What a client other than ours might submit.
  v1::LossSpec nested = *ParseLossSpec("mean@a+sum@b");
  *nested.add_terms() = *ParseLossSpec("mean@c+sum@d");
  EXPECT_THAT(std::string(ValidateLossSpec(nested).message()),
              HasSubstr("cannot have terms of its own"));
  v1::LossSpec beside = *ParseLossSpec("mean@a+sum@b");
  beside.set_kind(v1::LossSpec::MSE);
  EXPECT_THAT(std::string(ValidateLossSpec(beside).message()),
              HasSubstr("not beside them"));
  v1::LossSpec no_target;
  no_target.set_kind(v1::LossSpec::MSE);
  EXPECT_THAT(std::string(ValidateLossSpec(no_target).message()),
              HasSubstr("mse needs a target spec"));
  EXPECT_TRUE(ValidateLossSpec(v1::LossSpec()).ok());
}

TEST(ParseOptimizerSpec, KindsAndSettings) {
  EXPECT_EQ(ParseOptimizerSpec("adam")->kind(), v1::OptimizerSpec::ADAM);
  EXPECT_EQ(ParseOptimizerSpec("none")->kind(), v1::OptimizerSpec::NONE);
  auto sgd = ParseOptimizerSpec("sgd_momentum:lr=0.1,momentum=0.8");
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_DOUBLE_EQ(sgd->learning_rate(), 0.1);
  EXPECT_DOUBLE_EQ(sgd->momentum(), 0.8);
  EXPECT_THAT(std::string(ParseOptimizerSpec("adam:beta=1").status().message()),
              HasSubstr("unknown setting \"beta\""));
  EXPECT_FALSE(ParseOptimizerSpec("lamb").ok());
  EXPECT_FALSE(ParseOptimizerSpec("adam")->foreach_update());
  auto all = ParseOptimizerSpec("adamw:lr=0.01,foreach");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->foreach_update());
  EXPECT_DOUBLE_EQ(all->learning_rate(), 0.01);
  EXPECT_EQ(FormatOptimizerSpec(*all), "adamw:foreach");
  EXPECT_EQ(FormatOptimizerSpec(*ParseOptimizerSpec("adam")), "adam");
  EXPECT_THAT(std::string(ParseOptimizerSpec("adam:fused").status().message()),
              HasSubstr("use lr, momentum, weight_decay or foreach"));
}

TEST(ParseBatchSizes, Forms) {
  EXPECT_THAT(*ParseBatchSizes("16"), ElementsAre(16));
  EXPECT_THAT(*ParseBatchSizes("8,16,32"), ElementsAre(8, 16, 32));
  EXPECT_THAT(*ParseBatchSizes("8:64"), ElementsAre(8, 16, 32, 64));
  EXPECT_THAT(*ParseBatchSizes("8:64:x4"), ElementsAre(8, 32));
  EXPECT_THAT(*ParseBatchSizes("8:32:+8"), ElementsAre(8, 16, 24, 32));
  EXPECT_EQ(ParseBatchSizes("64:8").status().message(),
            "batch sizes \"64:8\": TO must not be below FROM");
  EXPECT_EQ(ParseBatchSizes("8,8").status().message(),
            "batch sizes \"8,8\": batch size 8 is listed twice");
  EXPECT_EQ(ParseBatchSizes("8,x").status().message(),
            "batch sizes \"8,x\": expected a positive integer, got \"x\"");
}

TEST(ValidateInputs, RejectsDuplicatesAndEmpty) {
  EXPECT_FALSE(ValidateInputs({}).ok());
  v1::TensorSpec a = *ParseTensorSpec("x:float32[B,3]");
  EXPECT_TRUE(ValidateInputs({a}).ok());
  EXPECT_EQ(ValidateInputs({a, a}).message(), "input \"x\" is given twice");
}

TEST(FormatBytes, HumanUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.00 GiB");
}

}  // namespace
}  // namespace mutwo

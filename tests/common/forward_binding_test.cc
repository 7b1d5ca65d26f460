// The input specs bound to forward's arguments (common/forward_binding.h):
// by name in any order, by position when no spec names an argument,
// Optional and defaulted arguments left out, and each refusal naming the
// argument and the signature.
#include "common/forward_binding.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace mutwo {
namespace {

v1::TensorSpec Spec(const std::string& name) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(v1::FLOAT32);
  spec.add_dims(-1);
  return spec;
}

const std::vector<ForwardArgument> kImageText = {
    {"image", "Tensor", std::nullopt},
    {"text", "Tensor", std::nullopt},
    {"mask", "Optional[Tensor]", "None"},
    {"scale", "float", "1."},
};

TEST(ForwardBindingTest, SpecsNamingArgumentsBindByNameInAnyOrder) {
  const auto bound =
      BindSpecsToArguments(kImageText, {Spec("text"), Spec("image")});
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, (std::vector<int>{1, 0, -1, -1}));
}

TEST(ForwardBindingTest, UnnamedSpecsBindByPosition) {
  const auto bound = BindSpecsToArguments(kImageText, {Spec("a"), Spec("b")});
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, (std::vector<int>{0, 1, -1, -1}));
}

TEST(ForwardBindingTest, ARequiredArgumentWithoutSpecIsNamed) {
  const auto bound = BindSpecsToArguments(kImageText, {Spec("image")});
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bound.status().message(),
            "forward's argument text (Tensor) has no --input spec and no "
            "default: give --input text:DTYPE[DIMS] (forward(image: Tensor, "
            "text: Tensor, mask: Optional[Tensor] = None, scale: float = "
            "1.))");
}

TEST(ForwardBindingTest, OptionalWithoutDefaultMayBeLeftOut) {
  const std::vector<ForwardArgument> arguments = {
      {"x", "Tensor", std::nullopt},
      {"mask", "Optional[Tensor]", std::nullopt}};
  const auto bound = BindSpecsToArguments(arguments, {Spec("x")});
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, (std::vector<int>{0, -1}));
}

TEST(ForwardBindingTest, ASpecNamingNoArgumentIsRefusedWhenOthersName) {
  const auto bound =
      BindSpecsToArguments(kImageText, {Spec("image"), Spec("txt")});
  ASSERT_FALSE(bound.ok());
  EXPECT_TRUE(absl::StartsWith(bound.status().message(),
                               "--input txt names no argument of forward("))
      << bound.status();
}

TEST(ForwardBindingTest, TwoSpecsForOneArgumentAreRefused) {
  const auto bound = BindSpecsToArguments(
      kImageText, {Spec("image"), Spec("text"), Spec("image")});
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().message(),
            "two --input specs for forward's argument image");
}

TEST(ForwardBindingTest, MoreSpecsThanArgumentsAreRefused) {
  const std::vector<ForwardArgument> one = {{"x", "Tensor", std::nullopt}};
  const auto bound = BindSpecsToArguments(one, {Spec("a"), Spec("b")});
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().message(),
            "forward takes 1 inputs, got 2 --input specs: forward(x: Tensor)");
}

// A spec is always a tensor (the worker makes one from it): an argument
// declared int, float or bool cannot take one, and the refusal names the
// argument, its type and the spec, by name and by position alike.
TEST(ForwardBindingTest, ASpecForAScalarArgumentIsRefusedNamingItsType) {
  const auto by_name = BindSpecsToArguments(
      kImageText, {Spec("image"), Spec("text"), Spec("scale")});
  ASSERT_FALSE(by_name.ok());
  EXPECT_EQ(by_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(by_name.status().message(),
            "--input scale:float32[B] gives a tensor to forward's argument "
            "scale, declared float: an --input spec is always a tensor; "
            "leave scale out (its default is 1.), or declare it Tensor "
            "(forward(image: Tensor, text: Tensor, mask: Optional[Tensor] = "
            "None, scale: float = 1.))");
  const auto by_position = BindSpecsToArguments(
      kImageText, {Spec("a"), Spec("b"), Spec("c"), Spec("d")});
  ASSERT_FALSE(by_position.ok());
  EXPECT_TRUE(absl::StartsWith(by_position.status().message(),
                               "--input d:float32[B] gives a tensor to "
                               "forward's argument scale, declared float"))
      << by_position.status();
  const std::vector<ForwardArgument> counted = {
      {"x", "Tensor", std::nullopt},
      {"steps", "int", std::nullopt},
      {"flag", "Optional[bool]", std::nullopt}};
  const auto required =
      BindSpecsToArguments(counted, {Spec("x"), Spec("steps")});
  ASSERT_FALSE(required.ok());
  EXPECT_TRUE(absl::StrContains(required.status().message(),
                                "argument steps, declared int: an --input "
                                "spec is always a tensor; give steps a "
                                "default in forward, or declare it Tensor"))
      << required.status();
  const auto optional =
      BindSpecsToArguments({counted[0], counted[2]}, {Spec("x"), Spec("flag")});
  ASSERT_FALSE(optional.ok());
  EXPECT_TRUE(absl::StrContains(optional.status().message(),
                                "argument flag, declared Optional[bool]: an "
                                "--input spec is always a tensor; leave flag "
                                "out (it is Optional: None)"))
      << optional.status();
  // Left out, the int has no value: said so, not "give --input steps".
  const auto left_out = BindSpecsToArguments(counted, {Spec("x")});
  ASSERT_FALSE(left_out.ok());
  EXPECT_EQ(left_out.status().message(),
            "forward's argument steps (int) has no default, and an --input "
            "spec (always a tensor) cannot give it one: give steps a default "
            "in forward, or declare it Tensor (forward(x: Tensor, steps: int, "
            "flag: Optional[bool]))");
}

TEST(ForwardBindingTest, TensorArgumentsTakeSpecsOptionalOrNot) {
  const auto bound = BindSpecsToArguments(
      kImageText, {Spec("image"), Spec("text"), Spec("mask")});
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, (std::vector<int>{0, 1, 2, -1}));
}

}  // namespace
}  // namespace mutwo

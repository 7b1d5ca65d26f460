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

}  // namespace
}  // namespace mutwo

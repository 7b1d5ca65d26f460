// A TorchScript archive read without LibTorch (common/model_archive.h) over
// real archives that torch 1.13 wrote (/usr/bin/python3): forward's
// arguments of a scripted model with Optional and defaulted arguments, of a
// two-input model and of a traced one; torch.save pickles (zip and legacy)
// and a truncated archive refused with the worker's messages; code this
// reader does not understand leaves the schema unknown and is not refused.
#include "common/model_archive.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/command.h"

namespace mutwo {
namespace {

// The models, written once for all tests by a Python with torch.
constexpr char kMakeModels[] = R"PY(
import sys, zipfile, torch
from typing import Optional
out = sys.argv[1]

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x, mask: Optional[torch.Tensor] = None, k: int = 3):
        y = self.fc(x)
        if mask is not None:
            y = y * mask
        return y * k

class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, image, text):
        return self.conv(image).mean(dim=(2, 3)) + self.fc(text)

class Scalars(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x, steps: int, scale: float = 2.0, flag: bool = False):
        for _ in range(steps):
            x = self.fc(x)
        return x * scale if flag else x

torch.jit.script(Net()).save(out + "/scripted.pt")
torch.jit.script(Scalars()).save(out + "/scalars.pt")
torch.jit.script(TwoInputs()).save(out + "/two_inputs.pt")
seq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                          torch.nn.Linear(8, 2))
torch.jit.trace(seq, torch.randn(2, 4)).save(out + "/traced.pt")
torch.save(Net(), out + "/pickle.pt")
torch.save(Net().state_dict(), out + "/legacy_pickle.pt",
           _use_new_zipfile_serialization=False)
data = open(out + "/scripted.pt", "rb").read()
open(out + "/truncated.pt", "wb").write(data[: len(data) // 2])
# An archive whose forward this reader cannot parse (a parameter without a
# type), in an otherwise TorchScript-shaped archive.
with zipfile.ZipFile(out + "/odd.pt", "w") as z:
    z.writestr("odd/data.pkl", b"\x80\x02c__torch__\nOdd\nq\x00)\x81.")
    z.writestr("odd/code/__torch__.py",
               "class Odd(Module):\n  def forward(self: __torch__.Odd,\n"
               "    *args) -> Tensor:\n    return args[0]\n",
               compress_type=zipfile.ZIP_DEFLATED)
    z.writestr("odd/version", b"3")
)PY";

class ModelArchiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                            absl::StrCat("model_archive_test_", getpid()))
                               .string());
    std::filesystem::create_directories(*dir_);
    const std::string script = *dir_ + "/make.py";
    std::ofstream(script) << kMakeModels;
    const auto made = testing::RunCommand(
        absl::StrCat("/usr/bin/python3 ", script, " ", *dir_));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static std::string Bytes(const std::string& name) {
    std::ifstream in(*dir_ + "/" + name, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    return bytes.str();
  }
  static std::string Path(const std::string& name) {
    return *dir_ + "/" + name;
  }

  static std::string* dir_;
};
std::string* ModelArchiveTest::dir_ = nullptr;

v1::TensorSpec Spec(const std::string& name) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(v1::FLOAT32);
  spec.add_dims(-1);
  spec.add_dims(4);
  return spec;
}

std::string Arguments(const ForwardSchema& schema) {
  return ForwardSignature(schema.arguments);
}

TEST_F(ModelArchiveTest, ScriptedModelsOptionalAndDefaultArguments) {
  const ForwardSchema schema = ReadForwardSchema(Bytes("scripted.pt"));
  ASSERT_TRUE(schema.known) << schema.unknown_reason;
  EXPECT_EQ(schema.class_name, "__torch__.Net");
  EXPECT_EQ(Arguments(schema),
            "forward(x: Tensor, mask: Optional[Tensor] = None, k: int = 3)");
}

TEST_F(ModelArchiveTest, TwoInputModelsArgumentsInOrder) {
  const ForwardSchema schema = ReadForwardSchema(Bytes("two_inputs.pt"));
  ASSERT_TRUE(schema.known) << schema.unknown_reason;
  EXPECT_EQ(Arguments(schema), "forward(image: Tensor, text: Tensor)");
}

TEST_F(ModelArchiveTest, TracedModelsForwardIsReadFromItsCode) {
  const ForwardSchema schema = ReadForwardSchema(Bytes("traced.pt"));
  ASSERT_TRUE(schema.known) << schema.unknown_reason;
  EXPECT_EQ(schema.class_name,
            "__torch__.torch.nn.modules.container.Sequential");
  EXPECT_EQ(Arguments(schema), "forward(input: Tensor)");
}

TEST_F(ModelArchiveTest, InputsGivenOutOfOrderByNameAreAccepted) {
  ForwardSchema schema;
  ASSERT_TRUE(CheckModelInputs(Bytes("two_inputs.pt"), "two_inputs",
                               {Spec("text"), Spec("image")}, &schema)
                  .ok());
  EXPECT_TRUE(schema.known);
}

TEST_F(ModelArchiveTest, OptionalArgumentsMayBeLeftOut) {
  EXPECT_TRUE(
      CheckModelInputs(Bytes("scripted.pt"), "net", {Spec("x")}, nullptr).ok());
}

TEST_F(ModelArchiveTest, AMissingInputIsRefusedNamingTheArgument) {
  const absl::Status status = CheckModelInputs(
      Bytes("two_inputs.pt"), "two_inputs", {Spec("image")}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "model two_inputs: forward's argument text (Tensor) has no "
            "--input spec and no default: give --input text:DTYPE[DIMS] "
            "(forward(image: Tensor, text: Tensor))");
}

// forward's int, float and bool arguments as the archive's code declares
// them; a spec (always a tensor) bound to one is refused before the worker
// would fail on it, naming the argument, its type and the spec.
TEST_F(ModelArchiveTest, ASpecForAnIntFloatOrBoolArgumentIsRefused) {
  const ForwardSchema schema = ReadForwardSchema(Bytes("scalars.pt"));
  ASSERT_TRUE(schema.known) << schema.unknown_reason;
  EXPECT_EQ(Arguments(schema),
            "forward(x: Tensor, steps: int, scale: float = 2., flag: bool = "
            "False)");
  const absl::Status steps = CheckModelInputs(
      Bytes("scalars.pt"), "scalars", {Spec("x"), Spec("steps")}, nullptr);
  EXPECT_EQ(steps.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(steps.message(),
            "model scalars: --input steps:float32[B,4] gives a tensor to "
            "forward's argument steps, declared int: an --input spec is "
            "always a tensor; give steps a default in forward, or declare it "
            "Tensor (forward(x: Tensor, steps: int, scale: float = 2., flag: "
            "bool = False))");
  // By position the second spec is forward's `steps` too.
  const absl::Status positional = CheckModelInputs(
      Bytes("scalars.pt"), "scalars", {Spec("a"), Spec("b")}, nullptr);
  EXPECT_TRUE(absl::StrContains(positional.message(),
                                "--input b:float32[B,4] gives a tensor to "
                                "forward's argument steps, declared int"))
      << positional;
  // Net's `k: int = 3` and the float and bool here, named.
  const absl::Status k = CheckModelInputs(Bytes("scripted.pt"), "net",
                                          {Spec("x"), Spec("k")}, nullptr);
  EXPECT_TRUE(absl::StrContains(k.message(),
                                "argument k, declared int: an --input spec "
                                "is always a tensor; leave k out (its default "
                                "is 3)"))
      << k;
  for (const std::string name : {"scale", "flag"}) {
    const absl::Status status =
        CheckModelInputs(Bytes("scalars.pt"), "scalars",
                         {Spec("x"), Spec("steps"), Spec(name)}, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
  }
  // The int left out has no value either: said so.
  const absl::Status left_out =
      CheckModelInputs(Bytes("scalars.pt"), "scalars", {Spec("x")}, nullptr);
  EXPECT_TRUE(absl::StrContains(left_out.message(),
                                "forward's argument steps (int) has no "
                                "default, and an --input spec (always a "
                                "tensor) cannot give it one"))
      << left_out;
}

TEST_F(ModelArchiveTest, TheMappedFileGivesTheSameAnswer) {
  const absl::Status status = CheckModelFileInputs(
      Path("two_inputs.pt"), "two_inputs", {Spec("image")}, nullptr);
  EXPECT_TRUE(absl::StrContains(status.message(), "argument text")) << status;
  EXPECT_TRUE(CheckModelFileInputs(Path("two_inputs.pt"), "two_inputs",
                                   {Spec("image"), Spec("text")}, nullptr)
                  .ok());
  EXPECT_EQ(
      CheckModelFileInputs(Path("absent.pt"), "absent", {}, nullptr).code(),
      absl::StatusCode::kInternal);
}

TEST_F(ModelArchiveTest, PicklesAreNamedAsSuch) {
  for (const std::string name : {"pickle.pt", "legacy_pickle.pt"}) {
    const absl::Status status = CheckModelArchive(Bytes(name), name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(
        absl::StrContains(status.message(), "this is a torch.save pickle"))
        << status;
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  "torch.jit.script(model).save(path)"))
        << status;
  }
}

TEST_F(ModelArchiveTest, ATruncatedArchiveIsRefused) {
  const absl::Status status =
      CheckModelInputs(Bytes("truncated.pt"), "cut", {Spec("x")}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(
      status.message(),
      "model cut: cannot load the TorchScript archive (truncated or "
      "corrupt?)"))
      << status;
}

TEST_F(ModelArchiveTest, CodeItCannotParseLeavesTheModelUnchecked) {
  ForwardSchema schema;
  // Any specs: the worker decides.
  const absl::Status status = CheckModelInputs(
      Bytes("odd.pt"), "odd", {Spec("a"), Spec("b"), Spec("c")}, &schema);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_FALSE(schema.known);
  EXPECT_TRUE(absl::StrContains(schema.unknown_reason, "*args"))
      << schema.unknown_reason;
}

TEST_F(ModelArchiveTest, ACorruptCodeRecordLeavesTheModelUnchecked) {
  // A flipped byte inside the deflated code record: its CRC fails, the
  // schema is unknown, and the check does not refuse what the worker may
  // still judge.
  std::string bytes = Bytes("odd.pt");
  const size_t code = bytes.find("odd/code/__torch__.py");
  ASSERT_NE(code, std::string::npos);
  bytes[code + 30] = static_cast<char>(bytes[code + 30] ^ 0x55);
  const ForwardSchema schema = ReadForwardSchema(bytes);
  EXPECT_FALSE(schema.known);
}

}  // namespace
}  // namespace mutwo

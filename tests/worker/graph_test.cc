#include "worker/graph.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/passes/constant_propagation.h>

#include <set>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "tests/worker/test_models.h"
#include "worker/alias.h"
#include "worker/inputs.h"
#include "worker/interpreter.h"
#include "worker/model_loader.h"
#include "worker/specialize.h"

namespace mutwo::worker {
namespace {

using ::mutwo::testing::ModelPath;

torch::jit::Module Load(const std::string& name) {
  auto module = LoadModuleFile(ModelPath(name), torch::kCPU);
  EXPECT_TRUE(module.ok()) << module.status();
  return *module;
}

TEST(GraphTest, ResNet18IsInlinedNumberedAndScoped) {
  auto graph = Graph::Create(Load("resnet18"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const auto& nodes = (*graph)->nodes();
  ASSERT_GT(nodes.size(), 300u);  // inlined: not one prim::CallMethod
  std::set<std::string> conv_scopes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(nodes[i].id, static_cast<int>(i));
    EXPECT_NE(nodes[i].kind, "prim::CallMethod");
    for (int input : nodes[i].input_nodes) EXPECT_LT(input, nodes[i].id);
    if (nodes[i].kind == "aten::conv2d") conv_scopes.insert(nodes[i].scope);
  }
  EXPECT_EQ(conv_scopes.size(), 20u);
  EXPECT_TRUE(conv_scopes.count("conv1"));
  EXPECT_TRUE(conv_scopes.count("layer1.0.conv1"));
  EXPECT_TRUE(conv_scopes.count("layer2.0.downsample.0"));
  EXPECT_EQ((*graph)->num_inputs(), 1);
  EXPECT_EQ((*graph)->fingerprint().size(), 16u);
}

TEST(GraphTest, ScopesNameModuleListElementsAsNamedModulesDoes) {
  // transformer: nn.TransformerEncoder calls `for mod in self.layers`; the
  // inliner records only "0" for `self.layers.0`. The scope is the path
  // model.named_modules() gives ("encoder.layers.0"), which mutwo.apply
  // matches against the eager module.
  auto graph = Graph::Create(Load("transformer"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::set<std::string> scopes;
  for (const auto& node : (*graph)->nodes()) scopes.insert(node.scope);
  EXPECT_TRUE(scopes.count("encoder.layers.0")) << absl::StrJoin(scopes, " ");
  EXPECT_TRUE(scopes.count("encoder.layers.1"));
  EXPECT_FALSE(scopes.count("encoder.0"));
  EXPECT_TRUE(scopes.count("head"));
}

TEST(GraphTest, FingerprintIsStableAcrossLoadsAndDiffersAcrossModels) {
  auto a = Graph::Create(Load("cnn"));
  auto b = Graph::Create(Load("cnn"));
  auto c = Graph::Create(Load("mlp"));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
  EXPECT_NE((*a)->fingerprint(), (*c)->fingerprint());
  ASSERT_EQ((*a)->num_nodes(), (*b)->num_nodes());
  for (int i = 0; i < (*a)->num_nodes(); ++i) {
    EXPECT_EQ((*a)->nodes()[i].kind, (*b)->nodes()[i].kind);
    EXPECT_EQ((*a)->nodes()[i].scope, (*b)->nodes()[i].scope);
  }
}

TEST(GraphTest, ControlFlowStaysOneNodeWithEdgesAndLastUses) {
  auto graph = Graph::Create(Load("control_flow"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  int ifs = 0, loops = 0;
  for (const IrNode& node : (*graph)->nodes()) {
    if (node.kind == "prim::If") ++ifs;
    if (node.kind == "prim::Loop") {
      ++loops;
      EXPECT_TRUE(node.is_op);  // its body runs linear and tanh
      EXPECT_FALSE(node.input_nodes.empty());
    }
    EXPECT_GE(node.last_use, node.id);
    for (int consumer : node.consumers) EXPECT_GT(consumer, node.id);
  }
  EXPECT_GE(ifs, 1);
  EXPECT_EQ(loops, 1);
  // The node producing the output lives until the end of forward.
  const IrNode& last = (*graph)->nodes().back();
  EXPECT_TRUE(last.returns_output);
  EXPECT_EQ(last.last_use, (*graph)->num_nodes() - 1);
}

// torchvision's IntermediateLayerGetter (FCN, DeepLabV3) puts each stage's
// output into a dict and the head reads one entry. A reader of one entry is
// not a reader of the others: fcn_resnet50 replayed its stem's recompute
// segments at the backbone's last block and held them through the whole
// backward. (What comes out of the dict may be any entry: its readers stay
// readers of all, and the executor keeps those it saw read the storage.)
TEST(AliasTest, ReadersOfADictEntryDoNotReadTheOtherEntries) {
  auto graph = Graph::Create(Load("feature_dict"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<const IrNode*> relus;
  const IrNode* head = nullptr;
  const IrNode* linear_b = nullptr;
  const IrNode* linear_c = nullptr;
  for (const IrNode& node : (*graph)->nodes()) {
    if (node.kind == "aten::relu") relus.push_back(&node);
    if (node.kind == "aten::linear" && node.scope == "head") head = &node;
    if (node.kind == "aten::linear" && node.scope == "stages.b")
      linear_b = &node;
    if (node.kind == "aten::linear" && node.scope == "stages.c")
      linear_c = &node;
  }
  ASSERT_EQ(relus.size(), 4u);  // three stages, then the head
  ASSERT_NE(head, nullptr);
  ASSERT_NE(linear_b, nullptr);
  ASSERT_NE(linear_c, nullptr);
  const auto readers = ReadersByRoot(**graph);
  auto readers_of = [&](const IrNode* producer) {
    auto it = readers.find(AliasRoot(producer->node->output()));
    EXPECT_NE(it, readers.end()) << "node " << producer->id;
    return it == readers.end()
               ? std::set<int>()
               : std::set<int>(it->second.begin(), it->second.end());
  };
  const std::set<int> a = readers_of(relus[0]);
  EXPECT_EQ(a.count(linear_b->id), 1u);  // read directly
  EXPECT_EQ(a.count(linear_c->id), 0u);  // reads b's output, also in the dict
  EXPECT_EQ(a.count(head->id), 1u);      // could be any entry: static
  const std::set<int> c = readers_of(relus[2]);
  EXPECT_EQ(c.count(head->id), 1u);  // through the dict's __getitem__
}

// Forward's arguments generated from TensorSpec texts, as the step does.
std::vector<c10::IValue> Inputs(const std::vector<std::string>& texts,
                                int64_t batch, uint64_t seed = 0) {
  std::vector<v1::TensorSpec> specs;
  for (const std::string& text : texts) specs.push_back(*ParseTensorSpec(text));
  auto tensors = MakeInputs(specs, batch, torch::kCPU, seed);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return std::vector<c10::IValue>(tensors->begin(), tensors->end());
}

int CountKind(const Graph& graph, const std::string& kind) {
  int count = 0;
  for (const IrNode& node : graph.nodes()) count += node.kind == kind;
  return count;
}

// Issue 13: a scripted nn.TransformerEncoderLayer is one prim::If (its
// fast-path check puts the layer in the else branch). Specialised, the
// layers are their ops, in their module paths, behind a guard each.
TEST(SpecializeTest, TransformerEncoderLayersBecomeTheirOps) {
  const torch::jit::Module module = Load("transformer");
  auto plain = Graph::Create(module);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_GE(CountKind(**plain, "prim::If"), 2);  // what the planner saw

  SpecializeStats stats;
  auto graph = CreateSpecializedGraph(
      module, Inputs({"tokens:int64[B,16]{0,1000}"}, 4), {}, &stats);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(stats.recording_error, "");
  EXPECT_EQ(stats.ifs_kept, 0);
  EXPECT_EQ(CountKind(**graph, "prim::If"), 0);
  EXPECT_EQ(CountKind(**graph, "prim::Loop"), 0);
  std::set<std::string> linears, norms, attention;
  int guards = 0;
  for (const IrNode& node : (*graph)->nodes()) {
    for (int input : node.input_nodes) EXPECT_LT(input, node.id);
    for (int consumer : node.consumers) EXPECT_GT(consumer, node.id);
    if (node.kind == "aten::linear") linears.insert(node.scope);
    if (node.kind == "aten::layer_norm") norms.insert(node.scope);
    if (node.scope.rfind("encoder.layers.0.self_attn", 0) == 0 && node.is_op) {
      attention.insert(node.kind);
    }
    if (node.kind == kBranchGuardKind) {
      ++guards;
      EXPECT_FALSE(node.is_op);
    }
  }
  EXPECT_GT(guards, 0);
  for (const char* scope :
       {"encoder.layers.0.linear1", "encoder.layers.0.linear2",
        "encoder.layers.1.linear1", "encoder.layers.1.linear2", "head"}) {
    EXPECT_TRUE(linears.count(scope))
        << scope << ": " << absl::StrJoin(linears, " ");
  }
  EXPECT_TRUE(norms.count("encoder.layers.0.norm1"))
      << absl::StrJoin(norms, " ");
  EXPECT_TRUE(norms.count("encoder.layers.1.norm2"));
  // multi_head_attention_forward's ops: projections, scores, softmax.
  EXPECT_TRUE(attention.count("aten::softmax"))
      << absl::StrJoin(attention, " ");
  EXPECT_TRUE(attention.count("aten::linear"));
  EXPECT_NE((*graph)->fingerprint(), (*plain)->fingerprint());
}

TEST(SpecializeTest, SameInputsGiveTheSameGraphAndTheModulesResult) {
  const torch::jit::Module module = Load("transformer");
  const auto inputs = Inputs({"tokens:int64[B,16]{0,1000}"}, 4);
  auto a = CreateSpecializedGraph(module, inputs);
  auto b = CreateSpecializedGraph(module, inputs);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
  // The specialised graph computes what the module computes (same RNG
  // draws for dropout).
  torch::jit::Module copy = module;
  torch::manual_seed(3);
  const torch::Tensor expected = copy.forward(inputs).toTensor();
  Interpreter interpreter(a->get());
  torch::manual_seed(3);
  auto out = interpreter.Run(module, inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->toTensor().equal(expected));
}

TEST(SpecializeTest, ConstantLoopsAreUnrolled) {
  // control_flow: `for _ in range(3): h = tanh(cell(h)) + h` and an `if`
  // on the data.
  const torch::jit::Module module = Load("control_flow");
  SpecializeStats stats;
  auto graph = CreateSpecializedGraph(module, Inputs({"x:float32[B,16]"}, 8),
                                      {}, &stats);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(stats.loops_unrolled, 1);
  EXPECT_EQ(stats.ifs_specialized, 1);
  EXPECT_EQ(CountKind(**graph, "prim::Loop"), 0);
  EXPECT_EQ(CountKind(**graph, "prim::If"), 0);
  EXPECT_EQ(CountKind(**graph, "aten::tanh"), 3);
  int cells = 0;
  for (const IrNode& node : (*graph)->nodes()) {
    cells += node.kind == "aten::linear" && node.scope == "cell";
  }
  EXPECT_EQ(cells, 3);
  // A loop over more trips than allowed stays.
  SpecializeOptions small;
  small.max_unrolled_trips = 2;
  auto kept = CreateSpecializedGraph(module, Inputs({"x:float32[B,16]"}, 8),
                                     small, &stats);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(stats.loops_unrolled, 0);
  EXPECT_EQ(CountKind(**kept, "prim::Loop"), 1);
}

// branchy: `if bool(x.sum() > 0)` inside submodule "gate". Specialised on
// one sign, the step on the other fails with an error naming the If's
// module, instead of running the wrong branch.
TEST(SpecializeTest, TheGuardFailsTheStepWhenTheOtherBranchIsTaken) {
  const torch::jit::Module module = Load("branchy");
  const std::vector<c10::IValue> positive{torch::ones({4, 16})};
  const std::vector<c10::IValue> negative{-torch::ones({4, 16})};
  auto graph = CreateSpecializedGraph(module, positive);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(CountKind(**graph, "prim::If"), 0);
  EXPECT_EQ(CountKind(**graph, "aten::relu"), 1);     // the branch taken
  EXPECT_EQ(CountKind(**graph, "aten::sigmoid"), 0);  // not the other
  ASSERT_EQ(CountKind(**graph, kBranchGuardKind), 1);
  Interpreter interpreter(graph->get());
  EXPECT_TRUE(interpreter.Run(module, positive).ok());
  auto other = interpreter.Run(module, negative);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(other.status().message());
  EXPECT_NE(message.find("mutwo: control flow at gate took the other branch "
                         "than when the model was profiled; re-profile"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;

  // Unspecialised, both run.
  auto plain = Graph::Create(module);
  ASSERT_TRUE(plain.ok());
  Interpreter opaque(plain->get());
  EXPECT_TRUE(opaque.Run(module, negative).ok());
}

TEST(SpecializeTest, AForwardThatFailsLeavesTheBranchesAsTheyAre) {
  const torch::jit::Module module = Load("branchy");
  SpecializeStats stats;
  auto graph =
      CreateSpecializedGraph(module, {torch::ones({4, 7})}, {}, &stats);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_NE(stats.recording_error, "");
  EXPECT_EQ(CountKind(**graph, "prim::If"), 1);
}

TEST(ModelLoaderTest, BadFilesGetErrorsNamingTheProblem) {
  auto not_zip = LoadModuleFile(ModelPath("not_a_zip"), torch::kCPU);
  ASSERT_FALSE(not_zip.ok());
  EXPECT_EQ(not_zip.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_zip.status().message().find("not a TorchScript archive"),
            std::string::npos);
  EXPECT_NE(not_zip.status().message().find("not_a_zip.pt"), std::string::npos);

  auto truncated = LoadModuleFile(ModelPath("truncated"), torch::kCPU);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("truncated or corrupt"),
            std::string::npos);
  EXPECT_EQ(truncated.status().message().find('\n'), std::string::npos);

  auto no_forward = LoadModuleFile(ModelPath("no_forward"), torch::kCPU);
  ASSERT_FALSE(no_forward.ok());
  EXPECT_NE(no_forward.status().message().find("no forward"),
            std::string::npos);

  auto empty = LoadModule("", "empty.pt", torch::kCPU);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);

  auto missing = LoadModuleFile(ModelPath("does_not_exist"), torch::kCPU);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);

  auto too_big = LoadModule(std::string(100, 'x'), "big.pt", torch::kCPU,
                            /*max_bytes=*/10);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("over the limit"),
            std::string::npos);
}

// The fingerprint hashes the IR's structure in graph order (node ids are
// what schedules name), never where its nodes and values were allocated:
// the same IR built again (copied after other graphs took the addresses
// the first one had, some freed again) hashes the same, and
// one edge changed hashes differently (a fingerprint that
// differed between two processes on the same file).
TEST(GraphTest, FingerprintDependsOnStructureNotOnAllocation) {
  const torch::jit::Module module = Load("cnn");
  auto first = Graph::Create(module);
  ASSERT_TRUE(first.ok()) << first.status();
  // Other graphs first, so that the copy lives at other addresses (and a
  // hash of its pointers would order it otherwise).
  std::vector<std::shared_ptr<torch::jit::Graph>> ballast;
  for (int i = 0; i < 8; ++i) ballast.push_back((*first)->graph()->copy());
  ballast.resize(4);  // and free some, so the next one is interleaved
  std::shared_ptr<torch::jit::Graph> parsed = (*first)->graph()->copy();
  auto again = Graph::Create(module, parsed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->fingerprint(), (*first)->fingerprint());
  EXPECT_EQ((*again)->num_nodes(), (*first)->num_nodes());

  // The same IR with the two inputs of one op swapped: another graph.
  std::shared_ptr<torch::jit::Graph> swapped = (*first)->graph()->copy();
  bool changed = false;
  for (torch::jit::Node* node : swapped->nodes()) {
    if (node->inputs().size() >= 2 && node->input(0) != node->input(1) &&
        node->input(0)->type()->kind() == node->input(1)->type()->kind()) {
      torch::jit::Value* a = node->input(0);
      torch::jit::Value* b = node->input(1);
      node->replaceInput(0, b);
      node->replaceInput(1, a);
      changed = true;
      break;
    }
  }
  ASSERT_TRUE(changed);
  auto other = Graph::Create(module, swapped);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->fingerprint(), (*first)->fingerprint());
}

// Folding the module's constant settings reaches the same graph wherever
// the allocator put the IR's values: LibTorch's constant propagation reads
// an alias analysis of the graph it is rewriting, and a single pass stopped
// at `len(why) > 0` in this fixture (and, address-dependent, in a 2.11
// nn.TransformerEncoder on CUDA). The IR is folded to the end: no branch on
// a constant left, and another pass finds nothing to fold.
TEST(GraphTest, ConstantSettingsAreFoldedToTheEnd) {
  auto graph = Graph::Create(Load("fast_path_check"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<std::string> kinds;
  for (const IrNode& node : (*graph)->nodes()) kinds.push_back(node.kind);
  EXPECT_EQ(absl::StrJoin(kinds, " "),
            "prim::GetAttr prim::GetAttr prim::GetAttr aten::linear");
  std::shared_ptr<torch::jit::Graph> copy = (*graph)->graph()->copy();
  EXPECT_FALSE(torch::jit::ConstantPropagation(copy)) << *copy;
}

}  // namespace
}  // namespace mutwo::worker

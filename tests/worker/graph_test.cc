#include "worker/graph.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_join.h"
#include "common/proto_io.h"
#include "tests/worker/test_models.h"
#include "worker/alias.h"
#include "worker/model_loader.h"

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

}  // namespace
}  // namespace mutwo::worker

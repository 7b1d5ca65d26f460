// The fixture models of the worker tests (written at build time by
// tests/testing/make_models.py into MUTWO_TEST_MODELS_DIR) and the inputs
// and loss that fit each.
#ifndef MUTWO_TESTS_WORKER_TEST_MODELS_H_
#define MUTWO_TESTS_WORKER_TEST_MODELS_H_

#include <ostream>
#include <string>
#include <vector>

namespace mutwo::testing {

struct TestModel {
  std::string name;
  std::vector<std::string> inputs;  // TensorSpec texts
  std::string loss = "mean";
  int batch = 4;  // small, to keep the suite fast
};

// Test names and failure messages show the model's name.
inline void PrintTo(const TestModel& model, std::ostream* os) {
  *os << model.name;
}

inline std::string ModelPath(const std::string& name) {
  return std::string(MUTWO_TEST_MODELS_DIR) + "/" + name + ".pt";
}

inline const std::vector<TestModel>& TestModels() {
  static const auto* const models = new std::vector<TestModel>{
      {"mlp", {"x:float32[B,32]"}},
      {"cnn", {"x:float32[B,3,16,16]"}},
      {"resnet18", {"x:float32[B,3,64,64]"}, "mean", 2},
      {"transformer",
       {"tokens:int64[B,16]{0,1000}"},
       "cross_entropy:y:int64[B,16]{0,1000}"},
      {"control_flow", {"x:float32[B,16]"}},
      {"two_inputs", {"x:float32[B,8]", "y:float32[B,4]"}},
      {"feature_dict", {"x:float32[B,16]"}},
  };
  return *models;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_WORKER_TEST_MODELS_H_

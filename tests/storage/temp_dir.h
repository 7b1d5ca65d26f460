// A temporary directory for one test, removed with everything in it when the
// object goes away.
#ifndef MUTWO_TESTS_STORAGE_TEMP_DIR_H_
#define MUTWO_TESTS_STORAGE_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace mutwo::storage::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != 0 ? base : "/tmp") +
        "/mutwo-storage-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << " failed";
    }
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace mutwo::storage::testing

#endif  // MUTWO_TESTS_STORAGE_TEMP_DIR_H_

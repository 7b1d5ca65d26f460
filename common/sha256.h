// Incremental SHA-256 (OpenSSL EVP) for content-addressed model files.
// Not thread-safe per object; use one Sha256 per stream.
#ifndef MUTWO_COMMON_SHA256_H_
#define MUTWO_COMMON_SHA256_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace mutwo {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // Lowercase hex digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Sha256Hex(absl::string_view bytes);
// True for 64 lowercase hex characters.
bool IsSha256Hex(absl::string_view text);

}  // namespace mutwo

#endif  // MUTWO_COMMON_SHA256_H_

#include "common/sha256.h"

#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"

namespace mutwo {

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->ctx); }

void Sha256::Update(absl::string_view bytes) {
  EVP_DigestUpdate(state_->ctx, bytes.data(), bytes.size());
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(state_->ctx, digest, &len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), len));
}

std::string Sha256Hex(absl::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes);
  return sha.HexDigest();
}

bool IsSha256Hex(absl::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

}  // namespace mutwo
